"""The results sampler's rule (edge_node.results.sampling), on a fake monotonic clock."""

from __future__ import annotations

import threading

import pytest

from edge_node.errors import InvalidInputError
from edge_node.results.sampling import ResultSampler, ResultsConfig
from tests.edge_node.results.support import result

INTERVAL = 10.0


def frames(taken: list[object]) -> list[tuple[str, int]]:
    return [(r.stream, r.frame_id) for r in taken]  # type: ignore[attr-defined]


def test_one_result_per_stream_and_interval_the_newest() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=INTERVAL, max_per_minute=600))
    for frame in range(1, 6):
        sampler.offer(result("gate", frame))
    assert frames(sampler.take(100.0)) == [("gate", 5)]
    for frame in range(6, 9):
        sampler.offer(result("gate", frame))
    assert sampler.take(105.0) == []  # within the interval: nothing, the candidates wait
    sampler.offer(result("gate", 9))
    assert frames(sampler.take(109.999)) == []
    assert frames(sampler.take(110.0)) == [("gate", 9)]
    assert sampler.take(130.0) == []  # nothing offered since: nothing to send
    stats = sampler.stats()
    assert (stats.offered, stats.taken, stats.streams) == (9, 2, 1)


def test_a_result_with_detections_wins_over_newer_empty_ones() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=INTERVAL, max_per_minute=600))
    sampler.offer(result("gate", 1))
    sampler.offer(result("gate", 2, detections=1))
    sampler.offer(result("gate", 3, detections=2))
    sampler.offer(result("gate", 4))
    (taken,) = sampler.take(0.0)
    assert (taken.frame_id, len(taken.decoded.detections)) == (3, 2)
    # The detection slot is emptied with the sample: the next interval starts afresh.
    sampler.offer(result("gate", 5))
    assert frames(sampler.take(INTERVAL)) == [("gate", 5)]


def test_streams_are_sampled_independently() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=INTERVAL, max_per_minute=600))
    sampler.offer(result("a", 1))
    assert frames(sampler.take(0.0)) == [("a", 1)]
    sampler.offer(result("a", 2))
    sampler.offer(result("b", 1))
    assert frames(sampler.take(1.0)) == [("b", 1)]  # a is not due, b has never been sampled
    assert frames(sampler.take(10.0)) == [("a", 2)]


def test_the_node_wide_rate_holds_and_the_longest_waiting_go_first() -> None:
    # 6 a minute: a bucket of one (10 s' worth), refilled one every 10 s.
    sampler = ResultSampler(ResultsConfig(interval_s=1.0, max_per_minute=6))
    for stream in ("a", "b", "c"):
        sampler.offer(result(stream, 1))
    assert frames(sampler.take(0.0)) == [("a", 1)]
    assert sampler.take(5.0) == []  # b and c are due, no token yet
    assert sampler.stats().rate_limited == 4  # b and c waited at both takes
    sampler.offer(result("a", 2))
    sampler.offer(result("b", 2))  # b's newest candidate replaces its older one
    # b and c were never sampled, so they go before a (sampled at 0), in the order seen.
    assert frames(sampler.take(10.0)) == [("b", 2)]
    assert frames(sampler.take(20.0)) == [("c", 1)]
    assert frames(sampler.take(30.0)) == [("a", 2)]  # a waited since 0, b since 10
    # Over a long run: at most 6 a minute plus the bucket, whatever is offered.
    taken = 0
    for second in range(31, 31 + 600):
        for stream in ("a", "b", "c"):
            sampler.offer(result(stream, second))
        taken += len(sampler.take(float(second)))
    assert 59 <= taken <= 61


def test_a_burst_is_bounded_by_ten_seconds_worth() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=1.0, max_per_minute=60, max_streams=64))
    for i in range(64):
        sampler.offer(result(f"cam-{i}", 1))
    assert len(sampler.take(0.0)) == 10
    assert len(sampler.take(0.5)) == 0
    assert len(sampler.take(3.0)) == 3


def test_streams_beyond_the_bound_are_counted_not_kept_and_idle_ones_are_forgotten() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=INTERVAL, max_per_minute=600, max_streams=2))
    sampler.offer(result("a", 1))
    sampler.offer(result("b", 1))
    sampler.offer(result("c", 1))
    assert sorted(frames(sampler.take(0.0))) == [("a", 1), ("b", 1)]
    assert sampler.stats().untracked == 1
    sampler.offer(result("a", 2))
    sampler.take(50.0)
    # b was offered nothing for 10 intervals: forgotten, so c gets its place.
    assert sampler.take(100.0) == []
    assert sampler.stats().streams == 1
    sampler.offer(result("c", 2))
    assert frames(sampler.take(101.0)) == [("c", 2)]


def test_offers_from_many_threads_are_all_counted_and_take_stays_bounded() -> None:
    sampler = ResultSampler(ResultsConfig(interval_s=1.0, max_per_minute=600, max_streams=8))
    per_thread = 5000
    taken: list[object] = []
    done = threading.Event()

    def offer(stream: str) -> None:
        for frame in range(per_thread):
            sampler.offer(result(stream, frame, detections=frame % 2))

    def take() -> None:
        now = 0.0
        while not done.is_set():
            taken.extend(sampler.take(now))
            now += 1.0

    threads = [threading.Thread(target=offer, args=(f"s{i}",)) for i in range(8)]
    taker = threading.Thread(target=take)
    taker.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    done.set()
    taker.join(timeout=60)
    taken.extend(sampler.take(1e9))
    stats = sampler.stats()
    assert stats.offered == 8 * per_thread
    assert stats.taken == len(taken) > 0
    # Each take gives at most one per stream; no result is handed out twice.
    assert len({(r.stream, r.frame_id) for r in taken}) == len(taken)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("interval_s", 0.5),
        ("interval_s", float("nan")),
        ("max_per_minute", 0),
        ("max_per_minute", 1.5),
        ("max_streams", 5000),
        ("outbox_share", 0.0),
        ("max_pending", True),
    ],
)
def test_unsafe_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=f"results.{field}") as caught:
        ResultsConfig(**{field: value})  # type: ignore[arg-type]
    assert caught.value.fields["field"] == f"results.{field}"
