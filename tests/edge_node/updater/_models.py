"""Tiny ONNX models and reference pairs for the updater tests (onnx.helper, no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from control_plane.registry.onnx_inspect import ReferencePair, save_reference
from tests.edge_node.runtime._models import echo_model

SHAPE = (1, 4)


def model_bytes(tmp: Path, add: float) -> bytes:
    """`y = images + add`; distinct `add` gives distinct bytes (and sha256)."""
    return echo_model(tmp / f"m{add}.onnx", SHAPE, add=add).read_bytes()


def reference_bytes(tmp: Path, add: float) -> bytes:
    """The reference pair of `model_bytes(tmp, add)`."""
    x = np.arange(4, dtype=np.float32).reshape(SHAPE)
    path = tmp / f"r{add}.npz"
    save_reference(ReferencePair(inputs={"images": x}, outputs={"y": x + np.float32(add)}), path)
    return path.read_bytes()
