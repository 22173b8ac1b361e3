"""Small ONNX models for the runtime tests, built with ``onnx.helper`` (no download)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
Shape = Sequence[int | str]

_ELEMENT = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "uint8": TensorProto.UINT8,
    "int64": TensorProto.INT64,
}


def _save(graph: onnx.GraphProto, path: Path, metadata: dict[str, str] | None = None) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString())
    return path


def echo_model(
    path: Path,
    shape: Shape = (1, 3, 8, 8),
    dtype: str = "float32",
    *,
    add: float = 0.0,
    preprocess_metadata: dict[str, object] | None = None,
) -> Path:
    """``y = x + add`` (``Identity`` when ``add`` is 0): shows exactly what the model was fed."""
    element = _ELEMENT[dtype]
    if add:
        nodes = [helper.make_node("Add", ["images", "c"], ["y"])]
        init = [numpy_helper.from_array(np.array(add, dtype=np.dtype(dtype)), "c")]
    else:
        nodes, init = [helper.make_node("Identity", ["images"], ["y"])], []
    graph = helper.make_graph(
        nodes,
        "echo",
        inputs=[helper.make_tensor_value_info("images", element, list(shape))],
        outputs=[helper.make_tensor_value_info("y", element, list(shape))],
        initializer=init,
    )
    metadata = (
        {"edgefleet.preprocess": json.dumps(preprocess_metadata)} if preprocess_metadata else None
    )
    return _save(graph, path, metadata)


def two_input_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "two_inputs",
        inputs=[
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3, 4, 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3, 4, 4]),
        ],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
    )
    return _save(graph, path)


def failing_model(path: Path) -> Path:
    """Loads fine with a dynamic input, then fails at run time: reshapes 48 values to [7, -1]."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["images", "shape"], ["y"])],
        "failing",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "h", "w"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, "n"])],
        initializer=[numpy_helper.from_array(np.array([7, -1], dtype=np.int64), "shape")],
    )
    return _save(graph, path)
