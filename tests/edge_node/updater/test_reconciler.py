"""Reconciler over MemoryNodeLink with real TUF metadata and real director signatures
(the fleet in memory: `edge_node.testing.update_world`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from edge_node.testing.memory_link import MemoryNodeLink
from edge_node.testing.update_world import (
    MODEL,
    FakeModelHost,
    Release,
    UpdateWorld,
    image_runtime,
    model_target_path,
)
from edge_node.updater.host import ModelBundle, Trial
from edge_node.updater.journal import JournalState, ModelRef, Phase
from edge_node.updater.reconciler import (
    OutcomeKind,
    UpdatePhase,
)
from edge_node.updater.selftest import SelfTestResult, TrialLoader, self_test
from edge_node.updater.store import DiskUsage, ModelStore
from tests.edge_node.updater._world import Crash, assert_consistent, install_first, make_world

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    return make_world(tmp_path)


# ------------------------------------------------------------------------ cases


async def test_normal_update_then_idempotent(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    rec = world.reconciler()
    outcome = await rec.apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    state = world.journal.load()
    assert state.active == ModelRef(new.path, new.sha256)
    assert state.previous == ModelRef(first.path, first.sha256)
    assert state.director_sequence == 2
    assert world.activated[-1] == world.store.path_of(new.sha256)
    assert world.store.path_of(new.sha256).read_bytes() == new.data
    assert world.phases()[-4:] == ["downloading", "verifying", "self-testing", "active"]
    assert_consistent(world, state)

    reports, activations = len(world.reports), len(world.activated)
    again = await rec.apply(signed)
    assert (again.kind, again.reason) == (OutcomeKind.UNCHANGED, "replayed")
    assert len(world.activated) == activations
    assert len(world.reports) == reports
    assert world.journal.load().active == state.active


async def test_tampered_artifact_fails_and_stays_on_old(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    world.peer.artifacts[new.sha256] = new.data[:-1] + b"\x00"
    outcome = await world.reconciler().apply(world.assign(new))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "hash-mismatch")
    state = world.journal.load()
    assert state.active == ModelRef(first.path, first.sha256)
    assert state.failed == ModelRef(new.path, new.sha256) and state.attempts == 1
    assert world.phases()[-2:] == ["failed", "reverted"]
    assert not world.store.exists(new.sha256)
    assert_consistent(world, state)


async def test_assignment_for_another_node(world: UpdateWorld) -> None:
    outcome = await world.reconciler().apply(
        world.assign(world.releases["1.0.0"], node_id="n-someoneelse")
    )
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "wrong-node")
    assert world.journal.load() == JournalState()
    assert [(r.phase, r.reason, r.target_path) for r in world.reports] == [
        (UpdatePhase.FAILED, "wrong-node", "")
    ]


async def test_stale_assignment_is_refused(world: UpdateWorld) -> None:
    old = world.assign(world.releases["1.0.0"])
    world.sequence = 5
    await world.reconciler().apply(world.assign(world.releases["1.1.0"]))
    outcome = await world.reconciler().apply(old)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "stale")
    assert world.journal.load().active == ModelRef(
        world.releases["1.1.0"].path, world.releases["1.1.0"].sha256
    )


async def test_below_the_floor(world: UpdateWorld) -> None:
    world.raise_floor(2)
    outcome = await world.reconciler().apply(world.assign(world.releases["1.0.0"]))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "below-floor")
    assert world.journal.load().director_sequence == 0


async def test_target_not_in_tuf(world: UpdateWorld) -> None:
    ghost = Release(
        "9.9.9", model_target_path(MODEL, "9.9.9"), b"ghost", hashlib.sha256(b"ghost").hexdigest()
    )
    outcome = await world.reconciler().apply(world.assign(ghost))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "unknown-target")


async def test_self_test_output_mismatch_reverts(world: UpdateWorld) -> None:
    first = await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    outcome = await world.reconciler().apply(world.assign(bad))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "self-test: output-mismatch")
    state = world.journal.load()
    assert state.active == ModelRef(first.path, first.sha256)
    assert world.activated == [world.store.path_of(first.sha256)]
    assert_consistent(world, state)


async def test_model_that_fails_to_load_reverts(world: UpdateWorld) -> None:
    first = await install_first(world)
    broken = world.release("2.0.0", add=0.0, counter=3, content=b"not onnx at all")
    outcome = await world.reconciler().apply(world.assign(broken))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "self-test: load-failed")
    assert world.journal.load().active == ModelRef(first.path, first.sha256)


class _RefusingHost(FakeModelHost):
    """A runtime that refuses every model it is handed."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        raise RuntimeError(self.message)


async def test_activation_failure_reverts(world: UpdateWorld) -> None:
    refuse = _RefusingHost("swap refused")
    outcome = await world.reconciler(host=refuse).apply(world.assign(world.releases["1.0.0"]))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "activate-failed")
    assert world.journal.load().active is None


async def test_disk_too_full_is_refused_before_download(world: UpdateWorld) -> None:
    world.free = 500
    downloads: list[str] = []

    class CountingLink(MemoryNodeLink):
        async def fetch_artifact(
            self, target_path: str, sha256: str, offset: int = 0
        ) -> AsyncIterator[bytes]:
            downloads.append(target_path)
            async for chunk in super().fetch_artifact(target_path, sha256, offset):
                yield chunk

    rel = world.releases["1.0.0"]
    signed = world.assign(rel)
    outcome = await world.reconciler(link=CountingLink(world.peer)).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "disk-full")
    assert downloads == []
    assert world.journal.load() == JournalState()
    # Space freed: the same assignment now applies (its sequence was not spent).
    world.free = 10**12
    assert (await world.reconciler().apply(signed)).kind is OutcomeKind.APPLIED


async def test_redelivery_retries_a_transient_failure(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]  # stream ends short: link trouble
    signed = world.assign(rel)
    outcome = await world.reconciler().apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "link-unavailable")
    world.peer.artifacts[rel.sha256] = rel.data
    outcome = await world.reconciler().apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    assert world.journal.load().active == ModelRef(rel.path, rel.sha256)


async def test_redelivery_does_not_retry_a_model_that_failed_on_its_merits(
    world: UpdateWorld,
) -> None:
    await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    signed = world.assign(bad)
    assert (await world.reconciler().apply(signed)).kind is OutcomeKind.REVERTED
    reports = len(world.reports)
    again = await world.reconciler().apply(signed)  # e.g. at every reconnect's Hello
    assert (again.kind, again.reason) == (OutcomeKind.UNCHANGED, "replayed")
    assert len(world.reports) == reports
    # A new pin of it (a new sequence) is a new decision: it is tried again.
    assert (await world.reconciler().apply(world.assign(bad))).kind is OutcomeKind.REVERTED
    assert world.journal.load().attempts == 2


async def test_redelivery_gives_up_after_max_attempts(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    signed = world.assign(rel)
    kinds = [(await world.reconciler().apply(signed)).reason for _ in range(4)]
    assert kinds == ["link-unavailable"] * 3 + ["too-many-attempts"]


# ---------------------------------------------------------------- crash + resume


def _crash_in(phase: str, w: UpdateWorld) -> dict[str, Any]:
    """Reconciler arguments that 'SIGKILL' the process at `phase`."""

    class CrashingLink(MemoryNodeLink):
        async def fetch_artifact(
            self, target_path: str, sha256: str, offset: int = 0
        ) -> AsyncIterator[bytes]:
            yield w.peer.artifacts[sha256][:7]
            raise Crash

    class CrashingStore(ModelStore):
        def install(self, temp_file: Path, sha256: str, length: int) -> Path:
            raise Crash

    def crashing_selftest(*args: Any) -> SelfTestResult:
        raise Crash

    class CrashingHost(FakeModelHost):
        async def serve(
            self, bundle: ModelBundle, *, trial: Trial | None = None
        ) -> SelfTestResult | None:
            raise Crash

    store_args = {"disk_usage": lambda _: DiskUsage(10**13, 0, 10**12)}
    crashes: dict[str, dict[str, Any]] = {
        "downloading": {"link": CrashingLink(w.peer)},
        "verifying": {"store": CrashingStore(w.tmp / "node" / "models", **store_args)},
        "self-testing": {"selftest": crashing_selftest},
        "activating": {"host": CrashingHost()},
    }
    return crashes[phase]


@pytest.mark.parametrize("phase", ["downloading", "verifying", "self-testing", "activating"])
async def test_crash_in_each_phase_then_resume_converges(world: UpdateWorld, phase: str) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    with pytest.raises(Crash):
        await world.reconciler(**_crash_in(phase, world)).apply(signed)
    crashed = world.journal.load()
    assert crashed.phase is Phase.TRIAL and crashed.trial == ModelRef(new.path, new.sha256)

    rec = world.reconciler()  # the restarted process
    state = await rec.resume_after_crash()
    assert state.active == ModelRef(first.path, first.sha256)
    assert state.failed == ModelRef(new.path, new.sha256)
    assert state.last_error == "interrupted by a restart"
    assert_consistent(world, state)
    assert world.journal.load() == state
    # Resuming twice changes nothing; a re-delivery then completes the update.
    assert (await rec.resume_after_crash()).active == state.active
    outcome = await rec.apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    assert_consistent(world, world.journal.load())


async def test_crash_after_commit_before_gc(world: UpdateWorld) -> None:
    await install_first(world)
    new = world.releases["1.1.0"]
    rec = world.reconciler()
    original_gc = ModelStore.gc

    def crashing_gc(self: ModelStore, keep: Any) -> list[str]:
        raise Crash

    ModelStore.gc = crashing_gc  # type: ignore[method-assign]
    try:
        with pytest.raises(Crash):
            await rec.apply(world.assign(new))
    finally:
        ModelStore.gc = original_gc  # type: ignore[method-assign]
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(new.path, new.sha256)
    assert_consistent(world, state)


async def test_resume_falls_back_to_previous_when_active_is_gone(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler().apply(world.assign(new))
    path = world.store.path_of(new.sha256)
    path.chmod(0o644)
    path.write_bytes(b"bit rot")
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(first.path, first.sha256)
    assert_consistent(world, state)


# ------------------------------------------------------------------ reports


async def test_reports_name_the_target_and_the_sequence(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    await world.reconciler().apply(world.assign(rel))
    assert [(r.phase.value, r.target_path, r.sequence) for r in world.reports] == [
        ("downloading", rel.path, 1),
        ("verifying", rel.path, 1),
        ("self-testing", rel.path, 1),
        ("active", rel.path, 1),
    ]
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    await world.reconciler().apply(world.assign(bad))
    failed, reverted = world.reports[-2:]
    assert (failed.phase, failed.reason) == (UpdatePhase.FAILED, "self-test: output-mismatch")
    assert "out of tolerance" in failed.text
    assert (reverted.phase, reverted.target_path, reverted.sequence) == (
        UpdatePhase.REVERTED,
        bad.path,
        2,
    )
    assert reverted.detail == f"{failed.detail}; serving {rel.path}"  # why, as it stays


# --------------------------------------------------------------- staging


async def test_a_trial_drops_other_partial_downloads_and_a_commit_drops_all(
    world: UpdateWorld,
) -> None:
    staging = world.store.staging_dir
    stale = staging / f"{'0' * 64}.part"
    stale.write_bytes(b"an abandoned download")
    rel = world.releases["1.0.0"]
    seen: list[list[str]] = []

    def peek_selftest(load: TrialLoader, ref: Path, atol: float, rtol: float) -> SelfTestResult:
        seen.append(sorted(p.name for p in staging.iterdir()))
        return self_test(
            load, ref, atol=atol, rtol=rtol, latency_budget_s=5, memory_budget_bytes=1 << 34
        )

    await world.reconciler(selftest=peek_selftest).apply(world.assign(rel))
    assert seen == [[]]  # the stale part went when the trial began; the downloads installed
    assert list(staging.iterdir()) == []


async def test_a_failed_trial_keeps_its_partial_download_for_the_retry(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    await world.reconciler().apply(world.assign(rel))
    assert [p.name for p in world.store.staging_dir.iterdir()] == [f"{rel.sha256}.part"]


# -------------------------------------------------------------- watchdog


async def test_a_commit_opens_the_watchdog_window_in_the_same_save(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    await world.reconciler(watchdog_s=90).apply(world.assign(rel))
    state = world.journal.load()
    assert state.active == ModelRef(rel.path, rel.sha256)
    assert state.probation is not None and not state.probation.paused
    assert state.probation.until == world.now + timedelta(seconds=90)
    assert world.reports[-1].detail.startswith("on watch until ")


async def test_revert_active_swaps_back_then_journals(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    rec = world.reconciler(watchdog_s=60)
    await rec.apply(world.assign(new))
    outcome = await rec.revert_active(
        ModelRef(new.path, new.sha256), "watchdog-errors", "12 inference errors"
    )
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "watchdog-errors")
    assert world.activated[-1] == world.store.path_of(first.sha256)
    state = world.journal.load()
    assert (state.active, state.previous, state.probation) == (
        ModelRef(first.path, first.sha256),
        None,
        None,
    )
    assert (state.failed, state.attempts) == (ModelRef(new.path, new.sha256), 1)
    last = world.reports[-1]
    assert (last.phase, last.reason, last.target_path) == (
        UpdatePhase.REVERTED,
        "watchdog-errors",
        new.path,
    )
    assert last.detail == f"12 inference errors; serving {first.path}"
    assert_consistent(world, state)
    # The model it reverted is no longer active: a second verdict changes nothing.
    again = await rec.revert_active(ModelRef(new.path, new.sha256), "watchdog-errors", "late")
    assert again.kind is OutcomeKind.UNCHANGED


async def test_revert_active_without_a_previous_model_keeps_serving(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    rec = world.reconciler(watchdog_s=60)
    await rec.apply(world.assign(rel))
    outcome = await rec.revert_active(ModelRef(rel.path, rel.sha256), "watchdog-errors", "x")
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "revert-impossible")
    state = world.journal.load()
    assert (state.active, state.probation) == (ModelRef(rel.path, rel.sha256), None)
    assert world.reports[-1].phase is UpdatePhase.FAILED
    assert "no previous model" in world.reports[-1].detail


async def test_revert_active_when_the_previous_model_cannot_be_served(world: UpdateWorld) -> None:
    await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler(watchdog_s=60).apply(world.assign(new))

    refuse = _RefusingHost("cannot load")
    outcome = await world.reconciler(host=refuse).revert_active(
        ModelRef(new.path, new.sha256), "watchdog-errors", "x"
    )
    assert outcome.kind is OutcomeKind.REJECTED
    assert world.journal.load().active == ModelRef(new.path, new.sha256)
    assert "cannot be served: cannot load" in world.reports[-1].detail


async def test_end_and_pause_of_the_watchdog_window(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    rec = world.reconciler(watchdog_s=60)
    await rec.apply(world.assign(rel))
    paused = await rec.pause_probation()
    assert paused.probation is not None and paused.probation.paused
    ended = await rec.end_probation(ModelRef(rel.path, rel.sha256))
    assert ended.probation is None and world.journal.load().probation is None
    assert (world.reports[-1].phase, world.reports[-1].detail) == (
        UpdatePhase.ACTIVE,
        "watchdog window passed",
    )
    assert rec.state == world.journal.load()


async def test_a_restart_on_watch_reverts_the_model_it_died_with(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    await world.reconciler(watchdog_s=60).apply(signed)

    state = await world.reconciler().resume_after_crash()  # the process died on watch

    assert state.active == ModelRef(first.path, first.sha256)
    assert (state.failed, state.attempts) == (ModelRef(new.path, new.sha256), 1)
    assert (world.reports[-1].phase, world.reports[-1].reason) == (
        UpdatePhase.REVERTED,
        "restarted-on-watch",
    )
    assert_consistent(world, state)
    # A re-delivery of the same assignment retries it (within the attempt limit).
    assert (await world.reconciler().apply(signed)).kind is OutcomeKind.APPLIED


async def test_a_restart_after_a_clean_stop_on_watch_keeps_the_model(world: UpdateWorld) -> None:
    await install_first(world)
    new = world.releases["1.1.0"]
    rec = world.reconciler(watchdog_s=60)
    await rec.apply(world.assign(new))
    await rec.pause_probation()
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(new.path, new.sha256)
    assert state.probation is not None and state.probation.paused


async def test_a_restart_during_a_trial_blames_the_trial_not_the_model_on_watch(
    world: UpdateWorld,
) -> None:
    await install_first(world)
    watched = world.releases["1.1.0"]
    await world.reconciler(watchdog_s=60).apply(world.assign(watched))
    third = world.release("2.0.0", add=5.0, counter=3)
    with pytest.raises(Crash):
        await world.reconciler(**_crash_in("self-testing", world)).apply(world.assign(third))
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(watched.path, watched.sha256)
    assert state.failed == ModelRef(third.path, third.sha256)
    assert state.probation is not None and state.probation.paused  # watched again


def test_metadata_refusals_say_which_kind_of_failure() -> None:
    from tuf.api.exceptions import (
        BadVersionNumberError,
        DownloadHTTPError,
        ExpiredMetadataError,
        SlowRetrievalError,
        UnsignedMetadataError,
    )

    from edge_node.updater.reconciler import metadata_reason

    assert metadata_reason(DownloadHTTPError("gone", 404)) == "metadata-unavailable"
    assert metadata_reason(SlowRetrievalError()) == "metadata-unavailable"
    assert metadata_reason(ExpiredMetadataError("timestamp.json is expired")) == (
        "metadata-expired"
    )
    assert metadata_reason(UnsignedMetadataError("0/1 keys")) == "metadata-untrusted"
    assert metadata_reason(BadVersionNumberError("rollback")) == "metadata-untrusted"


# ------------------------------------------------------------- model bundles


async def test_the_host_is_handed_the_model_with_what_was_signed_with_it(
    world: UpdateWorld,
) -> None:
    spec = image_runtime((8, 8), mean=(0.5,), std=(0.25,))
    signed = world.release_image("2.0.0", 3, size=(8, 8), mean=(0.5,), std=(0.25,))
    plain = world.releases["1.0.0"]  # signed before bundles: no custom.runtime
    rec = world.reconciler()
    assert (await rec.apply(world.assign(plain))).kind is OutcomeKind.APPLIED
    assert (await rec.apply(world.assign(signed))).kind is OutcomeKind.APPLIED
    old, new = world.host.bundles
    assert (old.label, old.runtime, old.sha256) == ("det@1.0.0", None, plain.sha256)
    assert (new.label, new.runtime, new.target_path) == ("det@2.0.0", spec, signed.path)
    assert new.path == world.store.path_of(signed.sha256)
    # Kept beside the model, so a revert (offline) serves it as it was signed.
    assert rec.bundle_of(ModelRef(signed.path, signed.sha256)) == new
    world.peer.metadata.clear()
    back = await rec.revert_active(ModelRef(signed.path, signed.sha256), "watchdog", "test")
    assert back.kind is OutcomeKind.REVERTED
    assert world.host.bundles[-1] == old
    assert rec.bundle_of(ModelRef(plain.path, plain.sha256)) == old


async def test_a_signed_release_check_is_accepted_and_ignored(world: UpdateWorld) -> None:
    """`custom.release_check` (`model push --baseline`, ADR 0048) is the control plane's:
    the node installs the version as it would without it, whatever the report says."""
    await install_first(world)
    report = {"verdict": "failed", "forced": True, "kind": "raw", "value": "0.2"}
    checked = world.release("2.0.0", add=2.0, counter=3, extra={"release_check": report})
    outcome = await world.reconciler().apply(world.assign(checked))
    assert outcome.kind is OutcomeKind.APPLIED
    assert world.activated[-1] == world.store.path_of(checked.sha256)


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        (
            {"format": 1, "preprocess": {"meen": ["0.5"]}, "output": {"decoder": "raw"}},
            "custom.runtime.preprocess.meen",
        ),
        ({"format": 1, "output": {"decoder": "segmentation"}}, "custom.runtime.output.decoder"),
        ({"format": 9, "output": {"decoder": "raw"}}, "custom.runtime.format"),
        ("raw", "custom.runtime"),
    ],
)
async def test_a_malformed_runtime_in_custom_refuses_the_assignment(
    world: UpdateWorld, runtime: Any, field: str
) -> None:
    first = await install_first(world)
    bad = world.release("2.0.0", add=2.0, counter=3, runtime=runtime)
    before = world.journal.load()
    outcome = await world.reconciler().apply(world.assign(bad))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "bad-runtime")
    report = world.reports[-1]
    assert (report.phase, report.reason) == (UpdatePhase.FAILED, "bad-runtime")
    assert report.detail.startswith(f"{bad.path}: {field}: ")
    assert world.journal.load() == before  # refused before the sequence was accepted
    assert world.activated[-1] == world.store.path_of(first.sha256)
