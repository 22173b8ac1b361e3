"""The node's IoU tracker: stable ids while boxes overlap, centre distance for fast small
objects, classes apart, min_hits against ghosts, lost tracks evicted, bounded."""

from __future__ import annotations

from edge_node.aggregation.model import Box, Detection
from edge_node.aggregation.tracker import IouTracker, TrackerConfig, iou
from tests.edge_node.aggregation.builders import T0, box_at


def d(
    x: float, y: float, cls: str = "person", w: float = 0.1, track: str | None = None
) -> Detection:
    return Detection(cls, 0.9, box_at(x, y, w, 0.2), track)


def ids(tracker: IouTracker, at: float, *detections: Detection) -> list[str | None]:
    return [x.track_id for x in tracker.assign("cam-1", at, detections)]


def test_iou() -> None:
    a = Box(0.0, 0.0, 0.2, 0.2)
    assert iou(a, a) == 1.0
    assert iou(a, Box(0.1, 0.0, 0.3, 0.2)) == 1 / 3
    assert iou(a, Box(0.5, 0.5, 0.6, 0.6)) == 0.0


def test_two_people_walking_keep_their_ids() -> None:
    t = IouTracker()
    first = ids(t, T0, d(0.2, 0.5), d(0.6, 0.5))
    assert first == ["n1", "n2"]
    for i in range(1, 20):
        step = i * 0.01
        # Given in the other order each frame: matching is by overlap, not position in the list.
        assert ids(t, T0 + i / 10, d(0.6 - step, 0.5), d(0.2 + step, 0.5)) == ["n2", "n1"]


def test_a_fast_small_object_is_followed_by_its_centre() -> None:
    t = IouTracker(TrackerConfig(max_centre_distance=0.05))
    assert ids(t, T0, d(0.2, 0.5, w=0.02)) == ["n1"]
    assert ids(t, T0 + 0.2, d(0.24, 0.5, w=0.02)) == ["n1"]  # no overlap, 4 % away
    assert ids(t, T0 + 0.4, d(0.5, 0.5, w=0.02)) == ["n2"]  # too far: a new object


def test_classes_are_tracked_apart_and_given_ids_pass_through() -> None:
    t = IouTracker()
    out = ids(t, T0, d(0.5, 0.5, "person"), d(0.5, 0.5, "dog"), d(0.5, 0.5, track="cam7"))
    assert out == ["n1", "n2", "cam7"]
    assert ids(t, T0 + 0.1, d(0.5, 0.5, "dog"), d(0.5, 0.5, "person")) == ["n2", "n1"]


def test_min_hits_keeps_one_frame_ghosts_without_an_id() -> None:
    t = IouTracker(TrackerConfig(min_hits=3))
    assert ids(t, T0, d(0.5, 0.5)) == [None]
    assert ids(t, T0 + 0.1, d(0.5, 0.5)) == [None]
    assert ids(t, T0 + 0.2, d(0.5, 0.5)) == ["n1"]


def test_lost_tracks_are_evicted_and_a_return_is_a_new_track() -> None:
    t = IouTracker(TrackerConfig(lost_after_s=1.0))
    assert ids(t, T0, d(0.5, 0.5)) == ["n1"]
    assert ids(t, T0 + 0.5) == []
    assert t.tracks("cam-1") == 1
    assert ids(t, T0 + 2.0, d(0.5, 0.5)) == ["n2"]
    assert t.stats.tracks_lost == 1


def test_tracks_are_bounded_per_source() -> None:
    t = IouTracker(TrackerConfig(max_tracks=8))
    for i in range(50):
        ids(t, T0 + i * 0.01, d(0.05 + (i % 10) * 0.1, 0.25 + (i // 10) * 0.15, w=0.01))
    assert t.tracks("cam-1") == 8
    assert t.stats.tracks_evicted == 42


def test_the_same_frames_give_the_same_ids() -> None:
    frames = [(T0 + i / 10, (d(0.2 + i * 0.01, 0.5), d(0.7, 0.5 + i * 0.005))) for i in range(30)]
    runs = []
    for _ in range(2):
        t = IouTracker()
        runs.append([ids(t, at, *dets) for at, dets in frames])
    assert runs[0] == runs[1]
