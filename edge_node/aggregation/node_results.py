"""The node's own inference results as the aggregation's input: ``InferenceResult`` in,
:class:`~edge_node.aggregation.model.Observation` out.

Pure (``protos.bundle.results`` is pure too): the agent's aggregation task calls it off
the inference path. The node's runtime stamps ``captured_at`` with the node's own clock,
so a node stream's clock offset is 0 and its event time is its capture time. Provenance
is the model and version that ran (a local ``runtime.model_path`` has no version: "").

Only ``detection`` results become observations, and only their detections with a box:
classification and raw outputs carry nothing a zone, a line or a count can use.

Not here: the device contract's adapter (``device.proto``'s frame results), the queue and
the outbox (``edge_node.agent.aggregation_task``).
"""

from __future__ import annotations

from edge_node.aggregation.model import Box, Detection, Observation, Provenance
from protos.bundle.results import InferenceResult

__all__ = ["node_observation_id", "observation_from_result"]


def node_observation_id(result: InferenceResult) -> str:
    """The idempotency id of a node frame: stream, frame number and capture time (µs).

    A pipeline numbers frames from 1 at each start, so the time is part of the id: a
    restarted node's frame 1 is not the frame 1 before the restart."""
    micros = round(result.captured_at.timestamp() * 1_000_000)
    return f"node:{result.stream}:{result.frame_id}:{micros}"


def observation_from_result(result: InferenceResult) -> Observation | None:
    """The observation of one decoded frame; ``None`` for a result that is not a detector's."""
    decoded = result.decoded
    if decoded.kind != "detection":
        return None
    detections = tuple(
        Detection(
            class_name=d.label,
            score=d.score,
            box=Box(d.box.x1, d.box.y1, d.box.x2, d.box.y2),
        )
        for d in decoded.detections
        if d.box is not None
    )
    return Observation(
        source=result.stream,
        observation_id=node_observation_id(result),
        frame_seq=result.frame_id,
        captured_at=result.captured_at.timestamp(),
        detections=detections,
        provenance=Provenance("node", result.model, result.version or ""),
    )
