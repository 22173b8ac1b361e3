"""`model quantize` on a model whose weights are ``Constant`` nodes (paddle2onnx's export).

ONNX Runtime quantizes a weight only when it is an initializer: PP-OCR's det and cls (no
initializer at all) came out "INT8" with float weights in calibrated Q/DQ pairs, larger
than the FP32 file. The weights are lifted into initializers before quantizing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from control_plane.registry import sample_models
from control_plane.registry.model_data import MIN_CALIBRATION_SAMPLES, open_samples
from control_plane.registry.onnx_inspect import inspect_model
from control_plane.registry.quantization import (
    QuantizeOptions,
    quantize_model,
    weights_as_initializers,
)

SIZE = 32


def as_constants(source: Path, target: Path) -> Path:
    """`source` with every initializer written as a Constant node instead, as paddle2onnx does."""
    model = onnx.load(str(source))
    constants = [
        helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t)
        for t in model.graph.initializer
    ]
    del model.graph.initializer[:]
    nodes = [*constants, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return target


def tensors(folder: Path, count: int) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(count):
        np.save(folder / f"{i:02d}.npy", rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    return folder


def test_weights_written_as_constants_are_quantized_to_int8(tmp_path: Path) -> None:
    plain = sample_models.tiny_detector(tmp_path / "plain.onnx", size=SIZE)
    fp32 = as_constants(plain, tmp_path / "fp32.onnx")
    data = tensors(tmp_path / "calibration", MIN_CALIBRATION_SAMPLES)
    samples = open_samples(data, inspect_model(fp32), None, minimum=MIN_CALIBRATION_SAMPLES)
    out = tmp_path / "int8.onnx"

    report = quantize_model(fp32, out, samples, QuantizeOptions(exclude=("sigmoid",)))

    assert report["constants_lifted"] == 4
    model = onnx.load(str(out))
    int8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8}
    assert {"conv_w_quantized", "fc_w_quantized"} <= int8, int8
    # The float weights are gone, not wrapped: no Constant left, the file no larger than FP32.
    assert not [n for n in model.graph.node if n.op_type == "Constant"]
    assert out.stat().st_size < fp32.stat().st_size + 4096
    # --exclude names survive the lifting (they are checked against the original graph).
    assert report["settings"]["nodes_excluded"] == ["sigmoid"]
    assert float(report["agreement"]["outputs"][0]["cosine_p5"]) > 0.99
    x = np.load(data / "00.npy")
    a = ort.InferenceSession(str(fp32)).run(None, {"images": x})[0]
    b = ort.InferenceSession(str(out)).run(None, {"images": x})[0]
    assert np.allclose(a, b, atol=0.05)
    assert not (tmp_path / "fp32-initializers.onnx").exists()  # staged beside out, then gone


def test_a_model_with_initializers_is_given_to_the_quantizer_as_it_is(tmp_path: Path) -> None:
    plain = sample_models.tiny_detector(tmp_path / "plain.onnx", size=SIZE)
    target = tmp_path / "lifted.onnx"
    assert weights_as_initializers(plain, target) == (plain, 0)
    assert not target.exists()
    lifted, count = weights_as_initializers(as_constants(plain, tmp_path / "c.onnx"), target)
    assert (lifted, count) == (target, 4)
    # The same graph as the original, node for node, the values bit for bit.
    a, b = onnx.load(str(plain)).graph, onnx.load(str(target)).graph
    assert [n.name for n in a.node] == [n.name for n in b.node]
    values = [{t.name: t.raw_data for t in graph.initializer} for graph in (a, b)]
    assert values[0] == values[1]


def test_per_channel_converts_a_model_older_than_opset_13(tmp_path: Path) -> None:
    # PP-OCR's cls is opset 11: ORT wrote per-channel DequantizeLinear nodes with an axis
    # that opset 11 has not, and onnx.checker refused the result.
    fp32 = sample_models.tiny_detector(tmp_path / "fp32.onnx", size=SIZE, opset=11)
    data = tensors(tmp_path / "calibration", MIN_CALIBRATION_SAMPLES)
    samples = open_samples(data, inspect_model(fp32), None, minimum=MIN_CALIBRATION_SAMPLES)
    out = tmp_path / "int8.onnx"

    report = quantize_model(fp32, out, samples, QuantizeOptions(per_channel=True))

    assert report["opset_converted_from"] == 11
    model = onnx.load(str(out))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    assert any(
        a.name == "axis"
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
        for a in n.attribute
    )
    assert float(report["agreement"]["outputs"][0]["cosine_p5"]) > 0.99
    # Per tensor, the model is quantized at the opset it has.
    again = quantize_model(fp32, tmp_path / "pt.onnx", samples, QuantizeOptions())
    assert again["opset_converted_from"] is None
