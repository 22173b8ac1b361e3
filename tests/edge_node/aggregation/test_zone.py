"""Zone intrusion: anchor point, inertia, re-entry, untracked detections, bounded state."""

from __future__ import annotations

from edge_node.aggregation.rules.zone import ZoneIntrusion, ZoneIntrusionConfig
from tests.edge_node.aggregation.builders import PROV, PROV_V2, T0, det, run, sighting, walk

SQUARE = ((0.4, 0.4), (0.6, 0.4), (0.6, 0.6), (0.4, 0.6))


def rule(**kw: object) -> ZoneIntrusion:
    return ZoneIntrusion(ZoneIntrusionConfig("yard", "cam-1", SQUARE, **kw))  # type: ignore[arg-type]


def test_an_object_walking_in_is_one_intrusion_at_its_first_frame_inside() -> None:
    frames = walk(
        "cam-1", [(0.5, 0.2), (0.5, 0.3), (0.5, 0.45), (0.5, 0.5), (0.5, 0.55), (0.5, 0.5)]
    )
    events = run(rule(), frames)
    assert len(events) == 1
    event = events[0]
    assert event.type == "zone.intrusion"
    assert event.at == frames[2].at  # the first frame inside, not the confirming third
    assert [e.frame_seq for e in event.evidence] == [3, 5]
    assert event.entities[0].id == "cam-1/1"
    assert event.provenance == (PROV,)


def test_the_anchor_is_the_bottom_centre_by_default() -> None:
    # The box's centre is inside the zone, its feet (bottom-centre) below it.
    frames = walk("cam-1", [(0.5, 0.65)] * 4)
    assert run(rule(), frames) == []
    assert len(run(rule(anchor="centre"), frames)) == 1


def test_a_box_flickering_on_the_edge_is_one_intrusion() -> None:
    inside, outside = (0.5, 0.45), (0.5, 0.35)
    path = [inside] * 3 + [outside, inside, outside, outside, inside] * 4
    assert len(run(rule(), walk("cam-1", path))) == 1


def test_leaving_for_inertia_frames_then_returning_is_a_second_intrusion() -> None:
    inside, outside = (0.5, 0.5), (0.5, 0.2)
    events = run(rule(), walk("cam-1", [inside] * 3 + [outside] * 3 + [inside] * 3))
    assert len(events) == 2
    assert events[0].event_id != events[1].event_id


def test_classes_and_scores_filter_and_untracked_detections_are_counted_not_judged() -> None:
    r = rule(classes=frozenset({"person"}), min_score=0.5)
    frames = [
        sighting(
            "cam-1",
            i,
            T0 + i,
            det(0.5, 0.5, "car-1", cls="car"),
            det(0.5, 0.5, "2", score=0.3),
            det(0.5, 0.5, None),
        )
        for i in range(5)
    ]
    assert run(r, frames) == []
    assert r.untracked == 5


def test_provenance_names_every_model_version_behind_the_event() -> None:
    frames = [
        sighting("cam-1", 1, T0, det(0.5, 0.5), prov=PROV),
        sighting("cam-1", 2, T0 + 0.1, det(0.5, 0.5), prov=PROV_V2),
        sighting("cam-1", 3, T0 + 0.2, det(0.5, 0.5), prov=PROV_V2),
    ]
    (event,) = run(rule(), frames)
    assert event.provenance == (PROV, PROV_V2)


def test_the_same_frames_give_the_same_event_id() -> None:
    frames = walk("cam-1", [(0.5, 0.5)] * 3)
    assert [e.event_id for e in run(rule(), frames)] == [e.event_id for e in run(rule(), frames)]


def test_track_state_is_bounded_and_lost_tracks_are_evicted() -> None:
    r = rule(max_tracks=10, lost_after_s=1.0)
    frames = [sighting("cam-1", i, T0 + i * 0.01, det(0.1, 0.1, str(i))) for i in range(100)]
    run(r, frames)
    assert r.state_size() == 10
    assert r.visits.stats.evicted == 90
    r.advance(T0 + 10.0)
    assert r.state_size() == 0


def test_a_track_back_after_lost_after_is_a_new_visit_whether_or_not_expire_ran() -> None:
    frames = walk("cam-1", [(0.5, 0.5)] * 3) + walk(
        "cam-1", [(0.5, 0.5)] * 3, start=T0 + 30, first_seq=100
    )
    for feed_advance in (True, False):
        r = rule(lost_after_s=10.0)
        events = []
        for s in frames:
            if feed_advance:
                events += r.advance(s.at)
            events += r.observe(s)
        assert len(events) == 2, feed_advance
