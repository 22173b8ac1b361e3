"""The on-node self-test of a model on trial (DESIGN §5): load it, run the signed reference
input, compare with the reference output, and hold latency and memory to their budgets.

The reference pair is the `.npz` the release carries (`input/<name>`, `output/<name>`,
already-preprocessed tensors; never unpickled), so the test runs a bare ONNX Runtime
session, not the camera pipeline. `self_test` is blocking: the reconciler runs it in a
thread. It returns a `SelfTestResult` rather than raising: a failing model is an
outcome, not an error. Not here: the hot swap, or deciding to revert.
"""

from __future__ import annotations

import statistics
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "ReferencePair",
    "ReferenceRunner",
    "SelfTestResult",
    "compare_outputs",
    "load_reference_pair",
    "ort_runner",
    "process_rss",
    "self_test",
]

_INPUT: Final = "input/"
_OUTPUT: Final = "output/"
MEMORY_HEADROOM: Final = 0.7
"""A model may use at most 70 % of its memory budget at load: 30 % stays for peaks."""

Array = npt.NDArray[Any]


class ReferenceRunner(Protocol):
    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]: ...


@dataclass(frozen=True, slots=True)
class SelfTestResult:
    """`reason` is None when ok, else one of load-failed, reference-invalid, run-failed,
    output-mismatch, latency, memory; `detail` says more for logs."""

    ok: bool
    reason: str | None
    max_abs_err: float | None = None
    latency_s: float | None = None
    rss_delta_bytes: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReferencePair:
    inputs: dict[str, Array]
    outputs: dict[str, Array]


def load_reference_pair(path: Path) -> ReferencePair:
    """Read `input/<name>` / `output/<name>` arrays; ValueError for anything else."""
    inputs: dict[str, Array] = {}
    outputs: dict[str, Array] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                if key.startswith(_INPUT):
                    inputs[key.removeprefix(_INPUT)] = archive[key]
                elif key.startswith(_OUTPUT):
                    outputs[key.removeprefix(_OUTPUT)] = archive[key]
                else:
                    raise ValueError(f"unexpected member {key!r}")
    except (OSError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
        raise ValueError(f"cannot read reference pair {path.name}: {exc}") from exc
    if not inputs or not outputs:
        raise ValueError(f"reference pair {path.name} lacks inputs or outputs")
    return ReferencePair(inputs, outputs)


def compare_outputs(
    expected: Mapping[str, Array], actual: Mapping[str, Array], atol: float, rtol: float
) -> tuple[bool, float, str]:
    """`|actual - expected| <= atol + rtol * |expected|` elementwise (NaN equals NaN);
    names, dtypes and shapes must agree; non-numeric tensors must be equal.
    Returns (ok, largest absolute error, message)."""
    problems: list[str] = []
    if set(expected) != set(actual):
        problems.append(f"outputs {sorted(actual)} differ from expected {sorted(expected)}")
    worst = 0.0
    for name in sorted(set(expected) & set(actual)):
        want, got = np.asarray(expected[name]), np.asarray(actual[name])
        if want.dtype != got.dtype or want.shape != got.shape:
            problems.append(
                f"{name!r}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
            )
            continue
        if want.dtype.kind not in "fiu":
            if np.count_nonzero(want != got):
                problems.append(f"{name!r}: elements differ")
            continue
        if want.size == 0:
            continue
        e, a = want.astype(np.float64), got.astype(np.float64)
        close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        with np.errstate(invalid="ignore"):
            diff = np.where(close & ~np.isfinite(a - e), 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = max(worst, float(diff.max()))
        if not close.all():
            problems.append(f"{name!r}: {int(close.size - close.sum())} elements out of tolerance")
    if problems:
        return False, worst, "; ".join(problems)
    return True, worst, f"{len(expected)} output(s) within atol={atol:g}, rtol={rtol:g}"


class _OrtRunner:
    def __init__(self, model_path: Path) -> None:
        import onnxruntime as ort  # heavy: imported when a model is actually tested

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._names = [o.name for o in self._session.get_outputs()]

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        values = self._session.run(self._names, dict(inputs))
        return {name: np.asarray(v) for name, v in zip(self._names, values, strict=True)}


def ort_runner(model_path: Path) -> ReferenceRunner:
    """A CPU ONNX Runtime session with explicit, small thread counts."""
    return _OrtRunner(model_path)


def process_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def self_test(
    model_path: Path,
    reference_npz_path: Path,
    *,
    atol: float,
    rtol: float,
    latency_budget_s: float,
    memory_budget_bytes: int,
    session_factory: Callable[[Path], ReferenceRunner] = ort_runner,
    runs: int = 5,
    rss: Callable[[], int] = process_rss,
    monotonic: Callable[[], float] = time.perf_counter,
) -> SelfTestResult:
    """Test a model against its reference pair; see `SelfTestResult` for the reasons.

    Latency is the median of `runs` timed runs after one warm-up. Memory is the growth
    of this process's RSS from before the load to after the runs, and must stay within
    `MEMORY_HEADROOM` of `memory_budget_bytes`.
    """
    try:
        pair = load_reference_pair(Path(reference_npz_path))
    except ValueError as exc:
        return SelfTestResult(False, "reference-invalid", detail=str(exc))
    before = rss()
    try:
        runner = session_factory(Path(model_path))
    except Exception as exc:  # ORT raises its own untyped errors for a bad model
        return SelfTestResult(False, "load-failed", detail=f"{type(exc).__name__}: {exc}")
    try:
        actual = runner.run(pair.inputs)
        timings: list[float] = []
        for _ in range(max(1, runs)):
            start = monotonic()
            runner.run(pair.inputs)
            timings.append(monotonic() - start)
    except Exception as exc:
        return SelfTestResult(False, "run-failed", detail=f"{type(exc).__name__}: {exc}")
    rss_delta = max(0, rss() - before)
    latency = statistics.median(timings)
    ok, max_abs_err, message = compare_outputs(pair.outputs, actual, atol, rtol)
    measured: dict[str, Any] = {
        "max_abs_err": max_abs_err,
        "latency_s": latency,
        "rss_delta_bytes": rss_delta,
    }
    if not ok:
        return SelfTestResult(False, "output-mismatch", detail=message, **measured)
    if latency > latency_budget_s:
        return SelfTestResult(
            False,
            "latency",
            detail=f"median {latency:.4g}s over the {latency_budget_s:g}s budget",
            **measured,
        )
    if rss_delta > MEMORY_HEADROOM * memory_budget_bytes:
        return SelfTestResult(
            False,
            "memory",
            detail=f"RSS grew {rss_delta} bytes, over {MEMORY_HEADROOM:.0%} of the "
            f"{memory_budget_bytes} byte budget",
            **measured,
        )
    return SelfTestResult(True, None, detail=message, **measured)
