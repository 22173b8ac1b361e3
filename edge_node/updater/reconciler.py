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
An assignment marked `renewal` (ADR 0032) of the target of the last assignment accepted
(`JournalState.assigned`) only moves the sequence: no download, no trial, no retry it would
not have made anyway; a renewal of a decision the node missed is taken as that decision. An
assignment's `shadow` candidate goes to the shadow stage (`edge_node.updater.shadow`, ADR 0031) once
the assignment is accepted; what it serves does not change.
Not here: the hot swap itself, the runtime, when to call `apply` or judge the watchdog
(the agent's update task, `edge_node.agent.update_task`).

Decisions:
- A trial found in the journal at start-up is **reverted**, not retried at once: the
  process may have died *because of* the trial (a model that exhausts memory at load),
  and retrying it blindly would loop. It counts as a failed attempt of that target.
- Re-delivery of the very assignment last accepted (same sequence, e.g. the retained MQTT
  doorbell or a reconnect) is a no-op when its target is active, and a bounded retry
  (`max_attempts`) when its last trial failed for a reason that may pass (`RETRIED`: a
  cut link, a restart, an activation refused while stopping, a full disk) — so those are
  retried without the director having to re-sign, but not before the backoff written
  with the failure (`JournalState.retry_at`; earlier: `DEFERRED`, the agent's timer
  retries then). A model that failed on its merits (hash, self-test, a runtime that
  refuses it, watchdog) is not retried by re-delivery: a new pin retries it. A retried
  target's files stay in the store and its partial downloads in staging, so a retry
  fetches only what is missing.
- A refusal for lack of disk space happens before the sequence is accepted, so the same
  assignment is applied once space is free. A version already in the store needs no
  free space (a rollback on a full disk).
- A full disk never stops the node: a journal write that fails *after* the step it
  records (a commit, a revert, the end of a watch window) keeps the new state in memory
  (`journal_pending`) and `flush_journal()` writes it later; only the write that must
  come *before* its step (a trial's start) refuses the step (`disk-full`), except for a
  rollback to `previous`, which goes ahead unjournalled (a restart then serves what the
  disk says). Failures of the box (`disk-full`, `storage-error`) do not count against
  the model.
- A restart that finds the active model still on watch (a probation not `paused` by a
  clean stop) blames that model — unless a trial was running too, which takes the blame
  instead, or the window had passed (its end recorded in place, `Journal.
  mark_watch_passed`, when the journal could not be written), or the journal cannot be
  written now (a full disk is the likely cause: the model is watched again instead) —
  and reverts it to `previous` (or to nothing, rather than a crash loop).
- The staging directory holds at most one trial's partial downloads: a trial drops the
  others when it starts, a commit drops all.
- A node never serves a revoked version (ADR 0035). When fresh metadata (every `apply`
  refreshes it) or, at start-up, the metadata the last refresh kept (`cached_view`) says
  the active model is below its model's floor, the node goes back to `previous` if that
  one is in the store and not revoked, else it serves nothing; either way it reports
  `revoked-active`. The fallback from a damaged active file and the watchdog's revert
  never go to a revoked `previous`.
- A renewal keeps the journal's retry schedule as it is: a target that failed for a reason
  that may pass is retried when its backoff says (the renewal's `Outcome.retry_at`), one
  that failed on its merits is not retried because of a renewal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
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
    DEFAULT_MAX_SEQUENCE_JUMP,
    AssignmentRejectedError,
    AssignmentReplayError,
    ShadowRequest,
    TargetInfo,
    TargetMismatchError,
    VerifiedAssignment,
    sequence_floor,
    verify_assignment,
    verify_shadow,
)
from edge_node.updater.download import ArtifactRejectedError, download_target, partial_path
from edge_node.updater.host import (
    ModelBundle,
    ModelHost,
    ShadowHost,
    ShadowSettings,
    bundle_from_record,
    name_and_version,
)
from edge_node.updater.journal import (
    Journal,
    JournalState,
    ModelRef,
    Phase,
    Probation,
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
from edge_node.updater.shadow import ShadowPlan, ShadowRefusal, ShadowStage, ShadowWanted
from edge_node.updater.source import RepositorySource
from edge_node.updater.store import DiskFullError, ModelStore, StoreIntegrityError
from protos.bundle.spec import BundleError, RuntimeSpec, runtime_of_custom
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

__all__ = [
    "NOT_COUNTED",
    "RETRIED",
    "REVOKED_ACTIVE",
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
_MAX_FACTS: Final = 32
_MAX_FACT_KEY: Final = 64
_MAX_FACT_VALUE: Final = 256
RESTART_REASON: Final = "interrupted by a restart"
PROBATION_RESTART_REASON: Final = "restarted-on-watch"
REVOKED_ACTIVE: Final = "revoked-active"
"""The active model's release counter is below its model's signed floor (ADR 0035)."""
DISK_FULL: Final = "disk-full"
STORAGE_ERROR: Final = "storage-error"
NOT_COUNTED: Final = frozenset({DISK_FULL, STORAGE_ERROR})
"""Failures of the box, not of the model: retried, never counted as attempts."""
RETRIED: Final = frozenset(
    {"link-unavailable", "activate-failed", RESTART_REASON, PROBATION_RESTART_REASON} | NOT_COUNTED
)
"""Failure reasons (journal `last_error`) that may pass: a re-delivery of the assignment
retries them once their backoff passed. Anything else failed on its merits."""


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
    DEFERRED = "deferred"
    """A re-delivery of a target whose retry is not due yet (`Outcome.retry_at`)."""
    REJECTED = "rejected"
    """Refused before any trial (bad assignment, metadata, disk full); nothing changed."""
    REVERTED = "reverted"
    """The trial failed; the previously active model still runs."""


@dataclass(frozen=True, slots=True)
class UpdateReport:
    """One step of an update, for the control plane (an UpdateStatus) and the log.

    `target_path` and `sequence` are empty (`""`, 0) for an assignment refused before it
    was authenticated and verified: nothing unverified is repeated. `reason` is a short
    code for FAILED and REVERTED (e.g. `hash-mismatch`, `self-test: output-mismatch`), and
    for an ACTIVE step with a problem beside it (`disk-full`: the journal cannot be
    written). `facts` are the numbers behind the reason, as text (a self-test's
    `max_abs_err`, a refusal's `free` bytes): bounded, for the control plane to show.
    """

    phase: UpdatePhase
    target_path: str = ""
    sequence: int = 0
    reason: str | None = None
    detail: str = ""
    facts: Mapping[str, str] = field(default_factory=dict)

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
    retry_at: datetime | None = None
    """REVERTED or DEFERRED: when a re-delivery may try the target again (None: never)."""


class TargetsView(Protocol):
    """Verified TUF metadata after one refresh (`tuf_fetch.TufView`); used from a thread."""

    def target(self, path: str) -> TargetInfo | None: ...

    def floor(self, model: str) -> int: ...

    def director_keys(self) -> list[Key]:
        """The director keys the verified root lists ([] for none: the enrollment key)."""
        ...


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
    """Between the download attempts of one trial."""
    retry_backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=10.0, cap_s=600.0))
    """Before a re-delivery retries a trial that failed for a reason that may pass."""
    watchdog_s: float = 0.0
    """A commit puts the new model on watch for this long (0: no watchdog window)."""
    max_sequence_jump: int = DEFAULT_MAX_SEQUENCE_JUMP
    """How far above the last accepted director sequence an assignment may be (ADR 0045)."""


class SelfTestFailedError(EdgeNodeError):
    title = "self-test failed"

    def __init__(self, result: SelfTestResult) -> None:
        super().__init__(
            f"self-test failed ({result.reason}): {result.detail}", reason=result.reason
        )
        self.result = result


class _ActivationError(EdgeNodeError):
    """The runtime did not serve the model: `activate-refused` when it refuses the model
    itself (it does not load, or does not fit the configuration: on its merits), else
    `activate-failed` (the agent is stopping, ...: may pass)."""

    title = "activation failed"

    def __init__(self, cause: Exception) -> None:
        refused = isinstance(cause, InvalidInputError | ValueError)
        self.reason = "activate-refused" if refused else "activate-failed"
        what = "the runtime refuses the model" if refused else "activation failed"
        fields = cause.fields if isinstance(cause, EdgeNodeError) else {}
        super().__init__(f"{what}: {_message_of(cause)}", **fields)


@dataclass(frozen=True, slots=True)
class _Plan:
    assignment: VerifiedAssignment
    reference: TargetInfo
    atol: float
    rtol: float
    redelivered: bool
    runtime: RuntimeSpec | None = None
    shadow: ShadowWanted = None
    rekeyed: bool = False
    """Signed by a director key the root lists in place of the last one: the sequence
    floor starts again (`sequence_floor`)."""

    @property
    def new_decision(self) -> bool:
        """Neither a re-delivery nor a renewal: the director decided anew."""
        return not self.redelivered and not self.assignment.renewal

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


_REFUSALS: Final = (AssignmentRejectedError, _PlanError, RepositoryError, DownloadError, OSError)
"""What refuses an assignment before any trial (OSError: the TUF cache cannot be written,
a full disk or a read-only data dir; refused like any other, never fatal to the agent)."""


@dataclass(frozen=True, slots=True)
class _Revoked:
    """An installed model whose release counter is below its model's floor."""

    ref: ModelRef
    model: str
    release_counter: int
    floor: int

    @property
    def detail(self) -> str:
        return (
            f"{self.ref.path} (release counter {self.release_counter}) is below the floor "
            f"{self.floor} of model {self.model!r}"
        )

    @property
    def facts(self) -> dict[str, str]:
        return bounded_facts(
            {"model": self.model, "release_counter": self.release_counter, "floor": self.floor}
        )


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
        shadow_host: ShadowHost | None = None,
        cached_view: Callable[[], TargetsView] | None = None,
    ) -> None:
        """`source` serves the model files; `tuf_client_factory()` is called in a worker
        thread and must refresh a fresh `Updater` (e.g. `TufClient(...).refresh`);
        `shadow_host` runs shadow candidates (None: every one fails as `unsupported`);
        `cached_view()` (in a worker thread, offline) is the metadata the last refresh
        kept (`TufClient.cached_view`), for the floors at start-up and in a watchdog
        revert (None: no floor is known then)."""
        self._journal = journal
        self._store = store
        self._source = source
        self._tuf = tuf_client_factory
        self._cached_view = cached_view
        self._trust = trust
        self._clock = clock
        self._selftest = selftest
        self._host = host
        self._report_cb = report or _no_report
        self._limits = limits or ReconcilerLimits()
        self._lock = asyncio.Lock()
        self._state: JournalState | None = None
        # The journal as it is on disk, while `_state` could not be written (a full disk).
        self._on_disk: JournalState | None = None
        self._journal_error: StorageError | None = None
        self._box_failures = 0  # consecutive failures of the box (NOT_COUNTED), for backoff
        self._shadow = ShadowStage(
            shadow_host,
            store=store,
            fetch=self._download,
            room_for=lambda targets: self._room_for(sum(self._missing(t) for t in targets)),
            selftest=selftest,
            describe=lambda exc: (_reason_of(exc), _message_of(exc)),
            mark_dir=journal.path.parent,
        )

    @property
    def state(self) -> JournalState | None:
        """The journal as last read or written by this reconciler (None before that);
        while `journal_pending`, what the node runs, ahead of the file."""
        return self._state

    @property
    def journal_pending(self) -> bool:
        """A state change is held in memory: the journal could not be written."""
        return self._journal_error is not None

    @property
    def journal_problem(self) -> StorageError | None:
        """Why the journal could not be written, while `journal_pending`."""
        return self._journal_error

    async def flush_journal(self) -> bool:
        """Write a state held in memory (`journal_pending`); True when none is left."""
        async with self._lock:
            return self._flush()

    @property
    def store(self) -> ModelStore:
        return self._store

    @property
    def shadow(self) -> ShadowStage:
        """The shadow stage: its `status` and `report()` (the health report's section)."""
        return self._shadow

    # ---------------------------------------------------------------- apply

    async def apply(self, signed: SignedDirectorAssignment) -> Outcome:
        """Take `signed` to an outcome; one apply (or resume) runs at a time."""
        async with self._lock:
            return await self._apply(signed)

    async def _apply(self, signed: SignedDirectorAssignment) -> Outcome:
        state = self._load()
        try:
            view, revoked = await asyncio.to_thread(self._refresh, state)
        except _REFUSALS as exc:
            return await self._refusal(exc)
        try:
            plan = await asyncio.to_thread(self._plan, signed, state, view)
        except _REFUSALS as exc:
            outcome = await self._refusal(exc)
            # Reported last, since it is what the node does now: the recall it learns now,
            # or the one that left it serving nothing (the Hello announcing that brings
            # the refused assignment back).
            if revoked is not None:
                await self._leave_revoked(state, view, revoked)
            elif state.active is None and state.last_error == REVOKED_ACTIVE:
                await self._still_stopped(state, view)
            return outcome
        if revoked is not None:
            # Before the trial: a trial that fails must not go back to the revoked model.
            state = await self._leave_revoked(state, view, revoked)
        outcome = await self._take(plan, state)
        if outcome.kind is not OutcomeKind.REJECTED:
            before = self._shadow.status
            await self._shadow.reconcile(plan.shadow, new_decision=plan.new_decision)
            if self._state is not None and self._shadow.status is not before:
                self._gc(self._state)  # a candidate stopped or failed leaves the store
        return outcome

    async def _take(self, plan: _Plan, state: JournalState) -> Outcome:
        """The assignment's target: a renewal, a re-delivery or a new decision."""
        target = plan.target
        sequence = plan.assignment.sequence
        if plan.assignment.renewal and not plan.redelivered:
            if target in _last_assigned(state):
                return await self._renew(plan, state)
            # A renewal of a decision this node never took (it was offline when it was
            # made, or refused it for want of disk): it is the director's current decision
            # for the node, so it is taken as one. Never a retry: a target that failed here
            # was accepted, and is last assigned.
            _log.info(
                "a renewal of %s, a decision this node missed: taken as the decision",
                target.path,
            )
        if plan.redelivered:
            handled = (
                state.phase is Phase.TRIAL
                or state.failed is None
                or state.failed != target
                or state.active == target
            )
            if handled or state.last_error not in RETRIED:
                return Outcome(OutcomeKind.UNCHANGED, "replayed", target, sequence)
            if state.attempts >= self._limits.max_attempts:
                return await self._rejected("too-many-attempts", None, target, sequence)
            if self._not_due(state.retry_at):
                return Outcome(
                    OutcomeKind.DEFERRED, state.last_error, target, sequence, state.retry_at
                )
        if state.active == target:
            if not plan.redelivered:
                state = self._record(_accept(state, plan, sequence, target))
            await self._report(
                self._noted(
                    UpdateReport(UpdatePhase.ACTIVE, target.path, sequence, detail="already active")
                )
            )
            return Outcome(OutcomeKind.UNCHANGED, "already-active", target, sequence)
        try:
            await asyncio.to_thread(self._check_space, plan)
        except DiskFullError as exc:
            return await self._rejected(DISK_FULL, exc, target, sequence)

        trial = begin_trial(
            state if plan.redelivered else _accept(state, plan, sequence, target), target
        )
        try:
            state = self._save(trial)
        except StorageError as exc:
            if state.previous != target:
                return await self._rejected(_storage_reason(exc), exc, target, sequence)
            # A rollback to the model kept for it, on a disk too full for the journal: it
            # goes ahead in memory; a restart before the journal catches up serves what
            # the disk says and is assigned the rollback again.
            state = self._hold(trial, exc)
        try:
            await self._trial(plan)
        except Exception as exc:
            return await self._trial_failed(state, plan, exc)
        until = None
        if self._limits.watchdog_s > 0:
            until = self._clock.now() + timedelta(seconds=self._limits.watchdog_s)
        state = self._record(commit_trial(state, until))
        self._box_failures = 0
        self._gc(state, clear_staging=True)
        await self._report(
            self._noted(
                UpdateReport(
                    UpdatePhase.ACTIVE,
                    target.path,
                    sequence,
                    detail="" if until is None else f"on watch until {_iso(until)}",
                )
            )
        )
        return Outcome(OutcomeKind.APPLIED, None, target, sequence)

    async def _renew(self, plan: _Plan, state: JournalState) -> Outcome:
        """A renewal of the last decision: only the sequence moves (and the expiry, which
        the node does not keep)."""
        target, sequence = plan.target, plan.assignment.sequence
        state = self._record(_accept(state, plan, sequence, target))
        retry_at = state.retry_at if state.retry_pending and state.failed == target else None
        _log.info("assignment renewed: sequence %d, still %s", sequence, target.path)
        return Outcome(OutcomeKind.UNCHANGED, "renewed", target, sequence, retry_at)

    async def _trial_failed(self, state: JournalState, plan: _Plan, exc: Exception) -> Outcome:
        """Revert the trial, say why (with the numbers), keep its files if it is retried."""
        target, sequence = plan.target, plan.assignment.sequence
        reason = _reason_of(exc)
        _log.warning("trial of %s failed: %s", target.path, exc)
        counted = reason not in NOT_COUNTED
        reverted = revert_trial(state, reason, counted=counted)
        retry_at = self._retry_at(reason, reverted.attempts, counted=counted)
        state = self._record(dataclasses.replace(reverted, retry_at=retry_at))
        message, facts = _message_of(exc), _facts_of(exc)
        await self._report(
            UpdateReport(UpdatePhase.FAILED, target.path, sequence, reason, message, facts)
        )
        await self._report(
            self._noted(
                UpdateReport(
                    UpdatePhase.REVERTED,
                    target.path,
                    sequence,
                    reason,
                    _joined(message, _still_running(state)),
                    facts,
                )
            )
        )
        self._gc(state)
        return Outcome(OutcomeKind.REVERTED, reason, target, sequence, retry_at)

    def _retry_at(self, reason: str, attempts: int, *, counted: bool = True) -> datetime | None:
        """When a failure of `reason` may be retried (None: not by a re-delivery)."""
        if reason not in RETRIED or attempts >= self._limits.max_attempts:
            return None
        if counted:
            tries = max(0, attempts - 1)
        else:
            tries = self._box_failures
            self._box_failures += 1
        delay = self._limits.retry_backoff.delay(tries)
        return self._clock.now() + timedelta(seconds=delay)

    def _not_due(self, retry_at: datetime | None) -> bool:
        """A retry written for later; one absurdly far ahead (the clock was set back) is due."""
        if retry_at is None:
            return False
        wait = retry_at - self._clock.now()
        return timedelta(0) < wait <= timedelta(seconds=self._limits.retry_backoff.cap_s)

    def _refresh(self, state: JournalState) -> tuple[TargetsView, _Revoked | None]:
        """In a worker thread: refresh TUF; is the active model below its floor now?"""
        view = self._tuf()
        return view, _revocation(view, state.active)

    def _plan(
        self, signed: SignedDirectorAssignment, state: JournalState, view: TargetsView
    ) -> _Plan:
        """In a worker thread: verify the assignment against `view`, find its reference."""
        now = self._clock.now()

        enrolled = _key_list(self._trust.director_keys)
        listed = view.director_keys()
        # The keys the root lists replace the enrollment-time key once there are any.
        keys = listed or enrolled
        floor = sequence_floor(
            last_sequence=state.director_sequence,
            last_keyid=state.director_keyid,
            enrollment_keyid=enrolled[0].keyid if enrolled else "",
            listed_keyids={k.keyid for k in listed},
            keyid=signed.keyid,
        )

        def verify(last_sequence: int) -> VerifiedAssignment:
            return verify_assignment(
                signed,
                director_key=keys,
                node_id=self._trust.node_id,
                fleet=self._trust.fleet,
                last_sequence=last_sequence,
                now=now,
                target_lookup=view.target,
                floor_lookup=view.floor,
                max_sequence_jump=self._limits.max_sequence_jump,
            )

        redelivered = False
        try:
            verified = verify(floor)
        except AssignmentReplayError as exc:
            if exc.reason != "replayed":
                raise
            # The very sequence last accepted: a re-delivery, checked like a new one.
            verified = verify(floor - 1)
            redelivered = True
        reference, atol, rtol = _reference_of(view, verified.target)
        runtime = _runtime_of(verified.target)
        shadow = None if verified.shadow is None else _shadow_of(view, verified.shadow, verified)
        rekeyed = floor != state.director_sequence
        return _Plan(verified, reference, atol, rtol, redelivered, runtime, shadow, rekeyed)

    def _check_space(self, plan: _Plan) -> None:
        """Room for what is still to download, with the margin; nothing to download (a
        version in the store, a rollback) needs no free space at all."""
        store = self._store
        needed = 0
        if not store.exists(plan.assignment.sha256):
            needed += self._missing(plan.assignment.target) + self._missing(plan.reference)
        elif not store.reference_path_of(
            plan.assignment.sha256, plan.assignment.target_path
        ).is_file():
            needed += self._missing(plan.reference)
        if needed > 0:
            store.check_space(needed, self._limits.space_margin_bytes)

    def _missing(self, target: TargetInfo) -> int:
        """Bytes of `target` not yet in staging (a partial download is resumed)."""
        try:
            have = partial_path(self._store.staging_dir, target.sha256).stat().st_size
        except OSError:
            have = 0
        return max(0, target.length - min(have, target.length))

    def _room_for(self, needed: int) -> None:
        if needed > 0:
            self._store.check_space(needed, self._limits.space_margin_bytes)

    async def _trial(self, plan: _Plan) -> Path:
        store = self._store
        sha = plan.assignment.sha256
        ref = plan.reference
        target_path, sequence = plan.assignment.target_path, plan.assignment.sequence
        model_path, ref_path = store.path_of(sha), store.reference_path_of(sha, target_path)

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
                functools.partial(
                    store.install_reference,
                    sha,
                    ref_part,
                    ref.sha256,
                    ref.length,
                    target_path=target_path,
                )
            )
        bundle = plan.bundle(model_path)
        await asyncio.to_thread(store.write_bundle, sha, bundle.to_record())
        await self._report(step(UpdatePhase.SELF_TESTING))

        def trial(load: TrialLoader) -> SelfTestResult:
            result = self._selftest(load, ref_path, plan.atol, plan.rtol)
            if result.ok:  # logged here, before the host swaps it in
                _log.info("self-test of %s passed: %s", bundle.label, result.detail)
            return result

        try:
            result = await self._host.serve(bundle, trial=trial)
        except Exception as exc:
            raise _ActivationError(exc) from exc
        if result is None:
            raise _ActivationError(
                EdgeNodeError(f"{bundle.label} was served without its self-test")
            )
        if not result.ok:
            raise SelfTestFailedError(result)
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
                    check_space=self._room_for,
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
            await asyncio.to_thread(self._shadow.recover)
            state = self._load()
            sequence = state.director_sequence
            if state.phase is Phase.TRIAL and state.trial is not None:
                trial = state.trial
                reverted = revert_trial(state, RESTART_REASON)
                retry_at = self._retry_at(RESTART_REASON, reverted.attempts)
                reverted = dataclasses.replace(reverted, retry_at=retry_at)
                if reverted.probation is not None and not reverted.probation.paused:
                    # The trial takes the blame for the restart; the model on watch is
                    # watched again from the start.
                    reverted = pause_probation(reverted)
                state = self._record(reverted)
                await self._report(
                    self._noted(
                        UpdateReport(
                            UpdatePhase.REVERTED,
                            trial.path,
                            sequence,
                            "restarted",
                            f"the agent restarted during the trial; {_still_running(state)}",
                        )
                    )
                )
            elif state.probation is not None and not state.probation.paused:
                state = await self._restarted_on_watch(state, state.probation)
            active = state.active
            store_verify = self._store.verify
            cached = await self._cached()
            if active is not None and not await asyncio.to_thread(store_verify, active.sha256):
                previous = state.previous
                revoked = None if cached is None else _revocation(cached, previous)
                if revoked is not None:
                    # Never the fallback: forget it, so that no later revert goes to it.
                    state = self._record(dataclasses.replace(state, previous=None))
                    await self._report(
                        UpdateReport(
                            UpdatePhase.FAILED,
                            active.path,
                            sequence,
                            "active-missing",
                            "the model file is missing or damaged and the previous one is "
                            f"revoked: {revoked.detail}",
                            revoked.facts,
                        )
                    )
                elif previous is not None and await asyncio.to_thread(
                    self._store.verify, previous.sha256
                ):
                    state = self._record(rollback(state))
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
            revoked_active = None if cached is None else _revocation(cached, state.active)
            if revoked_active is not None and state.phase is Phase.IDLE:
                assert cached is not None
                state = await self._leave_revoked(state, cached, revoked_active, serve=False)
            self._gc(state)
            return state

    async def _restarted_on_watch(self, state: JournalState, probation: Probation) -> JournalState:
        """The process died while the active model was on watch: blame the model, unless
        its window had passed (recorded in place when the journal could not be written)
        or the journal cannot be written now (the disk is the likely cause)."""
        died_on = state.active
        assert died_on is not None  # the journal refuses a probation without one
        sequence = state.director_sequence
        if self._journal.watch_passed(probation.until):
            state = self._record(end_probation(state))
            await self._report(
                self._noted(
                    UpdateReport(
                        UpdatePhase.ACTIVE,
                        died_on.path,
                        sequence,
                        detail="watchdog window passed before the restart",
                    )
                )
            )
            return state
        reverted = revert_active(state, PROBATION_RESTART_REASON)
        retry_at = self._retry_at(PROBATION_RESTART_REASON, reverted.attempts)
        try:
            state = self._save(dataclasses.replace(reverted, retry_at=retry_at))
        except StorageError as exc:
            _log.warning(
                "cannot record the revert of %s (%s): it keeps serving, watched again",
                died_on.path,
                exc.message,
            )
            state = self._hold(pause_probation(state), exc)
            await self._report(
                self._noted(
                    UpdateReport(
                        UpdatePhase.ACTIVE,
                        died_on.path,
                        sequence,
                        detail="the agent restarted in the watchdog window with its journal "
                        "unwritable: not blamed on the model, watched again",
                    )
                )
            )
            return state
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
            cached = await self._cached()
            revoked = None if cached is None else _revocation(cached, previous)
            problem = None
            if previous is None:
                problem = "there is no previous model to go back to"
            elif not await asyncio.to_thread(self._store.verify, previous.sha256):
                problem = f"the previous model {previous.path} is missing or damaged"
            elif revoked is not None:
                problem = f"the previous model is revoked: {revoked.detail}"
            else:
                try:
                    bundle = await asyncio.to_thread(self.bundle_of, previous)
                    await self._host.serve(bundle)
                except Exception as exc:
                    problem = f"the previous model {previous.path} cannot be served: {exc}"
            if problem is not None:
                _log.error("cannot revert %s (%s): %s", expected.path, reason, problem)
                state = self._record(end_probation(state))
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
            state = self._record(revert_active(state, f"{reason}: {detail}"))
            await self._report(
                self._noted(
                    UpdateReport(
                        UpdatePhase.REVERTED,
                        expected.path,
                        sequence,
                        reason,
                        f"{detail}; {_still_running(state)}",
                    )
                )
            )
            self._gc(state)
            return Outcome(OutcomeKind.REVERTED, reason, expected, sequence)

    async def end_probation(self, expected: ModelRef) -> JournalState:
        """The watchdog window of `expected` passed: the commit is final."""
        async with self._lock:
            state = self._load()
            probation = state.probation
            if state.active == expected and probation is not None:
                state = self._record(end_probation(state))
                if self.journal_pending and not self._journal.mark_watch_passed(probation.until):
                    _log.warning("the end of the watch window could not be recorded either")
                await self._report(
                    self._noted(
                        UpdateReport(
                            UpdatePhase.ACTIVE,
                            expected.path,
                            state.director_sequence,
                            detail="watchdog window passed",
                        )
                    )
                )
            return state

    async def watch_again(self, expected: ModelRef) -> JournalState:
        """The active model, stopped cleanly on watch, is watched again from now for a full
        window: a process that dies in it blames the model again."""
        async with self._lock:
            state = self._load()
            window = self._limits.watchdog_s
            if state.active == expected and state.probation is not None and window > 0:
                until = self._clock.now() + timedelta(seconds=window)
                state = self._record(dataclasses.replace(state, probation=Probation(until)))
            return state

    async def pause_probation(self) -> JournalState:
        """A clean stop inside the watchdog window: the next start watches again."""
        async with self._lock:
            state = self._load()
            if state.probation is not None and not state.probation.paused:
                state = self._record(pause_probation(state))
            return state

    # ----------------------------------------------------------- revocation

    async def _leave_revoked(
        self, state: JournalState, view: TargetsView, revoked: _Revoked, *, serve: bool = True
    ) -> JournalState:
        """The active model is revoked (ADR 0035): back to `previous` when it is in the
        store and not revoked itself, else to nothing (the runtime stops serving); the
        revoked model counts as failed (`revoked-active`, never retried). With `serve`
        False (start-up) only the journal moves: the caller serves what it says."""
        sequence = state.director_sequence
        if state.phase is not Phase.IDLE or state.active != revoked.ref:
            return state
        previous = state.previous
        problem = None
        if previous is None:
            problem = "there is no previous model to go back to"
        elif (also := await asyncio.to_thread(_revocation, view, previous)) is not None:
            problem = f"the previous model is revoked too: {also.detail}"
        elif not await asyncio.to_thread(self._store.verify, previous.sha256):
            problem = f"the previous model {previous.path} is missing or damaged"
        elif serve:
            try:
                bundle = await asyncio.to_thread(self.bundle_of, previous)
                await self._host.serve(bundle)
            except Exception as exc:
                problem = f"the previous model {previous.path} cannot be served: {exc}"
        reverted = revert_active(state, REVOKED_ACTIVE)
        if problem is None:
            state = self._record(reverted)
            _log.warning("%s: serving the previous model again", revoked.detail)
            phase = UpdatePhase.REVERTED
            detail = f"{revoked.detail}; {_still_running(state)}"
        else:
            if serve:
                try:
                    await self._host.stop_serving()
                except Exception:  # the journal says nothing runs; a restart serves nothing
                    _log.exception("stopping the runtime failed")
            state = self._record(dataclasses.replace(reverted, active=None))
            _log.error("%s; %s: serving nothing", revoked.detail, problem)
            phase = UpdatePhase.FAILED
            detail = f"{revoked.detail}; not reverted: {problem}; serving nothing"
        await self._report(
            self._noted(
                UpdateReport(
                    phase, revoked.ref.path, sequence, REVOKED_ACTIVE, detail, revoked.facts
                )
            )
        )
        self._gc(state)
        return state

    async def _still_stopped(self, state: JournalState, view: TargetsView) -> None:
        """Say again that the node serves nothing because its model was revoked."""
        revoked = await asyncio.to_thread(_revocation, view, state.failed)
        if revoked is not None:
            await self._report(
                UpdateReport(
                    UpdatePhase.FAILED,
                    revoked.ref.path,
                    state.director_sequence,
                    REVOKED_ACTIVE,
                    f"{revoked.detail}; serving nothing",
                    revoked.facts,
                )
            )

    async def _cached(self) -> TargetsView | None:
        """The metadata the last refresh kept, offline (None without `cached_view`)."""
        return None if self._cached_view is None else await asyncio.to_thread(self._cached_view)

    async def _refusal(self, exc: BaseException) -> Outcome:
        """The assignment refused for `exc` (one of `_REFUSALS`), reported."""
        if isinstance(exc, AssignmentRejectedError | _PlanError):
            return await self._rejected(exc.reason, exc)
        if isinstance(exc, RepositoryError | DownloadError):
            return await self._rejected(metadata_reason(exc), exc)
        return await self._rejected(_storage_reason(exc), exc)

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
            record = self._store.read_bundle(ref.sha256, ref.path)
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
        """The state to go on from: the journal's, or the one held in memory while the
        journal cannot be written (an attempt to write it is made first)."""
        if self._journal_error is not None:
            self._flush()
            assert self._state is not None
            return self._state
        self._state = self._on_disk = self._journal.load()
        return self._state

    def _save(self, state: JournalState) -> JournalState:
        """Write `state` before acting on it; raises StorageError (nothing changes)."""
        self._state = self._on_disk = self._journal.save(state)
        self._journal_error = None
        return self._state

    def _record(self, state: JournalState) -> JournalState:
        """Write `state`, which already happened (a commit after the swap, a revert, the end
        of a watch window): a failure holds it in memory instead, never raises."""
        try:
            return self._save(state)
        except StorageError as exc:
            return self._hold(state, exc)

    def _hold(self, state: JournalState, exc: StorageError) -> JournalState:
        if self._journal_error is None:
            _log.error("%s; the node goes on and writes it once it can", exc.message)
        self._state = state
        self._journal_error = exc
        return state

    def _flush(self) -> bool:
        if self._journal_error is None or self._state is None:
            return True
        try:
            self._save(self._state)
        except StorageError as exc:
            self._journal_error = exc
            return False
        _log.info("update journal written again: %s", self._journal.path)
        return True

    def _noted(self, report: UpdateReport) -> UpdateReport:
        """`report`, saying so when the journal could not be written."""
        problem = self._journal_error
        if problem is None:
            return report
        note = f"the journal cannot be written ({problem.message}): kept in memory, retried"
        return dataclasses.replace(
            report,
            reason=report.reason or _storage_reason(problem),
            detail=_joined(report.detail, note),
        )

    def _gc(self, state: JournalState, *, clear_staging: bool = False) -> None:
        keep = state.referenced_sha256s() | self._shadow.kept()
        if self._journal_error is not None and self._on_disk is not None:
            keep |= self._on_disk.referenced_sha256s()  # a restart would go on from that
        try:
            self._store.gc(keep)
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
                {} if exc is None else _facts_of(exc),
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


def _runtime_of(target: TargetInfo) -> RuntimeSpec | None:
    """The runtime spec signed with `target` (`custom.runtime`); a bad one is `bad-runtime`."""
    try:
        return runtime_of_custom(target.custom)
    except BundleError as exc:
        named = exc.message if exc.message.startswith(exc.field) else f"{exc.field}: {exc.message}"
        raise _PlanError(f"{target.path}: {named}", reason="bad-runtime", field=exc.field) from exc


def _shadow_of(
    view: TargetsView, request: ShadowRequest, assignment: VerifiedAssignment
) -> ShadowPlan | ShadowRefusal:
    """The assignment's shadow candidate checked against TUF, or why it is refused (a
    refused candidate fails the shadow stage, not the assignment)."""
    try:
        settings: ShadowSettings | None = ShadowSettings(
            request.sample_per_mille, request.max_cpu_percent
        )
    except InvalidInputError:
        settings = None
    try:
        checked = verify_shadow(
            request, model=assignment.model, target_lookup=view.target, floor_lookup=view.floor
        )
        reference, atol, rtol = _reference_of(view, checked.target)
        runtime = _runtime_of(checked.target)
    except (AssignmentRejectedError, _PlanError) as exc:
        return ShadowRefusal(
            request.target_path[:1024], request.sha256[:64], settings, exc.reason, _message_of(exc)
        )
    return ShadowPlan(checked, reference, atol, rtol, runtime)


def _revocation(view: TargetsView, ref: ModelRef | None) -> _Revoked | None:
    """`ref` when `view` lists it with a release counter below its model's floor; None
    for a model that is allowed, not a release, or not listed (nothing is known of it)."""
    if ref is None:
        return None
    model, version = name_and_version(ref.path)
    target = None if version is None else view.target(ref.path)
    counter = None if target is None else target.custom.get("release_counter")
    if not isinstance(counter, int) or isinstance(counter, bool):
        return None
    floor = view.floor(model)
    return _Revoked(ref, model, counter, floor) if counter < floor else None


def _last_assigned(state: JournalState) -> tuple[ModelRef, ...]:
    """The target a renewal may renew: the last one accepted; for a journal an older agent
    wrote (no `assigned`), the active or the last failed one."""
    if state.assigned is not None:
        return (state.assigned,)
    return tuple(ref for ref in (state.active, state.failed) if ref is not None)


def _still_running(state: JournalState) -> str:
    active = state.active
    return "serving nothing" if active is None else f"serving {active.path}"


def _message_of(exc: BaseException) -> str:
    """What an operator reads: a self-test's own detail, else the error's message."""
    if isinstance(exc, SelfTestFailedError):
        message = exc.result.detail or exc.message
    elif isinstance(exc, EdgeNodeError):
        message = exc.message
    else:
        message = str(exc) or type(exc).__name__
    return message[:_MAX_DETAIL]


def _facts_of(exc: BaseException) -> dict[str, str]:
    """The numbers behind a failure, as text: every measured field a self-test result
    has (whatever fields it grows), or an error's structured fields; bounded."""
    values: dict[str, object]
    if isinstance(exc, SelfTestFailedError):
        result = exc.result
        skip = {"ok", "reason", "detail"}
        values = (
            {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
            if dataclasses.is_dataclass(result)
            else {}
        )
        values = {k: v for k, v in values.items() if k not in skip}
    elif isinstance(exc, EdgeNodeError):
        values = {k: v for k, v in exc.fields.items() if k != "reason"}
    else:
        return {}
    return bounded_facts(values)


def bounded_facts(values: Mapping[str, object]) -> dict[str, str]:
    """Scalars as text, a mapping's scalars as `key.inner` (None and anything else left
    out), at most 32, keys up to 64 and values up to 256 characters: what an UpdateStatus
    carries."""
    flat: list[tuple[str, object]] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.extend((f"{key}.{inner}", v) for inner, v in value.items())
        else:
            flat.append((str(key), value))
    facts: dict[str, str] = {}
    for key, value in sorted(flat, key=lambda item: item[0]):
        if len(facts) >= _MAX_FACTS:
            break
        if value is None or not isinstance(value, str | int | float | bool):
            continue
        facts[key[:_MAX_FACT_KEY]] = _fact_text(value)[:_MAX_FACT_VALUE]
    return facts


def _fact_text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _joined(first: str, second: str) -> str:
    return f"{first}; {second}" if first and second else first or second


def _storage_reason(exc: BaseException) -> str:
    """`disk-full` when an ENOSPC (or EDQUOT) is behind `exc`, else `storage-error`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return DISK_FULL
        if isinstance(seen, EdgeNodeError) and seen.fields.get("errno") in (
            errno.ENOSPC,
            errno.EDQUOT,
        ):
            return DISK_FULL
        seen = seen.__cause__
    return STORAGE_ERROR


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _reason_of(exc: BaseException) -> str:
    if isinstance(exc, SelfTestFailedError):
        return f"self-test: {exc.result.reason}"
    if isinstance(exc, ArtifactRejectedError | _PlanError | _ActivationError):
        return exc.reason
    if isinstance(exc, DiskFullError):
        return DISK_FULL
    if isinstance(exc, StoreIntegrityError):
        return "integrity"
    if isinstance(exc, StorageError | OSError):
        return _storage_reason(exc)
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


def _key_list(keys: Key | Collection[Key]) -> list[Key]:
    return [keys] if isinstance(keys, Key) else list(keys)


def _accept(state: JournalState, plan: _Plan, sequence: int, target: ModelRef) -> JournalState:
    return accept_assignment(
        state, sequence, target, keyid=plan.assignment.keyid, rekeyed=plan.rekeyed
    )
