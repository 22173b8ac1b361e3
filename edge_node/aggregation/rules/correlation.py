"""Cross-camera correlation: "entered at A, left at B after Δt", and "entered at A, not
seen leaving within T".

An object is matched across cameras by a key: its plate text (an attribute, normalised
to upper-case letters and digits), another attribute, or a track id that the cameras
share (a multi-sensor unit with one tracker). The first sighting at an entry camera opens
a journey; sightings at entry cameras while it is open change nothing. The first sighting
at an exit camera at or after the entry closes it: ``transit.completed`` at that frame's
time, with ``delta_s``. A journey still open ``within_s`` after its entry is
``transit.overdue``, at entry + ``within_s`` of event time, when the watermark passes it
(never by the wall clock, so a replay gives the same event). At most ``max_pending``
journeys are open; past that the oldest is dropped and counted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

from edge_node.aggregation.model import (
    Detection,
    Entity,
    Event,
    Evidence,
    Provenance,
    Sighting,
    event_id,
)
from edge_node.aggregation.rules.base import wanted

__all__ = ["Correlation", "CorrelationConfig", "normalise_plate"]

COMPLETED = "transit.completed"
OVERDUE = "transit.overdue"
MatchBy = Literal["plate", "attribute", "track"]


@dataclass(frozen=True, slots=True)
class CorrelationConfig:
    rule_id: str
    entry: frozenset[str]
    exit: frozenset[str]
    within_s: float
    match_by: MatchBy = "plate"
    attribute: str = "plate_text"
    classes: frozenset[str] | None = None
    min_score: float = 0.0
    max_pending: int = 10_000


@dataclass(slots=True)
class _Journey:
    key: str
    class_name: str
    entered: Evidence
    provenance: Provenance


def normalise_plate(text: str) -> str:
    return "".join(ch for ch in text.upper() if ch.isalnum())


class Correlation:
    has_timers = True

    def __init__(self, config: CorrelationConfig) -> None:
        self.config = config
        self.rule_id = config.rule_id
        self.cameras: frozenset[str] | None = config.entry | config.exit
        self.pending: dict[str, _Journey] = {}
        self._due: list[tuple[float, str, float]] = []
        self.dropped = 0

    def state_size(self) -> int:
        return len(self.pending)

    def key_of(self, detection: Detection) -> str | None:
        config = self.config
        if config.match_by == "track":
            return detection.track_id
        value = detection.attributes.get(config.attribute)
        if not value:
            return None
        if config.match_by == "plate":
            return normalise_plate(value) or None
        return value

    def advance(self, at: float) -> list[Event]:
        due = self._due
        if not due or due[0][0] > at:
            return []
        events = []
        while due and due[0][0] <= at:
            deadline, key, entered_at = heapq.heappop(due)
            journey = self.pending.get(key)
            if journey is None or journey.entered.at != entered_at:
                continue  # completed or dropped meanwhile
            del self.pending[key]
            events.append(self._event(OVERDUE, journey, deadline, None, None))
        return events

    def observe(self, sighting: Sighting) -> list[Event]:
        config = self.config
        source = sighting.source
        is_entry = source in config.entry
        is_exit = source in config.exit
        events: list[Event] = []
        for detection in sighting.detections:
            if not wanted(detection, config.classes, config.min_score):
                continue
            key = self.key_of(detection)
            if key is None:
                continue
            journey = self.pending.get(key)
            if journey is not None and is_exit:
                del self.pending[key]
                events.append(
                    self._event(
                        COMPLETED,
                        journey,
                        sighting.at,
                        sighting.evidence(),
                        sighting.observation.provenance,
                    )
                )
            elif journey is None and is_entry:
                if len(self.pending) >= config.max_pending:
                    del self.pending[next(iter(self.pending))]
                    self.dropped += 1
                entered = sighting.evidence()
                self.pending[key] = _Journey(
                    key, detection.class_name, entered, sighting.observation.provenance
                )
                heapq.heappush(self._due, (entered.at + config.within_s, key, entered.at))
                if len(self._due) > 2 * config.max_pending:
                    self._compact()
        return events

    def _compact(self) -> None:
        """Drop the deadlines of journeys that completed or were dropped (bounded heap)."""
        within = self.config.within_s
        self._due = [(j.entered.at + within, k, j.entered.at) for k, j in self.pending.items()]
        heapq.heapify(self._due)

    def _event(
        self,
        kind: str,
        journey: _Journey,
        at: float,
        left: Evidence | None,
        left_by: Provenance | None,
    ) -> Event:
        entered = journey.entered
        match_by = self.config.match_by
        entity_kind = self.config.attribute if match_by == "attribute" else match_by
        attributes = {"entered_camera": entered.camera}
        values = {"entered_at": entered.at}
        if left is not None:
            attributes["left_camera"] = left.camera
            values["delta_s"] = left.at - entered.at
        else:
            values["within_s"] = self.config.within_s
        return Event(
            event_id=event_id(self.rule_id, kind, journey.key, entered.camera, entered.at),
            type=kind,
            rule_id=self.rule_id,
            at=at,
            entities=(Entity(entity_kind, journey.key, journey.class_name),),
            evidence=(entered,) if left is None else (entered, left),
            provenance=tuple(sorted({journey.provenance, *([left_by] if left_by else [])})),
            attributes=attributes,
            values=values,
        )
