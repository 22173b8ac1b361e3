"""The shadow stage through the reconciler (ADR 0031): a candidate verified against TUF,
downloaded, self-tested and handed to the host; nothing served changes, nothing is
journalled, a failure is reported and the node serves on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edge_node.testing.update_world import Release, UpdateWorld
from edge_node.updater.host import ShadowSettings
from edge_node.updater.journal import ModelRef
from edge_node.updater.reconciler import OutcomeKind
from edge_node.updater.shadow import LOADING_MARK
from tests.edge_node.updater._world import install_first, make_world

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    return make_world(tmp_path)


def _without_time(world: UpdateWorld) -> object:
    return dataclasses.replace(world.journal.load(), updated_at=None, director_sequence=0)


async def test_a_candidate_runs_in_shadow_and_nothing_served_changes(world: UpdateWorld) -> None:
    active = await install_first(world)
    candidate = world.releases["1.1.0"]
    journal, served = _without_time(world), list(world.activated)
    rec = world.reconciler()
    signed = world.assign(active, shadow=candidate, sample_per_mille=50, max_cpu_percent=20)
    outcome = await rec.apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.UNCHANGED, "already-active")
    assert world.activated == served  # nothing was swapped in
    assert _without_time(world) == journal  # the shadow is not journalled
    assert world.journal.load().active == ModelRef(active.path, active.sha256)
    running = world.host.shadow
    assert running is not None
    bundle, settings = running
    assert (bundle.label, settings) == ("det@1.1.0", ShadowSettings(50, 20))
    assert world.store.verify(candidate.sha256)
    status = rec.shadow.status
    assert status is not None and (status.state, status.candidate) == ("running", "det@1.1.0")
    report = rec.shadow.report()
    assert report is not None
    assert (report["state"], report["sample_per_mille"], report["max_cpu_percent"]) == (
        "running",
        50,
        20,
    )
    # Delivered again (a Hello's answer): it goes on, not loaded twice.
    await rec.apply(signed)
    assert len(world.host.shadows) == 1


async def test_a_later_assignment_without_shadow_stops_and_unloads_it(world: UpdateWorld) -> None:
    active = await install_first(world)
    candidate = world.releases["1.1.0"]
    rec = world.reconciler()
    await rec.apply(world.assign(active, shadow=candidate))
    assert world.host.shadow is not None
    await rec.apply(world.assign(active))
    assert world.host.shadow is None
    assert rec.shadow.status is None and rec.shadow.report() is None
    assert not world.store.exists(candidate.sha256)  # its files left the store


async def test_other_settings_restart_the_candidate(world: UpdateWorld) -> None:
    active = await install_first(world)
    candidate = world.releases["1.1.0"]
    rec = world.reconciler()
    await rec.apply(world.assign(active, shadow=candidate, sample_per_mille=10))
    await rec.apply(world.assign(active, shadow=candidate, sample_per_mille=500))
    assert [s[1].sample_per_mille for s in world.host.shadows if s is not None] == [10, 500]
    assert world.host.shadow is not None


async def test_a_failing_self_test_is_reported_and_the_node_serves_on(world: UpdateWorld) -> None:
    active = await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    rec = world.reconciler()
    outcome = await rec.apply(world.assign(active, shadow=bad))
    assert outcome.kind is OutcomeKind.UNCHANGED
    status = rec.shadow.status
    assert status is not None
    assert (status.state, status.reason) == ("failed", "self-test: output-mismatch")
    assert "out of tolerance" in status.detail
    assert world.host.shadow is None
    assert world.journal.load().failed is None  # the served target's record is untouched
    assert not world.store.exists(bad.sha256)
    # A renewal does not try it again; a new decision does.
    await rec.apply(world.assign(active, shadow=bad, renewal=True))
    assert rec.shadow.status is status
    await rec.apply(world.assign(active, shadow=bad))
    assert rec.shadow.status is not status
    assert rec.shadow.status is not None and rec.shadow.status.state == "failed"


async def test_a_candidate_that_is_not_what_tuf_lists_fails(world: UpdateWorld) -> None:
    active = await install_first(world)
    rec = world.reconciler()
    candidate = world.releases["1.1.0"]
    outcome = await rec.apply(world.assign(active, shadow=candidate, shadow_sha256="ab" * 32))
    assert outcome.kind is OutcomeKind.UNCHANGED  # the assignment itself is accepted
    assert world.journal.load().director_sequence == 2
    status = rec.shadow.status
    assert status is not None and (status.state, status.reason) == ("failed", "sha256-mismatch")
    ghost = Release("9.0.0", "models/det/9.0.0/model.onnx", b"x", "cd" * 32)
    await rec.apply(world.assign(active, shadow=ghost))
    assert rec.shadow.status is not None and rec.shadow.status.reason == "unknown-target"
    await rec.apply(world.assign(active, shadow=candidate, sample_per_mille=0))
    assert rec.shadow.status is not None and rec.shadow.status.reason == "bad-shadow"
    assert world.host.shadows == []
    assert world.activated == [world.store.path_of(active.sha256)]


async def test_a_refused_assignment_leaves_the_shadow_alone(world: UpdateWorld) -> None:
    active = await install_first(world)
    rec = world.reconciler()
    await rec.apply(world.assign(active, shadow=world.releases["1.1.0"]))
    refused = await rec.apply(world.assign(world.releases["1.1.0"], renewal=True))
    assert refused.reason == "renewal-mismatch"
    assert world.host.shadow is not None


async def test_a_restart_while_a_candidate_loaded_blames_it(world: UpdateWorld) -> None:
    active = await install_first(world)
    candidate = world.releases["1.1.0"]
    signed = world.assign(active, shadow=candidate)
    await world.reconciler().apply(signed)
    # The process died while it loaded the candidate: the mark was left behind.
    (world.node_dir / LOADING_MARK).write_text(candidate.sha256)
    world.host.shadows.clear()
    rec = world.reconciler()
    await rec.resume_after_crash()
    assert not (world.node_dir / LOADING_MARK).exists()
    await rec.apply(signed)  # its Hello's answer: the assignment it held
    status = rec.shadow.status
    assert status is not None and (status.state, status.reason) == (
        "failed",
        "restarted-while-loading",
    )
    assert world.host.shadows == []
    await rec.apply(world.assign(active, shadow=candidate))  # a new decision
    assert rec.shadow.status is not None and rec.shadow.status.state == "running"
    assert not (world.node_dir / LOADING_MARK).exists()
