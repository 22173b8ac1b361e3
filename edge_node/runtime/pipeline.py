"""The inference pipeline: worker threads that run queued camera frames through the model.

What it is for: taking frames from the :class:`~edge_node.runtime.streams.Scheduler`,
decoding and preprocessing them with the *current* session's preprocessor, running the
session, decoding its outputs with the session's decoder (the version's signed output
decoder, ``raw`` without one), and handing an
:class:`~protos.bundle.results.InferenceResult` (the decoded result, named by model and
version, plus latency split into queue, preprocess, inference and decode time) to
``on_result`` — the results interface the aggregation consumes. Bad frames, failed runs
and outputs that do not decode (``decode_error``) are counted per stream and reason,
logged (rate-limited) and skipped; they never stop a worker.

Hot swap (:meth:`InferencePipeline.swap_session`): the next frame a worker picks up runs on
the new session; frames already running finish on the old one, which is closed when its last
in-flight frame is done (a reference count under a small lock). The preprocessor belongs to
the session, so a new version that needs a different input size or normalisation switches
both at the same instant. No frame is lost or run twice because of a swap.

What it is not for: deciding *when* to swap (the updater's self-test does), or the
decoders themselves (:mod:`protos.bundle.decoders`, shared with the operator's CLI).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Final

from edge_node.clock import Clock
from edge_node.errors import ClosedError, InvalidInputError
from edge_node.runtime.config import SchedulerConfig, StreamConfig
from edge_node.runtime.errors import BadFrameError, InferenceError
from edge_node.runtime.preprocess import FrameDecoder, decode_frame, default_decoder
from edge_node.runtime.session import ModelSession
from edge_node.runtime.streams import Frame, Scheduler, StreamCounters, StreamStats, SubmitOutcome
from edge_node.runtime.timing import SystemTicker, Ticker
from protos.bundle.results import InferenceResult

__all__ = [
    "FrameResult",
    "InferencePipeline",
    "ResultCallback",
    "SessionRetirement",
    "StopReport",
]

_log = logging.getLogger(__name__)

_LOG_EVERY: Final = 1000
"""After the first, log one in this many repeats of the same problem on the same stream."""


FrameResult = InferenceResult
"""What the pipeline hands ``on_result`` for each frame (seconds, monotonic): ``queue_s``
from admission to a worker picking it up; ``preprocess_s`` frame decode, resize,
normalise; ``inference_s`` ``InferenceSession.run``; ``decode_s`` the output decoder.
``model``/``version`` are the session's (``model_label`` is ``name@version``)."""

ResultCallback = Callable[[InferenceResult], None]


class SessionRetirement:
    """Returned by :meth:`InferencePipeline.swap_session`: done when the old session closed."""

    def __init__(self, session: ModelSession) -> None:
        self.session = session
        self._closed = threading.Event()

    @property
    def done(self) -> bool:
        return self._closed.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the retired session's in-flight frames finished and it was closed."""
        return self._closed.wait(timeout)

    def _mark_closed(self) -> None:
        self._closed.set()


@dataclass(frozen=True, slots=True)
class StopReport:
    """``drained``: every queued frame was served before the deadline; else ``discarded``
    were dropped (``dropped{shutdown}``) and ``workers_running`` still finish one frame each."""

    drained: bool
    discarded: int
    workers_running: int


class _Lease:
    """A session plus the frames running on it; closed once retired and idle."""

    __slots__ = ("closed", "inflight", "retired", "retirement", "session")

    def __init__(self, session: ModelSession) -> None:
        self.session = session
        self.inflight = 0
        self.retired = False
        self.closed = False
        self.retirement = SessionRetirement(session)


class _LogLimiter:
    """The first occurrence of a (stream, problem) pair, then one in ``every``."""

    def __init__(self, every: int = _LOG_EVERY) -> None:
        self._seen: Counter[tuple[str, str]] = Counter()
        self._every = every
        self._lock = threading.Lock()

    def should_log(self, stream: str, problem: str) -> bool:
        with self._lock:
            self._seen[(stream, problem)] += 1
            return (self._seen[(stream, problem)] - 1) % self._every == 0


class InferencePipeline:
    """Streams → scheduler → worker threads → model → ``on_result``. Use as a context manager
    or call :meth:`start` and :meth:`stop` (safe to call twice).

    ``on_result`` runs in a worker thread, after the session is released; it should be quick
    (hand the result to a queue). An exception from it is logged and counted
    (:attr:`callback_errors`), and the worker goes on.
    """

    def __init__(
        self,
        session: ModelSession,
        streams: Sequence[StreamConfig],
        clock: Clock,
        on_result: ResultCallback,
        *,
        scheduler_config: SchedulerConfig | None = None,
        workers: int = 1,
        ticker: Ticker | None = None,
        decoder: FrameDecoder | Callable[[], FrameDecoder | None] | None = default_decoder,
    ) -> None:
        if not 1 <= workers <= 64:
            raise InvalidInputError(f"workers must be in [1, 64], got {workers}", workers=workers)
        if session.closed:
            raise ClosedError(f"model session {session.label} is closed", label=session.label)
        self._ticker = ticker or SystemTicker()
        self._scheduler = Scheduler(
            streams, scheduler_config or SchedulerConfig(), clock=clock, ticker=self._ticker
        )
        self._counters: dict[str, StreamCounters] = {
            name: self._scheduler.counters(name) for name in self._scheduler.stream_names()
        }
        self._on_result = on_result
        self._decoder: FrameDecoder | None = decoder() if callable(decoder) else decoder
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._swap_lock = threading.Lock()
        self._current = _Lease(session)
        self._lifecycle_lock = threading.Lock()
        self._started = False
        self._stop_report: StopReport | None = None
        self._stopping = False
        self._log_limiter = _LogLimiter()
        self._callback_errors = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        with self._lifecycle_lock:
            if self._stop_report is not None:
                raise ClosedError("the pipeline was stopped; build a new one")
            if self._started:
                return
            self._started = True
            for index in range(self._workers):
                thread = threading.Thread(
                    target=self._work, name=f"edgefleet-infer-{index}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def stop(self, timeout_s: float = 5.0) -> StopReport:
        """Refuse new frames, serve what is queued until ``timeout_s``, then drop the rest.

        A frame already running cannot be interrupted; it finishes (and its result is
        delivered) after this returns if it outlives the deadline. The active session is
        closed once no frame runs on it. A second call returns the first call's report.
        """
        with self._lifecycle_lock:
            if self._stop_report is not None:
                return self._stop_report
            deadline = time.monotonic() + max(0.0, timeout_s)
            with self._swap_lock:
                self._stopping = True
            self._scheduler.close()
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            discarded = self._scheduler.discard_queued("shutdown")
            running = sum(t.is_alive() for t in self._threads)
            with self._swap_lock:
                lease = self._current
                lease.retired = True
                close_now = lease.inflight == 0 and not lease.closed
                if close_now:
                    lease.closed = True
            if close_now:
                self._close(lease)
            self._stop_report = StopReport(
                drained=discarded == 0, discarded=discarded, workers_running=running
            )
            if discarded or running:
                _log.warning(
                    "pipeline stopped after %.1f s: %d queued frames dropped, %d still running",
                    timeout_s,
                    discarded,
                    running,
                )
            return self._stop_report

    def __enter__(self) -> InferencePipeline:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- producers -------------------------------------------------------------------

    def submit(
        self, stream: str, frame: object, *, captured_at: datetime | None = None
    ) -> SubmitOutcome:
        """Hand one frame of ``stream`` over (never blocks on the model); see ``Scheduler``."""
        return self._scheduler.submit(stream, frame, captured_at=captured_at)

    # -- sessions --------------------------------------------------------------------

    @property
    def session(self) -> ModelSession:
        """The session the next frame will run on."""
        return self._current.session

    def swap_session(self, session: ModelSession) -> SessionRetirement:
        """Make ``session`` serve the next frame; retire (then close) the current one."""
        if session.closed:
            raise ClosedError(f"model session {session.label} is closed", label=session.label)
        with self._swap_lock:
            if self._stopping:
                raise ClosedError("the pipeline is stopping or stopped")
            old = self._current
            if old.session is session:
                raise InvalidInputError(f"model session {session.label} is already active")
            self._current = _Lease(session)
            old.retired = True
            close_now = old.inflight == 0
            if close_now:
                old.closed = True
        _log.info("model swapped: %s -> %s", old.session.label, session.label)
        if close_now:
            self._close(old)
        return old.retirement

    def _acquire(self) -> _Lease:
        with self._swap_lock:
            lease = self._current
            lease.inflight += 1
            return lease

    def _release(self, lease: _Lease) -> None:
        with self._swap_lock:
            lease.inflight -= 1
            close_now = lease.retired and lease.inflight == 0 and not lease.closed
            if close_now:
                lease.closed = True
        if close_now:
            self._close(lease)

    def _close(self, lease: _Lease) -> None:
        lease.session.close()
        lease.retirement._mark_closed()
        _log.info("model session %s closed", lease.session.label)

    # -- workers ---------------------------------------------------------------------

    def _work(self) -> None:
        next_frame = self._scheduler.next_frame
        while True:
            frame = next_frame()
            if frame is None:
                return
            try:
                self._serve(frame)
            except Exception:  # a bug must cost one frame, not every camera on the box
                self._counters[frame.stream].count_failed("internal_error")
                _log.exception("internal error serving %s frame %d", frame.stream, frame.frame_id)

    def _serve(self, frame: Frame) -> None:
        ticker = self._ticker
        picked = ticker.monotonic()
        counters = self._counters[frame.stream]
        lease = self._acquire()
        try:
            session = lease.session
            try:
                image = decode_frame(frame.data, self._decoder)
                batch = session.preprocessor(image, reuse=True)
            except BadFrameError as exc:
                counters.count_bad(exc.reason)
                if self._log_limiter.should_log(frame.stream, f"bad:{exc.reason}"):
                    _log.warning("skipping %s frame %d: %s", frame.stream, frame.frame_id, exc)
                return
            prepared = ticker.monotonic()
            try:
                outputs = session.run(batch)
            except InferenceError as exc:
                counters.count_failed("inference_error")
                if self._log_limiter.should_log(frame.stream, "inference_error"):
                    _log.error("%s frame %d: %s", frame.stream, frame.frame_id, exc)
                return
            finished = ticker.monotonic()
        finally:
            self._release(lease)
        try:  # the decoder is the session's but needs no ONNX Runtime: off the lease
            decoded = session.decode(outputs, image.shape[0], image.shape[1])
        except Exception as exc:  # outputs the version's decoder cannot read, or its bug
            counters.count_failed("decode_error")
            if self._log_limiter.should_log(frame.stream, "decode_error"):
                _log.error(
                    "%s frame %d: %s outputs do not decode: %s",
                    frame.stream,
                    frame.frame_id,
                    session.label,
                    exc,
                )
            return
        decoded_at = ticker.monotonic()
        counters.count_processed()
        result = InferenceResult(
            stream=frame.stream,
            frame_id=frame.frame_id,
            captured_at=frame.captured_at,
            model=session.model,
            version=session.version,
            decoded=decoded,
            queue_s=picked - frame.enqueued_at,
            preprocess_s=prepared - picked,
            inference_s=finished - prepared,
            decode_s=decoded_at - finished,
        )
        try:
            self._on_result(result)
        except Exception:  # the aggregation input's failure must not stop inference
            with self._swap_lock:
                self._callback_errors += 1
            if self._log_limiter.should_log(frame.stream, "on_result"):
                _log.exception(
                    "result callback failed for %s frame %d", frame.stream, frame.frame_id
                )

    # -- telemetry -------------------------------------------------------------------

    @property
    def callback_errors(self) -> int:
        return self._callback_errors

    def stats(self) -> dict[str, StreamStats]:
        """Per-stream counters (see :class:`~edge_node.runtime.streams.StreamStats`)."""
        return self._scheduler.stats()

    def backlog(self) -> int:
        return self._scheduler.backlog()
