"""The intake's bounds alone: the token bucket and the recent-id memory, on a hand clock."""

from __future__ import annotations

import pytest

from edge_node.devices.limits import RecentIds, TokenBucket


def test_a_bucket_lets_a_burst_through_then_the_rate() -> None:
    bucket = TokenBucket(rate_per_s=10.0, burst=5, now=0.0)
    assert [bucket.take(0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert bucket.take(0.05) is False  # half a token
    assert bucket.take(0.1) is True  # one token after 0.1 s
    assert bucket.take(0.1) is False
    # A long pause refills to the burst, never above it.
    assert sum(bucket.take(100.0) for _ in range(20)) == 5


def test_a_clock_that_goes_back_refills_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=1, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)
    assert not bucket.take(10.5)
    assert bucket.take(11.0)


def test_a_bucket_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0.0, 1, 0.0)
    with pytest.raises(ValueError):
        TokenBucket(1.0, 0, 0.0)


def test_recent_ids_remember_within_the_horizon() -> None:
    ids = RecentIds(max_ids=100, horizon_s=60.0)
    assert not ids.seen_before(("cam", "a"), 0.0)
    assert ids.seen_before(("cam", "a"), 59.0)
    assert not ids.seen_before(("other", "a"), 59.0)  # ids are per camera
    assert not ids.seen_before(("cam", "a"), 60.0)  # forgotten at the horizon, taken again
    assert len(ids) == 2  # ("other", "a") and the new ("cam", "a")


def test_recent_ids_are_bounded_and_count_early_evictions() -> None:
    ids = RecentIds(max_ids=3, horizon_s=1e9)
    for n in range(5):
        assert not ids.seen_before(("cam", str(n)), float(n))
    assert len(ids) == 3
    assert ids.evicted_early == 2
    assert ids.seen_before(("cam", "4"), 5.0)
    assert not ids.seen_before(("cam", "0"), 5.0)  # evicted: the aggregation's check remains
