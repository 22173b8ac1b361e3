"""ModelSession.load: explicit options, provider fallback, and the input-signature check."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_node.errors import ClosedError
from edge_node.runtime.config import PreprocessConfig, SessionConfig
from edge_node.runtime.errors import (
    InferenceError,
    ModelLoadError,
    ModelSignatureError,
)
from edge_node.runtime.session import ModelSession, choose_providers, session_options
from protos.bundle.spec import OutputSpec, RuntimeSpec
from tests.edge_node.runtime._models import echo_model, failing_model, two_input_model

CPU = SessionConfig()


def test_loads_runs_and_resolves_size_from_the_model(tmp_path: Path) -> None:
    model = ModelSession.load(
        echo_model(tmp_path / "m.onnx", (1, 3, 6, 4)), CPU, PreprocessConfig()
    )

    assert model.preprocess.size == (6, 4)
    assert model.input_name == "images"
    assert model.output_names == ("y",)
    assert model.providers == ("CPUExecutionProvider",)
    assert model.label == "m.onnx"
    batch = np.ones((1, 3, 6, 4), dtype=np.float32)
    np.testing.assert_array_equal(model.run(batch)["y"], batch)


def test_session_options_are_set_explicitly() -> None:
    options = session_options(
        SessionConfig(
            intra_op_threads=3,
            inter_op_threads=2,
            graph_optimization="basic",
            execution_mode="parallel",
        )
    )
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 2
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = session_options(SessionConfig(allow_spinning=True))
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_choose_providers_keeps_order_and_always_ends_with_cpu() -> None:
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers(["CUDAExecutionProvider"], available) == (
        ("CUDAExecutionProvider", "CPUExecutionProvider"),
        (),
    )
    assert choose_providers(["TensorrtExecutionProvider", "CPUExecutionProvider"], available) == (
        ("CPUExecutionProvider",),
        ("TensorrtExecutionProvider",),
    )


def test_unavailable_provider_falls_back_to_cpu_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = SessionConfig(execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    with caplog.at_level(logging.WARNING, logger="edge_node.runtime.session"):
        model = ModelSession.load(
            echo_model(tmp_path / "m.onnx"),
            config,
            PreprocessConfig(),
            available_providers=["CPUExecutionProvider"],
        )
    assert model.providers == ("CPUExecutionProvider",)
    assert model.unavailable_providers == ("CUDAExecutionProvider",)
    assert "CUDAExecutionProvider" in caplog.text
    assert "not available" in caplog.text


def test_fallback_with_the_real_provider_list(tmp_path: Path) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime build has CUDA; the fallback cannot be seen")
    config = SessionConfig(execution_providers=("CUDAExecutionProvider",))
    model = ModelSession.load(echo_model(tmp_path / "m.onnx"), config, PreprocessConfig())
    assert model.providers == ("CPUExecutionProvider",)
    assert model.unavailable_providers == ("CUDAExecutionProvider",)


@pytest.mark.parametrize(
    ("shape", "dtype", "preprocess", "expected"),
    [
        # The model is NHWC, the config says NCHW: the classic silent layout bug.
        ((1, 8, 8, 3), "float32", PreprocessConfig(layout="NCHW"), "it looks NHWC"),
        ((1, 3, 8, 8), "float32", PreprocessConfig(layout="NHWC"), "it looks NCHW"),
        ((1, 3, 8, 8), "float32", PreprocessConfig(size=(16, 16)), "height: the model has 8"),
        ((1, 3, 8, 16), "float32", PreprocessConfig(size=(8, 8)), "width: the model has 16"),
        ((1, 3, 8, 8), "float16", PreprocessConfig(), "the model has float16"),
        ((1, 3, 8, 8), "uint8", PreprocessConfig(), "dtype float32"),
        ((1, 4, 8, 8), "float32", PreprocessConfig(), "4 on axis 1"),
        ((1, 1, 8, 8), "float32", PreprocessConfig(), "channel count"),  # 3 means for 1 channel
        ((1, 3, 8), "float32", PreprocessConfig(), "rank 3"),
        ((2, 3, 8, 8), "float32", PreprocessConfig(), "batch dimension"),
        ((1, 3, "h", "w"), "float32", PreprocessConfig(), "dynamic height/width"),
        ((1, "c", 8, 8), "float32", PreprocessConfig(), "channel axis"),
        ((1, 3, 8, 8), "int64", PreprocessConfig(), "tensor(int64)"),
    ],
)
def test_signature_mismatches_name_both_sides(
    tmp_path: Path,
    shape: tuple[int | str, ...],
    dtype: str,
    preprocess: PreprocessConfig,
    expected: str,
) -> None:
    path = echo_model(tmp_path / "m.onnx", shape, dtype)
    with pytest.raises(ModelSignatureError) as caught:
        ModelSession.load(path, CPU, preprocess)
    message = str(caught.value)
    assert expected in message
    assert "the model has" in message
    assert "the runtime config says" in message
    assert {"model", "config", "path"} <= caught.value.fields.keys()


@pytest.mark.parametrize(
    ("shape", "dtype", "preprocess", "resolved_size"),
    [
        ((1, 8, 6, 3), "float32", PreprocessConfig(layout="NHWC"), (8, 6)),
        (("n", 3, 8, 8), "float32", PreprocessConfig(), (8, 8)),
        ((1, 3, "h", "w"), "float32", PreprocessConfig(size=(12, 20)), (12, 20)),
        ((1, 3, 8, 8), "float16", PreprocessConfig(dtype="float16"), (8, 8)),
        (
            (1, 1, 8, 8),
            "uint8",
            PreprocessConfig(dtype="uint8", scale=1, mean=(0.0,), std=(1.0,)),
            (8, 8),
        ),
    ],
)
def test_matching_signatures_load(
    tmp_path: Path,
    shape: tuple[int | str, ...],
    dtype: str,
    preprocess: PreprocessConfig,
    resolved_size: tuple[int, int],
) -> None:
    model = ModelSession.load(echo_model(tmp_path / "m.onnx", shape, dtype), CPU, preprocess)
    assert model.preprocess.size == resolved_size


def test_more_than_one_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelSignatureError, match="2 inputs"):
        ModelSession.load(two_input_model(tmp_path / "m.onnx"), CPU, PreprocessConfig())


def test_normalisation_declared_in_the_model_must_match(tmp_path: Path) -> None:
    declared = {"mean": [0.5, 0.5, 0.5], "std": 0.5, "channel_order": "BGR"}
    path = echo_model(tmp_path / "m.onnx", preprocess_metadata=declared)

    ok = PreprocessConfig(mean=(0.5,), std=(0.5, 0.5, 0.5), channel_order="BGR")
    assert ModelSession.load(path, CPU, ok).preprocess.channel_order == "BGR"

    with pytest.raises(ModelSignatureError, match=r"edgefleet\.preprocess: mean"):
        ModelSession.load(path, CPU, PreprocessConfig(std=(0.5,), channel_order="BGR"))
    with pytest.raises(ModelSignatureError, match=r"edgefleet\.preprocess: channel_order"):
        ModelSession.load(path, CPU, PreprocessConfig(mean=(0.5,), std=(0.5,)))


def test_unreadable_models_raise_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        ModelSession.load(tmp_path / "missing.onnx", CPU, PreprocessConfig())
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError) as caught:
        ModelSession.load(garbage, CPU, PreprocessConfig())
    assert caught.value.fields["path"] == str(garbage)
    assert caught.value.__cause__ is not None


def test_run_failure_is_an_inference_error(tmp_path: Path) -> None:
    model = ModelSession.load(
        failing_model(tmp_path / "m.onnx"), CPU, PreprocessConfig(size=(4, 4))
    )
    with pytest.raises(InferenceError) as caught:
        model.run(np.zeros((1, 3, 4, 4), dtype=np.float32))
    assert caught.value.__cause__ is not None
    assert model.run_counts() == (1, 1)


def test_runs_are_counted_for_the_watchdog(tmp_path: Path) -> None:
    model = ModelSession.load(echo_model(tmp_path / "m.onnx"), CPU, PreprocessConfig())
    assert model.run_counts() == (0, 0)
    for _ in range(3):
        model.run(np.zeros((1, 3, 8, 8), dtype=np.float32))
    assert model.run_counts() == (3, 0)


def test_closed_session_refuses_to_run(tmp_path: Path) -> None:
    model = ModelSession.load(echo_model(tmp_path / "m.onnx"), CPU, PreprocessConfig())
    model.close()
    model.close()  # idempotent
    assert model.closed
    with pytest.raises(ClosedError):
        model.run(np.zeros((1, 3, 8, 8), dtype=np.float32))


# ------------------------------------------------------------- signed runtime specs


def test_a_signed_spec_replaces_the_nodes_preprocess_and_names_the_session(
    tmp_path: Path,
) -> None:
    spec = RuntimeSpec(
        preprocess=PreprocessConfig(size=(6, 4), mean=(0.5,), std=(0.25,)),
        output=OutputSpec(decoder="raw"),
    )
    node = PreprocessConfig(size=(32, 32))  # would not fit the model: it is not used
    model = ModelSession.load(
        echo_model(tmp_path / "m.onnx", (1, 3, 6, 4)),
        CPU,
        node,
        runtime=spec,
        model="det",
        version="1.0.0",
    )
    assert (model.label, model.model, model.version) == ("det@1.0.0", "det", "1.0.0")
    assert (model.runtime_source, model.runtime) == ("signed", spec)
    assert model.preprocess == spec.preprocess
    inputs = model.prepare(np.full((12, 8, 3), 255, dtype=np.uint8))
    np.testing.assert_allclose(inputs["images"], np.full((1, 3, 6, 4), 2.0))
    decoded = model.decode(model.run_inputs(inputs), 12, 8)
    assert (decoded.kind, decoded.tensors[0].mean) == ("raw", 2.0)


def test_without_a_spec_the_nodes_preprocess_serves_with_a_raw_decoder(tmp_path: Path) -> None:
    model = ModelSession.load(echo_model(tmp_path / "m.onnx"), CPU, PreprocessConfig())
    assert (model.runtime_source, model.runtime, model.version) == ("node", None, None)
    assert model.decode(
        model.run_inputs(model.prepare(np.zeros((8, 8, 3), np.uint8))), 8, 8
    ).kind == ("raw")
    with pytest.raises(ModelLoadError, match="no preprocess config"):
        ModelSession.load(echo_model(tmp_path / "n.onnx"), CPU)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (OutputSpec(decoder="raw", output="scores"), "output 'scores'"),
        (OutputSpec(decoder="classification"), "classification"),
    ],
)
def test_a_signed_decoder_that_cannot_read_the_outputs_is_refused_at_load(
    tmp_path: Path, output: OutputSpec, message: str
) -> None:
    spec = RuntimeSpec(output=output)
    with pytest.raises(ModelSignatureError, match=message) as caught:
        ModelSession.load(echo_model(tmp_path / "m.onnx"), CPU, runtime=spec)
    assert "m.onnx" in caught.value.message


def test_geometry_is_the_preprocessors_for_every_frame_size(tmp_path: Path) -> None:
    # Cached per frame size and bounded: a camera that keeps changing size still gets
    # the right geometry for each.
    model = ModelSession.load(
        echo_model(tmp_path / "m.onnx"), CPU, PreprocessConfig(fit="letterbox")
    )
    sizes = [(h, w) for h in range(1, 7) for w in range(1, 7)] * 2  # 36 sizes, twice
    for h, w in sizes:
        assert model.geometry(h, w) == model.preprocessor.geometry(h, w)
