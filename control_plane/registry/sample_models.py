"""Small, real ONNX models built in code, for the demo, tests and benchmarks.

Every builder is deterministic (same arguments, same bytes) and needs no download.
These are fixtures, not production models: nothing here is trained.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "PRODUCER_NAME",
    "TINY_DETECTOR_LABELS",
    "add_constant_model",
    "broken_model_bytes",
    "identity_model",
    "tiny_box_detector",
    "tiny_detector",
    "tiny_detector_runtime",
]

PRODUCER_NAME = "edgefleet.sample_models"
_PRODUCER_VERSION = "1"
DEFAULT_OPSET = 17

Shape = tuple[int | str, ...]

TINY_DETECTOR_LABELS = ("person", "vehicle", "bicycle", "animal")
"""Names for the four scores of :func:`tiny_detector` (nothing is trained: names only)."""


def tiny_detector(path: Path, *, seed: int = 0, size: int = 32, opset: int = DEFAULT_OPSET) -> Path:
    """A toy "detector": ``images`` float32 [1,3,size,size] (NCHW) -> ``scores`` float32 [1,4].

    Conv(3->8, 3x3, pads 1) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(8->4) -> Sigmoid,
    with weights drawn from ``numpy.random.default_rng(seed)``: a different seed is a
    different "version" with different outputs.
    """
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    rng = np.random.default_rng(seed)
    conv_w = (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32)
    conv_b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    fc_w = (rng.standard_normal((8, 4)) * 0.5).astype(np.float32)
    fc_b = (rng.standard_normal(4) * 0.1).astype(np.float32)

    nodes = [
        helper.make_node(
            "Conv",
            ["images", "conv_w", "conv_b"],
            ["conv"],
            name="conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[1, 1],
        ),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc"),
        helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_detector",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        outputs=[helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4])],
        initializer=[
            numpy_helper.from_array(conv_w, "conv_w"),
            numpy_helper.from_array(conv_b, "conv_b"),
            numpy_helper.from_array(fc_w, "fc_w"),
            numpy_helper.from_array(fc_b, "fc_b"),
        ],
    )
    return _save(_model(graph, opset), path)


def tiny_box_detector(path: Path, *, size: int = 48, opset: int = DEFAULT_OPSET) -> Path:
    """A toy box detector for the ``yolo`` decoder: ``images`` float32 [1,3,size,size]
    (NCHW) -> ``output0`` float32 [1, 8, 2], two candidate boxes (cxcywh in input pixels,
    then a score for each of :data:`TINY_DETECTOR_LABELS`; no objectness).

    Candidate 0 is a person in the right half (centre x 0.7 of the width, feet at 0.9 of
    the height, score 0.9), moved right by the mean of the first input channel (a
    quarter of the width per unit: ~0 on noise normalised around zero); candidate 1 a
    vehicle at the left (centre x 0.25, score 0.8). Nothing is trained: the same boxes
    for every frame of noise, which is what a demo of rules needs.
    """
    if size < 8:
        raise ValueError(f"size must be at least 8, got {size}")
    labels = len(TINY_DETECTOR_LABELS)
    k, n = 4 + labels, 2
    person = [0.7, 0.6, 0.2, 0.6]
    vehicle = [0.25, 0.7, 0.3, 0.25]
    values = np.zeros((k, n), dtype=np.float32)  # the [K, N] layout, row-major
    values[:4, 0] = np.asarray(person) * size
    values[:4, 1] = np.asarray(vehicle) * size
    values[4:, :] = 0.05
    values[4, 0], values[5, 1] = 0.9, 0.8
    weights = np.zeros((3, k * n), dtype=np.float32)
    weights[0, 0] = size / 4  # the person's cx, by the first channel's mean
    initializers = [
        numpy_helper.from_array(np.asarray([1, 3], dtype=np.int64), "flat"),
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(values.reshape(-1), "bias"),
        numpy_helper.from_array(np.asarray([1, k, n], dtype=np.int64), "boxes"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"], name="pool"),
        helper.make_node("Reshape", ["pooled", "flat"], ["features"], name="flatten"),
        helper.make_node("MatMul", ["features", "weights"], ["moved"], name="move"),
        helper.make_node("Add", ["moved", "bias"], ["candidates"], name="place"),
        helper.make_node("Reshape", ["candidates", "boxes"], ["output0"], name="output"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_box_detector",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        outputs=[helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, k, n])],
        initializer=initializers,
    )
    return _save(_model(graph, opset), path)


def tiny_detector_runtime(
    *,
    mean: tuple[float, ...] = (0.485, 0.456, 0.406),
    std: tuple[float, ...] = (0.229, 0.224, 0.225),
    top_k: int = 2,
    labels: tuple[str, ...] = TINY_DETECTOR_LABELS,
) -> dict[str, Any]:
    """A runtime spec (as an operator's ``runtime.yaml`` holds it) that fits
    :func:`tiny_detector` of any size: NCHW RGB float32 at the model's own size, the given
    normalisation, and its four sigmoid scores read as a classification."""
    return {
        "preprocess": {"layout": "NCHW", "mean": list(mean), "std": list(std)},
        "output": {"decoder": "classification", "top_k": top_k, "score_threshold": 0.0},
        "labels": list(labels),
    }


def identity_model(
    path: Path,
    shape: Shape = (1, 4),
    dtype: str = "float32",
    *,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """``y = x`` with input ``x`` and output ``y`` of ``dtype`` and ``shape``.

    ``shape`` may hold strings for symbolic dimensions (``("batch", 4)``).
    """
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="identity")],
        "identity",
        inputs=[helper.make_tensor_value_info("x", elem_type, list(shape))],
        outputs=[helper.make_tensor_value_info("y", elem_type, list(shape))],
    )
    return _save(_model(graph, opset), path)


def add_constant_model(
    path: Path,
    constant: float,
    *,
    shape: Shape = (1, 4),
    opset: int = DEFAULT_OPSET,
) -> Path:
    """``y = x + constant`` on float32 ``x``: two constants make two versions that differ."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"], name="add")],
        "add_constant",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[numpy_helper.from_array(np.array(constant, dtype=np.float32), "c")],
    )
    return _save(_model(graph, opset), path)


def broken_model_bytes() -> bytes:
    """A ModelProto that parses but fails ``onnx.checker``: an unknown op in the default domain."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["x"], ["y"], name="broken")],
        "broken",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return _model(graph, DEFAULT_OPSET, check=False).SerializeToString(deterministic=True)


def _model(graph: onnx.GraphProto, opset: int, *, check: bool = True) -> onnx.ModelProto:
    opset_ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        graph,
        opset_imports=opset_ids,
        producer_name=PRODUCER_NAME,
        producer_version=_PRODUCER_VERSION,
    )
    # The oldest IR version that can carry this opset, not the newest onnx knows (the
    # runtime on the node may be older than the onnx that built the model), but at
    # least IR 4, the first where initializers need not be listed as graph inputs.
    model.ir_version = max(helper.find_min_ir_version_for(opset_ids), 4)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    data = model.SerializeToString(deterministic=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path
