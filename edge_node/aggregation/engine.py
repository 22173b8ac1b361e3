"""The aggregation engine: observations in (any order, from any camera), events out.

:class:`Aggregator` puts the pure parts in a row: the aligner (clock offsets, watermark,
lateness, duplicates), the tracker (ids for detections that have none), then the rules in
event-time order. Before each sighting every rule with timers is advanced to its time,
so a timer due earlier (an interval's end, an overdue journey) fires first whatever the
batching; after a batch, every rule is advanced to the watermark. Nothing here reads a
clock or a file: the caller passes ``now`` (node clock, seconds) and gets events back to
hand to the outbox.

Not here: where observations come from (the device contract's and the node runtime's
adapters), where events go (the outbox, through ``edge_node.aggregation.wire``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_node.aggregation.model import Event, Observation, Sighting
from edge_node.aggregation.rules.base import Rule
from edge_node.aggregation.timeline import Aligner, AlignerConfig, Released
from edge_node.aggregation.tracker import IouTracker, TrackerConfig

__all__ = ["AggregationConfig", "Aggregator"]


@dataclass(frozen=True, slots=True)
class AggregationConfig:
    aligner: AlignerConfig = field(default_factory=AlignerConfig)
    # None: no node-side tracker (every detection keeps the id it came with, or none).
    tracker: TrackerConfig | None = field(default_factory=TrackerConfig)


class Aggregator:
    def __init__(self, config: AggregationConfig, rules: Sequence[Rule]) -> None:
        ids = [rule.rule_id for rule in rules]
        if len(set(ids)) != len(ids):
            raise ValueError(f"rule ids must be unique: {sorted(ids)}")
        self.config = config
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.aligner = Aligner(config.aligner)
        self.tracker = IouTracker(config.tracker) if config.tracker is not None else None
        self.events_by_type: Counter[str] = Counter()
        self.sightings = 0
        self._routes: dict[str, tuple[Rule, ...]] = {}
        self._timed = tuple(rule for rule in self.rules if rule.has_timers)

    def set_clock_offset(self, source: str, offset_s: float) -> None:
        """The camera's clock minus the node's, from its heartbeat's estimate."""
        self.aligner.set_clock_offset(source, offset_s)

    def offer(self, observation: Observation, now: float) -> list[Event]:
        return self._apply(self.aligner.offer(observation, now))

    def offer_many(self, observations: Iterable[Observation], now: float) -> list[Event]:
        """`offer` for a batch that arrived at `now`: the aligner takes each, and what it
        releases goes through the rules once, in event-time order, so the rules are
        advanced to the watermark once a batch instead of once an observation. The same
        events as offering them one by one (timers are advanced before each sighting)."""
        offer = self.aligner.offer
        released: list[Released] = []
        for observation in observations:
            released += offer(observation, now)
        return self._apply(released)

    def advance(self, now: float) -> list[Event]:
        """Let time pass with no new observation (idle cameras, timers)."""
        return self._apply(self.aligner.advance(now))

    def flush(self) -> list[Event]:
        """Apply everything still waiting for the watermark (end of input, shutdown)."""
        return self._apply(self.aligner.flush())

    def state_sizes(self) -> dict[str, int]:
        sizes = {rule.rule_id: rule.state_size() for rule in self.rules}
        sizes["aligner.buffered"] = self.aligner.buffered
        sizes["aligner.ids"] = self.aligner.remembered_ids
        return sizes

    def health(self) -> dict[str, Any]:
        """Counters by reason, for the node's health report."""
        stats = self.aligner.stats
        return {
            "sightings": self.sightings,
            "events": dict(self.events_by_type),
            "duplicates": stats.total("duplicates"),
            "late_applied": stats.total("late_applied"),
            "too_late": stats.total("too_late"),
            "future": stats.total("future"),
            "unknown_source": stats.unknown_source,
            "invalid_time": stats.invalid_time,
            "released_early": stats.released_early,
            "watermark": self.aligner.watermark,
            "state": self.state_sizes(),
        }

    def _route(self, source: str) -> tuple[Rule, ...]:
        rules = self._routes.get(source)
        if rules is None:
            rules = tuple(r for r in self.rules if r.cameras is None or source in r.cameras)
            self._routes[source] = rules
        return rules

    def _apply(self, released: list[Released]) -> list[Event]:
        events: list[Event] = []
        all_rules = self.rules
        timed = self._timed
        tracker = self.tracker
        for at, observation in released:
            for rule in timed:
                due = rule.advance(at)
                if due:
                    events += due
            detections = observation.detections
            if tracker is not None:
                detections = tracker.assign(observation.source, at, detections)
            sighting = Sighting(at, observation, detections)
            for rule in self._route(observation.source):
                found = rule.observe(sighting)
                if found:
                    events += found
        self.sightings += len(released)
        watermark = self.aligner.watermark
        for rule in all_rules:
            due = rule.advance(watermark)
            if due:
                events += due
        for event in events:
            self.events_by_type[event.type] += 1
        return events
