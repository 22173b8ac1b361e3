"""``protos.health_schema``: the health report's JSON against ``HealthReport`` (health.proto),
strict for the node, lenient for the control plane, and in step with protobuf's own JSON
mapping."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from protos.edgefleet.fleet.v1.health_pb2 import HealthReport
from protos.health_schema import SCHEMA, ReportSchemaError, check_report, conform_report

CAPTURED = Path(__file__).parent / "data" / "node_report_v2.json"


def captured() -> dict[str, Any]:
    """A report as the node wrote it before health.proto existed (how it was made:
    tests/control_plane/health/test_report_schema.py)."""
    doc: dict[str, Any] = json.loads(CAPTURED.read_bytes())
    return doc


def problems_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ReportSchemaError) as caught:
        check_report(doc)
    return [str(p) for p in caught.value.problems]


def test_a_node_report_fits_and_is_standard_proto3_json() -> None:
    doc = captured()
    assert doc["schema"] == SCHEMA == "edgefleet.agent.health/2"
    check_report(doc)
    # protobuf's own JSON parser reads it too, refusing unknown fields: any language's
    # protobuf library can read a report with nothing but health.proto.
    message = json_format.ParseDict(doc, HealthReport())
    assert message.memory.rss_bytes == doc["memory"]["rss_bytes"]
    assert (
        message.latency["detector/1.4.0"].compute.sketch_ms.bins
        == (doc["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]["bins"])
    )
    assert message.HasField("queue_depth_frames") and message.queue_depth_frames == 2
    assert message.thermal.zones[1].HasField("passive_c") is False  # null is "not set"


def test_round_trip_through_the_message_keeps_every_value() -> None:
    doc = captured()
    message = json_format.ParseDict(doc, HealthReport())
    again = HealthReport.FromString(message.SerializeToString())
    assert again == message
    back = json_format.MessageToDict(again, preserving_proto_field_name=True)
    # proto3 JSON writes int64 as strings and leaves unset fields out; read back, the
    # values are the node's.
    assert json_format.ParseDict(back, HealthReport()) == message
    assert int(back["memory"]["rss_bytes"]) == doc["memory"]["rss_bytes"]
    clean, problems = conform_report(doc)
    assert (clean, problems) == (doc, [])


def declared(message: Descriptor, prefix: str = "") -> set[str]:
    """Every field path ``HealthReport`` declares (``[]``: any map key or list index)."""
    paths: set[str] = set()
    for field in message.fields:
        path = prefix + field.name
        paths.add(path)
        target, _ = _inner(field)
        if target is not None:
            paths |= declared(target, path + "[]." if _many(field) else path + ".")
    return paths


def present(doc: dict[str, Any], message: Descriptor, prefix: str = "") -> set[str]:
    """The declared field paths that hold a value (not null) somewhere in ``doc``."""
    paths: set[str] = set()
    for key, value in doc.items():
        field = message.fields_by_name.get(key)
        if field is None or value is None:
            continue
        path = prefix + key
        paths.add(path)
        target, is_map = _inner(field)
        if target is None:
            continue
        entries = list(value.values()) if is_map else value if field.is_repeated else [value]
        for entry in entries:
            if entry is not None:
                paths |= present(entry, target, path + "[]." if _many(field) else path + ".")
    return paths


def _inner(field: Any) -> tuple[Descriptor | None, bool]:
    target = field.message_type
    if target is not None and target.GetOptions().map_entry:
        return target.fields_by_name["value"].message_type, True
    return target, False


def _many(field: Any) -> bool:
    return bool(field.is_repeated)


# Declared after the report above was captured; tests/edge_node/telemetry/test_telemetry.py
# shows the node sending each (issue 12: drop-directory files passed over, the outbox's
# files on disk).
ADDED_SINCE_CAPTURE = (
    {
        "streams[].capture_passed_over",
        "outbox.disk_bytes",
        "outbox.pending_results",
        "outbox.dropped_results",
    }
    | {  # issue 13: the shadow stage (tests/edge_node/agent/test_runtime_shadow.py)
        path
        for path in declared(HealthReport.DESCRIPTOR)
        if path == "shadow" or path.startswith("shadow.")
    }
    | {  # issue 14: the aggregation (tests/edge_node/agent/test_aggregation_task.py)
        path
        for path in declared(HealthReport.DESCRIPTOR)
        if path == "aggregation" or path.startswith("aggregation.")
    }
    | {  # issue 14: the device gateway (tests/edge_node/agent/test_agent_devices.py)
        path
        for path in declared(HealthReport.DESCRIPTOR)
        if path == "devices" or path.startswith("devices.")
    }
)


def test_the_schema_declares_nothing_the_node_does_not_send() -> None:
    # The captured report has every section filled: a field declared but never sent
    # would be a promise nobody keeps.
    unsent = declared(HealthReport.DESCRIPTOR) - present(captured(), HealthReport.DESCRIPTOR)
    assert unsent == ADDED_SINCE_CAPTURE


def test_unknown_fields_are_refused_by_the_node_and_ignored_by_the_reader() -> None:
    doc = captured()
    doc["gpu"] = {"util_percent": 40}
    doc["memory"]["swap_bytes"] = 0
    doc["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]["layout"] = "log"
    assert problems_of(doc) == [
        "latency['detector/1.4.0'].compute.sketch_ms.layout: not in the schema",
        "memory.swap_bytes: not in the schema",
        "gpu: not in the schema",
    ]
    clean, problems = conform_report(doc)
    assert problems == []
    assert clean == captured()
    json_format.ParseDict(doc, HealthReport(), ignore_unknown_fields=True)  # protobuf agrees


def test_wrong_types_are_named_by_path_and_left_out_only_where_they_are() -> None:
    doc = captured()
    doc["memory"]["rss_bytes"] = "a lot"
    doc["cpu"]["cores"] = True  # a boolean is not a number here
    doc["streams"]["gate"]["dropped"]["rate"] = -0.5
    doc["thermal"] = []
    names = sorted(problems_of(doc))
    assert names == [
        "cpu.cores: boolean True does not fit",
        "memory.rss_bytes: string 'a lot' does not fit",
        "streams['gate'].dropped['rate']: number -0.5 does not fit",
        "thermal: expected an object, got array",
    ]
    clean, problems = conform_report(doc)
    assert sorted(str(p) for p in problems) == names
    assert "rss_bytes" not in clean["memory"] and clean["memory"]["budget_bytes"] == 512_000_000
    assert "cores" not in clean["cpu"] and clean["cpu"]["threads"] == 12
    assert clean["streams"]["gate"]["dropped"] == {"queue_full": 3}
    assert "thermal" not in clean
    assert clean["latency"] == captured()["latency"]


def test_a_bad_element_drops_the_whole_list() -> None:
    doc = captured()
    sketch = doc["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]
    sketch["bins"] = [*sketch["bins"][:-1], "48"]
    clean, problems = conform_report(doc)
    assert [p.path for p in problems] == ["latency['detector/1.4.0'].compute.sketch_ms.bins[5]"]
    kept = clean["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]
    assert "bins" not in kept and kept["n"] == 120  # not a shorter list that reads as another


def test_null_is_not_set_and_the_node_may_send_it_only_where_the_schema_says() -> None:
    doc = captured()
    doc["model_active"] = None  # optional: fine
    doc["outbox"] = None  # a message: fine
    check_report(doc)
    doc["seq"] = None
    doc["streams"]["gate"]["skipped"]["stale"] = None
    assert sorted(problems_of(doc)) == [
        "seq: null, but the field cannot be unset",
        "streams['gate'].skipped['stale']: null does not fit",
    ]
    clean, problems = conform_report(doc)
    assert clean["seq"] is None and clean["outbox"] is None
    assert clean["streams"]["gate"]["skipped"] == {}
    assert [p.path for p in problems] == ["streams['gate'].skipped['stale']"]


@pytest.mark.parametrize(
    ("name", "value", "node_sends_it", "read_as"),
    [
        ("seq", 3.0, False, 3),  # proto3 JSON reads an integral number as an integer
        ("seq", 3.5, False, None),
        ("seq", 2**63, False, None),  # int64 bounds
        ("window_s", 30, True, 30),  # an integer is a fine double
        ("window_s", float("inf"), False, None),
        ("uptime_s", float("nan"), False, None),
        ("drift_suspected", 1, False, None),
        ("node_id", 7, False, None),
    ],
)
def test_numbers_follow_the_proto3_json_mapping(
    name: str, value: object, node_sends_it: bool, read_as: object
) -> None:
    doc = captured()
    doc[name] = value
    if node_sends_it:
        check_report(doc)
    else:
        assert [p.split(":")[0] for p in problems_of(doc)] == [name]
    clean, _ = conform_report(doc)
    assert clean.get(name) == read_as
    assert type(clean.get(name)) is type(read_as)


def test_the_node_refuses_another_schema_string() -> None:
    doc = captured()
    doc["schema"] = "edgefleet.agent.health/3"
    assert problems_of(doc) == [
        "schema: 'edgefleet.agent.health/3' is not 'edgefleet.agent.health/2'"
    ]


def test_the_error_lists_every_problem_and_stays_short() -> None:
    doc = captured()
    for i in range(40):
        doc[f"extra_{i}"] = i
    with pytest.raises(ReportSchemaError) as caught:
        check_report(doc)
    assert len(caught.value.problems) == 32  # bounded, like everything a peer can grow
    assert str(caught.value).endswith("(and 24 more)")
    assert "extra_0: not in the schema" in str(caught.value)


def test_conforming_does_not_touch_the_input() -> None:
    doc = captured()
    doc["memory"]["rss_bytes"] = "a lot"
    before = copy.deepcopy(doc)
    conform_report(doc)
    assert doc == before
