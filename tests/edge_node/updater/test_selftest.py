"""self_test: a passing model, and each failure with its reason."""

from __future__ import annotations

import itertools
from pathlib import Path

from edge_node.updater.selftest import self_test
from tests.edge_node.updater._models import model_bytes, reference_bytes

BUDGET = {"latency_budget_s": 5.0, "memory_budget_bytes": 1 << 34}


def write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def test_model_matching_its_reference_passes(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(model, ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert result.ok, result.detail
    assert result.reason is None
    assert result.max_abs_err == 0.0
    assert result.latency_s is not None and result.latency_s >= 0


def test_output_mismatch(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 2.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(model, ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert not result.ok
    assert result.reason == "output-mismatch"
    assert result.max_abs_err == 1.0


def test_model_that_fails_to_load(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", b"not an onnx model")
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    result = self_test(model, ref, atol=1e-5, rtol=1e-4, **BUDGET)
    assert (result.ok, result.reason) == (False, "load-failed")


def test_unreadable_reference(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", b"PK nonsense")
    assert self_test(model, ref, atol=0, rtol=0, **BUDGET).reason == "reference-invalid"


def test_latency_over_budget(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    ticks = itertools.count(step=0.5)  # every run "takes" half a second
    result = self_test(
        model,
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=0.1,
        memory_budget_bytes=1 << 34,
        monotonic=lambda: float(next(ticks)),
    )
    assert (result.ok, result.reason, result.latency_s) == (False, "latency", 0.5)


def test_memory_over_budget_keeps_30_percent_headroom(tmp_path: Path) -> None:
    model = write(tmp_path, "model.onnx", model_bytes(tmp_path, 1.0))
    ref = write(tmp_path, "ref.npz", reference_bytes(tmp_path, 1.0))
    # RSS grows 800 bytes: 80 % of a 1000-byte budget, over the 70 % allowed.
    readings = iter([1000, 1800])
    result = self_test(
        model,
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=5.0,
        memory_budget_bytes=1000,
        rss=lambda: next(readings),
    )
    assert (result.ok, result.reason, result.rss_delta_bytes) == (False, "memory", 800)
    readings = iter([1000, 1700])
    ok = self_test(
        model,
        ref,
        atol=1e-5,
        rtol=1e-4,
        latency_budget_s=5.0,
        memory_budget_bytes=1000,
        rss=lambda: next(readings),
    )
    assert ok.ok, ok.detail
