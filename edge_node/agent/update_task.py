"""The agent's update task: when to reconcile, what to serve at start, and the watchdog.

`UpdateTask` owns the node's `Reconciler` (journal `<data dir>/updater/journal.json`,
model store `<data dir>/models`, TUF cache `<data dir>/tuf`) and drives it; the model
itself is reached through one port, `ModelHost` (`edge_node.updater.host`), which the
agent's runtime implements:

- `start()` (before the agent's tasks run): `resume_after_crash()`, then serve the
  journal's active model again (`host.serve`) with the bundle the store kept beside it
  (`Reconciler.bundle_of`: offline, no TUF refresh), so a restarted node runs what it
  ran, as it was signed; a model still on watch is watched again.
- `on_control()` takes `DesiredState` messages from the uplink without blocking it: the
  newest assignment waits in a one-slot mailbox (a newer one replaces one not yet
  started), and `run()` applies them one at a time — never two applies at once.
- An assignment refused because the metadata could not be had (`metadata-unavailable`:
  control plane unreachable, its timestamp expired) or for lack of disk space
  (`disk-full`) is tried again by itself with capped backoff (`settings.retry`), until it
  passes or a newer assignment replaces it; so is a trial that failed for a reason that
  may pass, at the time its revert wrote (`Outcome.retry_at`: a re-delivery before then
  is `DEFERRED`), so nothing waits for the next reconnect.
- A full disk never stops the task: a journal write the reconciler could not make is
  held in memory and written again on a timer (`JOURNAL_RETRY`); the statuses say
  `disk-full` meanwhile, and the model keeps serving.
- After an apply that activated a model, the watchdog window: the model's own run
  counters (`host.health()`) are judged every `poll_s` (`updater.watchdog.judge`); a
  failing model is reverted to `previous` at once, without waiting for the control
  plane. The window runs between applies: an apply in progress delays a verdict, and
  cannot lose one (the counters belong to the session).
- TUF metadata and models come from `source` (default: the link itself; an MQTT node
  passes `HttpsRepository`, its broker carries no models).
- Every phase becomes an `UpdateStatus` on the link. The control plane keeps only the
  latest status of a node and a Hello resets it, so the last status is sent again after
  every (re)connect (`on_connect`); a status sent while the link is down is not queued
  — the last one is what counts, and it is always sent again. When an update changed
  what the node runs, a fresh Hello (`hello()`, which the agent's uplink sends too) goes
  out first, so the control plane's view of the active and installed targets is current
  without waiting for a reconnect.
- Every wait (the retry backoff, the watchdog's polls and window) is on the injected
  `TaskClock`, so tests move time by hand instead of sleeping.

`fault_point(name)` is a test seam, inert unless given: called with the phase of each
step the reconciler reports (right after that step's journal write: "downloading" after
the trial is journalled, "verifying" with the downloads complete but not installed,
"self-testing" with them installed, "active" after the commit, also "failed" and
"reverted") and with "activated" (right after a hot swap, before the commit is
journalled); `python -m edge_node` turns EDGEFLEET_NODE_TEST_KILL_AT=<name> into a
SIGKILL there.

Not here: the update steps themselves (`edge_node.updater.reconciler`, the verified-update
library), the hot swap (`edge_node.agent.runtime_host`), settings (`edge_node.config`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
from google.protobuf.timestamp_pb2 import Timestamp
from securesystemslib.signer import Key

from edge_node.clock import TaskClock
from edge_node.enroll import EnrollmentFiles
from edge_node.errors import StorageError
from edge_node.link.base import Backoff, LinkError, NodeLink, node_message
from edge_node.runtime.priority import work_time
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.host import ModelBundle, ModelHost, ShadowHost, Trial
from edge_node.updater.journal import Journal, JournalCorruptError, JournalState, ModelRef
from edge_node.updater.reconciler import (
    NOT_COUNTED,
    AssignmentTrust,
    Outcome,
    OutcomeKind,
    Reconciler,
    ReconcilerLimits,
    UpdatePhase,
    UpdateReport,
)
from edge_node.updater.selftest import SelfTestResult, TrialLoader, self_test
from edge_node.updater.source import RepositorySource
from edge_node.updater.store import ModelStore
from edge_node.updater.tuf_fetch import TufClient
from edge_node.updater.watchdog import ModelHealth, judge
from protos.edgefleet.fleet.v1 import link_pb2
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

__all__ = [
    "JOURNAL_PATH",
    "MODELS_DIR",
    "PULL_DESIRED",
    "TUF_DIR",
    "FaultPoint",
    "RunningState",
    "UpdateTask",
    "UpdateTaskSettings",
]

log = logging.getLogger(__name__)

JOURNAL_PATH: Final = Path("updater") / "journal.json"
MODELS_DIR: Final = "models"
TUF_DIR: Final = "tuf"
_IDLE_WAIT_S: Final = 30.0
# Refusals that may pass without a new assignment: the metadata could not be had (the
# control plane or its freshness loop is down, the link dropped), or did not verify (a
# control plane serving bad metadata may be repaired). Tried again with
# capped backoff (full jitter) until it passes or a newer assignment comes.
RETRIED_REFUSALS: Final = frozenset(
    {"metadata-unavailable", "metadata-expired", "metadata-untrusted"} | NOT_COUNTED
)
METADATA_RETRY: Final = Backoff(initial_s=10.0, cap_s=600.0)
# How often a journal write held in memory (a full disk) is tried again.
JOURNAL_RETRY: Final = Backoff(initial_s=5.0, cap_s=60.0)
# The doorbell's command "look for your assignment" (docs/protocol.md, MQTT node link).
PULL_DESIRED: Final = "pull-desired"
_MAX_STATUS_DETAIL: Final = 500

FaultPoint = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunningState:
    """The Hello's view of the journal: the active target, the targets kept in the
    store (active and previous), the highest director sequence accepted."""

    active_target: str = ""
    installed_targets: tuple[str, ...] = ()
    director_sequence: int = 0


@dataclass(frozen=True, slots=True)
class UpdateTaskSettings:
    """How the node's update task runs: the `updater:` settings and what the agent's
    config adds to them."""

    updater: UpdaterConfig
    data_dir: Path
    """Holds the journal, the model store and the TUF cache (see the module constants)."""
    memory_budget_bytes: int
    """The self-test's memory budget for a candidate model."""
    agent_version: str
    """For the Hello that says what the node runs."""
    initial_model: Path | None = None
    """`runtime.model_path`: served while the journal names no active model."""
    retry: Backoff = field(default_factory=lambda: METADATA_RETRY)
    """Backoff of a refused assignment tried again by itself (`RETRIED_REFUSALS`), and of
    a failed trial's retry (`ReconcilerLimits.retry_backoff`)."""


@dataclass(frozen=True, slots=True)
class _Watch:
    target: ModelRef
    model: str
    baseline: ModelHealth
    deadline: float  # TaskClock.monotonic()


class _FaultingHost:
    """The host as the reconciler sees it: the fault point "self-tested" when a trial's
    self-test passed (before the swap), "activated" right after each swap it makes (before
    the journal records it)."""

    def __init__(self, host: ModelHost, fault: Callable[[str], None]) -> None:
        self._host = host
        self._fault = fault

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        tested = None if trial is None else self._faulting(trial)
        result = await self._host.serve(bundle, trial=tested)
        if result is None or result.ok:
            self._fault("activated")
        return result

    def _faulting(self, trial: Trial) -> Trial:
        def tested(load: TrialLoader) -> SelfTestResult:
            result = trial(load)
            if result.ok:
                self._fault("self-tested")
            return result

        return tested

    def health(self) -> ModelHealth | None:
        return self._host.health()

    async def stop_serving(self) -> None:
        await self._host.stop_serving()


class UpdateTask:
    def __init__(
        self,
        settings: UpdateTaskSettings,
        *,
        files: EnrollmentFiles,
        link: NodeLink,
        clock: TaskClock,
        host: ModelHost,
        source: RepositorySource | None = None,
        fault_point: FaultPoint | None = None,
        shadow_host: ShadowHost | None = None,
    ) -> None:
        """`source` serves TUF metadata and models (default: `link`); `fault_point` is
        the test seam described above; `shadow_host` runs an assignment's shadow
        candidate (none: it fails as `unsupported`)."""
        self._settings = settings
        self._config = settings.updater
        self._files = files
        self._link = link
        self._source: RepositorySource = link if source is None else source
        self._clock = clock
        self._data_dir = Path(settings.data_dir)
        self._host = host
        self._shadow_host = shadow_host
        self._initial_model = settings.initial_model
        self._fault_point = fault_point
        self._journal = Journal(self._data_dir / JOURNAL_PATH, clock)
        self._store: ModelStore | None = None
        self._reconciler: Reconciler | None = None
        self._trust_problem: tuple[str, str] | None = None
        self._pending: SignedDirectorAssignment | None = None
        # An assignment refused because TUF metadata could not be had (control plane
        # unreachable, timestamp expired, untrusted metadata served) is tried again on its
        # own: (assignment, when, attempts so far). A newer assignment replaces it.
        self._retry_policy = settings.retry
        self._retry: tuple[SignedDirectorAssignment, float, int] | None = None
        self._wake = anyio.Event()
        self._watch: _Watch | None = None
        self._journal_retry: tuple[float, int] | None = None  # (when, attempts so far)
        self._last_status: link_pb2.NodeMessage | None = None
        self.applied = 0
        """Assignments taken through `Reconciler.apply` (any outcome)."""

    # ------------------------------------------------------------------ agent seams

    @property
    def reconciler(self) -> Reconciler:
        if self._reconciler is None:
            raise RuntimeError("UpdateTask.start() has not run")
        return self._reconciler

    def running(self) -> RunningState:
        """What the node runs, for its Hello (empty before `start()`)."""
        state = None if self._reconciler is None else self._reconciler.state
        if state is None:
            return RunningState()
        installed = tuple(ref.path for ref in (state.active, state.previous) if ref is not None)
        return RunningState(
            "" if state.active is None else state.active.path,
            installed,
            state.director_sequence,
        )

    def hello(self) -> link_pb2.Hello:
        """The node's Hello: its agent version and what it runs (`running()`)."""
        running = self.running()
        hello = link_pb2.Hello(
            agent_version=self._settings.agent_version,
            active_target=running.active_target,
            director_sequence=running.director_sequence,
        )
        hello.installed_targets.extend(running.installed_targets)
        return hello

    def shadow_report(self) -> dict[str, Any] | None:
        """The health report's `shadow` section (None: no candidate assigned)."""
        return None if self._reconciler is None else self._reconciler.shadow.report()

    @property
    def retry_pending(self) -> bool:
        """Whether a refused assignment waits to be tried again (see `METADATA_RETRY`)."""
        return self._retry is not None

    async def on_control(self, message: link_pb2.ControlMessage) -> None:
        """Take a DesiredState (never blocks: the uplink's receive loop calls this).

        The command `pull-desired` (an MQTT doorbell without the assignment) is answered
        with a fresh Hello, which the control plane answers with the node's current
        assignment; then the last status again, since a Hello resets it upstream.
        """
        kind = message.WhichOneof("body")
        if kind == "command" and message.command.name == PULL_DESIRED:
            await self._send(node_message(hello=self.hello()))
            if self._last_status is not None:
                await self._send(self._last_status)
            return
        if kind != "desired" or not message.desired.HasField("assignment"):
            return
        replaced = self._pending is not None
        self._pending = message.desired.assignment
        self._retry = None  # the new assignment (or this one again) is applied now
        self._wake.set()
        if replaced:
            log.info("a newer assignment replaces one that was still waiting")

    async def on_connect(self) -> None:
        """The link (re)connected and its Hello reset the control plane's view of this
        node: send the last update status again."""
        if self._last_status is not None:
            await self._send(self._last_status)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> JournalState:
        """Recover the journal and serve its active model (or `initial_model`)."""
        loop = asyncio.get_running_loop()
        self._store = store = await anyio.to_thread.run_sync(
            ModelStore, self._data_dir / MODELS_DIR
        )
        director_keys = self._director_keys()
        tuf = TufClient(
            self._source,
            loop,
            metadata_dir=self._data_dir / TUF_DIR,
            trusted_root=self._files.tuf_root_path,
        )
        config = self._config
        self._reconciler = reconciler = Reconciler(
            journal=self._journal,
            store=store,
            source=self._source,
            tuf_client_factory=tuf.refresh,
            cached_view=tuf.cached_view,
            trust=AssignmentTrust(self._files.node_id, self._files.fleet, director_keys),
            clock=self._clock,
            selftest=self._self_test,
            host=_FaultingHost(self._host, self._fault),
            report=self._step_reported,
            shadow_host=self._shadow_host,
            limits=ReconcilerLimits(
                max_artifact_bytes=config.max_artifact_bytes,
                space_margin_bytes=config.space_margin_bytes,
                max_attempts=config.max_attempts,
                retry_backoff=self._retry_policy,
                watchdog_s=config.watchdog.window_s,
                max_sequence_jump=config.max_sequence_jump,
            ),
        )
        try:
            state = await reconciler.resume_after_crash()
        except JournalCorruptError as exc:
            # A copy is kept beside it. Starting empty costs a re-download of what the
            # director assigns; refusing to start would leave the box unmanageable.
            log.error("%s; starting with an empty journal", exc.message)
            await anyio.to_thread.run_sync(self._journal.save, JournalState())
            await self._report(
                UpdateReport(UpdatePhase.FAILED, reason="journal-corrupt", detail=exc.message)
            )
            state = await reconciler.resume_after_crash()
        return await self._serve_at_start(state)

    async def run(self, stop: anyio.Event) -> None:
        """Apply assignments one at a time and run the watchdog, until `stop`."""
        if self._reconciler is None:
            await self.start()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._wake_on, stop)
                await self._serve(stop)
                group.cancel_scope.cancel()
        finally:
            if self._watch is not None:
                # A stop is not the model's fault: the next start watches it again.
                with anyio.CancelScope(shield=True):
                    await self.reconciler.pause_probation()

    # ------------------------------------------------------------------ internals

    async def _wake_on(self, stop: anyio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _serve(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            await self._flush_journal_when_due()
            signed, self._pending = self._pending, None
            attempts = 0
            if signed is None and self._retry is not None:
                again, due, tried = self._retry
                if self._clock.monotonic() >= due:
                    signed, attempts, self._retry = again, tried, None
            if signed is not None:
                await self._apply(signed, attempts)
                await self._check_watch()
                continue
            await self._wait_for_wake(self._next_wait())
            self._wake = anyio.Event()
            if not stop.is_set():
                await self._check_watch()

    async def _flush_journal_when_due(self) -> None:
        """A journal write held in memory (a full disk): try it again on its backoff."""
        reconciler = self.reconciler
        if not reconciler.journal_pending:
            self._journal_retry = None
            return
        now = self._clock.monotonic()
        if self._journal_retry is None:
            self._journal_retry = (now + JOURNAL_RETRY.delay(0), 1)
            return
        due, tried = self._journal_retry
        if now < due:
            return
        if await reconciler.flush_journal():
            self._journal_retry = None
            log.info("the update journal is written again")
            state = reconciler.state
            if state is not None and state.active is not None and self._retry is None:
                await self._report(
                    UpdateReport(
                        UpdatePhase.ACTIVE,
                        state.active.path,
                        state.director_sequence,
                        detail="the update journal is written again",
                    )
                )
        else:
            self._journal_retry = (now + JOURNAL_RETRY.delay(tried), tried + 1)

    async def _wait_for_wake(self, seconds: float) -> None:
        """Until `on_control` or the stop wakes the task, or `seconds` pass on the clock."""
        wake = self._wake
        async with anyio.create_task_group() as group:

            async def timeout() -> None:
                await self._clock.sleep(seconds)
                group.cancel_scope.cancel()

            group.start_soon(timeout)
            await wake.wait()
            group.cancel_scope.cancel()

    def _next_wait(self) -> float:
        now = self._clock.monotonic()
        wait = _IDLE_WAIT_S
        if self._retry is not None:
            wait = min(wait, self._retry[1] - now)
        if self._journal_retry is not None:
            wait = min(wait, self._journal_retry[0] - now)
        elif self._reconciler is not None and self._reconciler.journal_pending:
            wait = 0.0  # schedule its first retry now
        watch = self._watch
        if watch is not None:
            wait = min(wait, self._config.watchdog.poll_s, watch.deadline - now)
        return max(0.0, wait)

    async def _apply(self, signed: SignedDirectorAssignment, attempts: int = 0) -> None:
        self.applied += 1
        if self._trust_problem is not None:
            reason, detail = self._trust_problem
            await self._report(UpdateReport(UpdatePhase.FAILED, reason=reason, detail=detail))
            return
        before = self.running()
        try:
            outcome = await self.reconciler.apply(signed)
        except StorageError as exc:  # the journal cannot even be read: never fatal
            log.error("update journal unusable: %s", exc.message)
            outcome = Outcome(OutcomeKind.REJECTED, "storage-error")
            await self._report(
                UpdateReport(UpdatePhase.FAILED, reason="storage-error", detail=exc.message)
            )
        _log_outcome(outcome)
        if outcome.kind is OutcomeKind.APPLIED and outcome.target is not None:
            self._arm_watch(outcome.target)
        if self._pending is not None:
            return await self._announce(before)  # a newer assignment came meanwhile: it wins
        if outcome.kind is OutcomeKind.REJECTED and outcome.reason in RETRIED_REFUSALS:
            delay = self._retry_policy.delay(attempts)
            self._retry = (signed, self._clock.monotonic() + delay, attempts + 1)
            log.info("assignment refused (%s); trying again in %.1fs", outcome.reason, delay)
        elif outcome.retry_at is not None:
            delay = max(0.0, (outcome.retry_at - self._clock.now()).total_seconds())
            self._retry = (signed, self._clock.monotonic() + delay, attempts + 1)
            log.info(
                "%s of %s will be retried in %.1fs (%s)",
                "the update" if outcome.kind is OutcomeKind.DEFERRED else "the failed update",
                "-" if outcome.target is None else outcome.target.path,
                delay,
                outcome.reason,
            )
        await self._announce(before)

    def _arm_watch(self, target: ModelRef) -> None:
        watchdog = self._config.watchdog
        if not watchdog.enabled:
            return
        model = str(self.reconciler.store.path_of(target.sha256))
        health = self._host.health()
        baseline = health if health is not None and health.model == model else None
        self._watch = _Watch(
            target,
            model,
            baseline or ModelHealth(model, 0, 0),
            self._clock.monotonic() + watchdog.window_s,
        )
        log.info("watching %s for %.0fs", target.path, watchdog.window_s)

    async def _check_watch(self) -> None:
        watch = self._watch
        if watch is None:
            return
        health = self._host.health()
        if health is not None and health.model == watch.model:
            verdict = judge(watch.baseline, health, self._config.watchdog)
            if verdict is not None:
                self._watch = None
                log.warning("watchdog: %s fails (%s); reverting", watch.target.path, verdict.detail)
                before = self.running()
                try:
                    outcome = await self.reconciler.revert_active(
                        watch.target, verdict.reason, verdict.detail
                    )
                except StorageError as exc:  # the journal cannot be read: judged again
                    log.error("cannot revert %s now: %s", watch.target.path, exc.message)
                    self._watch = watch
                    return
                _log_outcome(outcome)
                await self._announce(before)
                return
        if self._clock.monotonic() >= watch.deadline:
            self._watch = None
            try:
                await self.reconciler.end_probation(watch.target)
            except StorageError as exc:  # the journal cannot be read: ended at the next poll
                log.error("cannot end the watch of %s now: %s", watch.target.path, exc.message)
                self._watch = watch
                return
            log.info("watchdog window of %s passed", watch.target.path)

    async def _serve_at_start(self, state: JournalState) -> JournalState:
        reconciler = self.reconciler
        active = state.active
        if active is None:
            if self._initial_model is not None:
                # The configured model (runtime.model_path) serves until an assignment
                # replaces it; it cannot load: fatal, as without the updater.
                await self._host.serve(ModelBundle.local(self._initial_model))
            return state
        try:
            bundle = await anyio.to_thread.run_sync(reconciler.bundle_of, active)
            await self._host.serve(bundle)
        except Exception as exc:
            log.error("cannot serve the active model %s: %s", active.path, exc)
            outcome = await reconciler.revert_active(
                active, "active-load-failed", f"{type(exc).__name__}: {exc}"
            )
            _log_outcome(outcome)
            if outcome.kind is OutcomeKind.REJECTED and self._initial_model is not None:
                # No previous model to go back to: serve the configured one rather than
                # nothing, until an assignment replaces it.
                try:
                    await self._host.serve(ModelBundle.local(self._initial_model))
                    log.warning("serving runtime.model_path %s instead", self._initial_model)
                except Exception as fallback:
                    log.error(
                        "runtime.model_path %s cannot serve either: %s",
                        self._initial_model,
                        fallback,
                    )
            return reconciler.state or state
        detail = "served again after a restart"
        if state.probation is not None:
            if self._config.watchdog.enabled:
                # A clean stop paused it: watch a full window again, also in the journal,
                # so that a process dying in this window blames the model again.
                state = await reconciler.watch_again(active)
                self._arm_watch(active)
                detail += f"; on watch for {self._config.watchdog.window_s:g}s again"
            else:
                state = await reconciler.end_probation(active)
        if self._last_status is None:
            # The control plane forgets a node's last status at its Hello: say what runs
            # (unless the recovery above reported something: that is the news).
            await self._report(
                UpdateReport(
                    UpdatePhase.ACTIVE, active.path, state.director_sequence, detail=detail
                )
            )
        return state

    def _director_keys(self) -> list[Key]:
        """The director key from enrollment; without it (or the TUF root) every
        assignment is refused with a clear status, and the node keeps what it runs."""
        if not self._files.tuf_root_path.is_file():
            self._trust_problem = (
                "no-tuf-root",
                f"{self._files.tuf_root_path} is missing: enroll the node again",
            )
            return []
        try:
            return [self._files.director_key()]
        except StorageError as exc:
            self._trust_problem = ("no-director-key", f"{exc.message}: enroll the node again")
            return []

    def _self_test(
        self, load: TrialLoader, reference: Path, atol: float, rtol: float
    ) -> SelfTestResult:
        return self_test(
            load,
            reference,
            atol=atol,
            rtol=rtol,
            latency_budget_s=self._config.selftest_latency_budget_s,
            memory_budget_bytes=self._settings.memory_budget_bytes,
            # CPU time when the host runs the trial at background priority
            monotonic=work_time,
        )

    async def _step_reported(self, report: UpdateReport) -> None:
        """The reconciler's report of a step (its journal write, if any, is done)."""
        await self._report(report, fault_point=True)

    async def _report(self, report: UpdateReport, *, fault_point: bool = False) -> None:
        level = logging.WARNING if report.phase in _BAD else logging.INFO
        log.log(
            level,
            "update %s %s (sequence %d): %s",
            report.phase.value,
            report.target_path or "-",
            report.sequence,
            report.text or "-",
        )
        at = Timestamp()
        at.FromDatetime(self._clock.now())
        message = node_message(
            update_status=link_pb2.UpdateStatus(
                target_path=report.target_path,
                phase=report.phase.value,
                detail=report.text[:_MAX_STATUS_DETAIL],
                director_sequence=report.sequence,
                at=at,
                reason=report.reason or "",
                facts=dict(report.facts),
            )
        )
        self._last_status = message
        if fault_point:
            self._fault(report.phase.value)
        await self._send(message)

    async def _announce(self, before: RunningState) -> None:
        """What the node runs changed: a Hello says so, then the last status again (the
        Hello resets it upstream)."""
        if self.running() == before:
            return
        await self._send(node_message(hello=self.hello()))
        if self._last_status is not None:
            await self._send(self._last_status)

    async def _send(self, message: link_pb2.NodeMessage) -> None:
        try:
            await self._link.send(message)
        except LinkError as exc:  # sent again after the next connect
            log.debug("update status not sent now (%s); resent on reconnect", exc.message)

    def _fault(self, name: str) -> None:
        if self._fault_point is not None:
            self._fault_point(name)


_BAD: Final = frozenset({UpdatePhase.FAILED, UpdatePhase.REVERTED})


def _log_outcome(outcome: Outcome) -> None:
    target = "-" if outcome.target is None else outcome.target.path
    log.info("update outcome %s for %s (%s)", outcome.kind.value, target, outcome.reason or "-")
