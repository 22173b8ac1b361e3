"""The model's fast constructors build the very objects the dataclasses' own do."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_node.aggregation.model import (
    Box,
    Detection,
    Evidence,
    Observation,
    Provenance,
    make_box,
    make_detection,
    make_evidence,
    make_observation,
    make_provenance,
)

_unit = st.floats(0.0, 1.0)
_text = st.text(max_size=8)


@given(_unit, _unit, _unit, _unit, _text, _unit, st.none() | _text, _text, st.integers(0, 99))
def test_fast_constructors_equal_the_dataclasses(
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    name: str,
    score: float,
    track: str | None,
    model: str,
    seq: int,
) -> None:
    attributes = MappingProxyType({"plate_text": name})
    box = make_box(x1, y1, x2, y2)
    assert box == Box(x1, y1, x2, y2) and hash(box) == hash(Box(x1, y1, x2, y2))
    detection = make_detection(name, score, box, track, attributes)
    assert detection == Detection(name, score, Box(x1, y1, x2, y2), track, attributes)
    provenance = make_provenance("device", model, "1.0", "fw")
    assert provenance == Provenance("device", model, "1.0", "fw")
    observation = make_observation("cam-1", "m1", seq, x1, (detection,), provenance)
    assert observation == Observation("cam-1", "m1", seq, x1, (detection,), provenance)
    evidence = make_evidence("cam-1", seq, y1, "m1")
    assert evidence == Evidence("cam-1", seq, y1, "m1")
    assert not evidence < Evidence("cam-1", seq, y1, "m1")


def test_fast_constructed_objects_stay_frozen() -> None:
    box = make_box(0.1, 0.2, 0.3, 0.4)
    detection = make_detection("person", 0.9, box, None, MappingProxyType({}))
    observation = make_observation(
        "cam-1", "m1", 1, 1.0, (detection,), make_provenance("device", "m", "1", "")
    )
    for obj, name in ((box, "x1"), (detection, "score"), (observation, "frame_seq")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 0)
    assert type(box) is Box and type(observation) is Observation
