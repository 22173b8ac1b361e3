"""What a model saw in one frame, decoded: the node's results interface and its wire form.

``Decoded`` is what a decoder returns; ``InferenceResult`` adds where it came from (stream,
frame, model name and version) and where the time went. The node hands every
``InferenceResult`` to one results sink (the aggregation's input) and sends a bounded
sample to the control plane as ``edgefleet.agent.results/1`` documents
(:func:`result_to_wire` / :func:`result_from_wire`), so an operator can see what the
model sees. Boxes are in the frame's coordinates, normalised to [0, 1] (a box means the
same whatever the camera's resolution). Pure: no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

__all__ = [
    "RESULTS_SCHEMA",
    "Box",
    "Decoded",
    "Detection",
    "InferenceResult",
    "ResultKind",
    "ResultWireError",
    "TensorSummary",
    "result_from_wire",
    "result_to_wire",
]

RESULTS_SCHEMA: Final = "edgefleet.agent.results/1"
ResultKind = Literal["classification", "detection", "raw"]
MAX_WIRE_DETECTIONS: Final = 100
MAX_WIRE_TENSORS: Final = 16


@dataclass(frozen=True, slots=True)
class Box:
    """``x1 <= x2``, ``y1 <= y2``, in [0, 1] of the frame's width and height."""

    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True, slots=True)
class Detection:
    """One class (classification) or one object (detection: with a ``box``)."""

    class_id: int
    label: str
    score: float
    box: Box | None = None


@dataclass(frozen=True, slots=True)
class TensorSummary:
    """A raw output, summarised: ``above`` is the fraction of values over ``threshold``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    min: float
    max: float
    mean: float
    threshold: float | None = None
    above: float | None = None


@dataclass(frozen=True, slots=True)
class Decoded:
    kind: ResultKind
    detections: tuple[Detection, ...] = ()
    tensors: tuple[TensorSummary, ...] = ()


@dataclass(frozen=True, slots=True)
class InferenceResult:
    """One frame's decoded result; ``model``/``version`` name the version that ran
    (``version`` is ``None`` for a model served from a local file, not a release)."""

    stream: str
    frame_id: int
    captured_at: datetime
    model: str
    version: str | None
    decoded: Decoded
    queue_s: float
    preprocess_s: float
    inference_s: float
    decode_s: float

    @property
    def model_label(self) -> str:
        """``name@version`` (or just the name): how logs, latency and drift name it."""
        return self.model if self.version is None else f"{self.model}@{self.version}"


def _round(value: float, digits: int = 4) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def result_to_wire(result: InferenceResult) -> dict[str, Any]:
    """The JSON document for one sampled result (bounded: the top detections, a few tensors)."""
    decoded = result.decoded
    doc: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "stream": result.stream,
        "frame_id": result.frame_id,
        "captured_at": result.captured_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "model": result.model,
        "version": result.version,
        "kind": decoded.kind,
        "latency_ms": {
            "queue": _round(result.queue_s * 1000, 3),
            "preprocess": _round(result.preprocess_s * 1000, 3),
            "inference": _round(result.inference_s * 1000, 3),
            "decode": _round(result.decode_s * 1000, 3),
        },
        "detections": [
            {
                "class_id": d.class_id,
                "label": d.label,
                "score": _round(d.score),
                **(
                    {}
                    if d.box is None
                    else {"box": [_round(v) for v in (d.box.x1, d.box.y1, d.box.x2, d.box.y2)]}
                ),
            }
            for d in decoded.detections[:MAX_WIRE_DETECTIONS]
        ],
        "detections_total": len(decoded.detections),
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "min": _round(t.min, 6),
                "max": _round(t.max, 6),
                "mean": _round(t.mean, 6),
                **({} if t.threshold is None else {"threshold": t.threshold, "above": t.above}),
            }
            for t in decoded.tensors[:MAX_WIRE_TENSORS]
        ],
    }
    return doc


class ResultWireError(ValueError):
    pass


def result_from_wire(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Check a results document enough to store and show it; returns its known fields.

    The control plane reads leniently (unknown keys are dropped) but refuses a document
    that is not one: wrong schema, missing stream/model, wrong types of the shown fields.
    """
    if not isinstance(doc, Mapping) or doc.get("schema") != RESULTS_SCHEMA:
        raise ResultWireError(f"not an {RESULTS_SCHEMA} document")
    out: dict[str, Any] = {"schema": RESULTS_SCHEMA}
    for key, kind in (("stream", str), ("model", str), ("kind", str), ("captured_at", str)):
        value = doc.get(key)
        if not isinstance(value, kind) or not value or len(value) > 256:
            raise ResultWireError(f"results.{key}: expected a short non-empty string")
        out[key] = value
    version = doc.get("version")
    if version is not None and (not isinstance(version, str) or len(version) > 64):
        raise ResultWireError("results.version: expected a string or null")
    out["version"] = version
    frame_id = doc.get("frame_id")
    if isinstance(frame_id, bool) or not isinstance(frame_id, int):
        raise ResultWireError("results.frame_id: expected an integer")
    out["frame_id"] = frame_id
    for key, limit in (("detections", MAX_WIRE_DETECTIONS), ("tensors", MAX_WIRE_TENSORS)):
        items = doc.get(key, [])
        if not isinstance(items, list) or len(items) > limit:
            raise ResultWireError(f"results.{key}: expected a list of at most {limit}")
        if not all(isinstance(item, Mapping) for item in items):
            raise ResultWireError(f"results.{key}: expected objects")
        out[key] = [dict(item) for item in items]
    total = doc.get("detections_total", len(out["detections"]))
    out["detections_total"] = total if isinstance(total, int) and not isinstance(total, bool) else 0
    latency = doc.get("latency_ms", {})
    out["latency_ms"] = dict(latency) if isinstance(latency, Mapping) else {}
    return out
