"""Model inspection refuses what a node could not run and records the reference pair."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

from control_plane.errors import InvalidInputError, InvalidModelError, PayloadTooLargeError
from control_plane.registry import onnx_inspect, reference_frame, sample_models
from control_plane.registry.onnx_inspect import (
    ModelInfo,
    ReferencePair,
    TensorSpec,
    inspect_model,
    load_reference,
    make_frame_reference,
    make_reference,
    outputs_match,
    save_reference,
)
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import PreprocessConfig, TensorSig


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    *,
    initializer: list[onnx.TensorProto] | None = None,
    opsets: dict[str, int] | None = None,
    ir_version: int = 8,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializer or [])
    opset_ids = [helper.make_opsetid(d, v) for d, v in (opsets or {"": 17}).items()]
    model = helper.make_model(graph, opset_imports=opset_ids)
    model.ir_version = ir_version
    return model


def _dynamic_image_model(path: Path) -> Path:
    """images float32 [N, 3, H, W] -> mean per channel [N, 3]: any input size runs."""
    return _save(
        _model(
            [helper.make_node("ReduceMean", ["images"], ["means"], axes=[2, 3], keepdims=0)],
            [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
            [helper.make_tensor_value_info("means", TensorProto.FLOAT, ["N", 3])],
        ),
        path,
    )


def _two_input_model(path: Path) -> Path:
    """z = x + y, both float32 ["batch", 4]."""
    return _save(
        _model(
            [helper.make_node("Add", ["x", "y"], ["z"])],
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            ],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])],
        ),
        path,
    )


@pytest.fixture
def detector(tmp_path: Path) -> Path:
    return sample_models.tiny_detector(tmp_path / "detector.onnx")


# ------------------------------------------------------------------------ inspect_model


def test_tiny_detector_signature_opset_and_digest(detector: Path) -> None:
    info = inspect_model(detector)
    data = detector.read_bytes()
    assert info == ModelInfo(
        inputs=(TensorSpec("images", "float32", (1, 3, 32, 32)),),
        outputs=(TensorSpec("scores", "float32", (1, 4)),),
        opset={"": 17},
        ir_version=8,
        producer="edgefleet.sample_models 1",
        sha256=hashlib.sha256(data).hexdigest(),
        length=len(data),
    )
    assert info.to_custom_io() == {
        "inputs": [{"name": "images", "dtype": "float32", "shape": [1, 3, 32, 32]}],
        "outputs": [{"name": "scores", "dtype": "float32", "shape": [1, 4]}],
    }


def test_hash_streams_over_chunk_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onnx_inspect, "_CHUNK", 7)
    path = sample_models.tiny_detector(tmp_path / "d.onnx")
    info = inspect_model(path)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_symbolic_and_unknown_dims(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", None, 4])],
    )
    info = inspect_model(_save(model, tmp_path / "m.onnx"))
    assert info.inputs == (TensorSpec("x", "int64", ("batch", "?", 4)),)
    assert info.outputs == (TensorSpec("y", "int64", ("batch", "?", 4)),)
    assert info.to_custom_io() == {
        "inputs": [{"name": "x", "dtype": "int64", "shape": ["batch", "?", 4]}],
        "outputs": [{"name": "y", "dtype": "int64", "shape": ["batch", "?", 4]}],
    }


def test_a_negative_dim_value_is_a_dynamic_dim_and_gets_a_reference(tmp_path: Path) -> None:
    """PaddlePaddle's exporter (PP-OCR's models) writes a dynamic batch as dim_value -1;
    a push used to crash making the reference input ("negative dimensions")."""
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
    )
    path = _save(model, tmp_path / "m.onnx")
    info = inspect_model(path)
    assert info.inputs == (TensorSpec("x", "float32", ("?", 3)),)
    assert make_reference(path, info).inputs["x"].shape == (1, 3)


def test_tensor_specs_become_the_bundles_tensor_signatures(tmp_path: Path) -> None:
    info = inspect_model(_dynamic_image_model(tmp_path / "m.onnx"))
    assert info.inputs[0].to_sig() == TensorSig("images", "float32", (None, 3, None, None))
    assert info.outputs[0].to_sig() == TensorSig("means", "float32", (None, 3))


def test_scalar_tensors_have_an_empty_shape(tmp_path: Path) -> None:
    path = sample_models.identity_model(tmp_path / "scalar.onnx", shape=())
    info = inspect_model(path)
    assert info.inputs == (TensorSpec("x", "float32", ()),)
    pair = make_reference(path, info)
    assert pair.inputs["x"].shape == ()


def test_initializers_listed_as_inputs_are_not_inputs(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(np.array([1.0], np.float32), "c")],
    )
    info = inspect_model(_save(model, tmp_path / "m.onnx"))
    assert [s.name for s in info.inputs] == ["x"]


def test_custom_domains_are_reported_and_ai_onnx_is_the_default(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        opsets={"ai.onnx": 15, "com.microsoft": 1},
    )
    info = inspect_model(_save(model, tmp_path / "m.onnx"))
    assert info.opset == {"": 15, "com.microsoft": 1}


@pytest.mark.parametrize(
    "garbage",
    [b"this is not a model at all", b"\x89PNG\r\n\x1a\n" + bytes(100), b"\xff" * 64],
)
def test_garbage_is_not_an_onnx_model(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(garbage)
    with pytest.raises(InvalidModelError, match="not an ONNX model"):
        inspect_model(path)


def test_empty_file_is_not_an_onnx_model(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(InvalidModelError, match="not an ONNX model"):
        inspect_model(path)


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.9])
def test_truncated_model_is_truncated_or_corrupt(detector: Path, keep: float) -> None:
    data = detector.read_bytes()
    detector.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InvalidModelError, match="truncated or corrupt"):
        inspect_model(detector)


def test_model_cut_exactly_after_its_graph_is_truncated(detector: Path) -> None:
    data = detector.read_bytes()
    model = onnx.load(str(detector))
    del model.opset_import[:]
    prefix = model.SerializeToString()
    assert data.startswith(prefix)  # a clean cut at a field boundary
    detector.write_bytes(prefix)
    with pytest.raises(InvalidModelError, match="truncated or corrupt"):
        inspect_model(detector)


def test_checker_failure_carries_the_checkers_message(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(sample_models.broken_model_bytes())
    with pytest.raises(InvalidModelError, match=r"ONNX checker.*NoSuchOperator") as caught:
        inspect_model(path)
    assert isinstance(caught.value.__cause__, onnx.checker.ValidationError)


def test_type_mismatch_is_caught_by_full_check(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("y", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(InvalidModelError, match=r"ONNX checker.*inconsistent type"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_external_data_is_refused(tmp_path: Path, detector: Path) -> None:
    model = onnx.load(str(detector))
    out = tmp_path / "ext" / "model.onnx"
    out.parent.mkdir()
    onnx.save_model(
        model, str(out), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    assert (out.parent / "weights.bin").exists()
    with pytest.raises(InvalidModelError, match="external file") as caught:
        inspect_model(out)
    assert caught.value.fields["tensor"] == "conv_w"


def test_external_data_inside_a_constant_node_is_refused(tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "k")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="k.bin")
    model = _model(
        [
            helper.make_node("Constant", [], ["k"], value=tensor),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    with pytest.raises(InvalidModelError, match="external file"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_model_without_inputs_is_refused(tmp_path: Path) -> None:
    model = _model(
        [
            helper.make_node(
                "Constant",
                [],
                ["y"],
                value=numpy_helper.from_array(np.ones(2, np.float32), "v"),
            )
        ],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidModelError, match="no inputs"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_model_without_outputs_is_refused(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [],
    )
    with pytest.raises(InvalidModelError, match="no outputs"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_input_without_declared_shape_is_refused(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidModelError, match="shape"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_non_tensor_input_is_refused(tmp_path: Path) -> None:
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    model = _model(
        [helper.make_node("SequenceLength", ["s"], ["n"])],
        [seq],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    with pytest.raises(InvalidModelError, match="not a tensor"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_opset_older_than_7_is_refused(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        opsets={"": 6},
        ir_version=3,
    )
    with pytest.raises(InvalidModelError, match="opset 6; the oldest supported is 7"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_opset_newer_than_installed_onnx_is_refused(tmp_path: Path) -> None:
    newest = onnx.defs.onnx_opset_version()
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        opsets={"": newest + 1},
    )
    with pytest.raises(InvalidModelError, match=f"opset {newest + 1}, newer") as caught:
        inspect_model(_save(model, tmp_path / "m.onnx"))
    assert caught.value.fields["maximum"] == newest


def test_missing_default_opset_is_refused(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        opsets={"com.example": 1},
    )
    with pytest.raises(InvalidModelError, match="no default-domain"):
        inspect_model(_save(model, tmp_path / "m.onnx"))


def test_file_over_the_limit_is_refused_before_reading(detector: Path) -> None:
    with pytest.raises(PayloadTooLargeError) as caught:
        inspect_model(detector, max_bytes=100)
    assert caught.value.fields["limit"] == 100


def test_missing_file_and_directory_are_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot read"):
        inspect_model(tmp_path / "absent.onnx")
    with pytest.raises(InvalidInputError, match="not a regular file"):
        inspect_model(tmp_path)


# ----------------------------------------------------------------------- make_reference


def test_reference_is_deterministic_for_a_seed(tmp_path: Path, detector: Path) -> None:
    info = inspect_model(detector)
    first = save_reference(make_reference(detector, info, seed=7), tmp_path / "a.npz")
    again = save_reference(make_reference(detector, info, seed=7), tmp_path / "b.npz")
    other = save_reference(make_reference(detector, info, seed=8), tmp_path / "c.npz")
    assert first == again
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    assert first != other


def test_generated_inputs_follow_the_documented_rules(tmp_path: Path) -> None:
    model = _model(
        [
            helper.make_node("Identity", ["f"], ["f_out"]),
            helper.make_node("Identity", ["i"], ["i_out"]),
            helper.make_node("Identity", ["b"], ["b_out"]),
        ],
        [
            helper.make_tensor_value_info("f", TensorProto.DOUBLE, ["n", 50]),
            helper.make_tensor_value_info("i", TensorProto.INT32, [None, 100]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, [100]),
        ],
        [
            helper.make_tensor_value_info("f_out", TensorProto.DOUBLE, ["n", 50]),
            helper.make_tensor_value_info("i_out", TensorProto.INT32, [None, 100]),
            helper.make_tensor_value_info("b_out", TensorProto.BOOL, [100]),
        ],
    )
    path = _save(model, tmp_path / "m.onnx")
    pair = make_reference(path, inspect_model(path))
    f, i, b = pair.inputs["f"], pair.inputs["i"], pair.inputs["b"]
    assert (f.dtype, f.shape) == (np.float64, (1, 50))
    assert f.min() >= 0.0 and f.max() < 1.0
    assert (i.dtype, i.shape) == (np.int32, (1, 100))
    assert i.min() >= 0 and i.max() < 10
    assert (b.dtype, b.shape) == (np.bool_, (100,))
    assert b.any() and not b.all()
    for name in ("f", "i", "b"):
        np.testing.assert_array_equal(pair.outputs[f"{name}_out"], pair.inputs[name])


def test_dynamic_image_dims_without_a_real_input_are_refused(tmp_path: Path) -> None:
    """A generated [1, 3, 1, 1] input made a self-test that proves nothing (issue 12)."""
    path = _dynamic_image_model(tmp_path / "m.onnx")
    with pytest.raises(InvalidInputError, match="--runtime") as refused:
        make_reference(path, inspect_model(path))
    assert "'images'" in refused.value.message
    assert "--reference-input" in refused.value.message
    # A real input is still taken as it is.
    images = np.full((1, 3, 5, 7), 0.5, np.float32)
    np.save(tmp_path / "in.npy", images)
    pair = make_reference(path, inspect_model(path), reference_input=tmp_path / "in.npy")
    np.testing.assert_allclose(pair.outputs["means"], [[0.5, 0.5, 0.5]])


def test_a_frame_reference_is_the_frame_through_the_preprocessor(tmp_path: Path) -> None:
    path = _dynamic_image_model(tmp_path / "m.onnx")
    frame = reference_frame.generated_frame()
    config = PreprocessConfig(size=(48, 64), mean=(0.5,), std=(0.25,))
    preprocessor = Preprocessor(config, 3)
    pair = make_frame_reference(path, inspect_model(path), frame, preprocessor)
    assert pair.frame is not None
    np.testing.assert_array_equal(pair.frame, frame)
    assert pair.inputs["images"].shape == (1, 3, 48, 64)
    np.testing.assert_array_equal(pair.inputs["images"], preprocessor(frame))
    np.testing.assert_allclose(
        pair.outputs["means"], pair.inputs["images"].mean(axis=(2, 3)), atol=1e-5
    )
    # The frame travels in the pair, beside input/ and output/.
    target = tmp_path / "ref.npz"
    save_reference(pair, target)
    with np.load(target, allow_pickle=False) as archive:
        assert sorted(archive.files) == ["frame", "input/images", "output/means"]
        assert archive["frame"].dtype == np.uint8
    loaded = load_reference(target)
    assert loaded.frame is not None
    np.testing.assert_array_equal(loaded.frame, frame)
    np.testing.assert_array_equal(loaded.inputs["images"], pair.inputs["images"])


def test_a_frame_reference_needs_a_single_input_model(tmp_path: Path) -> None:
    path = _two_input_model(tmp_path / "m.onnx")
    preprocessor = Preprocessor(PreprocessConfig(size=(4, 4)), 3)
    with pytest.raises(InvalidInputError, match="has 2"):
        make_frame_reference(
            path, inspect_model(path), reference_frame.generated_frame(), preprocessor
        )


def test_reference_outputs_are_what_the_model_computes(tmp_path: Path) -> None:
    path = sample_models.add_constant_model(tmp_path / "add.onnx", 0.5)
    pair = make_reference(path, inspect_model(path))
    np.testing.assert_allclose(pair.outputs["y"], pair.inputs["x"] + np.float32(0.5))


def test_npy_reference_input_is_used(tmp_path: Path, detector: Path) -> None:
    images = np.full((1, 3, 32, 32), 0.25, np.float32)
    np.save(tmp_path / "in.npy", images)
    pair = make_reference(detector, inspect_model(detector), reference_input=tmp_path / "in.npy")
    np.testing.assert_array_equal(pair.inputs["images"], images)
    assert pair.outputs["scores"].shape == (1, 4)


def test_npz_reference_input_binds_symbolic_dims(tmp_path: Path) -> None:
    path = _two_input_model(tmp_path / "m.onnx")
    x = np.ones((3, 4), np.float32)
    y = np.full((3, 4), 2.0, np.float32)
    np.savez(tmp_path / "in.npz", x=x, y=y)
    pair = make_reference(path, inspect_model(path), reference_input=tmp_path / "in.npz")
    np.testing.assert_array_equal(pair.outputs["z"], x + y)
    assert list(pair.inputs) == ["x", "y"]


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"x": np.ones((3, 4), np.float64), "y": np.ones((3, 4), np.float32)}, "dtype float64"),
        ({"x": np.ones((3, 5), np.float32), "y": np.ones((3, 5), np.float32)}, "shape"),
        ({"x": np.ones((3, 4), np.float32), "y": np.ones((2, 4), np.float32)}, "shape"),
        ({"x": np.ones((4,), np.float32), "y": np.ones((4,), np.float32)}, "shape"),
        ({"x": np.ones((3, 4), np.float32)}, "missing \\['y'\\]"),
        (
            {"x": np.ones((1, 4), np.float32), "y": np.ones((1, 4), np.float32), "w": np.ones(1)},
            "unexpected \\['w'\\]",
        ),
    ],
)
def test_mismatching_npz_is_refused(
    tmp_path: Path, arrays: dict[str, np.ndarray], match: str
) -> None:
    path = _two_input_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **arrays)
    with pytest.raises(InvalidInputError, match=match):
        make_reference(path, inspect_model(path), reference_input=tmp_path / "in.npz")


def test_npy_for_a_multi_input_model_is_refused(tmp_path: Path) -> None:
    path = _two_input_model(tmp_path / "m.onnx")
    np.save(tmp_path / "in.npy", np.ones((1, 4), np.float32))
    with pytest.raises(InvalidInputError, match="2 inputs"):
        make_reference(path, inspect_model(path), reference_input=tmp_path / "in.npy")


def test_mismatching_npy_is_refused(tmp_path: Path, detector: Path) -> None:
    np.save(tmp_path / "in.npy", np.ones((1, 3, 16, 16), np.float32))
    with pytest.raises(InvalidInputError, match="shape"):
        make_reference(detector, inspect_model(detector), reference_input=tmp_path / "in.npy")


def test_pickled_reference_input_is_refused(tmp_path: Path) -> None:
    path = sample_models.identity_model(tmp_path / "id.onnx")
    np.save(tmp_path / "in.npy", np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInputError, match="cannot read reference input"):
        make_reference(path, inspect_model(path), reference_input=tmp_path / "in.npy")


@pytest.mark.parametrize(("name", "content"), [("in.txt", b"1 2 3"), ("in.npz", b"not a zip")])
def test_unreadable_reference_input_is_refused(
    tmp_path: Path, detector: Path, name: str, content: bytes
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InvalidInputError):
        make_reference(detector, inspect_model(detector), reference_input=tmp_path / name)


def test_runtime_failure_is_an_invalid_model(tmp_path: Path) -> None:
    # Passes the checker (ops of unknown domains are not checked) but no runtime has it.
    model = _model(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        opsets={"": 17, "com.example": 1},
    )
    path = _save(model, tmp_path / "m.onnx")
    info = inspect_model(path)
    with pytest.raises(InvalidModelError, match="ONNX Runtime cannot load"):
        make_reference(path, info)


def test_string_inputs_need_a_reference_input(tmp_path: Path) -> None:
    path = sample_models.identity_model(tmp_path / "s.onnx", shape=(2,), dtype="str")
    info = inspect_model(path)
    assert info.inputs == (TensorSpec("x", "string", (2,)),)
    with pytest.raises(InvalidInputError, match="--reference-input"):
        make_reference(path, info)


# ------------------------------------------------------------- save / load reference


def test_reference_round_trips_with_prefixed_keys(tmp_path: Path, detector: Path) -> None:
    pair = make_reference(detector, inspect_model(detector))
    target = tmp_path / "ref.npz"
    sha256, length = save_reference(pair, target)
    data = target.read_bytes()
    assert (sha256, length) == (hashlib.sha256(data).hexdigest(), len(data))
    with np.load(target, allow_pickle=False) as archive:
        assert sorted(archive.files) == ["input/images", "output/scores"]
    loaded = load_reference(target)
    assert loaded.inputs.keys() == pair.inputs.keys()
    np.testing.assert_array_equal(loaded.inputs["images"], pair.inputs["images"])
    np.testing.assert_array_equal(loaded.outputs["scores"], pair.outputs["scores"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["detector.onnx", "ref.npz"]


def test_save_reference_bytes_do_not_depend_on_dict_order_or_time(tmp_path: Path) -> None:
    a = np.arange(3, dtype=np.float32)
    b = np.arange(4, dtype=np.int64)
    one = ReferencePair(inputs={"a": a, "b": b}, outputs={"y": a})
    two = ReferencePair(inputs={"b": b, "a": a}, outputs={"y": a.copy()})
    first = save_reference(one, tmp_path / "one.npz")
    second = save_reference(two, tmp_path / "two.npz")
    assert first == second


def test_save_reference_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "ref.npz"
    target.write_bytes(b"old")
    save_reference(ReferencePair({"x": np.zeros(1)}, {"y": np.ones(1)}), target)
    np.testing.assert_array_equal(load_reference(target).outputs["y"], np.ones(1))


def test_load_reference_refuses_garbage_and_foreign_archives(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"garbage")
    with pytest.raises(InvalidInputError, match="cannot read reference pair"):
        load_reference(garbage)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.zeros(2))
    with pytest.raises(InvalidInputError, match="unexpected member 'weights'"):
        load_reference(foreign)


# ------------------------------------------------------------------------ outputs_match


def test_identical_outputs_match() -> None:
    out = {"y": np.array([1.0, 2.0], np.float32)}
    ok, message = outputs_match(out, {"y": out["y"].copy()}, 0.0, 0.0)
    assert ok
    assert "max abs err 0" in message


def test_absolute_tolerance() -> None:
    expected = {"y": np.array([0.0, 1.0])}
    assert outputs_match(expected, {"y": np.array([1e-4, 1.0])}, 1e-3, 0.0)[0]
    ok, message = outputs_match(expected, {"y": np.array([1e-2, 1.0])}, 1e-3, 0.0)
    assert not ok
    assert "1 of 2 elements" in message
    assert "max abs err 0.01" in message


def test_relative_tolerance_scales_with_the_expected_value() -> None:
    expected = {"y": np.array([1000.0])}
    assert outputs_match(expected, {"y": np.array([1000.5])}, 0.0, 1e-3)[0]
    ok, message = outputs_match(expected, {"y": np.array([1002.0])}, 0.0, 1e-3)
    assert not ok
    assert "max rel err 0.002" in message


def test_bound_is_atol_plus_rtol_times_expected() -> None:
    expected = {"y": np.array([10.0])}
    # bound = 0.1 + 0.01 * 10 = 0.2
    assert outputs_match(expected, {"y": np.array([10.19])}, 0.1, 0.01)[0]
    assert not outputs_match(expected, {"y": np.array([10.21])}, 0.1, 0.01)[0]


def test_nan_and_infinity() -> None:
    expected = {"y": np.array([np.nan, np.inf, -np.inf])}
    assert outputs_match(expected, {"y": np.array([np.nan, np.inf, -np.inf])}, 0.0, 0.0)[0]
    ok, message = outputs_match(expected, {"y": np.array([0.0, np.inf, -np.inf])}, 1.0, 1.0)
    assert not ok
    assert "max abs err inf" in message
    assert not outputs_match(expected, {"y": np.array([np.nan, -np.inf, -np.inf])}, 1, 1)[0]


def test_names_shapes_and_dtypes_must_agree() -> None:
    y = np.zeros((1, 4), np.float32)
    ok, message = outputs_match({"y": y}, {"z": y}, 1.0, 1.0)
    assert not ok
    assert "missing outputs ['y']" in message
    assert "unexpected outputs ['z']" in message
    ok, message = outputs_match({"y": y}, {"y": y.reshape(4)}, 1.0, 1.0)
    assert not ok and "shape [4], expected [1, 4]" in message
    ok, message = outputs_match({"y": y}, {"y": y.astype(np.float64)}, 1.0, 1.0)
    assert not ok and "dtype float64, expected float32" in message


def test_integer_and_boolean_outputs() -> None:
    assert outputs_match({"k": np.array([3, 4])}, {"k": np.array([3, 4])}, 0.0, 0.0)[0]
    assert not outputs_match({"k": np.array([3, 4])}, {"k": np.array([3, 5])}, 0.0, 0.0)[0]
    ok, message = outputs_match({"m": np.array([True])}, {"m": np.array([False])}, 9.0, 9.0)
    assert not ok and "1 of 1 elements differ" in message


def test_negative_tolerance_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        outputs_match({}, {}, -1.0, 0.0)


@pytest.mark.parametrize("module", [onnx_inspect, reference_frame, sample_models])
def test_public_names_exist(module: object) -> None:
    exported = module.__all__  # type: ignore[attr-defined]
    assert sorted(exported) == exported
    assert all(hasattr(module, name) for name in exported)
