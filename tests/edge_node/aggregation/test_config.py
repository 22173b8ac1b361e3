"""The rules file: a full document parsed, each refusal naming its field, the file adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_node.aggregation.config import build_aggregator, parse_duration, parse_rules
from edge_node.aggregation.errors import RulesConfigError
from edge_node.aggregation.rules.correlation import CorrelationConfig
from edge_node.aggregation.rules.line import LineCrossingConfig
from edge_node.aggregation.rules_file import load_rules_file
from edge_node.errors import InvalidInputError

EXAMPLE = """
version: 1
time: {allowed_lateness: 80ms, idle_timeout: 3s}
tracker: {iou_threshold: 0.4, min_hits: 2}
cameras: [gate-a, gate-b]
rules:
  - id: yard
    type: zone_intrusion
    camera: gate-a
    zone: [[0.1, 0.1], [0.9, 0.1], [0.9, 0.9], [0.1, 0.9]]
    classes: [person]
    anchor: centre
  - id: door
    type: line_crossing
    camera: gate-a
    line: [[0, 0.5], [1, 0.5]]
    directions: [in]
    hysteresis: 0.03
  - id: loiter
    type: dwell
    camera: gate-b
    zone: [[0, 0], [1, 0], [1, 1]]
    min_time: 2m
  - id: people
    type: count
    interval: 1m
    classes: [person, vehicle]
  - id: transit
    type: correlation
    entry: gate-a
    exit: [gate-b]
    within: 30m
"""


def test_a_full_file_is_parsed_and_builds_an_aggregator(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(EXAMPLE)
    parsed = load_rules_file(path)
    assert parsed.aggregation.aligner.allowed_lateness_s == pytest.approx(0.08)
    assert parsed.aggregation.aligner.known_sources == {"gate-a", "gate-b"}
    assert parsed.aggregation.tracker is not None
    assert parsed.aggregation.tracker.min_hits == 2
    assert [r.rule_id for r in parsed.rules] == ["yard", "door", "loiter", "people", "transit"]
    door = parsed.rules[1]
    assert isinstance(door, LineCrossingConfig)
    assert door.directions == {"in"} and door.hysteresis == 0.03
    transit = parsed.rules[4]
    assert isinstance(transit, CorrelationConfig)
    assert transit.within_s == 1800 and transit.entry == {"gate-a"}
    assert len(build_aggregator(parsed).rules) == 5


def test_the_tracker_can_be_off() -> None:
    assert parse_rules({"tracker": {"enabled": False}}).aggregation.tracker is None


def test_an_empty_file_is_no_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("")
    assert load_rules_file(path).rules == ()


def zone(**kw: Any) -> dict[str, Any]:
    return {
        "id": "z",
        "type": "zone_intrusion",
        "camera": "c",
        "zone": [[0, 0], [1, 0], [1, 1]],
        **kw,
    }


@pytest.mark.parametrize(
    ("doc", "field", "says"),
    [
        ({"version": 2}, "version", "expected 1"),
        ({"rulez": []}, "rulez", "unknown key"),
        ({"rules": [zone(type="zone")]}, "rules[0].type", "expected one of"),
        ({"rules": [zone(inertai=3)]}, "rules[0].inertai", "unknown key"),
        ({"rules": [zone(zone=[[0, 0], [1, 1]])]}, "rules[0].zone", "3 to 64"),
        ({"rules": [zone(zone=[[0, 0], [1, 0], [2, 1]])]}, "rules[0].zone[2]", "in [0, 1]"),
        ({"rules": [zone(zone=[[0, 0], [0.5, 0.5], [1, 1]])]}, "rules[0].zone", "no area"),
        ({"rules": [zone(anchor="feet")]}, "rules[0].anchor", "bottom_centre"),
        ({"rules": [zone(inertia=0)]}, "rules[0].inertia", "integer in [1, 1000]"),
        ({"rules": [zone(camera=None)]}, "rules[0].camera", "expected a name"),
        ({"rules": [zone(), zone()]}, "rules[1].id", "duplicate"),
        (
            {"rules": [{"id": "l", "type": "line_crossing", "camera": "c"}]},
            "rules[0].line",
            "required",
        ),
        (
            {
                "rules": [
                    {"id": "l", "type": "line_crossing", "camera": "c", "line": [[0, 0], [0, 0]]}
                ]
            },
            "rules[0].line",
            "differ",
        ),
        (
            {
                "rules": [
                    {
                        "id": "l",
                        "type": "line_crossing",
                        "camera": "c",
                        "line": [[0, 0], [1, 0]],
                        "directions": ["up"],
                    }
                ]
            },
            "rules[0].directions",
            "in and/or out",
        ),
        (
            {
                "rules": [
                    {
                        "id": "d",
                        "type": "dwell",
                        "camera": "c",
                        "zone": [[0, 0], [1, 0], [1, 1]],
                        "min_time": "soon",
                    }
                ]
            },
            "rules[0].min_time",
            "duration",
        ),
        ({"rules": [{"id": "n", "type": "count"}]}, "rules[0].interval", "required"),
        (
            {
                "rules": [
                    {"id": "t", "type": "correlation", "entry": ["a"], "exit": ["a"], "within": 60}
                ]
            },
            "rules[0].exit",
            "both entry and exit",
        ),
        (
            {
                "rules": [
                    {
                        "id": "t",
                        "type": "correlation",
                        "entry": ["a"],
                        "exit": ["b"],
                        "within": 60,
                        "match_by": "attribute",
                    }
                ]
            },
            "rules[0].attribute",
            "required",
        ),
        ({"cameras": ["a"], "rules": [zone(camera="b")]}, "rules[0]", "not in cameras"),
        ({"time": {"allowed_lateness": -1}}, "time.allowed_lateness", "above zero"),
        ({"tracker": {"iou_threshold": 2}}, "tracker.iou_threshold", "in [0.01, 1.0]"),
        ([], "(top)", "expected a mapping"),
    ],
)
def test_each_refusal_names_its_field(doc: Any, field: str, says: str) -> None:
    with pytest.raises(RulesConfigError) as caught:
        parse_rules(doc)
    assert caught.value.field == field
    assert says in caught.value.problem
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, InvalidInputError)


def test_durations() -> None:
    assert parse_duration("50ms", "f") == pytest.approx(0.05)
    assert parse_duration("2m", "f") == 120
    assert parse_duration(1.5, "f") == 1.5
    assert parse_duration("0", "f", allow_zero=True) == 0
    for bad in ("0", True, "2 weeks", None):
        with pytest.raises(RulesConfigError):
            parse_duration(bad, "f")


def test_the_file_adapter_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.yaml"
    with pytest.raises(RulesConfigError, match="cannot be read"):
        load_rules_file(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [unclosed")
    with pytest.raises(RulesConfigError) as caught:
        load_rules_file(broken)
    assert caught.value.field == str(broken)
