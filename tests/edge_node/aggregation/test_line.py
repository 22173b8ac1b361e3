"""Line crossing: per direction, hysteresis against flicker, the segment's extent, and
detections without a track id never counted (supervision#2598, #2578)."""

from __future__ import annotations

from edge_node.aggregation.rules.line import LineCrossing, LineCrossingConfig
from tests.edge_node.aggregation.builders import T0, det, run, sighting, walk


def rule(**kw: object) -> LineCrossing:
    # Horizontal line across the middle, a=(0.2, 0.5) to b=(0.8, 0.5): walking a->b (to the
    # right) the walker's right is below on the picture, so "in" is moving down.
    return LineCrossing(LineCrossingConfig("door", "cam-1", (0.2, 0.5), (0.8, 0.5), **kw))  # type: ignore[arg-type]


DOWN = [(0.5, y) for y in (0.3, 0.4, 0.45, 0.55, 0.6, 0.7)]


def test_moving_down_is_one_crossing_in_and_moving_up_one_out() -> None:
    r = rule()
    events = run(r, walk("cam-1", DOWN) + walk("cam-1", DOWN[::-1], start=T0 + 5, first_seq=10))
    assert [e.attributes["direction"] for e in events] == ["in", "out"]
    assert r.counts == {"in": 1, "out": 1}
    first = events[0]
    assert first.at == T0 + 0.3  # the first frame beyond the band on the new side
    assert [e.frame_seq for e in first.evidence] == [3, 4, 5]


def test_a_box_flickering_across_the_line_is_not_a_crossing() -> None:
    # The anchor jitters around the line, a frame at a time across it, within and beyond
    # the band: never two frames in a row on the other side.
    jitter = [(0.5, y) for y in (0.45, 0.51, 0.47, 0.53, 0.48, 0.49, 0.56, 0.44, 0.52, 0.46)] * 5
    r = rule()
    assert run(r, walk("cam-1", jitter)) == []
    assert r.counts == {"in": 0, "out": 0}


def test_frames_inside_the_band_neither_count_nor_reset() -> None:
    path = [(0.5, 0.4), (0.5, 0.53), (0.5, 0.51), (0.5, 0.6)]
    assert len(run(rule(), walk("cam-1", path))) == 1


def test_detections_without_a_track_id_never_count() -> None:
    r = rule()
    frames = [
        sighting("cam-1", i, T0 + i / 10, *(det(0.5, y, None) for y in (0.3, 0.7)))
        for i in range(20)
    ]
    frames += walk("cam-1", DOWN, track=None, start=T0 + 3)
    assert run(r, frames) == []
    assert r.counts == {"in": 0, "out": 0}
    assert r.untracked == 46


def test_passing_beside_the_segment_is_not_a_crossing_unless_extended() -> None:
    beside = [(0.9, y) for y in (0.3, 0.4, 0.6, 0.7)]
    assert run(rule(), walk("cam-1", beside)) == []
    assert len(run(rule(extend=True), walk("cam-1", beside))) == 1


def test_directions_filter_what_is_emitted_but_both_are_counted() -> None:
    r = rule(directions=frozenset({"out"}))
    events = run(r, walk("cam-1", DOWN) + walk("cam-1", DOWN[::-1], start=T0 + 5, first_seq=10))
    assert [e.attributes["direction"] for e in events] == ["out"]
    assert r.counts == {"in": 1, "out": 1}


def test_two_tracks_are_counted_apart() -> None:
    frames = [
        sighting("cam-1", i, T0 + i / 10, det(0.4, y, "a"), det(0.6, y, "b"))
        for i, (_, y) in enumerate(DOWN)
    ]
    events = run(rule(), frames)
    assert sorted(e.entities[0].id for e in events) == ["cam-1/a", "cam-1/b"]
    assert len({e.event_id for e in events}) == 2


def test_a_track_lost_and_seen_again_starts_without_a_side() -> None:
    r = rule(lost_after_s=1.0)
    above = walk("cam-1", [(0.5, 0.3)] * 2)
    # Seen again below the line 5 s later: no side known any more, so no crossing.
    below = walk("cam-1", [(0.5, 0.7)] * 3, start=T0 + 5, first_seq=10)
    assert run(r, above + below) == []
