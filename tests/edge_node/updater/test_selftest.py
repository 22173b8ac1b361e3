"""self_test: a passing model, and each failure with its reason and its numbers — on the
older, preprocessed-only pairs and on today's pairs with a camera frame, run through the
serving session's own preprocessing."""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_node.runtime.config import SessionConfig
from edge_node.runtime.session import ModelSession
from edge_node.testing.update_world import (
    BareModel,
    frame_reference_bytes,
    image_model_bytes,
    image_runtime,
    reference_frame,
)
from edge_node.updater.selftest import TrialLoader, TrialModel, self_test
from protos.bundle.results import Decoded
from protos.bundle.spec import BundleError, PreprocessConfig, RuntimeSpec
from tests.edge_node.updater._models import model_bytes, reference_bytes

BUDGET = {"latency_budget_s": 5.0, "memory_budget_bytes": 1 << 34}
SIZE = (12, 16)
SPEC = image_runtime(SIZE, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def bare(path: Path) -> TrialLoader:
    return lambda: BareModel(path)


def serving(path: Path, runtime: RuntimeSpec = SPEC) -> TrialLoader:
    """The runtime's serving session, as the agent's host hands it to the self-test."""
    return lambda: ModelSession.load(path, SessionConfig(intra_op_threads=2), runtime=runtime)


# ------------------------------------------------------- older, preprocessed-only pairs


def test_model_matching_its_reference_passes(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(bare(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert result.ok, result.detail
    assert result.reason is None
    assert result.max_abs_err == 0.0
    assert result.latency_s is not None and result.latency_s >= 0


def test_output_mismatch_names_the_output_the_count_and_the_tolerance(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 2.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(bare(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert not result.ok
    assert result.reason == "output-mismatch"
    assert result.max_abs_err == 1.0
    assert (result.tensor, result.mismatched, result.elements) == ("output/y", 4, 4)
    assert (result.atol, result.rtol) == (1e-5, 1e-4)
    assert "'y': 4 of 4 elements out of tolerance, largest difference 1" in result.detail
    assert result.details()["tensor"] == "output/y"


def test_model_that_fails_to_load(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", b"not an onnx model")
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(bare(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert (result.ok, result.reason) == (False, "load-failed")


def test_unreadable_reference(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", b"PK nonsense")
    assert self_test(bare(model), ref, atol=0, rtol=0, **BUDGET).reason == "reference-invalid"


def test_latency_over_budget(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    ticks = itertools.count(step=0.5)  # every run "takes" half a second
    result = self_test(
        bare(model),
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=0.1,
        memory_budget_bytes=1 << 34,
        monotonic=lambda: float(next(ticks)),
    )
    assert (result.ok, result.reason, result.latency_s) == (False, "latency", 0.5)
    assert result.latency_budget_s == 0.1


def test_memory_over_budget_keeps_30_percent_headroom(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    # RSS grows 800 bytes: 80 % of a 1000-byte budget, over the 70 % allowed.
    readings = iter([1000, 1800])
    result = self_test(
        bare(model),
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=5.0,
        memory_budget_bytes=1000,
        rss=lambda: next(readings),
    )
    assert (result.ok, result.reason, result.rss_delta_bytes) == (False, "memory", 800)
    assert result.memory_limit_bytes == 700
    readings = iter([1000, 1700])
    ok = self_test(
        bare(model),
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=5.0,
        memory_budget_bytes=1000,
        rss=lambda: next(readings),
    )
    assert ok.ok, ok.detail


# ------------------------------------------------------------ today's pairs: a frame


def test_a_frame_through_the_serving_sessions_own_preprocessing_passes(tmp_path: Path) -> None:
    data = image_model_bytes(SIZE, add=0.5)
    model = write(tmp_path, "model.onnx", data)
    ref = write(tmp_path, "ref.npz", frame_reference_bytes(data, SPEC.preprocess))
    result = self_test(serving(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert result.ok, result.detail


def test_a_reference_made_with_another_mean_is_a_preprocess_mismatch(tmp_path: Path) -> None:
    data = image_model_bytes(SIZE)
    model = write(tmp_path, "model.onnx", data)
    # The model's runtime says ImageNet's mean; the reference was made with 0.5.
    other = PreprocessConfig(size=SIZE, mean=(0.5,), std=SPEC.preprocess.std)
    ref = write(tmp_path, "ref.npz", frame_reference_bytes(data, other))
    result = self_test(serving(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert (result.ok, result.reason) == (False, "preprocess-mismatch")
    assert result.tensor == "input/images"
    elements = 3 * SIZE[0] * SIZE[1]
    assert result.elements == elements
    assert result.mismatched is not None and result.mismatched > 0
    assert result.max_abs_err == pytest.approx((0.5 - 0.406) / 0.225, rel=1e-3)
    assert "largest difference" in result.detail and "'images'" in result.detail


def test_the_same_pair_passes_with_the_mean_it_was_made_with(tmp_path: Path) -> None:
    # The mismatch above is the mean's, not the pair's: served with it, the pair passes.
    data = image_model_bytes(SIZE)
    model = write(tmp_path, "model.onnx", data)
    other = image_runtime(SIZE, mean=(0.5,), std=SPEC.preprocess.std)
    ref = write(tmp_path, "ref.npz", frame_reference_bytes(data, other.preprocess))
    assert self_test(serving(model, other), ref, atol=1e-5, rtol=1e-4, **BUDGET).ok


def test_a_frame_a_model_cannot_take_is_a_preprocess_mismatch(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))  # input [1, 4]
    buffer = io.BytesIO()
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.savez(buffer, frame=reference_frame(), **{"input/images": x, "output/y": x + 1})
    ref = write(tmp_path, "ref.npz", buffer.getvalue())
    result = self_test(bare(model), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert (result.ok, result.reason) == (False, "preprocess-mismatch")
    assert "cannot preprocess the reference frame" in result.detail


def test_a_frame_that_is_not_an_rgb_image_makes_the_reference_invalid(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", image_model_bytes(SIZE))
    buffer = io.BytesIO()
    x = np.zeros((1, 3, *SIZE), dtype=np.float32)
    np.savez(buffer, frame=np.zeros((4, 4), np.float32), **{"input/images": x, "output/y": x})
    ref = write(tmp_path, "ref.npz", buffer.getvalue())
    result = self_test(serving(model), ref, atol=0, rtol=0, **BUDGET)
    assert (result.reason, "frame is float32[4, 4]" in result.detail) == ("reference-invalid", True)


class _Undecodable:
    """The serving session, with outputs its decoder refuses."""

    def __init__(self, model: TrialModel) -> None:
        self._model = model

    def run_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return self._model.run_inputs(inputs)

    def prepare(self, frame: Any) -> dict[str, Any]:
        return self._model.prepare(frame)

    def decode(self, outputs: Mapping[str, Any], frame_h: int, frame_w: int) -> Decoded:
        raise BundleError("classification expects [1, C] scores", field="output")


def test_outputs_that_do_not_decode_fail_the_self_test(tmp_path: Path) -> None:
    data = image_model_bytes(SIZE)
    model = write(tmp_path, "model.onnx", data)
    ref = write(tmp_path, "ref.npz", frame_reference_bytes(data, SPEC.preprocess))
    load = serving(model)
    result = self_test(lambda: _Undecodable(load()), ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert (result.ok, result.reason) == (False, "decode-failed")
    assert "classification expects [1, C] scores" in result.detail
