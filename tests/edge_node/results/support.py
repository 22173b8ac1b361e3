"""Inference results as a decoder would make them, for the results tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from protos.bundle.results import Box, Decoded, Detection, InferenceResult

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def result(
    stream: str = "gate",
    frame_id: int = 1,
    *,
    detections: int = 0,
    model: str = "detector",
    version: str | None = "1.1.0",
) -> InferenceResult:
    found = tuple(
        Detection(
            class_id=i % 3,
            label=("person", "car", "plate")[i % 3],
            score=0.9 - i * 0.01,
            box=Box(0.1, 0.2, 0.3 + i * 0.001, 0.4),
        )
        for i in range(detections)
    )
    return InferenceResult(
        stream=stream,
        frame_id=frame_id,
        captured_at=T0 + timedelta(milliseconds=40 * frame_id),
        model=model,
        version=version,
        decoded=Decoded(kind="detection", detections=found),
        queue_s=0.001,
        preprocess_s=0.002,
        inference_s=0.010,
        decode_s=0.0005,
    )
