"""Zone intrusion: an event when a tracked object's anchor point enters a polygon.

The anchor is bottom-centre by default (where a person stands, as DeepStream and Frigate
place it). Entry is confirmed after ``inertia`` consecutive frames inside, and the object
must be outside for ``inertia`` frames before it can enter again, so a box that flickers
on the edge is one intrusion, not many. The event's time is the first frame inside; its
id is keyed on the track and that frame (its sequence and time: a camera's
sequence restarts when it reboots). Detections without a track id cannot be told
apart from frame to frame and are counted (``untracked``), not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.aggregation.geometry import Anchor, Polygon
from edge_node.aggregation.model import Entity, Event, Sighting, event_id
from edge_node.aggregation.rules.base import Visit, ZoneVisitRule, track_key, wanted

__all__ = ["ZoneIntrusion", "ZoneIntrusionConfig"]

EVENT_TYPE = "zone.intrusion"


@dataclass(frozen=True, slots=True)
class ZoneIntrusionConfig:
    rule_id: str
    camera: str
    polygon: Polygon
    classes: frozenset[str] | None = None
    min_score: float = 0.0
    anchor: Anchor = "bottom_centre"
    inertia: int = 3
    lost_after_s: float = 10.0
    max_tracks: int = 10_000


class ZoneIntrusion(ZoneVisitRule):
    def __init__(self, config: ZoneIntrusionConfig) -> None:
        super().__init__(config)
        self.config = config

    def observe(self, sighting: Sighting) -> list[Event]:
        config = self.config
        events: list[Event] = []
        evidence = None
        source = sighting.source
        for detection in sighting.detections:
            if not wanted(detection, config.classes, config.min_score):
                continue
            if detection.track_id is None:
                self.untracked += 1
                continue
            key = track_key(source, detection)
            visit = self.visits.touch(key, sighting.at, Visit)
            evidence = evidence or sighting.evidence()
            inside = self.zone.contains(detection)
            provenance = sighting.observation.provenance
            if self.zone.update(visit, inside, evidence, provenance) and inside:
                entered = visit.entered or evidence
                events.append(
                    Event(
                        event_id=event_id(
                            self.rule_id, EVENT_TYPE, key, entered.frame_seq, entered.at
                        ),
                        type=EVENT_TYPE,
                        rule_id=self.rule_id,
                        at=entered.at,
                        entities=(Entity("track", key, detection.class_name, source),),
                        evidence=(entered, evidence) if entered != evidence else (evidence,),
                        provenance=tuple(sorted(visit.provenance)),
                        attributes={"camera": source, "class": detection.class_name},
                    )
                )
        return events
