"""The node's own inference results as observations: provenance, ids, boxes, kinds."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from edge_node.aggregation.model import Box, Provenance
from edge_node.aggregation.node_results import observation_from_result
from protos.bundle.results import Box as ResultBox
from protos.bundle.results import Decoded, Detection
from tests.edge_node.results.support import T0, result


def test_a_detection_result_becomes_an_observation_named_by_its_model_version() -> None:
    observation = observation_from_result(result("gate", 7, detections=3))
    assert observation is not None
    assert observation.source == "gate"
    assert observation.frame_seq == 7
    # The node's clock: the capture time as it is, no offset to apply.
    assert observation.captured_at == (T0 + timedelta(milliseconds=280)).timestamp()
    assert observation.provenance == Provenance("node", "detector", "1.1.0")
    assert [d.class_name for d in observation.detections] == ["person", "car", "plate"]
    first = observation.detections[0]
    assert (first.score, first.box, first.track_id) == (0.9, Box(0.1, 0.2, 0.3, 0.4), None)


def test_a_local_model_has_no_version() -> None:
    observation = observation_from_result(result(version=None, detections=1))
    assert observation is not None
    assert observation.provenance == Provenance("node", "detector", "")


def test_the_id_is_the_same_for_the_same_frame_and_differs_after_a_restart() -> None:
    again = observation_from_result(result("gate", 3))
    same = observation_from_result(result("gate", 3))
    # A restarted pipeline numbers its frames from 1 again, at a later time.
    restarted = observation_from_result(
        replace(result("gate", 3), captured_at=T0 + timedelta(hours=1))
    )
    other_stream = observation_from_result(result("yard", 3))
    assert again is not None and same is not None
    assert restarted is not None and other_stream is not None
    assert again.observation_id == same.observation_id
    assert len({again.observation_id, restarted.observation_id, other_stream.observation_id}) == 3


def test_only_detectors_results_and_only_boxes_count() -> None:
    classified = replace(
        result(), decoded=Decoded("classification", (Detection(1, "person", 0.8),))
    )
    assert observation_from_result(classified) is None
    assert observation_from_result(replace(result(), decoded=Decoded("raw"))) is None
    mixed = replace(
        result(),
        decoded=Decoded(
            "detection",
            (Detection(0, "person", 0.7), Detection(1, "car", 0.6, ResultBox(0.5, 0.5, 0.6, 0.7))),
        ),
    )
    observation = observation_from_result(mixed)
    assert observation is not None
    assert [d.class_name for d in observation.detections] == ["car"]
    # An empty frame is still a frame: the rules see the object is gone.
    empty = observation_from_result(result(detections=0))
    assert empty is not None and empty.detections == ()
