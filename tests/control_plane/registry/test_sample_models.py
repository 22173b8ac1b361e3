"""The sample models are real ONNX: valid, deterministic, and runnable by ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from control_plane.registry import sample_models


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def test_tiny_detector_is_valid_and_has_the_documented_signature(tmp_path: Path) -> None:
    path = sample_models.tiny_detector(tmp_path / "det.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["images"]
    assert [o.name for o in model.graph.output] == ["scores"]
    assert [n.op_type for n in model.graph.node] == [
        "Conv",
        "Relu",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
        "Sigmoid",
    ]
    assert {o.domain: o.version for o in model.opset_import} == {"": 17}
    (scores,) = _run(path, {"images": np.zeros((1, 3, 32, 32), np.float32)})
    assert scores.shape == (1, 4)
    assert scores.dtype == np.float32
    assert np.all((scores > 0) & (scores < 1))  # sigmoid


def test_tiny_detector_bytes_are_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = sample_models.tiny_detector(tmp_path / "a.onnx", seed=3).read_bytes()
    b = sample_models.tiny_detector(tmp_path / "b.onnx", seed=3).read_bytes()
    c = sample_models.tiny_detector(tmp_path / "c.onnx", seed=4).read_bytes()
    assert a == b
    assert a != c


@pytest.mark.parametrize(("size", "opset"), [(16, 11), (64, 13), (32, 7)])
def test_tiny_detector_size_and_opset(tmp_path: Path, size: int, opset: int) -> None:
    path = sample_models.tiny_detector(tmp_path / "det.onnx", size=size, opset=opset)
    model = onnx.load(str(path))
    assert model.opset_import[0].version == opset
    (scores,) = _run(path, {"images": np.ones((1, 3, size, size), np.float32)})
    assert scores.shape == (1, 4)


def test_identity_model_returns_its_input(tmp_path: Path) -> None:
    path = sample_models.identity_model(tmp_path / "id.onnx", shape=(2, 3), dtype="int64")
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    (y,) = _run(path, {"x": x})
    np.testing.assert_array_equal(y, x)


def test_add_constant_models_with_different_constants_answer_differently(tmp_path: Path) -> None:
    one = sample_models.add_constant_model(tmp_path / "one.onnx", 1.0)
    two = sample_models.add_constant_model(tmp_path / "two.onnx", 2.0)
    x = np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
    np.testing.assert_array_equal(_run(one, {"x": x})[0], x + 1)
    np.testing.assert_array_equal(_run(two, {"x": x})[0], x + 2)


def test_broken_model_parses_but_fails_the_checker() -> None:
    model = onnx.ModelProto()
    model.ParseFromString(sample_models.broken_model_bytes())
    assert model.graph.node
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)


@pytest.mark.parametrize("size", [32, 48])
def test_the_tiny_detectors_runtime_spec_fits_it_at_any_size(tmp_path: Path, size: int) -> None:
    from control_plane.registry.onnx_inspect import inspect_model
    from control_plane.trust.custom import check_runtime
    from protos.bundle.spec import parse_runtime_spec

    info = inspect_model(sample_models.tiny_detector(tmp_path / "det.onnx", size=size))
    spec = parse_runtime_spec(sample_models.tiny_detector_runtime(mean=(0.5,), std=(0.5,)))
    resolved, channels = check_runtime(
        spec, [t.to_sig() for t in info.inputs], [t.to_sig() for t in info.outputs]
    )
    assert (resolved.size, channels) == ((size, size), 3)
    assert spec.labels == sample_models.TINY_DETECTOR_LABELS
    assert spec.output.decoder == "classification"


def test_the_tiny_box_detector_finds_its_person_and_vehicle_through_the_yolo_decoder(
    tmp_path: Path,
) -> None:
    """What the demo's rules file relies on: on a frame of noise the person's feet are in
    the right half (x 0.7, y 0.9) and the vehicle is at the left."""
    from control_plane.registry.onnx_inspect import inspect_model
    from control_plane.trust.custom import check_runtime
    from protos.bundle.decoders import build_decoder
    from protos.bundle.geometry import Geometry
    from protos.bundle.spec import parse_runtime_spec

    path = sample_models.tiny_box_detector(tmp_path / "boxes.onnx", size=48)
    assert (
        path.read_bytes() == sample_models.tiny_box_detector(tmp_path / "again.onnx").read_bytes()
    )
    spec = parse_runtime_spec(
        {
            "preprocess": {"layout": "NCHW", "mean": 0.5, "std": 0.5},
            "output": {"decoder": "yolo", "objectness": False, "score_threshold": 0.5},
            "labels": list(sample_models.TINY_DETECTOR_LABELS),
        }
    )
    info = inspect_model(path)
    resolved, _ = check_runtime(
        spec, [t.to_sig() for t in info.inputs], [t.to_sig() for t in info.outputs]
    )
    assert resolved.size == (48, 48)
    noise = np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 48)).astype(np.float32)
    [boxes] = _run(path, {"images": noise})
    decoded = build_decoder(spec).decode({"output0": boxes}, Geometry.stretch(48, 48, 48, 48))
    found = {d.label: d for d in decoded.detections}
    assert set(found) == {"person", "vehicle"}
    person, vehicle = found["person"].box, found["vehicle"].box
    assert person is not None and vehicle is not None
    assert (person.x1 + person.x2) / 2 == pytest.approx(0.7, abs=0.02)
    assert person.y2 == pytest.approx(0.9, abs=1e-6)
    assert (vehicle.x1 + vehicle.x2) / 2 == pytest.approx(0.25, abs=1e-6)
    assert found["person"].score == pytest.approx(0.9) and found["vehicle"].score == pytest.approx(
        0.8
    )
