"""Admission and scheduling: latest-frame-wins, rate caps, motion, priorities and shedding."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import pytest

from edge_node.clock import ManualClock
from edge_node.errors import InvalidInputError
from edge_node.runtime.config import SchedulerConfig, StreamConfig
from edge_node.runtime.streams import (
    Frame,
    FrameQueue,
    FrameRateLimiter,
    MotionFilter,
    Scheduler,
    StreamCounters,
)
from edge_node.runtime.timing import ManualTicker


def image(value: int = 0, h: int = 48, w: int = 64) -> npt.NDArray[np.uint8]:
    return np.full((h, w, 3), value, dtype=np.uint8)


def make_frame(frame_id: int, at: float = 0.0) -> Frame:
    return Frame("cam", frame_id, datetime(2026, 1, 1, tzinfo=UTC), image(), at)


def scheduler(
    *streams: StreamConfig, config: SchedulerConfig | None = None
) -> tuple[Scheduler, ManualTicker]:
    ticker = ManualTicker()
    return (
        Scheduler(streams, config or SchedulerConfig(), clock=ManualClock(), ticker=ticker),
        ticker,
    )


def drain(s: Scheduler) -> list[tuple[str, int]]:
    picked = []
    while (frame := s.next_frame(timeout=0)) is not None:
        picked.append((frame.stream, frame.frame_id))
    return picked


# -- FrameQueue ---------------------------------------------------------------------------


def test_a_full_queue_drops_the_oldest_frame() -> None:
    counters = StreamCounters("cam")
    queue = FrameQueue(2, counters)
    evicted = [queue.put(make_frame(i)) for i in range(5)]

    assert [f.frame_id for f in evicted if f is not None] == [0, 1, 2]
    assert [queue.pop().frame_id, queue.pop().frame_id] == [3, 4]  # type: ignore[union-attr]
    assert queue.pop() is None
    assert counters.snapshot().dropped == {"queue_full": 3}


def test_queue_is_thread_safe() -> None:
    counters = StreamCounters("cam")
    queue = FrameQueue(8, counters)
    per_thread = 2000

    def produce() -> None:
        for i in range(per_thread):
            queue.put(make_frame(i))

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for t in threads:
        t.start()
    popped = 0
    while any(t.is_alive() for t in threads):
        popped += queue.pop() is not None
    for t in threads:
        t.join()
    popped += len(queue)
    assert popped + counters.snapshot().dropped["queue_full"] == 4 * per_thread


# -- FrameRateLimiter ---------------------------------------------------------------------


def admitted(limiter: FrameRateLimiter, times: list[float]) -> int:
    return sum(limiter.admit(t) for t in times)


def test_rate_limiter_holds_the_target_rate_despite_jitter() -> None:
    rng = np.random.default_rng(1)
    times = [i / 30 + float(rng.uniform(-0.004, 0.004)) for i in range(900)]  # 30 s at 30 FPS
    assert admitted(FrameRateLimiter(10), sorted(times)) == pytest.approx(300, abs=2)
    assert admitted(FrameRateLimiter(25), sorted(times)) == pytest.approx(750, abs=2)


def test_rate_limiter_admits_everything_below_the_target() -> None:
    times = [i / 5 for i in range(50)]
    assert admitted(FrameRateLimiter(10), times) == 50


def test_rate_limiter_does_not_burst_after_a_pause() -> None:
    limiter = FrameRateLimiter(10)
    assert limiter.admit(0.0)
    assert not limiter.admit(0.05)
    # Ten seconds of silence, then a 100 FPS burst: still one frame per 100 ms.
    burst = [10.0 + i / 100 for i in range(100)]
    assert admitted(limiter, burst) == pytest.approx(10, abs=1)


# -- MotionFilter -------------------------------------------------------------------------


def test_motion_filter_skips_identical_frames_and_keeps_changes() -> None:
    motion = MotionFilter(threshold=2.0)
    assert motion.changed(image(100))  # the first frame is the reference
    assert not motion.changed(image(100))
    assert not motion.changed(image(101))  # 1 grey level: noise
    assert motion.changed(image(110))
    assert not motion.changed(image(110))


def test_motion_filter_compares_with_the_last_kept_frame_so_drift_adds_up() -> None:
    motion = MotionFilter(threshold=2.0)
    assert motion.changed(image(100))
    assert not motion.changed(image(101))
    assert motion.changed(image(102))  # 2 levels from the kept 100, not 1 from the last seen


def test_motion_filter_sees_a_local_change_and_a_new_size() -> None:
    motion = MotionFilter(threshold=2.0)
    still = image(50, 480, 640)
    moved = still.copy()
    moved[100:340, 200:440] = 255  # an object covering ~19 % of the frame
    assert motion.changed(still)
    assert motion.changed(moved)
    assert motion.changed(image(255, 240, 320))


# -- Scheduler ----------------------------------------------------------------------------


def test_higher_priority_first_round_robin_within_a_priority() -> None:
    s, _ = scheduler(
        StreamConfig("low", priority=0, queue_size=4),
        StreamConfig("a", priority=5, queue_size=4),
        StreamConfig("b", priority=5, queue_size=4),
    )
    for _ in range(2):
        s.submit("low", image())
    for _ in range(2):
        s.submit("a", image())
        s.submit("b", image())

    assert drain(s) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("low", 0), ("low", 1)]


def test_saturation_sheds_low_priority_frames_first() -> None:
    s, ticker = scheduler(
        StreamConfig("gate", priority=10, queue_size=4),
        StreamConfig("yard", priority=1, queue_size=4),
        StreamConfig("lot", priority=0, queue_size=4),
        config=SchedulerConfig(shed_after_s=0.5),
    )
    s.submit("yard", image())
    s.submit("lot", image())
    ticker.advance(0.3)
    s.submit("lot", image())
    s.submit("gate", image())
    ticker.advance(0.3)  # yard 0 and lot 0 have now waited 0.6 s behind higher-priority work
    s.submit("gate", image())

    first = s.next_frame(timeout=0)
    assert first is not None and first.stream == "gate"
    stats = s.stats()
    assert stats["yard"].dropped == {"shed": 1}
    assert stats["lot"].dropped == {"shed": 1}
    assert stats["gate"].dropped == {}
    assert drain(s) == [("gate", 1), ("lot", 1)]


def test_one_priority_never_sheds_by_age() -> None:
    s, ticker = scheduler(
        StreamConfig("a", queue_size=4),
        StreamConfig("b", queue_size=4),
        config=SchedulerConfig(shed_after_s=0.1),
    )
    for _ in range(3):
        s.submit("a", image())
        s.submit("b", image())
    ticker.advance(10)
    assert len(drain(s)) == 6
    assert all(not st.dropped for st in s.stats().values())


def test_backlog_budget_evicts_the_lowest_priority_first() -> None:
    s, ticker = scheduler(
        StreamConfig("high", priority=2, queue_size=8),
        StreamConfig("low", priority=0, queue_size=8),
        config=SchedulerConfig(max_backlog_frames=4, shed_after_s=None),
    )
    for _ in range(3):
        s.submit("low", image())
        ticker.advance(0.01)
    for _ in range(3):
        s.submit("high", image())
        ticker.advance(0.01)

    stats = s.stats()
    assert stats["low"].dropped == {"shed": 2}  # its two oldest made room for high's frames
    assert s.backlog() == 4
    for _ in range(2):  # only high left to evict from: its own oldest go
        s.submit("high", image())
    assert s.stats()["low"].dropped == {"shed": 3}
    assert s.stats()["high"].dropped == {"shed": 1}
    assert drain(s) == [("high", 1), ("high", 2), ("high", 3), ("high", 4)]


def test_submit_counts_every_outcome() -> None:
    s, ticker = scheduler(
        StreamConfig("cam", target_fps=10, motion_threshold=2.0, queue_size=8),
    )
    outcomes = [s.submit("cam", image(0))]  # queued
    ticker.advance(0.01)
    outcomes.append(s.submit("cam", image(50)))  # too soon: rate
    ticker.advance(0.1)
    outcomes.append(s.submit("cam", image(0)))  # unchanged: no_motion
    ticker.advance(0.1)
    outcomes.append(s.submit("cam", np.zeros((4, 4), dtype=np.uint8)))  # bad: shape
    outcomes.append(s.submit("cam", image(0).astype(np.float32)))  # bad: dtype
    outcomes.append(s.submit("cam", b"\xff\xd8 jpeg"))  # encoded: bypasses motion
    ticker.advance(0.1)
    outcomes.append(s.submit("cam", image(99)))  # changed: queued

    assert [(o.frame_id, o.status, o.reason) for o in outcomes] == [
        (0, "queued", None),
        (1, "dropped", "rate"),
        (2, "skipped", "no_motion"),
        (3, "bad", "shape"),
        (4, "bad", "dtype"),
        (5, "queued", None),
        (6, "queued", None),
    ]
    stats = s.stats()["cam"]
    assert (stats.submitted, stats.accepted, stats.queued) == (7, 3, 3)
    assert stats.dropped == {"rate": 1}
    assert stats.skipped == {"no_motion": 1}
    assert stats.bad == {"shape": 1, "dtype": 1}


def test_captured_at_defaults_to_the_clock_and_can_be_given() -> None:
    s, _ = scheduler(StreamConfig("cam", queue_size=4))
    given = datetime(2025, 5, 5, tzinfo=UTC)
    s.submit("cam", image())
    s.submit("cam", image(), captured_at=given)
    first, second = s.next_frame(timeout=0), s.next_frame(timeout=0)
    assert first is not None and first.captured_at == ManualClock().now()
    assert second is not None and second.captured_at == given


def test_unknown_stream_is_invalid_input() -> None:
    s, _ = scheduler(StreamConfig("cam"))
    with pytest.raises(InvalidInputError):
        s.submit("nope", image())


def test_close_refuses_new_frames_and_wakes_idle_workers() -> None:
    s, _ = scheduler(StreamConfig("cam", queue_size=4))
    s.submit("cam", image())
    got: list[Frame | None] = []
    woke = threading.Event()

    def worker() -> None:
        while (frame := s.next_frame()) is not None:
            got.append(frame)
        woke.set()

    thread = threading.Thread(target=worker)
    thread.start()
    s.close()
    assert woke.wait(5)
    thread.join(5)
    assert [f.frame_id for f in got if f is not None] == [0]  # the queued frame was drained
    outcome = s.submit("cam", image())
    assert (outcome.status, outcome.reason) == ("dropped", "stopped")


def test_next_frame_times_out_when_idle() -> None:
    s, _ = scheduler(StreamConfig("cam"))
    assert s.next_frame(timeout=0.01) is None


def test_a_worker_waiting_for_a_frame_is_woken_by_each_one() -> None:
    # A submit wakes a worker only if one waits: no frame may be left unseen while the
    # worker sleeps. One frame at a time, so the worker is usually waiting when it comes.
    s, _ = scheduler(StreamConfig("cam", queue_size=4))
    got: list[int] = []
    taken = threading.Semaphore(0)

    def worker() -> None:
        while (frame := s.next_frame()) is not None:
            got.append(frame.frame_id)
            taken.release()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    for _ in range(200):
        s.submit("cam", image())
        assert taken.acquire(timeout=5), f"frame {len(got)} never reached the waiting worker"
    s.close()
    thread.join(5)
    assert got == list(range(200))
