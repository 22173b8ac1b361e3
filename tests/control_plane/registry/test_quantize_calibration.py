"""`model quantize`'s calibration method: MinMax (ADR 0046's pin) or Percentile / Entropy.

PP-OCRv4 det's activations are heavy-tailed (its first hardswish spans ±66 while most
values are near 1): MinMax spends int8's 255 steps on a range that a few values reach.
Percentile clips those extremes. Here one outlier pixel in the calibration set sets
MinMax's input range alone; Percentile's range ignores it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from control_plane.errors import InvalidInputError
from control_plane.registry import sample_models
from control_plane.registry.model_data import MIN_CALIBRATION_SAMPLES, open_samples
from control_plane.registry.onnx_inspect import inspect_model
from control_plane.registry.quantization import QuantizeOptions, quantize_model

SIZE = 128  # 8 samples of 3x128x128: one outlier is under Percentile's 0.001 % tail


def _input_scale(path: Path) -> float:
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(
        n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "images"
    )
    return float(inits[node.input[1]])


def _calibration(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(MIN_CALIBRATION_SAMPLES):
        x = rng.uniform(-1, 1, (1, 3, SIZE, SIZE)).astype(np.float32)
        if i == 0:
            x[0, 0, 0, 0] = 500.0  # one glint
        np.save(folder / f"{i:02d}.npy", x)
    return folder


def test_percentile_calibration_clips_the_outlier_that_sets_minmax_range(tmp_path: Path) -> None:
    fp32 = sample_models.tiny_detector(tmp_path / "fp32.onnx", size=SIZE)
    data = _calibration(tmp_path / "calibration")
    samples = open_samples(data, inspect_model(fp32), None, minimum=MIN_CALIBRATION_SAMPLES)

    minmax = quantize_model(fp32, tmp_path / "minmax.onnx", samples, QuantizeOptions())
    percentile = quantize_model(
        fp32, tmp_path / "pct.onnx", samples, QuantizeOptions(calibration="percentile")
    )

    assert minmax["settings"]["calibration"] == "MinMax"
    assert percentile["settings"]["calibration"] == "Percentile"
    # MinMax: (500 - (-1)) / 255 ≈ 1.96; Percentile: about 2 / 255.
    assert _input_scale(tmp_path / "minmax.onnx") > 1.5
    assert _input_scale(tmp_path / "pct.onnx") < 0.05


def test_an_unknown_or_dynamic_calibration_method_is_refused(tmp_path: Path) -> None:
    fp32 = sample_models.tiny_detector(tmp_path / "fp32.onnx", size=SIZE)
    data = _calibration(tmp_path / "calibration")
    samples = open_samples(data, inspect_model(fp32), None, minimum=MIN_CALIBRATION_SAMPLES)
    out = tmp_path / "int8.onnx"
    with pytest.raises(InvalidInputError, match="minmax, percentile, entropy"):
        quantize_model(fp32, out, samples, QuantizeOptions(calibration="kl"))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="needs --method static"):
        quantize_model(
            fp32, out, samples, QuantizeOptions(method="dynamic", calibration="percentile")
        )
    assert not out.exists()
