"""Line crossing, counted per direction, with hysteresis.

A track is on a side of the line a-b only when its anchor is at least ``hysteresis``
(normalised distance) away from it; inside that band it keeps the side it had. A
crossing is confirmed when the anchor has been on the other side for ``min_frames``
frames in a row (frames inside the band neither count nor reset), and the path from the
last point on the old side to the confirming point meets the segment itself (or the
infinite line with ``extend``). So a box whose edge flickers across the line is not a
crossing (supervision#2598), and a detection without a track id never counts
(supervision#2578 counted all of them as one track): those are counted as ``untracked``.

Direction: walking from a to b on the picture (y down), ``in`` crosses from the walker's
left to their right, ``out`` the other way. The event's time is the first frame on the
new side; its id is keyed on the track, that frame and the direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_node.aggregation.geometry import (
    Anchor,
    Point,
    anchor_point,
    segments_cross,
    signed_distance,
)
from edge_node.aggregation.model import Entity, Event, Evidence, Provenance, Sighting, event_id
from edge_node.aggregation.rules.base import TrackBook, track_key, wanted

__all__ = ["DIRECTIONS", "LineCrossing", "LineCrossingConfig"]

EVENT_TYPE = "line.crossed"
DIRECTIONS = ("in", "out")


@dataclass(frozen=True, slots=True)
class LineCrossingConfig:
    rule_id: str
    camera: str
    a: Point
    b: Point
    directions: frozenset[str] = frozenset(DIRECTIONS)
    classes: frozenset[str] | None = None
    min_score: float = 0.0
    anchor: Anchor = "bottom_centre"
    hysteresis: float = 0.02
    min_frames: int = 2
    extend: bool = False
    lost_after_s: float = 10.0
    max_tracks: int = 10_000


@dataclass(slots=True)
class _Side:
    side: int = 0  # -1 left, +1 right, 0 not known yet
    last_point: Point = (0.0, 0.0)
    last_evidence: Evidence | None = None
    candidate: int = 0
    count: int = 0
    first: Evidence | None = None
    provenance: set[Provenance] = field(default_factory=set)


class LineCrossing:
    has_timers = False

    def __init__(self, config: LineCrossingConfig) -> None:
        self.config = config
        self.rule_id = config.rule_id
        self.cameras: frozenset[str] | None = frozenset({config.camera})
        self.tracks: TrackBook[_Side] = TrackBook(config.lost_after_s, config.max_tracks)
        self.counts = dict.fromkeys(DIRECTIONS, 0)
        self.untracked = 0

    def state_size(self) -> int:
        return len(self.tracks)

    def advance(self, at: float) -> list[Event]:
        self.tracks.expire(at)
        return []

    def observe(self, sighting: Sighting) -> list[Event]:
        config = self.config
        a, b, band = config.a, config.b, config.hysteresis
        events: list[Event] = []
        source = sighting.source
        for detection in sighting.detections:
            if not wanted(detection, config.classes, config.min_score):
                continue
            if detection.track_id is None:
                self.untracked += 1
                continue
            point = anchor_point(detection.box, config.anchor)
            distance = signed_distance(point[0], point[1], a, b)
            side = 1 if distance >= band else -1 if distance <= -band else 0
            key = track_key(source, detection)
            state = self.tracks.touch(key, sighting.at, _Side)
            if side == 0:
                continue
            if side == state.side or state.side == 0:
                state.side = side
                state.last_point = point
                state.last_evidence = sighting.evidence()
                state.candidate = state.count = 0
                continue
            evidence = sighting.evidence()
            provenance = sighting.observation.provenance
            if state.candidate == side:
                state.count += 1
                state.provenance.add(provenance)
            else:
                state.candidate, state.count, state.first = side, 1, evidence
                state.provenance = {provenance}
            if state.count < config.min_frames:
                continue
            crossed = config.extend or segments_cross(state.last_point, point, a, b)
            before, first = state.last_evidence, state.first or evidence
            state.side, state.last_point, state.last_evidence = side, point, evidence
            state.candidate = state.count = 0
            if not crossed:
                continue
            direction = "in" if side > 0 else "out"
            self.counts[direction] += 1
            if direction not in config.directions:
                continue
            frames = tuple(e for e in (before, first, evidence) if e is not None)
            events.append(
                Event(
                    event_id=event_id(
                        self.rule_id, EVENT_TYPE, key, first.frame_seq, first.at, direction
                    ),
                    type=EVENT_TYPE,
                    rule_id=self.rule_id,
                    at=first.at,
                    entities=(Entity("track", key, detection.class_name, source),),
                    evidence=tuple(dict.fromkeys(frames)),
                    provenance=tuple(sorted(state.provenance)),
                    attributes={
                        "camera": source,
                        "class": detection.class_name,
                        "direction": direction,
                    },
                )
            )
        return events
