"""The inference pipeline: threads that run queued camera frames through the model.

What it is for: taking frames from the :class:`~edge_node.runtime.streams.Scheduler`,
decoding and preprocessing them with the *current* session's preprocessor, running the
session, decoding its outputs with the session's decoder (the version's signed output
decoder, ``raw`` without one), and handing an
:class:`~protos.bundle.results.InferenceResult` (the decoded result, named by model and
version, plus latency split into queue, preprocess, inference and decode time) to
``on_result`` — the results interface the aggregation consumes. Bad frames, failed runs
and outputs that do not decode (``decode_error``) are counted per stream and reason,
logged (rate-limited) and skipped; they never stop a thread.

Stages (``preprocess_threads``, ADR 0027): with 0, each inference worker decodes,
preprocesses and runs its frame in turn (one core does it all). With N > 0, N preprocess
threads take frames from the scheduler, decode them (at reduced size where the model's input
is smaller, see :class:`~edge_node.runtime.preprocess.DecodeTarget`) and preprocess them
into a small bounded hand-off; the inference workers only run prepared tensors, so on a
multi-core box decoding the next frame overlaps with running this one. The hand-off holds
at most ``max(workers, preprocess_threads)`` frames *counting those being prepared*: a
preprocess thread takes a frame from the scheduler only once a slot is free, so frames wait
in the scheduler's queues (where latest-frame-wins and shedding apply), not as stale
tensors, and latency does not grow. ``queue_s`` is the wait in the scheduler plus the wait
in the hand-off.

Hot swap (:meth:`InferencePipeline.swap_session`): the next frame picked up is prepared and
run on the new session; a frame already picked up — being prepared, waiting in the hand-off,
or running — finishes on the session it was prepared for, which is closed when its last such
frame is done (a reference count under a small lock). The preprocessor belongs to the
session, so a new version that needs a different input size or normalisation switches both
at the same instant, and a tensor never reaches a session it was not made for. No frame is
lost or run twice because of a swap.

Tap (:meth:`InferencePipeline.set_tap`): after a frame's result went to ``on_result``,
the worker hands the frame, the session's raw outputs, its decoded result and the
session's label to the tap, if one is set: the shadow stage's
:meth:`~edge_node.runtime.shadow.ShadowRunner.offer`, which must return at once (it
samples, and drops what it has no room for). A tap that raises is counted with the
callback errors; it never costs a frame.

What it is not for: deciding *when* to swap (the updater's self-test does), or the
decoders themselves (:mod:`protos.bundle.decoders`, shared with the operator's CLI).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final

import numpy.typing as npt

from edge_node.clock import Clock
from edge_node.errors import ClosedError, InvalidInputError
from edge_node.runtime.config import SchedulerConfig, StreamConfig
from edge_node.runtime.errors import BadFrameError, InferenceError
from edge_node.runtime.preprocess import (
    DecodeTarget,
    FrameData,
    FrameDecoder,
    decode_frame,
    default_decoder,
)
from edge_node.runtime.session import ModelSession
from edge_node.runtime.streams import Frame, Scheduler, StreamCounters, StreamStats, SubmitOutcome
from edge_node.runtime.timing import SystemTicker, Ticker
from protos.bundle.results import Decoded, InferenceResult

__all__ = [
    "FrameResult",
    "FrameTap",
    "InferencePipeline",
    "ResultCallback",
    "SessionRetirement",
    "StopReport",
]

_log = logging.getLogger(__name__)

_LOG_EVERY: Final = 1000
"""After the first, log one in this many repeats of the same problem on the same stream."""
MAX_PREPROCESS_THREADS: Final = 64


FrameResult = InferenceResult
"""What the pipeline hands ``on_result`` for each frame (seconds, monotonic): ``queue_s``
from admission to a thread picking it up, plus (staged pipeline) the wait between its
tensor being ready and an inference worker taking it; ``preprocess_s`` frame decode, resize,
normalise; ``inference_s`` ``InferenceSession.run``; ``decode_s`` the output decoder.
``model``/``version`` are the session's (``model_label`` is ``name@version``)."""

ResultCallback = Callable[[InferenceResult], None]
FrameTap = Callable[[FrameData, Mapping[str, npt.NDArray[Any]], Decoded, str], None]
"""(frame data, the session's outputs, its decoded result, its label) of a served frame."""


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
    (queued, or prepared and waiting) were dropped (``dropped{shutdown}``) and
    ``workers_running`` threads (preprocess or inference) still finish one frame each."""

    drained: bool
    discarded: int
    workers_running: int


class _Lease:
    """A session plus the frames picked up for it (being prepared, handed off or running);
    closed once retired and idle."""

    __slots__ = ("closed", "decode_target", "inflight", "retired", "retirement", "session")

    def __init__(self, session: ModelSession) -> None:
        self.session = session
        self.decode_target = DecodeTarget.of(session.preprocessor)
        self.inflight = 0
        self.retired = False
        self.closed = False
        self.retirement = SessionRetirement(session)


@dataclass(slots=True)
class _Prepared:
    """One frame, preprocessed for ``lease``'s session (which it holds), with its times.

    ``image_size`` is the decoded image's (height, width): the camera's, or less when a
    JPEG was decoded at reduced size (the same picture, so normalised coordinates hold)."""

    frame: Frame
    lease: _Lease
    batch: npt.NDArray[Any]
    image_size: tuple[int, int]
    picked: float
    prepared: float


class _HandOff:
    """The bounded hand-off between the preprocess threads and the inference workers.

    ``capacity`` counts frames being prepared as well as ready ones: a preprocess thread
    reserves a slot before it takes a frame from the scheduler, and a worker frees it when
    it takes the frame. At stop, once the last producer is done, workers get ``None`` after
    the last frame; past the deadline :meth:`discard` empties it and refuses new
    reservations (a frame being prepared is still delivered).
    """

    def __init__(self, capacity: int, producers: int) -> None:
        self._capacity = capacity
        self._producers = producers
        self._reserved = 0
        self._items: deque[_Prepared] = deque()
        self._discarding = False
        self._changed = threading.Condition(threading.Lock())

    def reserve(self) -> bool:
        """Wait for a free slot and take it; ``False`` once discarding (stop past deadline)."""
        with self._changed:
            while self._reserved >= self._capacity and not self._discarding:
                self._changed.wait()
            if self._discarding:
                return False
            self._reserved += 1
            return True

    def cancel(self) -> None:
        """Give back a reserved slot that no frame will fill."""
        with self._changed:
            self._reserved -= 1
            self._changed.notify_all()

    def put(self, item: _Prepared) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    def take(self) -> _Prepared | None:
        """The oldest ready frame; ``None`` once every producer is done and nothing is left."""
        with self._changed:
            while not self._items:
                if self._producers == 0:
                    return None
                self._changed.wait()
            self._reserved -= 1
            self._changed.notify_all()
            return self._items.popleft()

    def producer_done(self) -> None:
        with self._changed:
            self._producers -= 1
            self._changed.notify_all()

    def ready(self) -> int:
        with self._changed:
            return len(self._items)

    def discard(self) -> list[_Prepared]:
        with self._changed:
            self._discarding = True
            items = list(self._items)
            self._items.clear()
            self._reserved -= len(items)
            self._changed.notify_all()
            return items


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
    """Streams → scheduler → [preprocess threads → hand-off →] inference workers → model →
    ``on_result``. Use as a context manager or call :meth:`start` and :meth:`stop` (safe to
    call twice).

    ``workers`` inference threads; ``preprocess_threads`` decode/preprocess threads in front
    of them (0: the workers do it inline; see the module docstring). ``on_result`` runs in a
    worker thread, after the session is released; it should be quick (hand the result to a
    queue). An exception from it is logged and counted (:attr:`callback_errors`), and the
    worker goes on.
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
        preprocess_threads: int = 0,
        ticker: Ticker | None = None,
        decoder: FrameDecoder | Callable[[], FrameDecoder | None] | None = default_decoder,
    ) -> None:
        if not 1 <= workers <= 64:
            raise InvalidInputError(f"workers must be in [1, 64], got {workers}", workers=workers)
        if not 0 <= preprocess_threads <= MAX_PREPROCESS_THREADS:
            raise InvalidInputError(
                f"preprocess_threads must be in [0, {MAX_PREPROCESS_THREADS}], "
                f"got {preprocess_threads}",
                preprocess_threads=preprocess_threads,
            )
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
        self._preprocess_threads = preprocess_threads
        self._handoff = (
            _HandOff(max(workers, preprocess_threads), producers=preprocess_threads)
            if preprocess_threads
            else None
        )
        self._threads: list[threading.Thread] = []
        self._swap_lock = threading.Lock()
        self._current = _Lease(session)
        self._lifecycle_lock = threading.Lock()
        self._started = False
        self._stop_report: StopReport | None = None
        self._stopping = False
        self._log_limiter = _LogLimiter()
        self._callback_errors = 0
        self._tap: FrameTap | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        with self._lifecycle_lock:
            if self._stop_report is not None:
                raise ClosedError("the pipeline was stopped; build a new one")
            if self._started:
                return
            self._started = True
            handoff = self._handoff
            targets: list[tuple[str, Callable[[], None]]] = []
            if handoff is None:
                targets += [
                    (f"edgefleet-infer-{i}", self._work_inline) for i in range(self._workers)
                ]
            else:
                targets += [
                    (f"edgefleet-prep-{i}", lambda: self._work_preprocess(handoff))
                    for i in range(self._preprocess_threads)
                ]
                targets += [
                    (f"edgefleet-infer-{i}", lambda: self._work_infer(handoff))
                    for i in range(self._workers)
                ]
            for name, target in targets:
                thread = threading.Thread(target=target, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()

    def stop(self, timeout_s: float = 5.0) -> StopReport:
        """Refuse new frames, serve what is queued until ``timeout_s``, then drop the rest.

        Past the deadline the frames still queued, and those prepared but not yet running,
        are dropped (``dropped{shutdown}``). A frame already being prepared or running
        cannot be interrupted; it finishes (and its result is delivered) after this returns.
        The active session is closed once no frame is left on it. A second call returns the
        first call's report.
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
            if self._handoff is not None:
                for item in self._handoff.discard():
                    self._counters[item.frame.stream].count_dropped("shutdown")
                    self._release(item.lease)
                    discarded += 1
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

    def set_tap(self, tap: FrameTap | None) -> None:
        """Hand every served frame to `tap` from now on (None: to nothing)."""
        self._tap = tap

    @property
    def tap(self) -> FrameTap | None:
        return self._tap

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

    # -- threads ---------------------------------------------------------------------

    def _work_inline(self) -> None:
        """``preprocess_threads=0``: pick, prepare and run each frame in this thread."""
        next_frame = self._scheduler.next_frame
        while True:
            frame = next_frame()
            if frame is None:
                return
            try:
                item = self._prepare(frame, reuse=True)
                if item is not None:
                    self._infer(item)
            except Exception:  # a bug must cost one frame, not every camera on the box
                self._internal_error(frame)

    def _work_preprocess(self, handoff: _HandOff) -> None:
        """Staged: take a frame once a hand-off slot is free, prepare it, hand it off."""
        next_frame = self._scheduler.next_frame
        try:
            while handoff.reserve():
                frame = next_frame()
                if frame is None:
                    handoff.cancel()
                    return
                item: _Prepared | None = None
                try:
                    # A fresh tensor per frame: it is run by another thread while this one
                    # prepares the next.
                    item = self._prepare(frame, reuse=False)
                except Exception:
                    self._internal_error(frame)
                if item is None:
                    handoff.cancel()
                else:
                    handoff.put(item)
        finally:
            handoff.producer_done()

    def _work_infer(self, handoff: _HandOff) -> None:
        """Staged: run prepared tensors on the session they were prepared for."""
        while True:
            item = handoff.take()
            if item is None:
                return
            try:
                self._infer(item)
            except Exception:
                self._internal_error(item.frame)

    def _internal_error(self, frame: Frame) -> None:
        self._counters[frame.stream].count_failed("internal_error")
        _log.exception("internal error serving %s frame %d", frame.stream, frame.frame_id)

    def _prepare(self, frame: Frame, *, reuse: bool) -> _Prepared | None:
        """Decode and preprocess ``frame`` for the current session, which it now holds
        (released by :meth:`_infer`); ``None`` (counted, released) for a bad frame."""
        ticker = self._ticker
        picked = ticker.monotonic()
        lease = self._acquire()
        try:
            session = lease.session
            image = decode_frame(frame.data, self._decoder, lease.decode_target)
            batch = session.preprocessor(image, reuse=reuse)
        except BadFrameError as exc:
            self._release(lease)
            self._counters[frame.stream].count_bad(exc.reason)
            if self._log_limiter.should_log(frame.stream, f"bad:{exc.reason}"):
                _log.warning("skipping %s frame %d: %s", frame.stream, frame.frame_id, exc)
            return None
        except BaseException:
            self._release(lease)
            raise
        height, width = image.shape[:2]
        return _Prepared(frame, lease, batch, (height, width), picked, ticker.monotonic())

    def _infer(self, item: _Prepared) -> None:
        """Run ``item`` on the session it was prepared for, release it, report the result."""
        frame, lease = item.frame, item.lease
        counters = self._counters[frame.stream]
        ticker = self._ticker
        try:
            started = ticker.monotonic()
            try:
                outputs = lease.session.run(item.batch)
            except InferenceError as exc:
                counters.count_failed("inference_error")
                if self._log_limiter.should_log(frame.stream, "inference_error"):
                    _log.error("%s frame %d: %s", frame.stream, frame.frame_id, exc)
                return
            finished = ticker.monotonic()
        finally:
            self._release(lease)
        try:  # the decoder is the session's but needs no ONNX Runtime: off the lease
            decoded = lease.session.decode(outputs, item.image_size[0], item.image_size[1])
        except Exception as exc:  # outputs the version's decoder cannot read, or its bug
            counters.count_failed("decode_error")
            if self._log_limiter.should_log(frame.stream, "decode_error"):
                _log.error(
                    "%s frame %d: %s outputs do not decode: %s",
                    frame.stream,
                    frame.frame_id,
                    lease.session.label,
                    exc,
                )
            return
        decoded_at = ticker.monotonic()
        counters.count_processed()
        self._emit(item, decoded, started, finished, decoded_at)
        tap = self._tap
        if tap is not None:
            try:
                tap(frame.data, outputs, decoded, lease.session.label)
            except Exception:  # the shadow's failure must not stop inference
                with self._swap_lock:
                    self._callback_errors += 1
                if self._log_limiter.should_log(frame.stream, "tap"):
                    _log.exception("frame tap failed for %s frame %d", frame.stream, frame.frame_id)

    def _emit(
        self,
        item: _Prepared,
        decoded: Decoded,
        started: float,
        finished: float,
        decoded_at: float,
    ) -> None:
        """Build the frame's result and hand it to ``on_result``: the one place a result is
        made. ``started``/``finished`` bracket ``session.run``."""
        frame = item.frame
        session = item.lease.session
        result = InferenceResult(
            stream=frame.stream,
            frame_id=frame.frame_id,
            captured_at=frame.captured_at,
            model=session.model,
            version=session.version,
            decoded=decoded,
            queue_s=(item.picked - frame.enqueued_at) + (started - item.prepared),
            preprocess_s=item.prepared - item.picked,
            inference_s=finished - started,
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
        """Frames queued in the scheduler (not yet picked up)."""
        return self._scheduler.backlog()

    def prepared_frames(self) -> int:
        """Frames preprocessed and waiting for an inference worker (always 0 inline)."""
        return self._handoff.ready() if self._handoff is not None else 0
