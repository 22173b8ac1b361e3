"""A node never silently serves a revoked version (ADR 0035): the floor in its verified
TUF metadata (fresh at every apply, the cached copy at start-up) decides whether the
active model may go on and whether `previous` may replace it; either way it reports
`revoked-active`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edge_node.testing.memory_link import MemoryNodeLink
from edge_node.testing.update_world import Release, UpdateWorld
from edge_node.updater.journal import ModelRef
from edge_node.updater.reconciler import REVOKED_ACTIVE, OutcomeKind, UpdatePhase, UpdateReport
from edge_node.updater.tuf_fetch import CachedTufView, TufClient
from tests.edge_node.updater._world import assert_consistent, install_first, make_world

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    return make_world(tmp_path)


def ref(rel: Release) -> ModelRef:
    return ModelRef(rel.path, rel.sha256)


async def refresh_cache(world: UpdateWorld) -> None:
    """The node's TUF cache refreshed (as any apply does), nothing else."""
    tuf = TufClient(
        MemoryNodeLink(world.peer),
        asyncio.get_running_loop(),
        metadata_dir=world.node_dir / "tuf",
        trusted_root=world.node_dir / "tuf-root.json",
    )
    await asyncio.to_thread(tuf.refresh)


async def on_new_with_old_kept(world: UpdateWorld) -> tuple[Release, Release]:
    """1.0.0 then 1.1.0 installed: active 1.1.0, previous 1.0.0."""
    old, new = await install_first(world), world.releases["1.1.0"]
    assert (await world.reconciler().apply(world.assign(new))).kind is OutcomeKind.APPLIED
    return old, new


async def rolled_back_to_old(world: UpdateWorld) -> tuple[Release, Release]:
    """Pinned back to 1.0.0 after 1.1.0: active 1.0.0, previous 1.1.0."""
    old, new = await on_new_with_old_kept(world)
    assert (await world.reconciler().apply(world.assign(old))).kind is OutcomeKind.APPLIED
    return old, new


def damage(world: UpdateWorld, rel: Release) -> None:
    path = world.store.path_of(rel.sha256)
    path.chmod(0o600)
    path.write_bytes(b"not the model")


def last(world: UpdateWorld) -> UpdateReport:
    return world.reports[-1]


# ------------------------------------------------------------------ start-up


@pytest.mark.parametrize("revoked", [False, True])
async def test_a_damaged_active_file_falls_back_only_to_a_previous_that_is_not_revoked(
    world: UpdateWorld, revoked: bool
) -> None:
    old, new = await on_new_with_old_kept(world)
    if revoked:
        world.raise_floor(2)  # `model revoke det 1.0.0`
        await refresh_cache(world)
    damage(world, new)
    served = list(world.activated)

    state = await world.reconciler().resume_after_crash()

    if not revoked:  # the fallback as before
        assert state.active == ref(old)
        assert (last(world).phase, last(world).reason) == (UpdatePhase.REVERTED, "active-missing")
        return
    assert state.previous is None  # never a fallback again
    assert not world.store.exists(old.sha256)
    report = last(world)
    assert (report.phase, report.reason) == (UpdatePhase.FAILED, "active-missing")
    assert "previous one is revoked" in report.detail
    assert report.facts == {"floor": "2", "model": "det", "release_counter": "1"}
    assert world.activated == served  # nothing served by the recovery


async def test_at_start_a_revoked_active_goes_back_to_an_allowed_previous_offline(
    world: UpdateWorld,
) -> None:
    old, new = await rolled_back_to_old(world)
    world.raise_floor(2)
    await refresh_cache(world)
    world.peer.metadata.clear()  # offline from now on: only the cached metadata counts

    state = await world.reconciler().resume_after_crash()

    assert (state.active, state.previous, state.failed) == (ref(new), None, ref(old))
    assert_consistent(world, state)
    report = last(world)
    assert (report.phase, report.reason) == (UpdatePhase.REVERTED, REVOKED_ACTIVE)
    assert "serving models/det/1.1.0/model.onnx" in report.detail


async def test_a_cache_that_does_not_verify_knows_no_floor(world: UpdateWorld) -> None:
    await rolled_back_to_old(world)
    world.raise_floor(2)
    await refresh_cache(world)
    cache = world.node_dir / "tuf" / "targets.json"
    assert CachedTufView(world.node_dir / "tuf").floor("det") == 2
    cache.write_bytes(cache.read_bytes().replace(b'"floor":2', b'"floor":9'))
    assert CachedTufView(world.node_dir / "tuf").floor("det") == 0  # signature broken


# ------------------------------------------------------------------ running


async def test_a_refused_below_floor_assignment_reverts_a_revoked_active_to_previous(
    world: UpdateWorld,
) -> None:
    old, new = await rolled_back_to_old(world)
    world.raise_floor(2)
    rec = world.reconciler()

    # The node's last assignment (1.0.0) again, e.g. a reconnect: refused, and the node
    # learns that what it serves is revoked.
    outcome = await rec.apply(world.assign(old, sequence=world.sequence))

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "below-floor")
    assert world.activated[-1] == world.store.path_of(new.sha256)
    state = world.journal.load()
    assert (state.active, state.failed, state.last_error) == (ref(new), ref(old), REVOKED_ACTIVE)
    report = last(world)  # after the refusal: what the node does now
    assert (report.phase, report.reason) == (UpdatePhase.REVERTED, REVOKED_ACTIVE)
    assert report.facts["floor"] == "2"


async def test_with_nothing_allowed_the_node_stops_serving_and_says_so(
    world: UpdateWorld,
) -> None:
    _, new = await on_new_with_old_kept(world)
    world.raise_floor(3)  # `model revoke det 1.1.0`: 1.0.0 is below the floor too
    rec = world.reconciler()

    outcome = await rec.apply(world.assign(new, renewal=True))

    assert outcome.reason == "below-floor"
    assert (world.host.serving, world.host.stops) == (False, 1)
    state = world.journal.load()
    assert (state.active, state.previous) == (None, None)
    assert world.store.installed() == frozenset()
    report = last(world)
    assert (report.phase, report.reason) == (UpdatePhase.FAILED, REVOKED_ACTIVE)
    assert "previous model is revoked too" in report.detail
    assert report.detail.endswith("serving nothing")

    # The Hello that says so brings the refused assignment back: refused again, and the
    # recall stays the last word.
    again = await rec.apply(world.assign(new, renewal=True, sequence=world.sequence))
    assert again.reason == "below-floor"
    assert [(r.phase, r.reason) for r in world.reports[-2:]] == [
        (UpdatePhase.FAILED, "below-floor"),
        (UpdatePhase.FAILED, REVOKED_ACTIVE),
    ]
    assert world.host.stops == 1

    # The control plane moves it once a good version is pushed.
    fixed = world.release("1.2.0", add=3.0, counter=3)
    assert (await rec.apply(world.assign(fixed))).kind is OutcomeKind.APPLIED
    assert world.host.serving
    assert world.journal.load().active == ref(fixed)


async def test_moved_by_the_director_the_revoked_model_is_left_before_the_trial(
    world: UpdateWorld,
) -> None:
    """A failing trial of the new version must not go back to the revoked one."""
    old = await install_first(world)
    world.raise_floor(2)
    broken = world.release("1.2.0", add=3.0, counter=3, reference_add=9.0)  # fails its test
    rec = world.reconciler()

    outcome = await rec.apply(world.assign(broken))

    assert outcome.kind is OutcomeKind.REVERTED
    assert [(r.phase, r.reason) for r in world.reports if r.reason == REVOKED_ACTIVE] == [
        (UpdatePhase.FAILED, REVOKED_ACTIVE)
    ]
    state = world.journal.load()
    assert state.active is None and not world.host.serving
    assert not world.store.exists(old.sha256)


async def test_the_watchdog_does_not_revert_to_a_revoked_previous(world: UpdateWorld) -> None:
    _, new = await on_new_with_old_kept(world)
    world.raise_floor(2)
    await refresh_cache(world)
    rec = world.reconciler()

    outcome = await rec.revert_active(ref(new), "watchdog-errors", "3 of 10 runs failed")

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "revert-impossible")
    assert "previous model is revoked" in last(world).detail
    assert world.activated[-1] == world.store.path_of(new.sha256)
