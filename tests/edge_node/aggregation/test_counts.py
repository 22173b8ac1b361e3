"""Counts per class per interval: epoch-aligned intervals, distinct and peak, closing by
event time (not before the interval's end), bounded open intervals."""

from __future__ import annotations

from edge_node.aggregation.rules.counts import ClassCounts, ClassCountsConfig
from tests.edge_node.aggregation.builders import T0, det, run, sighting

assert T0 % 60 == 20  # T0 is 20 s into a minute


def rule(**kw: object) -> ClassCounts:
    return ClassCounts(ClassCountsConfig("people", 60.0, **kw))  # type: ignore[arg-type]


def test_one_event_per_camera_and_interval_with_distinct_and_peak() -> None:
    frames = [
        sighting("cam-1", 1, T0, det(0.1, 0.1, "1"), det(0.2, 0.2, "2"), det(0.3, 0.3, "c", "car")),
        sighting("cam-1", 2, T0 + 1, det(0.1, 0.1, "1")),
        sighting("cam-1", 3, T0 + 2, det(0.1, 0.1, "3"), det(0.1, 0.1, None)),
        sighting("cam-2", 1, T0 + 3, det(0.1, 0.1, "9")),
    ]
    r = rule()
    assert run(r, frames, until=T0 + 39) == []  # the minute ends at T0 + 40
    events = sorted(r.advance(T0 + 40), key=lambda e: e.attributes["camera"])
    assert [e.attributes["camera"] for e in events] == ["cam-1", "cam-2"]
    cam1 = events[0]
    assert cam1.at == T0 + 40
    assert cam1.values["person.distinct"] == 3
    assert cam1.values["person.peak"] == 2
    assert cam1.values["car.distinct"] == 1
    assert cam1.values["frames"] == 3
    assert cam1.values["interval_start"] == T0 - 20
    assert [e.frame_seq for e in cam1.evidence] == [1, 3]


def test_a_frame_in_the_next_interval_closes_the_last_one_first() -> None:
    r = rule()
    events = run(
        r,
        [
            sighting("cam-1", 1, T0, det(0.1, 0.1, "1")),
            sighting("cam-1", 2, T0 + 45, det(0.1, 0.1, "2")),
        ],
    )
    assert len(events) == 1
    assert events[0].values["person.distinct"] == 1


def test_listed_classes_are_reported_at_zero() -> None:
    r = rule(classes=frozenset({"person", "bicycle"}))
    events = run(r, [sighting("cam-1", 1, T0, det(0.1, 0.1, "1"))], until=T0 + 40)
    assert events[0].values["bicycle.distinct"] == 0
    assert events[0].values["bicycle.peak"] == 0


def test_a_zone_restricts_what_is_counted() -> None:
    zone = ((0.0, 0.0), (0.5, 0.0), (0.5, 0.5), (0.0, 0.5))
    r = rule(polygon=zone)
    frame = sighting("cam-1", 1, T0, det(0.2, 0.2, "in"), det(0.8, 0.8, "out"))
    (event,) = run(r, [frame], until=T0 + 40)
    assert event.values["person.distinct"] == 1


def test_the_same_interval_has_the_same_id_and_cameras_differ() -> None:
    a = run(rule(), [sighting("cam-1", 1, T0, det(0.1, 0.1))], until=T0 + 40)
    b = run(rule(), [sighting("cam-1", 7, T0 + 30, det(0.1, 0.1))], until=T0 + 40)
    c = run(rule(), [sighting("cam-2", 1, T0, det(0.1, 0.1))], until=T0 + 40)
    assert a[0].event_id == b[0].event_id != c[0].event_id


def test_open_intervals_are_bounded() -> None:
    r = rule(max_open=4)
    frames = [sighting(f"cam-{i}", 1, T0, det(0.1, 0.1)) for i in range(10)]
    events = run(r, frames)
    assert r.state_size() == 4
    assert len(events) == 6
    assert r.closed_early == 6
