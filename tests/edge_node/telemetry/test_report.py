"""The node's report checked against ``HealthReport`` (health.proto) as it is encoded: what
does not fit the schema never leaves the node, and the bytes on the wire are unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_node.telemetry.report import ReportSchemaError, bound_size, encode
from protos.health_schema import check_report

CAPTURED = (Path(__file__).parents[2] / "protos" / "data" / "node_report_v2.json").read_bytes()


def captured() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(CAPTURED)
    return doc


def test_the_wire_form_is_what_nodes_sent_before_the_schema() -> None:
    # Byte for byte: control planes that predate health.proto read new nodes unchanged.
    assert encode(captured()) == CAPTURED


def test_a_field_the_schema_does_not_declare_is_refused_before_it_is_encoded() -> None:
    report = captured()
    report["memory"]["swap_bytes"] = 0
    report["cpu"]["cores"] = "4"
    with pytest.raises(ReportSchemaError) as caught:
        encode(report)
    assert [str(p) for p in caught.value.problems] == [
        "cpu.cores: string '4' does not fit",
        "memory.swap_bytes: not in the schema",
    ]
    assert "does not fit edgefleet.agent.health/2" in str(caught.value)
    with pytest.raises(ReportSchemaError):
        bound_size(report, 1_000_000)


def test_a_report_shed_to_its_bound_still_fits_the_schema() -> None:
    report = captured()
    data = bound_size(report, 2000)
    assert len(data) < len(CAPTURED)
    assert report["telemetry"]["sketches_dropped"] is True and report["streams"] == {}
    assert report["streams_omitted"] == 2
    check_report(report)
    assert json.loads(data) == report
