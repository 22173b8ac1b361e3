"""Failures an operator can read, retried only when they may pass, and a full disk that
never stops the node (issue 12 §4): the reconciler over the in-memory fleet
(`edge_node.testing.update_world`), with a simulated full disk (`UpdateWorld.full`: the
journal's atomic write fails with ENOSPC, the store sees no free space)."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from pathlib import Path

import pytest

from edge_node.clock import ManualClock
from edge_node.errors import ClosedError, StorageError
from edge_node.link.base import Backoff
from edge_node.runtime.errors import ModelSignatureError
from edge_node.testing.memory_link import MemoryNodeLink
from edge_node.testing.update_world import FakeModelHost, Release, UpdateWorld
from edge_node.updater.host import ModelBundle, Trial
from edge_node.updater.journal import ModelRef, Phase, accept_assignment, begin_trial
from edge_node.updater.reconciler import OutcomeKind, UpdatePhase
from edge_node.updater.selftest import SelfTestResult
from edge_node.updater.store import ModelStore
from tests.edge_node.updater._world import assert_consistent, install_first, make_world

pytestmark = pytest.mark.anyio

BACKOFF = Backoff(initial_s=60.0, cap_s=600.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    return make_world(tmp_path)


def ref(rel: Release) -> ModelRef:
    return ModelRef(rel.path, rel.sha256)


class CountingLink(MemoryNodeLink):
    """The node's link, counting the artifact bytes it fetched (and from which offset)."""

    def __init__(self, w: UpdateWorld) -> None:
        super().__init__(w.peer)
        self.fetched: list[tuple[str, int]] = []

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        self.fetched.append((target_path, offset))
        async for chunk in super().fetch_artifact(target_path, sha256, offset):
            yield chunk


class RefusingHost(FakeModelHost):
    """A runtime that refuses to serve with `error` (the models in `refusing`, or all)."""

    def __init__(self, error: Exception, refusing: Iterable[Path] | None = None) -> None:
        super().__init__()
        self.error = error
        self.refusing = None if refusing is None else set(refusing)

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        if self.refusing is None or bundle.path in self.refusing:
            raise self.error
        return await super().serve(bundle, trial=trial)


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ------------------------------------------------------------- readable reasons


async def test_a_self_test_failure_says_what_the_self_test_said_with_its_numbers(
    world: UpdateWorld,
) -> None:
    first = await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3)

    def mismatch(model: Path, reference: Path, atol: float, rtol: float) -> SelfTestResult:
        return SelfTestResult(
            False,
            "output-mismatch",
            max_abs_err=0.031,
            latency_s=0.002,
            detail="'scores' 12 of 1000 elements out of tolerance (max 0.031, atol 1e-4)",
        )

    outcome = await world.reconciler(selftest=mismatch).apply(world.assign(bad))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "self-test: output-mismatch")
    failed, reverted = world.reports[-2:]
    assert failed.phase is UpdatePhase.FAILED
    assert failed.text == (
        "self-test: output-mismatch: "
        "'scores' 12 of 1000 elements out of tolerance (max 0.031, atol 1e-4)"
    )
    assert failed.facts["max_abs_err"] == "0.031"
    assert failed.facts["latency_s"] == "0.002"
    assert "ok" not in failed.facts and "detail" not in failed.facts
    # The revert keeps the reason and the numbers: it is the status that stays upstream.
    assert (reverted.phase, reverted.reason) == (UpdatePhase.REVERTED, failed.reason)
    assert reverted.detail == f"{failed.detail}; serving {first.path}"
    assert reverted.facts == failed.facts


async def test_a_refusal_for_lack_of_space_carries_the_figures(world: UpdateWorld) -> None:
    world.free = 500
    outcome = await world.reconciler().apply(world.assign(world.releases["1.0.0"]))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "disk-full")
    facts = world.reports[-1].facts
    assert facts["free"] == "500" and facts["margin"] == "1000"
    assert int(facts["needed"]) > 0


# ------------------------------------------------------- what is retried, when


async def test_a_model_the_runtime_refuses_is_not_retried_by_a_redelivery(
    world: UpdateWorld,
) -> None:
    """The configuration does not fit the model (the runtime refuses its signature): a
    deterministic failure. Neither the re-delivery at a reconnect's Hello, nor the
    retained MQTT doorbell, nor the control plane sending the desired state again try it
    (nor download it) again; a new pin does."""
    rel = world.releases["1.0.0"]
    link = CountingLink(world)
    host = RefusingHost(ModelSignatureError("the model has 416, the config says [480, 640]"))
    signed = world.assign(rel)
    outcome = await world.reconciler(link=link, host=host).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "activate-refused")
    assert outcome.retry_at is None
    assert world.reports[-2].text.startswith("activate-refused: ")
    assert "416" in world.reports[-2].text
    fetched = len(link.fetched)
    for _ in range(3):  # doorbell, Hello answer, desired state sent again
        again = await world.reconciler(link=link, host=host).apply(signed)
        assert (again.kind, again.reason) == (OutcomeKind.UNCHANGED, "replayed")
    assert len(link.fetched) == fetched
    assert not world.store.exists(rel.sha256)  # of no use until a new pin: not kept
    # A new pin is the operator's decision: tried again.
    renewed = await world.reconciler(link=link, host=host).apply(world.assign(rel))
    assert renewed.kind is OutcomeKind.REVERTED
    assert world.journal.load().attempts == 2


async def test_a_transient_failure_is_retried_after_its_backoff_not_at_every_redelivery(
    world: UpdateWorld,
) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]  # the stream ends short: the link
    clock = ManualClock(world.now, sleeps_advance=True)
    link = CountingLink(world)
    signed = world.assign(rel)
    outcome = await world.reconciler(link=link, clock=clock, retry=BACKOFF).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "link-unavailable")
    assert outcome.retry_at is not None
    assert clock.now() <= outcome.retry_at <= clock.now() + timedelta(seconds=60)
    assert world.journal.load().retry_at == outcome.retry_at  # kept across a restart
    world.peer.artifacts[rel.sha256] = rel.data
    fetched = len(link.fetched)
    # The doorbell and the Hello's answer come at once: neither retries before the backoff.
    for _ in range(2):
        early = await world.reconciler(link=link, clock=clock, retry=BACKOFF).apply(signed)
        assert (early.kind, early.retry_at) == (OutcomeKind.DEFERRED, outcome.retry_at)
    assert len(link.fetched) == fetched
    clock.advance(outcome.retry_at - clock.now())
    done = await world.reconciler(link=link, clock=clock, retry=BACKOFF).apply(signed)
    assert done.kind is OutcomeKind.APPLIED
    # The retry resumed the partial download: the first 10 bytes were not fetched again.
    assert (rel.path, 10) in link.fetched[fetched:]


async def test_the_backoff_grows_with_each_failed_attempt(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = b""  # nothing comes: the link again and again
    clock = ManualClock(world.now, sleeps_advance=True)
    signed = world.assign(rel)
    waits = []
    for _ in range(3):
        rec = world.reconciler(clock=clock, retry=Backoff(initial_s=60.0, cap_s=600.0))
        outcome = await rec.apply(signed)
        if outcome.kind is OutcomeKind.DEFERRED:
            assert outcome.retry_at is not None
            clock.advance(outcome.retry_at - clock.now())
            outcome = await rec.apply(signed)
        assert outcome.kind is OutcomeKind.REVERTED
        if outcome.retry_at is not None:
            waits.append((outcome.retry_at - clock.now()).total_seconds())
    # Full jitter: each wait lies under its ceiling, 60 s then 120 s; the last attempt
    # (max_attempts = 3) schedules none.
    assert len(waits) == 2
    assert 0 <= waits[0] <= 60 and 0 <= waits[1] <= 120
    last = await world.reconciler(clock=clock).apply(signed)
    assert (last.kind, last.reason) == (OutcomeKind.REJECTED, "too-many-attempts")


async def test_a_retry_of_a_trial_that_was_installed_downloads_nothing(
    world: UpdateWorld,
) -> None:
    """The activation was refused because the agent was stopping: the model passed its
    self-test and may serve at the next try, so its files stay in the store for it."""
    await install_first(world)
    new = world.releases["1.1.0"]
    link = CountingLink(world)
    signed = world.assign(new)
    stopping = RefusingHost(ClosedError("the agent is stopping"))
    outcome = await world.reconciler(link=link, host=stopping).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "activate-failed")
    state = world.journal.load()
    assert state.retry_pending and world.store.verify(new.sha256)
    assert_consistent(world, state)
    fetched = len(link.fetched)
    done = await world.reconciler(link=link).apply(signed)
    assert done.kind is OutcomeKind.APPLIED
    assert link.fetched[fetched:] == []


async def test_files_kept_for_a_retry_go_once_it_is_no_longer_due(world: UpdateWorld) -> None:
    await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    stopping = RefusingHost(ClosedError("the agent is stopping"))
    for _ in range(3):  # max_attempts
        await world.reconciler(host=stopping).apply(signed)
    state = world.journal.load()
    assert (state.attempts, state.retry_pending) == (3, False)
    assert not world.store.exists(new.sha256)
    assert_consistent(world, state)


async def test_a_restart_during_a_trial_is_retried_after_a_backoff(world: UpdateWorld) -> None:
    """A trial that the process died in may have killed it (a model that exhausts memory
    at load): its retry waits, so a crash loop is slowed down, and it is bounded."""
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    journal = world.journal
    died = begin_trial(accept_assignment(journal.load(), 2), ref(new))
    journal.save(died)  # the process died in the trial
    clock = ManualClock(world.now, sleeps_advance=True)
    state = await world.reconciler(clock=clock, retry=BACKOFF).resume_after_crash()
    assert state.active == ref(first) and state.retry_at is not None
    early = await world.reconciler(clock=clock, retry=BACKOFF).apply(signed)  # its Hello
    assert early.kind is OutcomeKind.DEFERRED
    clock.advance(state.retry_at - clock.now())
    assert (await world.reconciler(clock=clock).apply(signed)).kind is OutcomeKind.APPLIED


# ------------------------------------------------------------------------ space


async def test_activating_a_version_in_the_store_needs_no_free_space(world: UpdateWorld) -> None:
    """A rollback to the previous version, on a disk with no free byte left (not even for
    the journal): it serves, and the journal follows once it can be written."""
    first = await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler().apply(world.assign(new))
    world.full = True
    rec = world.reconciler()
    outcome = await rec.apply(world.assign(first))
    assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
    assert world.activated[-1] == world.store.path_of(first.sha256)
    assert rec.journal_pending
    assert world.journal.load().active == ref(new)  # the disk still says what it said
    world.full = False
    assert await rec.flush_journal()
    state = world.journal.load()
    assert (state.active, state.previous, state.director_sequence) == (ref(first), ref(new), 3)
    assert not rec.journal_pending
    assert_consistent(world, state)


async def test_a_version_in_the_store_is_activated_below_the_margin(world: UpdateWorld) -> None:
    first = await install_first(world)
    await world.reconciler().apply(world.assign(world.releases["1.1.0"]))
    world.free = 0  # under the margin, but the journal can still be written
    outcome = await world.reconciler().apply(world.assign(first))
    assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
    assert world.journal.load().active == ref(first)


async def test_a_resumed_download_needs_room_only_for_what_is_missing(world: UpdateWorld) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:-10]  # all but the last 10 bytes come
    signed = world.assign(rel)
    first = await world.reconciler().apply(signed)
    assert first.reason == "link-unavailable"
    world.peer.artifacts[rel.sha256] = rel.data
    reference_length = len(world.artifacts[_reference_sha(world, rel)])
    world.free = 1000 + 10 + reference_length  # the margin, the missing bytes, the pair
    outcome = await world.reconciler().apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]


def _reference_sha(w: UpdateWorld, rel: Release) -> str:
    target = w.targets.signed.targets[rel.path]
    sha: str = target.unrecognized_fields["custom"]["reference"]["sha256"]
    return sha


# ------------------------------------------------------------------- full disk


async def test_a_full_disk_while_downloading_does_not_count_against_the_model(
    world: UpdateWorld,
) -> None:
    rel = world.releases["1.0.0"]

    class FillingLink(CountingLink):
        """The disk fills up while the model comes: the write fails with ENOSPC."""

        full = True

        async def fetch_artifact(
            self, target_path: str, sha256: str, offset: int = 0
        ) -> AsyncIterator[bytes]:
            self.fetched.append((target_path, offset))
            data = world.peer.artifacts[sha256]
            yield data[offset : offset + 10]
            if self.full:
                raise enospc()
            yield data[offset + 10 :]

    link = FillingLink(world)
    signed = world.assign(rel)
    outcome = await world.reconciler(link=link).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "disk-full")
    state = world.journal.load()
    assert (state.attempts, state.retry_pending) == (0, True)
    assert [p.name for p in world.store.staging_dir.iterdir()] == [f"{rel.sha256}.part"]
    link.full = False
    done = await world.reconciler(link=link).apply(signed)
    assert done.kind is OutcomeKind.APPLIED
    assert (rel.path, 10) in link.fetched  # resumed where the disk stopped it


async def test_a_full_disk_when_the_trial_would_begin_refuses_and_changes_nothing(
    world: UpdateWorld,
) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    link = CountingLink(world)
    signed = world.assign(new)
    world.full = True
    world.free = 10**12  # the space check passes; the journal write is what fails
    store = ModelStore(world.node_dir / "models")
    outcome = await world.reconciler(link=link, store=store).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "disk-full")
    assert link.fetched == []
    state = world.journal.load()
    assert (state.active, state.director_sequence, state.phase) == (ref(first), 1, Phase.IDLE)
    world.full = False
    assert (await world.reconciler(link=link).apply(signed)).kind is OutcomeKind.APPLIED


async def test_a_full_disk_at_the_commit_keeps_the_new_model_serving(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]

    class FillingHost(FakeModelHost):
        async def serve(
            self, bundle: ModelBundle, *, trial: Trial | None = None
        ) -> SelfTestResult | None:
            result = await world.host.serve(bundle, trial=trial)
            world.full = True  # the swap done, the commit's journal write fails
            return result

    rec = world.reconciler(host=FillingHost())
    outcome = await rec.apply(world.assign(new))
    assert outcome.kind is OutcomeKind.APPLIED
    assert world.activated[-1] == world.store.path_of(new.sha256)
    assert rec.journal_pending and rec.state is not None and rec.state.active == ref(new)
    report = world.reports[-1]
    assert (report.phase, report.reason) == (UpdatePhase.ACTIVE, "disk-full")
    assert "cannot be written" in report.detail
    on_disk = world.journal.load()
    assert (on_disk.phase, on_disk.trial, on_disk.active) == (Phase.TRIAL, ref(new), ref(first))
    # Room again: the commit reaches the disk.
    world.full = False
    assert await rec.flush_journal()
    state = world.journal.load()
    assert (state.active, state.previous) == (ref(new), ref(first))
    assert_consistent(world, state)


async def test_a_restart_before_a_commit_reached_the_disk_converges(world: UpdateWorld) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]

    class FillingHost(FakeModelHost):
        async def serve(
            self, bundle: ModelBundle, *, trial: Trial | None = None
        ) -> SelfTestResult | None:
            result = await world.host.serve(bundle, trial=trial)
            world.full = True
            return result

    signed = world.assign(new)
    await world.reconciler(host=FillingHost()).apply(signed)
    world.full = False
    rec = world.reconciler()  # the process restarted before the commit could be written
    state = await rec.resume_after_crash()
    assert state.active == ref(first)  # what the disk said; the trial is retried
    assert_consistent(world, state)
    assert (await rec.apply(signed)).kind is OutcomeKind.APPLIED


async def test_a_full_disk_for_an_already_active_assignment_is_no_error(
    world: UpdateWorld,
) -> None:
    first = await install_first(world)
    world.full = True
    outcome = await world.reconciler().apply(world.assign(first))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.UNCHANGED, "already-active")


async def test_a_full_disk_at_the_end_of_the_watch_window_keeps_the_model(
    world: UpdateWorld,
) -> None:
    """The issue's outage: the journal write that ends the watch window failed, and the
    restarts that followed reverted a healthy model as `restarted-on-watch`."""
    first = await install_first(world)
    new = world.releases["1.1.0"]
    clock = ManualClock(world.now, sleeps_advance=True)
    rec = world.reconciler(clock=clock, watchdog_s=60)
    await rec.apply(world.assign(new))
    clock.advance(timedelta(seconds=61))
    world.full = True
    state = await rec.end_probation(ref(new))  # no exception: nothing stops
    assert state.probation is None and rec.journal_pending
    assert world.journal.load().probation is not None
    # The process restarts (for whatever reason) while the disk is still full.
    again = world.reconciler(clock=clock)
    state = await again.resume_after_crash()
    assert (state.active, state.previous) == (ref(new), ref(first))
    assert state.probation is None
    assert not any(r.phase is UpdatePhase.REVERTED for r in world.reports[-2:])
    world.full = False
    assert await again.flush_journal()
    assert world.journal.load().probation is None


async def test_a_model_that_passed_its_window_on_a_full_disk_is_not_blamed_after_room_returns(
    world: UpdateWorld,
) -> None:
    """Space is freed and the agent restarted before it wrote the journal again: the end
    of the window, recorded in place, still saves the model from a revert."""
    first = await install_first(world)
    new = world.releases["1.1.0"]
    clock = ManualClock(world.now, sleeps_advance=True)
    rec = world.reconciler(clock=clock, watchdog_s=60)
    await rec.apply(world.assign(new))
    clock.advance(timedelta(seconds=61))
    world.full = True
    await rec.end_probation(ref(new))
    world.full = False  # room again, and a restart before the journal caught up
    state = await world.reconciler(clock=clock).resume_after_crash()
    assert (state.active, state.previous, state.probation) == (ref(new), ref(first), None)
    assert world.journal.load().probation is None
    assert not world.journal.watch_mark_path.exists()


async def test_a_restart_on_watch_still_blames_the_model(world: UpdateWorld) -> None:
    """The in-place mark says only what was recorded: a window that had not passed (or
    passed with the journal written normally) is judged as before."""
    first = await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler(watchdog_s=60).apply(world.assign(new))
    assert world.journal.watch_mark_path.stat().st_size == 64  # reserved while on watch
    state = await world.reconciler().resume_after_crash()
    assert (state.active, state.failed) == (ref(first), ref(new))
    assert world.reports[-1].reason == "restarted-on-watch"


async def test_a_restart_on_watch_with_a_full_disk_watches_the_model_again(
    world: UpdateWorld,
) -> None:
    """Inside the window, a restart while the disk is full is not blamed on the model
    (the disk is the likely cause, and a revert could not be recorded): it is watched
    again for a full window."""
    await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler(watchdog_s=60).apply(world.assign(new))
    world.full = True
    rec = world.reconciler()
    state = await rec.resume_after_crash()
    assert state.active == ref(new)
    assert state.probation is not None and state.probation.paused
    assert all(r.phase is not UpdatePhase.REVERTED for r in world.reports[-1:])


async def test_a_failing_gc_never_fails_an_update(world: UpdateWorld) -> None:
    await install_first(world)

    class FullStore(ModelStore):
        def gc(self, keep: Iterable[str]) -> list[str]:
            raise StorageError("model store: garbage-collecting failed: [Errno 28] ...")

    store = FullStore(world.node_dir / "models", disk_usage=world.disk_usage)
    outcome = await world.reconciler(store=store).apply(world.assign(world.releases["1.1.0"]))
    assert outcome.kind is OutcomeKind.APPLIED


def test_facts_are_bounded_text_whatever_a_result_grows() -> None:
    from edge_node.updater.reconciler import bounded_facts

    facts = bounded_facts(
        {
            "max_abs_err": 0.0312345678,
            "output": "scores",
            "ok": False,
            "elements": 12,
            "per_output": {"scores": 0.031, "boxes": None},
            "missing": None,
            "shape": [1, 3],
            "long": "x" * 300,
            "k" * 70: 1,
        }
    )
    assert facts["max_abs_err"] == "0.0312346"
    assert (facts["output"], facts["ok"], facts["elements"]) == ("scores", "false", "12")
    assert facts["per_output.scores"] == "0.031"
    assert "per_output.boxes" not in facts and "missing" not in facts and "shape" not in facts
    assert len(facts["long"]) == 256 and "k" * 64 in facts
    assert len(bounded_facts({f"f{i:02}": i for i in range(40)})) == 32


# ---------------------------------------------------------------- the journal


def test_the_journal_keeps_a_retry_and_what_it_needs(tmp_path: Path) -> None:
    import json

    from edge_node.errors import InvalidInputError
    from edge_node.updater.journal import (
        Journal,
        JournalCorruptError,
        JournalState,
        commit_trial,
        revert_trial,
    )

    a = ModelRef("models/det/1.0.0/model.onnx", "a" * 64)
    b = ModelRef("models/det/1.1.0/model.onnx", "b" * 64)
    clock = ManualClock()
    at = clock.now() + timedelta(seconds=30)
    state = commit_trial(begin_trial(JournalState(), a))
    failed = revert_trial(begin_trial(state, b), "link-unavailable", retry_at=at)
    assert (failed.attempts, failed.retry_at, failed.retry_pending) == (1, at, True)
    assert failed.referenced_sha256s() == {a.sha256, b.sha256}  # kept for the retry
    not_counted = revert_trial(begin_trial(failed, b), "disk-full", retry_at=at, counted=False)
    assert not_counted.attempts == 1
    merits = revert_trial(begin_trial(failed, b), "self-test: output-mismatch")
    assert (merits.attempts, merits.retry_at, merits.referenced_sha256s()) == (
        2,
        None,
        {a.sha256},
    )
    assert begin_trial(failed, b).retry_at is None  # the retry runs: nothing is pending
    journal = Journal(tmp_path / "journal.json", clock)
    saved = journal.save(failed)
    assert journal.load() == saved
    raw = json.loads((tmp_path / "journal.json").read_text())
    raw["retry_at"] = "2026-01-01T00:00:00"  # no time zone
    (tmp_path / "journal.json").write_text(json.dumps(raw))
    with pytest.raises(JournalCorruptError, match="retry_at has no time zone"):
        journal.load()
    with pytest.raises(InvalidInputError, match="retry_at"):
        JournalState(retry_at=at.replace(tzinfo=None))


def test_the_watch_mark_is_reserved_while_a_window_runs_and_written_in_place(
    tmp_path: Path,
) -> None:
    from edge_node.updater.journal import Journal, JournalState, commit_trial, end_probation

    a = ModelRef("models/det/1.0.0/model.onnx", "a" * 64)
    clock = ManualClock()
    until = clock.now() + timedelta(seconds=60)
    journal = Journal(tmp_path / "journal.json", clock)
    mark = journal.watch_mark_path
    assert not journal.mark_watch_passed(until)  # nothing reserved: nothing written
    on_watch = journal.save(commit_trial(begin_trial(JournalState(), a), until))
    assert mark.read_bytes() == bytes(64) and not journal.watch_passed(until)
    inode = mark.stat().st_ino
    assert journal.mark_watch_passed(until)
    assert mark.stat().st_ino == inode and mark.stat().st_size == 64  # in place
    assert journal.watch_passed(until)
    assert not journal.watch_passed(until + timedelta(seconds=1))
    journal.save(end_probation(on_watch))
    assert not mark.exists()
