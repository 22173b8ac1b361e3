"""Renewed assignments on the node (ADR 0032): the same target only, and only the sequence
moves: no download, no trial, no retry of a target that failed or was reverted."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edge_node.testing.update_world import UpdateWorld
from edge_node.updater.journal import ModelRef
from edge_node.updater.reconciler import OutcomeKind, UpdatePhase
from tests.edge_node.updater._world import install_first, make_world

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    return make_world(tmp_path)


async def test_renewal_of_the_active_target_only_moves_the_sequence(world: UpdateWorld) -> None:
    rel = await install_first(world)
    before = world.journal.load()
    reports, served = len(world.reports), len(world.activated)
    outcome = await world.reconciler().apply(world.assign(rel, renewal=True))
    assert (outcome.kind, outcome.reason, outcome.retry_at) == (
        OutcomeKind.UNCHANGED,
        "renewed",
        None,
    )
    after = world.journal.load()
    assert after.director_sequence == 2
    assert dataclasses.replace(after, director_sequence=1, updated_at=None) == (
        dataclasses.replace(before, updated_at=None)
    )
    assert (len(world.reports), len(world.activated)) == (reports, served)
    # The renewal delivered again (a Hello's answer) is the decision already held.
    again = await world.reconciler().apply(world.assign(rel, renewal=True, sequence=2))
    assert (again.kind, again.reason) == (OutcomeKind.UNCHANGED, "replayed")


async def test_renewal_never_retries_a_target_that_failed_on_its_merits(
    world: UpdateWorld,
) -> None:
    first = await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    assert (await world.reconciler().apply(world.assign(bad))).kind is OutcomeKind.REVERTED
    failed = world.journal.load()
    assert failed.failed == ModelRef(bad.path, bad.sha256) and failed.attempts == 1
    served, reports = len(world.activated), len(world.reports)
    for _ in range(3):  # a long rollout: renewed again and again
        outcome = await world.reconciler().apply(world.assign(bad, renewal=True))
        assert (outcome.kind, outcome.reason, outcome.retry_at) == (
            OutcomeKind.UNCHANGED,
            "renewed",
            None,
        )
    state = world.journal.load()
    assert state.active == ModelRef(first.path, first.sha256)
    assert (state.attempts, state.director_sequence) == (1, 5)
    assert (len(world.activated), len(world.reports)) == (served, reports)


async def test_renewal_never_unreverts_a_watchdog_revert(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    rec = world.reconciler()
    assert (await rec.apply(world.assign(new))).kind is OutcomeKind.APPLIED
    reverted = await rec.revert_active(ModelRef(new.path, new.sha256), "error-rate", "50 %")
    assert reverted.kind is OutcomeKind.REVERTED
    outcome = await world.reconciler().apply(world.assign(new, renewal=True))
    assert outcome.reason == "renewed"
    assert world.journal.load().active == ModelRef(first.path, first.sha256)
    assert world.activated[-1] == world.store.path_of(first.sha256)


async def test_renewal_of_another_target_is_refused(world: UpdateWorld) -> None:
    await install_first(world)
    other = world.releases["1.1.0"]
    outcome = await world.reconciler().apply(world.assign(other, renewal=True))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "renewal-mismatch")
    assert world.journal.load().director_sequence == 1
    last = world.reports[-1]
    assert (last.phase, last.reason, last.target_path) == (
        UpdatePhase.FAILED,
        "renewal-mismatch",
        other.path,
    )
    assert "1.0.0" in last.detail
    assert not world.store.exists(other.sha256)


async def test_a_fresh_node_refuses_a_renewal(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    outcome = await world.reconciler().apply(world.assign(world.releases["1.0.0"], renewal=True))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "renewal-mismatch")
    assert world.activated == []


async def test_renewal_keeps_a_transient_failures_retry(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]  # the link cuts the download short
    first = await world.reconciler().apply(world.assign(rel))
    assert first.reason == "link-unavailable" and first.retry_at is not None
    renewed = await world.reconciler().apply(world.assign(rel, renewal=True))
    assert (renewed.reason, renewed.retry_at) == ("renewed", first.retry_at)
    assert world.activated == []
    # The retry itself comes when the update task applies the renewal again at retry_at:
    # a re-delivery, retried within the attempt limit as before.
    world.peer.artifacts[rel.sha256] = rel.data
    retried = await world.reconciler().apply(world.assign(rel, renewal=True, sequence=2))
    assert retried.kind is OutcomeKind.APPLIED


async def test_a_journal_without_assigned_renews_its_active_target(world: UpdateWorld) -> None:
    rel = await install_first(world)
    path = world.node_dir / "journal.json"
    data = json.loads(path.read_text())
    del data["assigned"]  # as an agent before renewals wrote it
    path.write_text(json.dumps(data))
    assert world.journal.load().assigned is None
    outcome = await world.reconciler().apply(world.assign(rel, renewal=True))
    assert outcome.reason == "renewed"
    refused = await world.reconciler().apply(world.assign(world.releases["1.1.0"], renewal=True))
    assert refused.reason == "renewal-mismatch"
