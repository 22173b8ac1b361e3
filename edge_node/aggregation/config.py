"""The rules file, parsed: a plain dict (from YAML) in, frozen rule configs out.

Every refusal is a :class:`RulesConfigError` naming the field as a path
(``rules[2].line``) and what was expected, so an operator can fix the file from the
message alone. Durations are seconds as numbers or strings with a unit (``50ms``, ``2s``,
``5m``, ``1h``). Unknown keys are refused: a misspelt ``inertia`` must not silently
become the default. The file itself is read by ``edge_node.aggregation.rules_file``.

    version: 1
    time: {allowed_lateness: 50ms, idle_timeout: 2s, max_future: 5s}
    tracker: {enabled: true, iou_threshold: 0.3, min_hits: 1, lost_after: 2s}
    cameras: [gate-a, gate-b]          # optional allow-list
    rules:
      - {id: yard, type: zone_intrusion, camera: gate-a, zone: [[0, 0], [1, 0], [1, 1]]}
      - {id: door, type: line_crossing, camera: gate-a, line: [[0, 0.5], [1, 0.5]]}
      - {id: loiter, type: dwell, camera: gate-a, zone: [...], min_time: 2m}
      - {id: people, type: count, interval: 1m, classes: [person]}
      - {id: transit, type: correlation, entry: [gate-a], exit: [gate-b], within: 30m}
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from edge_node.aggregation.engine import AggregationConfig, Aggregator
from edge_node.aggregation.errors import RulesConfigError
from edge_node.aggregation.geometry import ANCHORS, Anchor, Point, Polygon
from edge_node.aggregation.rules.base import Rule
from edge_node.aggregation.rules.correlation import Correlation, CorrelationConfig, MatchBy
from edge_node.aggregation.rules.counts import ClassCounts, ClassCountsConfig
from edge_node.aggregation.rules.dwell import Dwell, DwellConfig
from edge_node.aggregation.rules.line import DIRECTIONS, LineCrossing, LineCrossingConfig
from edge_node.aggregation.rules.zone import ZoneIntrusion, ZoneIntrusionConfig
from edge_node.aggregation.timeline import AlignerConfig
from edge_node.aggregation.tracker import TrackerConfig

__all__ = [
    "RULE_TYPES",
    "RuleConfig",
    "RulesFile",
    "build_aggregator",
    "build_rule",
    "parse_duration",
    "parse_rules",
]

RuleConfig = (
    ZoneIntrusionConfig | LineCrossingConfig | DwellConfig | ClassCountsConfig | CorrelationConfig
)
RULE_TYPES: Final = ("zone_intrusion", "line_crossing", "dwell", "count", "correlation")
MAX_RULES: Final = 500
MAX_POLYGON_POINTS: Final = 64
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class RulesFile:
    aggregation: AggregationConfig
    rules: tuple[RuleConfig, ...]


def parse_duration(value: object, field: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool):
        raise RulesConfigError(field, "expected a duration (2s, 50ms, 5m, or seconds)")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match[1]) * _UNIT_S[match[2]]
    else:
        raise RulesConfigError(
            field, f"expected a duration (2s, 50ms, 5m, or seconds), got {value!r}"
        )
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise RulesConfigError(field, f"expected a duration above zero, got {value!r}")
    return seconds


class _Fields:
    """One mapping being read: typed getters that name the field, unknown keys refused."""

    def __init__(self, doc: object, path: str, known: Sequence[str]) -> None:
        if not isinstance(doc, Mapping):
            raise RulesConfigError(path or "(top)", f"expected a mapping, got {type(doc).__name__}")
        unknown = sorted(str(k) for k in doc if k not in known)
        if unknown:
            where = f"{path}.{unknown[0]}" if path else unknown[0]
            raise RulesConfigError(where, f"unknown key (known: {', '.join(known)})")
        self.doc = cast(Mapping[str, Any], doc)
        self.path = path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.doc

    def required(self, key: str) -> Any:
        if key not in self.doc:
            raise RulesConfigError(self.name(key), "required")
        return self.doc[key]

    def string(self, key: str) -> str:
        value = self.required(key)
        if not isinstance(value, str) or not _ID.match(value):
            raise RulesConfigError(
                self.name(key),
                f"expected a name of letters, digits and _.:- (at most 64), got {value!r}",
            )
        return value

    def strings(self, key: str, default: frozenset[str] | None = None) -> frozenset[str] | None:
        if key not in self.doc:
            return default
        value = self.doc[key]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise RulesConfigError(self.name(key), "expected a non-empty list of names")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not _ID.match(item):
                raise RulesConfigError(f"{self.name(key)}[{i}]", f"expected a name, got {item!r}")
        return frozenset(value)

    def number(self, key: str, default: float, low: float, high: float) -> float:
        value = self.doc.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            raise RulesConfigError(
                self.name(key), f"expected a number in [{low}, {high}], got {value!r}"
            )
        return float(value)

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
            raise RulesConfigError(
                self.name(key), f"expected an integer in [{low}, {high}], got {value!r}"
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.doc.get(key, default)
        if not isinstance(value, bool):
            raise RulesConfigError(self.name(key), f"expected true or false, got {value!r}")
        return value

    def duration(self, key: str, default: float | None = None) -> float:
        if key not in self.doc:
            if default is None:
                raise RulesConfigError(self.name(key), "required")
            return default
        return parse_duration(self.doc[key], self.name(key))

    def anchor(self) -> Anchor:
        value = self.doc.get("anchor", "bottom_centre")
        if value not in ANCHORS:
            raise RulesConfigError(
                self.name("anchor"), f"expected one of {', '.join(ANCHORS)}, got {value!r}"
            )
        return cast(Anchor, value)

    def points(self, key: str, low: int, high: int) -> tuple[Point, ...]:
        value = self.required(key)
        shape = f"expected {low}{'' if low == high else f' to {high}'} [x, y] points in [0, 1]"
        if not isinstance(value, list) or not low <= len(value) <= high:
            raise RulesConfigError(self.name(key), shape)
        out: list[Point] = []
        for i, point in enumerate(value):
            if (
                not isinstance(point, list | tuple)
                or len(point) != 2
                or not all(
                    isinstance(c, int | float) and not isinstance(c, bool) and 0 <= c <= 1
                    for c in point
                )
            ):
                raise RulesConfigError(f"{self.name(key)}[{i}]", f"{shape}, got {point!r}")
            out.append((float(point[0]), float(point[1])))
        return tuple(out)

    def polygon(self, key: str) -> Polygon:
        polygon = self.points(key, 3, MAX_POLYGON_POINTS)
        area = sum(
            a[0] * b[1] - b[0] * a[1]
            for a, b in zip(polygon, polygon[1:] + polygon[:1], strict=True)
        )
        if abs(area) < 1e-9:
            raise RulesConfigError(self.name(key), "the polygon has no area")
        return polygon


_COMMON = ("id", "type", "classes", "min_score")
_TRACKS = ("lost_after", "max_tracks")


def _zone(f: _Fields, rule_id: str) -> ZoneIntrusionConfig:
    return ZoneIntrusionConfig(
        rule_id=rule_id,
        camera=f.string("camera"),
        polygon=f.polygon("zone"),
        classes=f.strings("classes"),
        min_score=f.number("min_score", 0.0, 0.0, 1.0),
        anchor=f.anchor(),
        inertia=f.integer("inertia", 3, 1, 1000),
        lost_after_s=f.duration("lost_after", 10.0),
        max_tracks=f.integer("max_tracks", 10_000, 1, 1_000_000),
    )


def _line(f: _Fields, rule_id: str) -> LineCrossingConfig:
    a, b = f.points("line", 2, 2)
    if a == b:
        raise RulesConfigError(f.name("line"), "the two points must differ")
    directions = f.strings("directions", frozenset(DIRECTIONS))
    assert directions is not None
    bad = sorted(directions - set(DIRECTIONS))
    if bad:
        raise RulesConfigError(f.name("directions"), f"expected in and/or out, got {bad[0]!r}")
    return LineCrossingConfig(
        rule_id=rule_id,
        camera=f.string("camera"),
        a=a,
        b=b,
        directions=directions,
        classes=f.strings("classes"),
        min_score=f.number("min_score", 0.0, 0.0, 1.0),
        anchor=f.anchor(),
        hysteresis=f.number("hysteresis", 0.02, 0.0, 0.5),
        min_frames=f.integer("min_frames", 2, 1, 1000),
        extend=f.boolean("extend", False),
        lost_after_s=f.duration("lost_after", 10.0),
        max_tracks=f.integer("max_tracks", 10_000, 1, 1_000_000),
    )


def _dwell(f: _Fields, rule_id: str) -> DwellConfig:
    return DwellConfig(
        rule_id=rule_id,
        camera=f.string("camera"),
        polygon=f.polygon("zone"),
        min_time_s=f.duration("min_time"),
        classes=f.strings("classes"),
        min_score=f.number("min_score", 0.0, 0.0, 1.0),
        anchor=f.anchor(),
        inertia=f.integer("inertia", 3, 1, 1000),
        lost_after_s=f.duration("lost_after", 10.0),
        max_tracks=f.integer("max_tracks", 10_000, 1, 1_000_000),
    )


def _count(f: _Fields, rule_id: str) -> ClassCountsConfig:
    return ClassCountsConfig(
        rule_id=rule_id,
        interval_s=f.duration("interval"),
        cameras=f.strings("cameras"),
        classes=f.strings("classes"),
        min_score=f.number("min_score", 0.0, 0.0, 1.0),
        polygon=f.polygon("zone") if f.has("zone") else None,
        anchor=f.anchor(),
        max_open=f.integer("max_open", 1_000, 1, 1_000_000),
    )


def _correlation(f: _Fields, rule_id: str) -> CorrelationConfig:
    entry, exit_ = f.strings("entry"), f.strings("exit")
    if entry is None:
        raise RulesConfigError(f.name("entry"), "required")
    if exit_ is None:
        raise RulesConfigError(f.name("exit"), "required")
    if entry & exit_:
        raise RulesConfigError(
            f.name("exit"), f"a camera cannot be both entry and exit: {sorted(entry & exit_)[0]}"
        )
    match_by = f.doc.get("match_by", "plate")
    if match_by not in ("plate", "attribute", "track"):
        raise RulesConfigError(
            f.name("match_by"), f"expected plate, attribute or track, got {match_by!r}"
        )
    if match_by == "attribute" and not f.has("attribute"):
        raise RulesConfigError(f.name("attribute"), "required with match_by: attribute")
    return CorrelationConfig(
        rule_id=rule_id,
        entry=entry,
        exit=exit_,
        within_s=f.duration("within"),
        match_by=cast(MatchBy, match_by),
        attribute=f.string("attribute") if f.has("attribute") else "plate_text",
        classes=f.strings("classes"),
        min_score=f.number("min_score", 0.0, 0.0, 1.0),
        max_pending=f.integer("max_pending", 10_000, 1, 1_000_000),
    )


_RULES: Final[dict[str, tuple[tuple[str, ...], Callable[[_Fields, str], RuleConfig]]]] = {
    "zone_intrusion": (("camera", "zone", "anchor", "inertia", *_TRACKS), _zone),
    "line_crossing": (
        ("camera", "line", "directions", "anchor", "hysteresis", "min_frames", "extend", *_TRACKS),
        _line,
    ),
    "dwell": (("camera", "zone", "min_time", "anchor", "inertia", *_TRACKS), _dwell),
    "count": (("cameras", "interval", "zone", "anchor", "max_open"), _count),
    "correlation": (
        ("entry", "exit", "within", "match_by", "attribute", "max_pending"),
        _correlation,
    ),
}


def _rule(doc: object, path: str) -> RuleConfig:
    if not isinstance(doc, Mapping):
        raise RulesConfigError(path, f"expected a mapping, got {type(doc).__name__}")
    kind = doc.get("type")
    if kind not in _RULES:
        raise RulesConfigError(
            f"{path}.type", f"expected one of {', '.join(RULE_TYPES)}, got {kind!r}"
        )
    known, parse = _RULES[kind]
    f = _Fields(doc, path, (*_COMMON, *known))
    return parse(f, f.string("id"))


def parse_rules(doc: object) -> RulesFile:
    """Check a rules document (what ``yaml.safe_load`` returned) and build its configs."""
    top = _Fields(doc, "", ("version", "time", "tracker", "cameras", "rules"))
    version = top.doc.get("version", 1)
    if version != 1:
        raise RulesConfigError("version", f"expected 1, got {version!r}")
    time = _Fields(
        top.doc.get("time", {}),
        "time",
        ("allowed_lateness", "idle_timeout", "max_future", "dedup_horizon", "max_buffered"),
    )
    aligner = AlignerConfig(
        allowed_lateness_s=parse_duration(
            time.doc.get("allowed_lateness", 0.05), "time.allowed_lateness", allow_zero=True
        ),
        idle_timeout_s=time.duration("idle_timeout", 2.0),
        max_future_s=time.duration("max_future", 5.0),
        dedup_horizon_s=time.duration("dedup_horizon", 120.0),
        max_buffered=time.integer("max_buffered", 20_000, 1, 10_000_000),
        known_sources=top.strings("cameras"),
    )
    tracking = _Fields(
        top.doc.get("tracker", {}),
        "tracker",
        ("enabled", "iou_threshold", "max_centre_distance", "min_hits", "lost_after", "max_tracks"),
    )
    tracker = (
        TrackerConfig(
            iou_threshold=tracking.number("iou_threshold", 0.3, 0.01, 1.0),
            max_centre_distance=tracking.number("max_centre_distance", 0.05, 0.0, 1.0),
            min_hits=tracking.integer("min_hits", 1, 1, 100),
            lost_after_s=tracking.duration("lost_after", 2.0),
            max_tracks=tracking.integer("max_tracks", 256, 1, 100_000),
        )
        if tracking.boolean("enabled", True)
        else None
    )
    items = top.doc.get("rules", [])
    if not isinstance(items, list) or len(items) > MAX_RULES:
        raise RulesConfigError("rules", f"expected a list of at most {MAX_RULES} rules")
    rules = tuple(_rule(item, f"rules[{i}]") for i, item in enumerate(items))
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.rule_id in seen:
            raise RulesConfigError(f"rules[{i}].id", f"duplicate rule id {rule.rule_id!r}")
        seen.add(rule.rule_id)
    known = aligner.known_sources
    if known is not None:
        for i, rule in enumerate(rules):
            cameras = _cameras_of(rule)
            for camera in sorted(cameras - known):
                raise RulesConfigError(f"rules[{i}]", f"camera {camera!r} is not in cameras")
    return RulesFile(AggregationConfig(aligner=aligner, tracker=tracker), rules)


def _cameras_of(rule: RuleConfig) -> frozenset[str]:
    if isinstance(rule, ClassCountsConfig):
        return rule.cameras or frozenset()
    if isinstance(rule, CorrelationConfig):
        return rule.entry | rule.exit
    return frozenset({rule.camera})


def build_rule(config: RuleConfig) -> Rule:
    if isinstance(config, ZoneIntrusionConfig):
        return ZoneIntrusion(config)
    if isinstance(config, LineCrossingConfig):
        return LineCrossing(config)
    if isinstance(config, DwellConfig):
        return Dwell(config)
    if isinstance(config, ClassCountsConfig):
        return ClassCounts(config)
    return Correlation(config)


def build_aggregator(rules_file: RulesFile) -> Aggregator:
    return Aggregator(rules_file.aggregation, [build_rule(r) for r in rules_file.rules])
