"""Camera streams in front of the model: admission, bounded queues, priorities and shedding.

What it is for: deciding, for every frame a camera hands in, whether it is queued or dropped,
and in which order queued frames reach the model — with every frame that does not reach it
counted per stream and reason. Pure bookkeeping over numpy arrays: no ONNX Runtime, no I/O.

Admission (``Scheduler.submit``, in the camera's thread), in this order:

1. the frame is checked (shape, dtype, size): a bad one is counted ``bad{reason}``;
2. :class:`FrameRateLimiter`: a frame that comes sooner than the stream's target FPS allows
   is ``dropped{rate}``;
3. :class:`MotionFilter` (optional): a frame that barely differs from the last kept one is
   ``skipped{no_motion}``; encoded (JPEG) frames are not decoded here and always pass;
4. :class:`FrameQueue`: bounded, latest-frame-wins — when full, its oldest frame is
   ``dropped{queue_full}``;
5. the backlog bound (``SchedulerConfig.max_backlog_frames``): over it, the oldest frame of
   the lowest-priority stream holding frames is ``dropped{shed}``.

Service (``Scheduler.next_frame``, in a worker thread): the highest priority first,
round-robin among streams of one priority. While a frame is served, lower-priority frames
that have waited longer than ``shed_after_s`` are ``dropped{shed}``: the box is saturated,
and they would only be served stale. So under saturation low-priority streams lose frames
first, and a single-priority box never sheds (latest-frame-wins bounds its queues).

Frames are not copied: a producer hands its array over and must not write to it afterwards.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from edge_node.clock import Clock
from edge_node.errors import InvalidInputError
from edge_node.runtime.config import SchedulerConfig, StreamConfig
from edge_node.runtime.errors import BadFrameError
from edge_node.runtime.preprocess import FrameData, check_frame
from edge_node.runtime.timing import Ticker

__all__ = [
    "Frame",
    "FrameQueue",
    "FrameRateLimiter",
    "MotionFilter",
    "Scheduler",
    "StreamCounters",
    "StreamStats",
    "SubmitOutcome",
    "total_dropped",
]

SubmitStatus = Literal["queued", "dropped", "skipped", "bad"]

_MOTION_SAMPLE_SIDE: Final = 96
_LUMA: Final = np.array([0.299, 0.587, 0.114], dtype=np.float32)


@dataclass(frozen=True, slots=True)
class Frame:
    """One admitted frame. ``enqueued_at`` is on the scheduler's ticker (monotonic seconds)."""

    stream: str
    frame_id: int
    captured_at: datetime
    data: FrameData
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """What became of a submitted frame at admission; ``reason`` is its counter label."""

    stream: str
    frame_id: int
    status: SubmitStatus
    reason: str | None = None

    @property
    def queued(self) -> bool:
        return self.status == "queued"


@dataclass(frozen=True, slots=True)
class StreamStats:
    """A consistent snapshot of one stream's counters.

    ``submitted = accepted + dropped{rate,stopped} + skipped + bad-at-admission``, and every
    accepted frame ends as exactly one of processed, ``dropped{queue_full,shed,shutdown}``,
    a ``bad`` frame found by the worker (corrupt bytes), ``failed``, or is still queued or
    in flight.
    """

    stream: str
    submitted: int
    accepted: int
    processed: int
    dropped: Mapping[str, int]
    skipped: Mapping[str, int]
    bad: Mapping[str, int]
    failed: Mapping[str, int]
    queued: int

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


@dataclass
class StreamCounters:
    """Per-stream counts by outcome and reason. Thread-safe; the runtime's telemetry source."""

    stream: str
    submitted: int = 0
    accepted: int = 0
    processed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    bad: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_submitted(self) -> None:
        with self._lock:
            self.submitted += 1

    def count_accepted(self) -> None:
        with self._lock:
            self.accepted += 1

    def count_processed(self) -> None:
        with self._lock:
            self.processed += 1

    def count_dropped(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.dropped[reason] += n

    def count_skipped(self, reason: str) -> None:
        with self._lock:
            self.skipped[reason] += 1

    def count_bad(self, reason: str) -> None:
        with self._lock:
            self.bad[reason] += 1

    def count_failed(self, reason: str) -> None:
        with self._lock:
            self.failed[reason] += 1

    def snapshot(self, queued: int = 0) -> StreamStats:
        with self._lock:
            return StreamStats(
                stream=self.stream,
                submitted=self.submitted,
                accepted=self.accepted,
                processed=self.processed,
                dropped=dict(self.dropped),
                skipped=dict(self.skipped),
                bad=dict(self.bad),
                failed=dict(self.failed),
                queued=queued,
            )


class FrameQueue:
    """A bounded, thread-safe FIFO where the newest frame wins.

    A put into a full queue evicts the oldest frame and counts it ``dropped{queue_full}``:
    for live video a fresh frame is worth more than an old one, and a producer must never
    block on a slow model.
    """

    def __init__(self, capacity: int, counters: StreamCounters) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.counters = counters
        self._frames: deque[Frame] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: Frame) -> Frame | None:
        """Append ``frame``; return the frame evicted to make room, if any (already counted)."""
        with self._lock:
            evicted = self._frames.popleft() if len(self._frames) >= self.capacity else None
            self._frames.append(frame)
        if evicted is not None:
            self.counters.count_dropped("queue_full")
        return evicted

    def pop(self) -> Frame | None:
        """The oldest frame, or ``None`` when empty."""
        with self._lock:
            return self._frames.popleft() if self._frames else None

    def oldest(self) -> Frame | None:
        with self._lock:
            return self._frames[0] if self._frames else None

    def drop_oldest(self, reason: str) -> Frame | None:
        """Remove the oldest frame and count it ``dropped{reason}``."""
        with self._lock:
            frame = self._frames.popleft() if self._frames else None
        if frame is not None:
            self.counters.count_dropped(reason)
        return frame

    def drop_older_than(self, cutoff: float, reason: str) -> int:
        """Drop (and count) every frame enqueued before ``cutoff``; return how many."""
        dropped = 0
        with self._lock:
            while self._frames and self._frames[0].enqueued_at < cutoff:
                self._frames.popleft()
                dropped += 1
        if dropped:
            self.counters.count_dropped(reason, dropped)
        return dropped

    def clear(self, reason: str) -> int:
        with self._lock:
            dropped = len(self._frames)
            self._frames.clear()
        if dropped:
            self.counters.count_dropped(reason, dropped)
        return dropped


class FrameRateLimiter:
    """Admits frames at most at ``target_fps``, on a fixed grid so the average rate holds.

    Frames due at ``t0, t0 + 1/fps, ...``; a frame up to ``slack`` (a fraction of the
    interval) early still counts for its slot, so a 30 FPS camera capped at 10 FPS gives 10,
    not 7.5, despite jitter. After a gap longer than one interval the grid restarts at the
    next admitted frame: a stream that paused does not get a burst to catch up.
    """

    def __init__(self, target_fps: float, *, slack: float = 0.25) -> None:
        if not math.isfinite(target_fps) or target_fps <= 0:
            raise ValueError(f"target_fps must be positive, got {target_fps}")
        if not 0 <= slack < 1:
            raise ValueError(f"slack must be in [0, 1), got {slack}")
        self.interval = 1.0 / target_fps
        self._slack = slack * self.interval
        self._next_due: float | None = None

    def admit(self, now: float) -> bool:
        due = self._next_due
        if due is not None and now < due - self._slack:
            return False
        on_grid = due is not None and now - due < self.interval
        self._next_due = (due if on_grid and due is not None else now) + self.interval
        return True


class MotionFilter:
    """Skips frames that did not change: mean absolute grey difference vs the last kept frame.

    The frame is subsampled to about ``sample_side`` pixels on its long side (a strided view:
    cheap enough for the camera's thread) and converted to grey. A frame whose difference
    from the last *kept* frame is below ``threshold`` grey levels is skipped, so a slow drift
    still gets through once it adds up. A change of frame size always passes.
    """

    def __init__(self, threshold: float, *, sample_side: int = _MOTION_SAMPLE_SIDE) -> None:
        if not 0 < threshold <= 255:
            raise ValueError(f"threshold must be in (0, 255], got {threshold}")
        self.threshold = threshold
        self._sample_side = sample_side
        self._reference: npt.NDArray[np.float32] | None = None
        self.last_difference: float | None = None

    def _signature(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        step = max(1, math.ceil(max(image.shape[0], image.shape[1]) / self._sample_side))
        sample = image[::step, ::step].astype(np.float32)
        grey: npt.NDArray[np.float32] = sample @ _LUMA
        return grey

    def changed(self, image: npt.NDArray[np.uint8]) -> bool:
        """``True`` (and this frame becomes the reference) when the frame should be kept."""
        signature = self._signature(image)
        reference = self._reference
        if reference is None or reference.shape != signature.shape:
            self._reference = signature
            self.last_difference = None
            return True
        difference = float(np.mean(np.abs(signature - reference)))
        self.last_difference = difference
        if difference < self.threshold:
            return False
        self._reference = signature
        return True


class _Stream:
    """One stream's admission state; ``lock`` serialises its producers."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.counters = StreamCounters(config.name)
        self.queue = FrameQueue(config.queue_size, self.counters)
        self.limiter = (
            FrameRateLimiter(config.target_fps) if config.target_fps is not None else None
        )
        self.motion = (
            MotionFilter(config.motion_threshold) if config.motion_threshold is not None else None
        )
        self.next_id = 0
        self.lock = threading.Lock()


class _Level:
    """The streams of one priority, served round-robin."""

    def __init__(self, priority: int, streams: list[_Stream]) -> None:
        self.priority = priority
        self.streams = streams
        self.cursor = 0

    def pick(self) -> Frame | None:
        count = len(self.streams)
        for offset in range(count):
            index = (self.cursor + offset) % count
            frame = self.streams[index].queue.pop()
            if frame is not None:
                self.cursor = (index + 1) % count
                return frame
        return None

    def backlog(self) -> int:
        return sum(len(s.queue) for s in self.streams)


class Scheduler:
    """Admits frames per stream and hands them to workers by priority. Thread-safe.

    Producers call :meth:`submit` (never blocks on the model); workers call
    :meth:`next_frame`. After :meth:`close` submits are counted ``dropped{stopped}`` and
    workers drain what is queued, then get ``None``.
    """

    def __init__(
        self,
        streams: Sequence[StreamConfig],
        config: SchedulerConfig,
        *,
        clock: Clock,
        ticker: Ticker,
    ) -> None:
        if not streams:
            raise InvalidInputError("the runtime needs at least one stream")
        names = [s.name for s in streams]
        if len(set(names)) != len(names):
            raise InvalidInputError("stream names must be unique", streams=names)
        self.config = config
        self._clock = clock
        self._ticker = ticker
        self._streams: dict[str, _Stream] = {s.name: _Stream(s) for s in streams}
        priorities = sorted({s.priority for s in streams}, reverse=True)
        self._levels = [
            _Level(p, [st for st in self._streams.values() if st.config.priority == p])
            for p in priorities
        ]  # highest priority first
        self._ready = threading.Condition(threading.Lock())
        self._waiting = 0  # workers blocked in next_frame: a submit wakes one only if any
        self._closed = False

    # -- producers -------------------------------------------------------------------

    def submit(
        self, stream: str, data: object, *, captured_at: datetime | None = None
    ) -> SubmitOutcome:
        """Admit one frame of ``stream`` (see the module docstring for the order of checks)."""
        state = self._streams.get(stream)
        if state is None:
            raise InvalidInputError(f"unknown stream {stream!r}", stream=stream)
        counters = state.counters
        with state.lock:
            frame_id = state.next_id
            state.next_id += 1
            counters.count_submitted()
            if self._closed:
                counters.count_dropped("stopped")
                return SubmitOutcome(stream, frame_id, "dropped", "stopped")
            try:
                checked = check_frame(data)
            except BadFrameError as exc:
                counters.count_bad(exc.reason)
                return SubmitOutcome(stream, frame_id, "bad", exc.reason)
            now = self._ticker.monotonic()
            if state.limiter is not None and not state.limiter.admit(now):
                counters.count_dropped("rate")
                return SubmitOutcome(stream, frame_id, "dropped", "rate")
            if (
                state.motion is not None
                and isinstance(checked, np.ndarray)
                and not state.motion.changed(checked)
            ):
                counters.count_skipped("no_motion")
                return SubmitOutcome(stream, frame_id, "skipped", "no_motion")
            frame = Frame(
                stream=stream,
                frame_id=frame_id,
                captured_at=captured_at if captured_at is not None else self._clock.now(),
                data=checked,
                enqueued_at=now,
            )
            with self._ready:
                if self._closed:  # closed while this frame was being checked
                    counters.count_dropped("stopped")
                    return SubmitOutcome(stream, frame_id, "dropped", "stopped")
                counters.count_accepted()
                state.queue.put(frame)
                self._enforce_backlog_locked()
                if self._waiting:
                    self._ready.notify()
        return SubmitOutcome(stream, frame_id, "queued")

    def _enforce_backlog_locked(self) -> None:
        limit = self.config.max_backlog_frames
        if limit is None:
            return
        excess = sum(level.backlog() for level in self._levels) - limit
        for level in reversed(self._levels):  # lowest priority first
            while excess > 0:
                victim = max(
                    (s for s in level.streams if len(s.queue)),
                    key=lambda s: (len(s.queue), -_head_enqueued_at(s)),  # longest, then oldest
                    default=None,
                )
                if victim is None:
                    break
                victim.queue.drop_oldest("shed")
                excess -= 1
            if excess <= 0:
                return

    # -- workers ---------------------------------------------------------------------

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        """The next frame to serve; ``None`` after ``timeout`` or once closed and drained."""
        with self._ready:
            while True:
                frame = self._pick_locked()
                if frame is not None:
                    return frame
                if self._closed:
                    return None
                self._waiting += 1
                try:
                    woken = self._ready.wait(timeout)
                finally:
                    self._waiting -= 1
                if not woken:
                    return None

    def _pick_locked(self) -> Frame | None:
        for index, level in enumerate(self._levels):
            frame = level.pick()
            if frame is None:
                continue
            shed_after = self.config.shed_after_s
            if shed_after is not None and index + 1 < len(self._levels):
                cutoff = self._ticker.monotonic() - shed_after
                for lower in self._levels[index + 1 :]:
                    for stream in lower.streams:
                        if len(stream.queue):
                            stream.queue.drop_older_than(cutoff, "shed")
            return frame
        return None

    # -- lifecycle and telemetry -------------------------------------------------------

    def close(self) -> None:
        """Refuse new frames (counted ``dropped{stopped}``); wake workers so they drain."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def discard_queued(self, reason: str) -> int:
        """Drop every queued frame (counted ``dropped{reason}``); return how many."""
        with self._ready:
            return sum(s.queue.clear(reason) for s in self._streams.values())

    def backlog(self) -> int:
        with self._ready:
            return sum(level.backlog() for level in self._levels)

    def stream_names(self) -> list[str]:
        return list(self._streams)

    def counters(self, stream: str) -> StreamCounters:
        try:
            return self._streams[stream].counters
        except KeyError:
            raise InvalidInputError(f"unknown stream {stream!r}", stream=stream) from None

    def stats(self) -> dict[str, StreamStats]:
        return {name: s.counters.snapshot(queued=len(s.queue)) for name, s in self._streams.items()}


def _head_enqueued_at(stream: _Stream) -> float:
    oldest = stream.queue.oldest()
    return oldest.enqueued_at if oldest is not None else math.inf


def total_dropped(stats: Iterable[StreamStats]) -> dict[str, int]:
    """Dropped frames by reason, summed over streams (for logs and benchmarks)."""
    total: Counter[str] = Counter()
    for s in stats:
        total.update(s.dropped)
    return dict(total)
