"""Counts per class per interval: one event per camera and interval (ONVIF's
CountAggregation), emitted when event time passes the interval's end.

Intervals are tumbling and aligned to the epoch (``[k * interval, (k + 1) * interval)``
on the node's clock), so every node and every replay cuts them the same way. Per class:
``distinct`` tracked objects seen in the interval, and ``peak``, the most in one frame
(what a frame of untracked detections can still say). Only intervals in which the camera
sent at least one frame are reported; listed ``classes`` are reported even at zero. An
optional zone restricts what is counted to anchors inside it. Open intervals are bounded
(``max_open``: the oldest is closed early, counted) and so are distinct ids per class.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from edge_node.aggregation.geometry import Anchor, Polygon, anchor_point, point_in_polygon
from edge_node.aggregation.model import Entity, Event, Evidence, Provenance, Sighting, event_id
from edge_node.aggregation.rules.base import wanted

__all__ = ["ClassCounts", "ClassCountsConfig"]

EVENT_TYPE = "count.interval"


@dataclass(frozen=True, slots=True)
class ClassCountsConfig:
    rule_id: str
    interval_s: float
    cameras: frozenset[str] | None = None
    classes: frozenset[str] | None = None
    min_score: float = 0.0
    polygon: Polygon | None = None
    anchor: Anchor = "bottom_centre"
    max_open: int = 1_000
    max_distinct: int = 10_000  # per class and interval


@dataclass(slots=True)
class _Window:
    frames: int = 0
    first: Evidence | None = None
    last: Evidence | None = None
    distinct: dict[str, set[str]] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    provenance: set[Provenance] = field(default_factory=set)


class ClassCounts:
    has_timers = True

    def __init__(self, config: ClassCountsConfig) -> None:
        self.config = config
        self.rule_id = config.rule_id
        self.cameras = config.cameras
        self.windows: dict[tuple[str, int], _Window] = {}
        self._due: list[tuple[float, str, int]] = []
        self.closed_early = 0
        self.distinct_capped = 0

    def state_size(self) -> int:
        return len(self.windows)

    def advance(self, at: float) -> list[Event]:
        due = self._due
        if not due or due[0][0] > at:
            return []
        events = []
        while due and due[0][0] <= at:
            _, source, index = heapq.heappop(due)
            events.append(self._close(source, index))
        return events

    def observe(self, sighting: Sighting) -> list[Event]:
        config = self.config
        source = sighting.source
        index = math.floor(sighting.at / config.interval_s)
        key = (source, index)
        window = self.windows.get(key)
        events: list[Event] = []
        if window is None:
            if len(self.windows) >= config.max_open:
                _, old_source, old_index = heapq.heappop(self._due)
                events.append(self._close(old_source, old_index))
                self.closed_early += 1
            window = self.windows[key] = _Window()
            heapq.heappush(self._due, ((index + 1) * config.interval_s, source, index))
        evidence = sighting.evidence()
        window.frames += 1
        window.first = window.first or evidence
        window.last = evidence
        window.provenance.add(sighting.observation.provenance)
        in_frame: dict[str, int] = {}
        polygon = config.polygon
        for detection in sighting.detections:
            if not wanted(detection, config.classes, config.min_score):
                continue
            if polygon is not None:
                x, y = anchor_point(detection.box, config.anchor)
                if not point_in_polygon(x, y, polygon):
                    continue
            name = detection.class_name
            in_frame[name] = in_frame.get(name, 0) + 1
            if detection.track_id is not None:
                ids = window.distinct.setdefault(name, set())
                if len(ids) < config.max_distinct:
                    ids.add(detection.track_id)
                elif detection.track_id not in ids:
                    self.distinct_capped += 1
        peak = window.peak
        for name, n in in_frame.items():
            if n > peak.get(name, 0):
                peak[name] = n
        return events

    def _close(self, source: str, index: int) -> Event:
        config = self.config
        window = self.windows.pop((source, index))
        names = sorted(set(window.peak) | set(window.distinct) | set(config.classes or ()))
        values: dict[str, float] = {"frames": float(window.frames)}
        for name in names:
            values[f"{name}.distinct"] = float(len(window.distinct.get(name, ())))
            values[f"{name}.peak"] = float(window.peak.get(name, 0))
        start = index * config.interval_s
        end = start + config.interval_s
        frames = tuple(e for e in (window.first, window.last) if e is not None)
        return Event(
            event_id=event_id(self.rule_id, EVENT_TYPE, source, index),
            type=EVENT_TYPE,
            rule_id=self.rule_id,
            at=end,
            entities=tuple(Entity("class", name, name, source) for name in names),
            evidence=tuple(dict.fromkeys(frames)),
            provenance=tuple(sorted(window.provenance)),
            attributes={"camera": source},
            values={**values, "interval_start": start, "interval_s": config.interval_s},
        )
