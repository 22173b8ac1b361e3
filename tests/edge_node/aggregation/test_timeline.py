"""The aligner: clock offsets, event-time order, per-source watermarks, idle sources,
lateness (applied within the bound, counted beyond it), duplicates, bounds."""

from __future__ import annotations

import math

from edge_node.aggregation.model import Observation
from edge_node.aggregation.timeline import Aligner, AlignerConfig
from tests.edge_node.aggregation.builders import T0, obs


def ids(released: list[tuple[float, Observation]]) -> list[str]:
    return [o.observation_id for _, o in released]


def aligner(**kw: object) -> Aligner:
    return Aligner(AlignerConfig(**kw))  # type: ignore[arg-type]


def test_frames_are_released_in_event_time_order_once_the_watermark_passes() -> None:
    a = aligner(allowed_lateness_s=0.05)
    out = []
    out += a.offer(obs("c1", 2, T0 + 0.04), now=T0 + 0.05)
    out += a.offer(obs("c1", 1, T0 + 0.00), now=T0 + 0.06)  # late by 40 ms: within the bound
    assert out == []  # the watermark (T0 - 0.01) has passed nothing yet
    out += a.offer(obs("c1", 3, T0 + 0.10), now=T0 + 0.11)
    assert ids(out) == ["c1-1", "c1-2"]
    assert a.watermark == T0 + 0.10 - 0.05
    assert a.stats.per_source["c1"].late_applied == 0  # 40 ms is not behind newest - 50 ms


def test_late_within_the_bound_is_applied_and_counted_beyond_it_dropped() -> None:
    a = aligner(allowed_lateness_s=0.05)
    a.offer(obs("c1", 1, T0), now=T0)
    a.offer(obs("c2", 1, T0), now=T0)
    a.offer(obs("c1", 3, T0 + 0.2), now=T0 + 0.2)
    # c1 is 200 ms ahead, but c2 holds the watermark: c1's frame 100 ms behind its newest
    # is late for c1's own watermark, still ahead of the aligner's: applied, in order.
    a.offer(obs("c1", 2, T0 + 0.1), now=T0 + 0.21)
    out = a.offer(obs("c2", 2, T0 + 0.3), now=T0 + 0.3)
    assert ids(out) == ["c1-1", "c2-1", "c1-2"]  # the watermark is T0 + 0.15 (c1's)
    stats = a.stats.per_source["c1"]
    assert (stats.late_applied, stats.too_late) == (1, 0)
    # Now behind the aligner's watermark (T0 + 0.15): too late, never released.
    assert a.offer(obs("c1", 9, T0 + 0.12), now=T0 + 0.31) == []
    assert stats.too_late == 1
    assert "c1-9" not in ids(a.flush())


def test_the_camera_clock_offset_is_removed() -> None:
    a = aligner(allowed_lateness_s=0.0)
    a.set_clock_offset("fast", 2.0)  # its clock runs 2 s ahead of the node's
    a.offer(obs("fast", 1, T0 + 2.0), now=T0)
    a.offer(obs("slow", 1, T0 + 0.5), now=T0 + 0.5)
    out = a.flush()
    assert [(at, o.observation_id) for at, o in out] == [(T0, "fast-1"), (T0 + 0.5, "slow-1")]


def test_an_idle_source_stops_holding_the_watermark() -> None:
    a = aligner(allowed_lateness_s=0.05, idle_timeout_s=2.0)
    a.offer(obs("quiet", 1, T0), now=T0)
    for i in range(1, 20):  # busy sends 10 frames a second, quiet nothing after its first
        a.offer(obs("busy", i, T0 + i / 10), now=T0 + i / 10)
    assert a.watermark == T0 - 0.05  # quiet still holds it at 1.9 s
    a.offer(obs("busy", 30, T0 + 3.0), now=T0 + 3.0)
    assert a.watermark == T0 + 3.0 - 0.05
    assert a.buffered == 1


def test_when_every_source_is_idle_the_watermark_follows_the_node_clock() -> None:
    a = aligner(allowed_lateness_s=0.05, idle_timeout_s=2.0)
    a.offer(obs("c1", 1, T0), now=T0)
    assert a.advance(T0 + 1.0) == []
    out = a.advance(T0 + 10.0)
    assert ids(out) == ["c1-1"]
    assert a.watermark == T0 + 10.0 - 0.05


def test_the_watermark_never_goes_back() -> None:
    a = aligner(allowed_lateness_s=0.0, idle_timeout_s=1.0)
    a.offer(obs("c1", 1, T0 + 5), now=T0 + 5)
    a.advance(T0 + 100)  # everyone idle: follows the clock
    a.offer(obs("c2", 1, T0 + 200), now=T0 + 50)
    assert a.watermark == T0 + 100


def test_duplicates_are_dropped_and_counted_while_the_id_is_remembered() -> None:
    a = aligner(allowed_lateness_s=0.0, dedup_horizon_s=10.0)
    first = obs("c1", 1, T0)
    released = ids(a.offer(first, now=T0))
    released += ids(a.offer(obs("c1", 2, T0 + 1), now=T0 + 1))
    released += ids(a.offer(first, now=T0 + 1))  # a QoS 1 redelivery
    released += ids(a.offer(first, now=T0 + 2))
    released += ids(a.flush())
    assert released.count("c1-1") == 1
    assert a.stats.per_source["c1"].duplicates == 2
    # Another camera may use the same id: ids are per source.
    a.offer(Observation("c2", "c1-1", 1, T0 + 3, (), first.provenance), now=T0 + 3)
    assert a.stats.per_source["c2"].accepted == 1


def test_remembered_ids_are_bounded_by_time_and_count() -> None:
    a = aligner(allowed_lateness_s=0.0, dedup_horizon_s=5.0, max_ids=1000)
    for i in range(5000):
        a.offer(obs("c1", i, T0 + i * 0.01), now=T0 + i * 0.01)
    assert a.remembered_ids <= 501
    b = aligner(allowed_lateness_s=0.0, dedup_horizon_s=1e6, max_ids=100)
    for i in range(500):
        b.offer(obs("c1", i, T0 + i * 0.01), now=T0 + i * 0.01)
    assert b.remembered_ids == 100
    assert b.stats.ids_evicted == 400


def test_impossible_times_unknown_sources_and_a_full_buffer_are_counted() -> None:
    a = aligner(
        max_future_s=5.0, known_sources=frozenset({"c1"}), max_buffered=3, allowed_lateness_s=100.0
    )
    assert a.offer(obs("c1", 1, T0 + 60), now=T0) == []
    assert a.stats.per_source["c1"].future == 1
    a.offer(obs("c9", 1, T0), now=T0)
    assert a.stats.unknown_source == 1
    a.offer(Observation("c1", "nan", 1, math.nan, (), obs("c1", 1, T0).provenance), now=T0)
    assert a.stats.invalid_time == 1
    out = []
    for i in range(5):  # the lateness holds them all back; the buffer takes 3
        out += a.offer(obs("c1", 10 + i, T0 + i * 0.1), now=T0 + i * 0.1)
    assert a.buffered == 3
    assert a.stats.released_early == 2
    assert ids(out) == ["c1-10", "c1-11"]
    # What went out early moved the watermark: an older frame is now too late.
    a.offer(obs("c1", 5, T0 + 0.05), now=T0 + 1)
    assert a.stats.per_source["c1"].too_late == 1


def test_a_future_frame_does_not_move_the_watermark() -> None:
    a = aligner(allowed_lateness_s=0.0, max_future_s=1.0)
    a.offer(obs("c1", 1, T0), now=T0)
    a.offer(obs("c1", 2, T0 + 3600), now=T0 + 0.1)  # a camera clock an hour off
    assert a.watermark == T0


def test_a_fast_camera_clock_does_not_push_the_watermark_past_the_node_clock() -> None:
    a = aligner(allowed_lateness_s=0.05, max_future_s=5.0)
    a.offer(obs("fast", 1, T0 + 4.0), now=T0)  # 4 s ahead: possible, so accepted
    assert a.watermark == T0 - 0.05
    # Another camera's frame of now is not too late because of it.
    a.offer(obs("slow", 1, T0), now=T0 + 0.01)
    assert a.stats.per_source["slow"].too_late == 0
