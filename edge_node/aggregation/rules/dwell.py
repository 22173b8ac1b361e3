"""Dwell (loitering): an event when a tracked object has stayed in a zone for
``min_time_s`` (Frigate's ``loitering_time``), once per visit.

Membership has the same inertia as zone intrusion: a visit starts at the first of
``inertia`` consecutive frames inside and ends after ``inertia`` frames outside, so a box
that slips out for a frame keeps its time. The event fires at the first frame whose time
is ``min_time_s`` or more after the visit's start (event time, never the wall clock),
with the dwell so far; its id is keyed on the track and the visit's start. A track not
seen for ``lost_after_s`` is forgotten (state is bounded and evicted, unlike the
time-in-zone timers of supervision's example).
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_node.aggregation.geometry import Anchor, Polygon
from edge_node.aggregation.model import Entity, Event, Sighting, event_id
from edge_node.aggregation.rules.base import Visit, ZoneVisitRule, track_key, wanted

__all__ = ["Dwell", "DwellConfig"]

EVENT_TYPE = "zone.loitering"


@dataclass(frozen=True, slots=True)
class DwellConfig:
    rule_id: str
    camera: str
    polygon: Polygon
    min_time_s: float
    classes: frozenset[str] | None = None
    min_score: float = 0.0
    anchor: Anchor = "bottom_centre"
    inertia: int = 3
    lost_after_s: float = 10.0
    max_tracks: int = 10_000


class Dwell(ZoneVisitRule):
    def __init__(self, config: DwellConfig) -> None:
        super().__init__(config)
        self.config = config

    def observe(self, sighting: Sighting) -> list[Event]:
        config = self.config
        events: list[Event] = []
        source = sighting.source
        evidence = None
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
            self.zone.update(visit, inside, evidence, sighting.observation.provenance)
            if not visit.inside or visit.entered is None:
                continue
            dwell = sighting.at - visit.entered.at
            if visit.fired or dwell < config.min_time_s:
                continue
            visit.fired = True
            entered = visit.entered
            events.append(
                Event(
                    event_id=event_id(self.rule_id, EVENT_TYPE, key, entered.frame_seq, entered.at),
                    type=EVENT_TYPE,
                    rule_id=self.rule_id,
                    at=sighting.at,
                    entities=(Entity("track", key, detection.class_name, source),),
                    evidence=(entered, evidence),
                    provenance=tuple(sorted(visit.provenance)),
                    attributes={"camera": source, "class": detection.class_name},
                    values={"dwell_s": dwell},
                )
            )
        return events
