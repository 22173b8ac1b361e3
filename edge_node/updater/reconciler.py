"""The updater's reconciler (DESIGN §5): take a signed director assignment to the running model.

`Reconciler.apply(signed)` refreshes TUF (fresh `Updater`, in a thread), verifies the
assignment against it (`AssignmentTrust`: this node, its fleet, the director's keys) and
reads the runtime spec signed with the target (`custom.runtime`; a malformed one is a
refusal, `bad-runtime`), journals the accepted sequence and the trial, downloads the model
and its reference pair (resuming, verified, with backoff on the injected clock), installs
them into the store with the verified bundle beside them, has the `ModelHost` load it as
it will serve and self-test that very session, serve it (the agent's hot swap) and
commits — or reverts the trial and stays on the active model. A revert serves the
previous model with the bundle the store kept (`bundle_of`), offline. Every step is
journalled first, so `resume_after_crash()` at start-up converges whatever step a SIGKILL
interrupted. Phases go to a `report(UpdateReport)` callback that the agent turns into
UpdateStatus messages.
With `limits.watchdog_s` the commit also opens the active model's watchdog window
(`journal.Probation`); `revert_active`, `end_probation` and `pause_probation` close it.
Not here: the hot swap itself, the runtime, when to call `apply` or judge the watchdog
(the agent's update task, `edge_node.agent.update_task`).

Decisions:
- A trial found in the journal at start-up is **reverted**, not retried: the process may
  have died *because of* the trial (a model that exhausts memory at load), and retrying
  it blindly would loop. It counts as a failed attempt of that target.
- Re-delivery of the very assignment last accepted (same sequence, e.g. the retained MQTT
  doorbell or a reconnect) is a no-op when its target is active, and a bounded retry
  (`max_attempts`) when its last trial failed for a reason that may pass (`RETRIED`: a
  cut link, a restart, an activation refused while stopping) — so those are retried
  without the director having to re-sign. A model that failed on its merits (hash,
  self-test, watchdog) is not retried by re-delivery: a new pin retries it.
- A refusal for lack of disk space happens before the sequence is accepted, so the same
  assignment is applied once space is free.
- A restart that finds the active model still on watch (a probation not `paused` by a
  clean stop) blames that model — unless a trial was running too, which takes the blame
  instead — and reverts it to `previous` (or to nothing, rather than a crash loop).
- The staging directory holds at most one trial's partial downloads: a trial drops the
  others when it starts, a commit drops all.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

from securesystemslib.signer import Key
from tuf.api.exceptions import DownloadError, ExpiredMetadataError, RepositoryError

from edge_node.clock import TaskClock
from edge_node.errors import EdgeNodeError, InvalidInputError, StorageError
from edge_node.link.base import Backoff, LinkError, LinkUnavailableError
from edge_node.updater.director import (
    AssignmentRejectedError,
    AssignmentReplayError,
    TargetInfo,
    TargetMismatchError,
    VerifiedAssignment,
    verify_assignment,
)
from edge_node.updater.download import ArtifactRejectedError, download_target
from edge_node.updater.host import ModelBundle, ModelHost, bundle_from_record, name_and_version
from edge_node.updater.journal import (
    Journal,
    JournalState,
    ModelRef,
    Phase,
    accept_assignment,
    begin_trial,
    commit_trial,
    end_probation,
    pause_probation,
    revert_active,
    revert_trial,
    rollback,
)
from edge_node.updater.selftest import SelfTestResult, TrialLoader
from edge_node.updater.source import RepositorySource
from edge_node.updater.store import DiskFullError, ModelStore, StoreIntegrityError
from protos.bundle.spec import BundleError, RuntimeSpec, runtime_of_custom
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

__all__ = [
    "AssignmentTrust",
    "Outcome",
    "OutcomeKind",
    "Reconciler",
    "ReconcilerLimits",
    "SelfTest",
    "SelfTestFailedError",
    "TargetsView",
    "UpdatePhase",
    "UpdateReport",
    "metadata_reason",
]

_log = logging.getLogger(__name__)
_GIB: Final = 1 << 30
_MAX_DETAIL: Final = 400
RESTART_REASON: Final = "interrupted by a restart"
PROBATION_RESTART_REASON: Final = "restarted-on-watch"
RETRIED: Final = frozenset(
    {"link-unavailable", "activate-failed", RESTART_REASON, PROBATION_RESTART_REASON}
)
"""Failure reasons (journal `last_error`) that a re-delivery of the assignment retries."""


class UpdatePhase(StrEnum):
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    SELF_TESTING = "self-testing"
    ACTIVE = "active"
    FAILED = "failed"
    REVERTED = "reverted"


class OutcomeKind(StrEnum):
    APPLIED = "applied"
    """The target passed its trial and is now active."""
    UNCHANGED = "unchanged"
    """Nothing to do: already active, or a re-delivery of what was already handled."""
    REJECTED = "rejected"
    """Refused before any trial (bad assignment, metadata, disk full); nothing changed."""
    REVERTED = "reverted"
    """The trial failed; the previously active model still runs."""


@dataclass(frozen=True, slots=True)
class UpdateReport:
    """One step of an update, for the control plane (an UpdateStatus) and the log.

    `target_path` and `sequence` are empty (`""`, 0) for an assignment refused before it
    was authenticated and verified: nothing unverified is repeated. `reason` is a short
    code for FAILED and REVERTED (e.g. `hash-mismatch`, `self-test: output-mismatch`).
    """

    phase: UpdatePhase
    target_path: str = ""
    sequence: int = 0
    reason: str | None = None
    detail: str = ""

    @property
    def text(self) -> str:
        """`reason: detail`, or whichever of the two there is."""
        if self.reason and self.detail:
            return f"{self.reason}: {self.detail}"
        return self.reason or self.detail


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    reason: str | None = None
    target: ModelRef | None = None
    sequence: int | None = None


class TargetsView(Protocol):
    """Verified TUF metadata after one refresh (`tuf_fetch.TufView`); used from a thread."""

    def target(self, path: str) -> TargetInfo | None: ...

    def floor(self, model: str) -> int: ...


SelfTest = Callable[[TrialLoader, Path, float, float], SelfTestResult]
"""(load the serving session, reference path, atol, rtol) -> result; blocking, run in a
thread by the host. The agent binds its latency/memory budgets, e.g. with
`functools.partial(self_test, ...)`."""
Report = Callable[[UpdateReport], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class AssignmentTrust:
    """What a director assignment must match: this node, its fleet, and a signature by
    one of the director's keys (none: every assignment is refused)."""

    node_id: str
    fleet: str
    director_keys: Key | Collection[Key]


@dataclass(frozen=True, slots=True)
class ReconcilerLimits:
    max_artifact_bytes: int = 4 * _GIB
    space_margin_bytes: int = 256 << 20
    """Free space that must remain after both downloads."""
    max_attempts: int = 3
    """Failed trials of one target after which a re-delivery is no longer retried."""
    download_attempts: int = 4
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=1.0, cap_s=30.0))
    watchdog_s: float = 0.0
    """A commit puts the new model on watch for this long (0: no watchdog window)."""


class SelfTestFailedError(EdgeNodeError):
    title = "self-test failed"

    def __init__(self, result: SelfTestResult) -> None:
        super().__init__(
            f"self-test failed ({result.reason}): {result.detail}", reason=result.reason
        )
        self.result = result


class _ActivationError(EdgeNodeError):
    title = "activation failed"


@dataclass(frozen=True, slots=True)
class _Plan:
    assignment: VerifiedAssignment
    reference: TargetInfo
    atol: float
    rtol: float
    redelivered: bool
    runtime: RuntimeSpec | None = None

    @property
    def target(self) -> ModelRef:
        return ModelRef(self.assignment.target_path, self.assignment.sha256)

    def bundle(self, path: Path) -> ModelBundle:
        """The model at `path` with what TUF verified of it."""
        assignment = self.assignment
        name, version = name_and_version(assignment.target_path)
        signed_version = assignment.target.custom.get("version")
        return ModelBundle(
            path,
            assignment.model or name,
            signed_version if isinstance(signed_version, str) else version,
            assignment.sha256,
            self.runtime,
            assignment.target_path,
        )


class _PlanError(EdgeNodeError):
    def __init__(self, message: str, *, reason: str, **fields: Any) -> None:
        super().__init__(message, reason=reason, **fields)
        self.reason = reason


async def _no_report(report: UpdateReport) -> None:
    return None


class Reconciler:
    def __init__(
        self,
        *,
        journal: Journal,
        store: ModelStore,
        source: RepositorySource,
        tuf_client_factory: Callable[[], TargetsView],
        trust: AssignmentTrust,
        clock: TaskClock,
        selftest: SelfTest,
        host: ModelHost,
        report: Report | None = None,
        limits: ReconcilerLimits | None = None,
    ) -> None:
        """`source` serves the model files; `tuf_client_factory()` is called in a worker
        thread and must refresh a fresh `Updater` (e.g. `TufClient(...).refresh`)."""
        self._journal = journal
        self._store = store
        self._source = source
        self._tuf = tuf_client_factory
        self._trust = trust
        self._clock = clock
        self._selftest = selftest
        self._host = host
        self._report_cb = report or _no_report
        self._limits = limits or ReconcilerLimits()
        self._lock = asyncio.Lock()
        self._state: JournalState | None = None

    @property
    def state(self) -> JournalState | None:
        """The journal as last read or written by this reconciler (None before that)."""
        return self._state

    @property
    def store(self) -> ModelStore:
        return self._store

    # ---------------------------------------------------------------- apply

    async def apply(self, signed: SignedDirectorAssignment) -> Outcome:
        """Take `signed` to an outcome; one apply (or resume) runs at a time."""
        async with self._lock:
            return await self._apply(signed)

    async def _apply(self, signed: SignedDirectorAssignment) -> Outcome:
        state = self._load()
        try:
            plan = await asyncio.to_thread(self._plan, signed, state)
        except (AssignmentRejectedError, _PlanError) as exc:
            return await self._rejected(exc.reason, exc)
        except (RepositoryError, DownloadError) as exc:
            return await self._rejected(metadata_reason(exc), exc)
        except OSError as exc:
            # The TUF cache could not be written (a full disk, a read-only data dir):
            # refused like any other, never fatal to the agent.
            reason = "disk-full" if exc.errno == errno.ENOSPC else "storage-error"
            return await self._rejected(reason, exc)
        target = plan.target
        sequence = plan.assignment.sequence
        if plan.redelivered:
            handled = (
                state.phase is Phase.TRIAL
                or state.failed is None
                or state.failed.sha256 != target.sha256
                or (state.active is not None and state.active.sha256 == target.sha256)
            )
            if handled or state.last_error not in RETRIED:
                return Outcome(OutcomeKind.UNCHANGED, "replayed", target, sequence)
            if state.attempts >= self._limits.max_attempts:
                return await self._rejected("too-many-attempts", None, target, sequence)
        if state.active is not None and state.active.sha256 == target.sha256:
            if not plan.redelivered:
                self._save(accept_assignment(state, sequence))
            await self._report(
                UpdateReport(UpdatePhase.ACTIVE, target.path, sequence, detail="already active")
            )
            return Outcome(OutcomeKind.UNCHANGED, "already-active", target, sequence)
        try:
            self._check_space(plan)
        except DiskFullError as exc:
            return await self._rejected("disk-full", exc, target, sequence)

        if not plan.redelivered:
            state = accept_assignment(state, sequence)
        state = self._save(begin_trial(state, target))
        try:
            await self._trial(plan)
        except Exception as exc:
            reason = _reason_of(exc)
            _log.warning("trial of %s failed: %s", target.path, exc)
            state = self._save(revert_trial(state, reason))
            message = _message_of(exc)
            await self._report(
                UpdateReport(UpdatePhase.FAILED, target.path, sequence, reason, message)
            )
            await self._report(
                UpdateReport(
                    UpdatePhase.REVERTED,
                    target.path,
                    sequence,
                    reason,
                    _still_running(state),
                )
            )
            self._gc(state)
            return Outcome(OutcomeKind.REVERTED, reason, target, sequence)
        until = None
        if self._limits.watchdog_s > 0:
            until = self._clock.now() + timedelta(seconds=self._limits.watchdog_s)
        state = self._save(commit_trial(state, until))
        self._gc(state, clear_staging=True)
        await self._report(
            UpdateReport(
                UpdatePhase.ACTIVE,
                target.path,
                sequence,
                detail="" if until is None else f"on watch until {_iso(until)}",
            )
        )
        return Outcome(OutcomeKind.APPLIED, None, target, sequence)

    def _plan(self, signed: SignedDirectorAssignment, state: JournalState) -> _Plan:
        """In a worker thread: refresh TUF, verify the assignment, find its reference."""
        view = self._tuf()
        now = self._clock.now()

        def verify(last_sequence: int) -> VerifiedAssignment:
            return verify_assignment(
                signed,
                director_key=self._trust.director_keys,
                node_id=self._trust.node_id,
                fleet=self._trust.fleet,
                last_sequence=last_sequence,
                now=now,
                target_lookup=view.target,
                floor_lookup=view.floor,
            )

        redelivered = False
        try:
            verified = verify(state.director_sequence)
        except AssignmentReplayError as exc:
            if exc.reason != "replayed":
                raise
            # The very sequence last accepted: a re-delivery, checked like a new one.
            verified = verify(state.director_sequence - 1)
            redelivered = True
        reference, atol, rtol = _reference_of(view, verified.target)
        try:
            runtime = runtime_of_custom(verified.target.custom)
        except BundleError as exc:
            named = (
                exc.message if exc.message.startswith(exc.field) else f"{exc.field}: {exc.message}"
            )
            raise _PlanError(
                f"{verified.target_path}: {named}", reason="bad-runtime", field=exc.field
            ) from exc
        return _Plan(verified, reference, atol, rtol, redelivered, runtime)

    def _check_space(self, plan: _Plan) -> None:
        needed = 0
        if not self._store.exists(plan.assignment.sha256):
            needed = plan.assignment.length + plan.reference.length
        self._store.check_space(needed, self._limits.space_margin_bytes)

    async def _trial(self, plan: _Plan) -> Path:
        store = self._store
        sha = plan.assignment.sha256
        ref = plan.reference
        model_path, ref_path = store.path_of(sha), store.reference_path_of(sha)
        target_path, sequence = plan.assignment.target_path, plan.assignment.sequence

        def step(phase: UpdatePhase, detail: str = "") -> UpdateReport:
            return UpdateReport(phase, target_path, sequence, detail=detail)

        # Another trial's partial downloads are of no use any more: at most one trial's stay.
        await asyncio.to_thread(store.clear_staging, {sha, ref.sha256})
        await self._report(step(UpdatePhase.DOWNLOADING, f"{plan.assignment.length} bytes"))
        have_model = await asyncio.to_thread(store.verify, sha)
        model_part = None if have_model else await self._download(plan.assignment.target)
        have_ref = have_model and ref_path.is_file()
        ref_part = None if have_ref else await self._download(ref)
        await self._report(step(UpdatePhase.VERIFYING))
        if model_part is not None:
            model_path = await asyncio.to_thread(
                store.install, model_part, sha, plan.assignment.length
            )
        if ref_part is not None:
            ref_path = await asyncio.to_thread(
                store.install_reference, sha, ref_part, ref.sha256, ref.length
            )
        bundle = plan.bundle(model_path)
        await asyncio.to_thread(store.write_bundle, sha, bundle.to_record())
        await self._report(step(UpdatePhase.SELF_TESTING))

        def trial(load: TrialLoader) -> SelfTestResult:
            return self._selftest(load, ref_path, plan.atol, plan.rtol)

        try:
            result = await self._host.serve(bundle, trial=trial)
        except Exception as exc:
            raise _ActivationError(f"activation failed: {exc}", reason="activate-failed") from exc
        if result is None:
            raise _ActivationError(
                f"{bundle.label} was served without its self-test", reason="activate-failed"
            )
        if not result.ok:
            raise SelfTestFailedError(result)
        _log.info("self-test of %s passed: %s", bundle.label, result.detail)
        return model_path

    async def _download(self, target: TargetInfo) -> Path:
        limits = self._limits
        for attempt in range(limits.download_attempts):
            try:
                return await download_target(
                    self._source,
                    target,
                    self._store.staging_dir,
                    max_bytes=limits.max_artifact_bytes,
                    check_space=lambda n: self._store.check_space(n, limits.space_margin_bytes),
                )
            except LinkUnavailableError:
                if attempt + 1 >= limits.download_attempts:
                    raise
                await self._clock.sleep(limits.backoff.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    # --------------------------------------------------------------- resume

    async def resume_after_crash(self) -> JournalState:
        """At start-up: revert a trial the process died in (else a model it died on
        watch with), make sure the active model is in the store (else fall back to
        `previous`), and collect garbage. Nothing is activated here: the caller serves
        the returned state's `active`."""
        async with self._lock:
            state = self._load()
            sequence = state.director_sequence
            if state.phase is Phase.TRIAL and state.trial is not None:
                trial = state.trial
                state = self._save(revert_trial(state, RESTART_REASON))
                if state.probation is not None and not state.probation.paused:
                    # The trial takes the blame for the restart; the model on watch is
                    # watched again from the start.
                    state = self._save(pause_probation(state))
                await self._report(
                    UpdateReport(
                        UpdatePhase.REVERTED,
                        trial.path,
                        sequence,
                        "restarted",
                        f"the agent restarted during the trial; {_still_running(state)}",
                    )
                )
            elif state.probation is not None and not state.probation.paused:
                died_on = state.active
                assert died_on is not None  # the journal refuses a probation without one
                state = self._save(revert_active(state, PROBATION_RESTART_REASON))
                await self._report(
                    UpdateReport(
                        UpdatePhase.REVERTED,
                        died_on.path,
                        sequence,
                        PROBATION_RESTART_REASON,
                        "the agent restarted while the model was in its watchdog window; "
                        + _still_running(state),
                    )
                )
            active = state.active
            store_verify = self._store.verify
            if active is not None and not await asyncio.to_thread(store_verify, active.sha256):
                previous = state.previous
                if previous is not None and await asyncio.to_thread(
                    self._store.verify, previous.sha256
                ):
                    state = self._save(rollback(state))
                    await self._report(
                        UpdateReport(
                            UpdatePhase.REVERTED,
                            active.path,
                            sequence,
                            "active-missing",
                            f"the model file is missing or damaged; {_still_running(state)}",
                        )
                    )
                else:
                    _log.error("active model %s is missing from the store", active.path)
                    await self._report(
                        UpdateReport(
                            UpdatePhase.FAILED,
                            active.path,
                            sequence,
                            "active-missing",
                            "the model file is missing or damaged and there is no previous one",
                        )
                    )
            self._gc(state)
            return state

    # ------------------------------------------------------------ watchdog

    async def revert_active(self, expected: ModelRef, reason: str, detail: str) -> Outcome:
        """Go back to `previous` because `expected`, the active model, fails after its
        commit: the runtime is swapped first (`host.serve`), then the journal written — so
        a crash in between is a restart on watch, which reverts too.

        UNCHANGED when `expected` is no longer active (an apply moved on meanwhile);
        REJECTED, with the model left serving, when there is no previous model or it
        cannot be activated.
        """
        async with self._lock:
            state = self._load()
            sequence = state.director_sequence
            if state.phase is not Phase.IDLE or state.active != expected:
                return Outcome(OutcomeKind.UNCHANGED, "not-active", expected, sequence)
            previous = state.previous
            problem = None
            if previous is None:
                problem = "there is no previous model to go back to"
            elif not await asyncio.to_thread(self._store.verify, previous.sha256):
                problem = f"the previous model {previous.path} is missing or damaged"
            else:
                try:
                    bundle = await asyncio.to_thread(self.bundle_of, previous)
                    await self._host.serve(bundle)
                except Exception as exc:
                    problem = f"the previous model {previous.path} cannot be served: {exc}"
            if problem is not None:
                _log.error("cannot revert %s (%s): %s", expected.path, reason, problem)
                state = self._save(end_probation(state))
                await self._report(
                    UpdateReport(
                        UpdatePhase.FAILED,
                        expected.path,
                        sequence,
                        reason,
                        f"{detail}; not reverted: {problem}; it keeps serving",
                    )
                )
                return Outcome(OutcomeKind.REJECTED, "revert-impossible", expected, sequence)
            state = self._save(revert_active(state, f"{reason}: {detail}"))
            await self._report(
                UpdateReport(
                    UpdatePhase.REVERTED,
                    expected.path,
                    sequence,
                    reason,
                    f"{detail}; {_still_running(state)}",
                )
            )
            self._gc(state)
            return Outcome(OutcomeKind.REVERTED, reason, expected, sequence)

    async def end_probation(self, expected: ModelRef) -> JournalState:
        """The watchdog window of `expected` passed: the commit is final."""
        async with self._lock:
            state = self._load()
            if state.active == expected and state.probation is not None:
                state = self._save(end_probation(state))
                await self._report(
                    UpdateReport(
                        UpdatePhase.ACTIVE,
                        expected.path,
                        state.director_sequence,
                        detail="watchdog window passed",
                    )
                )
            return state

    async def pause_probation(self) -> JournalState:
        """A clean stop inside the watchdog window: the next start watches again."""
        async with self._lock:
            state = self._load()
            if state.probation is not None and not state.probation.paused:
                state = self._save(pause_probation(state))
            return state

    # -------------------------------------------------------------- helpers

    def bundle_of(self, ref: ModelRef) -> ModelBundle:
        """The installed model `ref` with the bundle the store kept beside it (blocking).

        Without one (installed before bundles) or with a damaged one, the model is served
        with the node's own preprocess config, and the log says so.
        """
        path = self._store.path_of(ref.sha256)
        name, version = name_and_version(ref.path)
        fallback = ModelBundle(path, name, version, ref.sha256, None, ref.path)
        try:
            record = self._store.read_bundle(ref.sha256)
        except StorageError as exc:
            _log.error("%s; serving %s with the node's preprocess config", exc.message, ref.path)
            return fallback
        if record is None:
            _log.warning(
                "%s has no bundle record (installed before bundles); serving it with the "
                "node's preprocess config",
                ref.path,
            )
            return fallback
        try:
            return bundle_from_record(record, path)
        except InvalidInputError as exc:
            _log.error(
                "the bundle record of %s is unusable (%s); serving it with the node's "
                "preprocess config",
                ref.path,
                exc.message,
            )
            return fallback

    def _load(self) -> JournalState:
        self._state = self._journal.load()
        return self._state

    def _save(self, state: JournalState) -> JournalState:
        self._state = self._journal.save(state)
        return self._state

    def _gc(self, state: JournalState, *, clear_staging: bool = False) -> None:
        try:
            self._store.gc(state.referenced_sha256s())
            if clear_staging:
                self._store.clear_staging(())
        except EdgeNodeError as exc:  # gc is housekeeping: never fail an update for it
            _log.warning("model store gc failed: %s", exc)

    async def _rejected(
        self,
        reason: str,
        exc: BaseException | None,
        target: ModelRef | None = None,
        sequence: int | None = None,
    ) -> Outcome:
        _log.warning("assignment rejected (%s): %s", reason, exc)
        message = "" if exc is None else _message_of(exc)
        if exc is None and reason == "too-many-attempts":
            message = f"failed {self._limits.max_attempts} times; pin it again to retry"
        await self._report(
            UpdateReport(
                UpdatePhase.FAILED,
                "" if target is None else target.path,
                sequence or 0,
                reason,
                message,
            )
        )
        return Outcome(OutcomeKind.REJECTED, reason, target, sequence)

    async def _report(self, report: UpdateReport) -> None:
        try:
            await self._report_cb(report)
        except Exception:  # a status message lost must not fail the update
            _log.exception("update status report failed")


def _reference_of(view: TargetsView, model: TargetInfo) -> tuple[TargetInfo, float, float]:
    """The model's reference pair as TUF lists it, checked against the model's custom."""
    custom: Any = model.custom.get("reference")
    if not isinstance(custom, Mapping):
        raise _PlanError(f"{model.path} names no reference pair", reason="no-reference")
    path = custom.get("path")
    try:
        atol, rtol = float(custom["atol"]), float(custom["rtol"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _PlanError(f"{model.path}: bad reference tolerance", reason="bad-custom") from exc
    if not isinstance(path, str) or not (atol >= 0 and rtol >= 0):
        raise _PlanError(f"{model.path}: bad reference entry", reason="bad-custom")
    reference = view.target(path)
    if reference is None:
        raise _PlanError(f"reference {path!r} is not in TUF metadata", reason="no-reference")
    if reference.sha256 != custom.get("sha256") or reference.length != custom.get("length"):
        raise TargetMismatchError(
            f"reference {path!r} differs from what {model.path} names",
            reason="reference-mismatch",
            target_path=path,
        )
    return reference, atol, rtol


def _still_running(state: JournalState) -> str:
    active = state.active
    return "serving nothing" if active is None else f"serving {active.path}"


def _message_of(exc: BaseException) -> str:
    message = exc.message if isinstance(exc, EdgeNodeError) else str(exc)
    return message[:_MAX_DETAIL]


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _reason_of(exc: BaseException) -> str:
    if isinstance(exc, SelfTestFailedError):
        return f"self-test: {exc.result.reason}"
    if isinstance(exc, ArtifactRejectedError | _PlanError):
        return exc.reason
    if isinstance(exc, _ActivationError):
        return "activate-failed"
    if isinstance(exc, DiskFullError):
        return "disk-full"
    if isinstance(exc, StoreIntegrityError):
        return "integrity"
    if isinstance(exc, LinkError):
        return "link-unavailable"
    return type(exc).__name__


def metadata_reason(exc: RepositoryError | DownloadError) -> str:
    """Why a TUF refresh failed, as an operator reads it: the metadata could not be had
    (`metadata-unavailable`), it was out of date (`metadata-expired`: the control plane's
    freshness loop is not running), or it did not verify (`metadata-untrusted`: bad
    signatures, a rollback of versions, wrong hashes)."""
    if isinstance(exc, DownloadError):
        return "metadata-unavailable"
    if isinstance(exc, ExpiredMetadataError):
        return "metadata-expired"
    return "metadata-untrusted"
