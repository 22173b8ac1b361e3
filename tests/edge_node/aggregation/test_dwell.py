"""Dwell: minimum time in event time, zone inertia, once per visit, bounded state."""

from __future__ import annotations

from edge_node.aggregation.rules.dwell import Dwell, DwellConfig
from tests.edge_node.aggregation.builders import T0, det, run, sighting, walk

ZONE = ((0.3, 0.3), (0.7, 0.3), (0.7, 0.7), (0.3, 0.7))


def rule(min_time_s: float = 5.0, **kw: object) -> Dwell:
    return Dwell(DwellConfig("loiter", "cam-1", ZONE, min_time_s, **kw))  # type: ignore[arg-type]


def test_staying_past_the_minimum_time_is_one_event_with_the_dwell() -> None:
    frames = walk("cam-1", [(0.5, 0.5)] * 100, fps=10)  # 9.9 s inside
    events = run(rule(), frames)
    assert len(events) == 1
    (event,) = events
    assert event.type == "zone.loitering"
    assert event.at == T0 + 5.0
    assert event.values["dwell_s"] == 5.0
    assert event.evidence[0].frame_seq == 1


def test_leaving_before_the_minimum_time_is_no_event() -> None:
    frames = walk("cam-1", [(0.5, 0.5)] * 40 + [(0.9, 0.9)] * 10 + [(0.5, 0.5)] * 40, fps=10)
    assert run(rule(), frames) == []  # two visits of 4 s each


def test_a_frame_or_two_outside_does_not_end_the_visit() -> None:
    path = ([(0.5, 0.5)] * 20 + [(0.9, 0.9)] * 2) * 3
    assert len(run(rule(), walk("cam-1", path, fps=10))) == 1


def test_a_new_visit_after_leaving_can_fire_again() -> None:
    path = [(0.5, 0.5)] * 60 + [(0.9, 0.9)] * 5 + [(0.5, 0.5)] * 60
    events = run(rule(), walk("cam-1", path, fps=10))
    assert len(events) == 2
    assert events[0].event_id != events[1].event_id


def test_untracked_detections_are_not_judged() -> None:
    r = rule()
    frames = [sighting("cam-1", i, T0 + i, det(0.5, 0.5, None)) for i in range(20)]
    assert run(r, frames) == []
    assert r.untracked == 20


def test_a_track_not_seen_for_lost_after_is_forgotten() -> None:
    r = rule(lost_after_s=2.0)
    first = walk("cam-1", [(0.5, 0.5)] * 30, fps=10)  # 2.9 s
    again = walk("cam-1", [(0.5, 0.5)] * 30, fps=10, start=T0 + 10, first_seq=100)
    assert run(r, first + again) == []  # the gap ended the visit: neither reached 5 s
    r.advance(T0 + 100)
    assert r.state_size() == 0


def test_state_is_bounded() -> None:
    r = rule(max_tracks=50)
    run(r, [sighting("cam-1", i, T0 + i * 0.01, det(0.5, 0.5, str(i))) for i in range(500)])
    assert r.state_size() == 50
