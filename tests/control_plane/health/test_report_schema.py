"""The control plane reads ``/2`` reports through ``HealthReport`` (health.proto) and gets
the same points as before it had the definition.

``tests/protos/data/node_report_v2.json`` is a report exactly as the node wrote it before
this schema existed (commit b6fa5da: the ``Rig`` of tests/edge_node/telemetry/
test_telemetry.py with two model versions, drift ready on one, two streams, one with a
camera, thermal zones, an RSS trend, an error, outbox and uplink counters), plus the
fields declared since (``model_runtime``, issue 12), which that commit's reader ignores;
``data/node_report_v2.point.json`` is what that commit's ``parse_report`` made of it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from control_plane.health.report import MAX_PAYLOAD_BYTES, MalformedReportError, parse_report
from tests.control_plane.health.support import START, v2_report

DATA = Path(__file__).parent / "data"
CAPTURED = (Path(__file__).parents[2] / "protos" / "data" / "node_report_v2.json").read_bytes()
CREATED_AT = datetime(2026, 3, 1, 11, 0, tzinfo=UTC)


def as_stored(point: Any) -> dict[str, Any]:
    return {
        "schema": point.schema,
        "at": point.at.isoformat(),
        "metrics": point.metrics,
        "latency": point.latency,
    }


# Numbers read from that report since it was captured (issue 12: bad frames, camera
# capture failures and the outbox's cumulative counters were in it but not read).
READ_SINCE_CAPTURE = {
    "frames_bad": 0.0,
    "frames_corrupt": 0.0,
    "capture_failed": 2.0,
    "outbox_dropped_health": 0.0,
    "outbox_refused_events": 0.0,
}


def test_a_report_from_today_s_node_still_parses_to_the_same_point() -> None:
    expected = json.loads((DATA / "node_report_v2.point.json").read_text())
    expected["metrics"].update(READ_SINCE_CAPTURE)
    point = parse_report(CAPTURED, created_at=CREATED_AT)
    assert as_stored(point) == expected
    assert point.sketches()["detector/1.4.0"]["compute"].count == 120
    assert point.metrics["rss_slope_mb_per_h"] == 360.0 and point.metrics["errors"] == 1.0


def test_unknown_fields_anywhere_are_ignored() -> None:
    doc = json.loads(CAPTURED)
    doc["gpu"] = {"util_percent": 40}
    doc["memory"]["swap_bytes"] = 0
    doc["latency"]["detector/1.4.0"]["npu"] = {"p99_ms": 1.0}
    doc["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]["layout"] = "log"
    point = parse_report(json.dumps(doc).encode(), created_at=CREATED_AT)
    expected = as_stored(parse_report(CAPTURED, created_at=CREATED_AT))
    assert as_stored(point) == expected
    assert "npu" not in point.latency["detector/1.4.0"]


def test_a_field_the_schema_types_otherwise_is_left_out_alone() -> None:
    doc = json.loads(CAPTURED)
    doc["latency"]["detector/1.4.0"]["compute"]["p99_ms"] = True  # not a latency
    doc["latency"]["detector/1.4.0"]["compute"]["sketch_ms"]["bins"][0] = "159"
    doc["thermal"]["throttled"] = "yes"
    doc["outbox"] = ["not", "an", "object"]
    point = parse_report(json.dumps(doc).encode(), created_at=CREATED_AT)
    compute = point.latency["detector/1.4.0"]["compute"]
    assert "p99_ms" not in compute and compute["p95_ms"] == 24.78
    # A sketch without its bins cannot be merged: the percentiles stay, the merge goes.
    assert "sketch_ms" not in compute and "compute" not in point.sketches()["detector/1.4.0"]
    assert "throttled" not in point.metrics and point.metrics["max_temp_c"] == 61.5
    assert not any(name.startswith("outbox_") for name in point.metrics)
    assert point.metrics["rss_bytes"] == 306_000_000


def test_an_integral_number_in_an_integer_field_is_read_as_proto3_json_reads_it() -> None:
    report = v2_report(START, frames_dropped=2.0)
    assert (
        parse_report(json.dumps(report).encode(), created_at=START).metrics["frames_dropped"] == 2.0
    )
    report = v2_report(START, frames_dropped=2.5)  # no such count
    assert (
        "frames_dropped" not in parse_report(json.dumps(report).encode(), created_at=START).metrics
    )


@pytest.mark.parametrize(
    ("payload", "reason", "says"),
    [
        (b"\xff{}", "not-json", "not JSON"),
        (b'"a string"', "not-an-object", "JSON object"),
        (b'{"schema": 2}', "unknown-schema", "unknown report schema 2"),
        (b'{"schema": "edgefleet.agent.status/2"}', "unknown-schema", "edgefleet.agent.status/2"),
        (b" " * (MAX_PAYLOAD_BYTES + 1), "too-large", f"over {MAX_PAYLOAD_BYTES} bytes"),
    ],
)
def test_a_report_that_cannot_be_read_is_refused_with_its_reason(
    payload: bytes, reason: str, says: str
) -> None:
    with pytest.raises(MalformedReportError) as caught:
        parse_report(payload, created_at=START)
    assert caught.value.reason == reason
    assert says in str(caught.value)


def test_the_shadow_section_reaches_the_metrics_and_the_point() -> None:
    doc = json.loads(CAPTURED)
    assert parse_report(CAPTURED, created_at=CREATED_AT).shadow is None
    doc["shadow"] = {
        "candidate": "detector@1.5.0",
        "state": "running",
        "reason": None,
        "sample_per_mille": 50,
        "max_cpu_percent": 10,
        "against": "detector@1.4.0",
        "frames_compared": 840,
        "samples_dropped": 12,
        "cpu_percent": 6.5,
        "agreement": {"kind": "detection", "frames": 840, "recall": 0.97, "precision": 0.9},
        "latency": {"p99_ms": 41.0, "sketch_ms": {"v": 1, "n": 0}},
        "reference_latency": {"p99_ms": 40.0, "sketch_ms": {"v": 1, "n": 0}},
        "latency_ratio_p50": 1.02,
        "rss_delta_bytes": 25_000_000,
        "a_newer_field": 1,  # an agent newer than this reader
    }
    doc["memory"]["rss_bytes"] = 1 << 28
    point = parse_report(json.dumps(doc).encode(), created_at=CREATED_AT)
    shadow = {k: v for k, v in point.metrics.items() if k.startswith("shadow_")}
    assert shadow == {
        "shadow_running": 1.0,
        "shadow_frames_compared": 840.0,
        "shadow_samples_dropped": 12.0,
        "shadow_cpu_percent": 6.5,
        "shadow_recall": 0.97,
        "shadow_precision": 0.9,
        "shadow_p99_ms": 41.0,
        "shadow_reference_p99_ms": 40.0,
        "shadow_latency_ratio_p50": 1.02,
        "shadow_rss_delta_bytes": 25_000_000.0,
    }
    assert point.shadow is not None
    assert (point.shadow["candidate"], point.shadow["state"]) == ("detector@1.5.0", "running")
    assert point.shadow["latency"] == {"p99_ms": 41.0}  # no sketch kept
    assert point.shadow["reference_latency"] == {"p99_ms": 40.0}
    assert "a_newer_field" not in point.shadow
    # A failed candidate, with a field of the wrong type: read as far as it is understood.
    doc["shadow"] = {"candidate": "detector@1.5.0", "state": "failed", "reason": 7}
    failed = parse_report(json.dumps(doc).encode(), created_at=CREATED_AT)
    assert failed.metrics["shadow_running"] == 0.0
    assert failed.shadow == {"candidate": "detector@1.5.0", "state": "failed"}
