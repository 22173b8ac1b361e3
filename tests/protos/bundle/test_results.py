"""The results wire document: what the node sends, what the control plane keeps."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from protos.bundle.results import (
    MAX_WIRE_DETECTIONS,
    MAX_WIRE_TENSORS,
    RESULTS_SCHEMA,
    Box,
    Decoded,
    Detection,
    InferenceResult,
    ResultWireError,
    TensorSummary,
    result_from_wire,
    result_to_wire,
)

AT = datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)


def result(decoded: Decoded, version: str | None = "1.1.0") -> InferenceResult:
    return InferenceResult(
        stream="gate-a",
        frame_id=41,
        captured_at=AT,
        model="detector",
        version=version,
        decoded=decoded,
        queue_s=0.0012,
        preprocess_s=0.0034,
        inference_s=0.0205,
        decode_s=0.0004,
    )


def test_a_detection_result_round_trips() -> None:
    decoded = Decoded(
        "detection",
        detections=(
            Detection(0, "person", 0.91234, Box(0.1, 0.2, 0.3, 0.4)),
            Detection(2, "car", 0.5, Box(0.5, 0.5, 1.0, 1.0)),
        ),
    )
    wire = result_to_wire(result(decoded))
    doc = result_from_wire(json.loads(json.dumps(wire, allow_nan=False)))

    assert doc["schema"] == RESULTS_SCHEMA
    assert (doc["stream"], doc["frame_id"], doc["model"], doc["version"]) == (
        "gate-a",
        41,
        "detector",
        "1.1.0",
    )
    assert doc["kind"] == "detection"
    assert doc["captured_at"] == "2026-11-30T12:00:00.250000Z"
    assert doc["detections"] == [
        {"class_id": 0, "label": "person", "score": 0.9123, "box": [0.1, 0.2, 0.3, 0.4]},
        {"class_id": 2, "label": "car", "score": 0.5, "box": [0.5, 0.5, 1.0, 1.0]},
    ]
    assert doc["detections_total"] == 2
    assert doc["latency_ms"] == {
        "queue": 1.2,
        "preprocess": 3.4,
        "inference": 20.5,
        "decode": 0.4,
    }


def test_a_local_time_is_sent_in_utc() -> None:
    local = replace(result(Decoded("raw")), captured_at=AT.astimezone(timezone(timedelta(hours=2))))
    assert result_to_wire(local)["captured_at"] == "2026-11-30T12:00:00.250000Z"


def test_classification_and_raw_results_round_trip() -> None:
    classes = Decoded("classification", detections=(Detection(3, "dog", 0.7),))
    doc = result_from_wire(result_to_wire(result(classes, version=None)))
    assert doc["version"] is None
    assert doc["detections"] == [{"class_id": 3, "label": "dog", "score": 0.7}]

    raw = Decoded(
        "raw",
        tensors=(
            TensorSummary("maps", (1, 1, 8, 8), "float32", 0.0, 1.0, 0.25, 0.3, 0.125),
            TensorSummary("names", (2,), "str", float("nan"), float("nan"), float("nan")),
        ),
    )
    wire = result_to_wire(result(raw))
    json.dumps(wire, allow_nan=False)  # a NaN summary is sent as null, not as invalid JSON
    doc = result_from_wire(wire)
    assert doc["tensors"] == [
        {
            "name": "maps",
            "shape": [1, 1, 8, 8],
            "dtype": "float32",
            "min": 0.0,
            "max": 1.0,
            "mean": 0.25,
            "threshold": 0.3,
            "above": 0.125,
        },
        {"name": "names", "shape": [2], "dtype": "str", "min": None, "max": None, "mean": None},
    ]


def test_the_wire_lists_are_bounded_and_the_total_kept() -> None:
    many = tuple(
        Detection(i % 3, f"c{i % 3}", 1 - i / 1000, Box(0, 0, 1, 1))
        for i in range(MAX_WIRE_DETECTIONS + 50)
    )
    tensors = tuple(
        TensorSummary(f"t{i}", (1,), "float32", 0, 0, 0) for i in range(MAX_WIRE_TENSORS + 4)
    )
    wire = result_to_wire(result(Decoded("detection", detections=many, tensors=tensors)))
    assert len(wire["detections"]) == MAX_WIRE_DETECTIONS
    assert wire["detections"][0]["score"] == 1.0  # the best, in order
    assert wire["detections_total"] == MAX_WIRE_DETECTIONS + 50
    assert len(wire["tensors"]) == MAX_WIRE_TENSORS
    assert result_from_wire(wire)["detections_total"] == MAX_WIRE_DETECTIONS + 50


def test_unknown_keys_are_dropped_not_refused() -> None:
    wire = result_to_wire(result(Decoded("detection")))
    doc = result_from_wire({**wire, "added_by_a_newer_node": {"x": 1}})
    assert "added_by_a_newer_node" not in doc


def good() -> dict[str, Any]:
    return result_to_wire(result(Decoded("detection", detections=(Detection(0, "a", 0.5),))))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"schema": "edgefleet.agent.results/2"}, "not an"),
        ({"stream": ""}, "results.stream"),
        ({"stream": None}, "results.stream"),
        ({"model": "m" * 257}, "results.model"),
        ({"kind": 3}, "results.kind"),
        ({"captured_at": None}, "results.captured_at"),
        ({"version": 1}, "results.version"),
        ({"version": "v" * 65}, "results.version"),
        ({"frame_id": True}, "results.frame_id"),
        ({"frame_id": "41"}, "results.frame_id"),
        ({"detections": {"class_id": 0}}, "results.detections"),
        ({"detections": [{}] * (MAX_WIRE_DETECTIONS + 1)}, "results.detections"),
        ({"detections": ["person"]}, "results.detections"),
        ({"tensors": [{}] * (MAX_WIRE_TENSORS + 1)}, "results.tensors"),
    ],
)
def test_a_bad_document_is_refused(change: dict[str, Any], said: str) -> None:
    with pytest.raises(ResultWireError, match=said):
        result_from_wire({**good(), **change})


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(ResultWireError):
        result_from_wire([])  # type: ignore[arg-type]


def test_the_model_label_names_the_version() -> None:
    assert result(Decoded("raw")).model_label == "detector@1.1.0"
    assert result(Decoded("raw"), version=None).model_label == "detector"
