"""The on-node self-test of a model on trial (DESIGN §5): load it as it will serve, run the
signed reference through the same preprocessing the frames get, compare with the
reference, decode, and hold latency and memory to their budgets.

The reference pair is the `.npz` the release carries (never unpickled). The format that
`model push` writes today has `frame` (a uint8 HxWx3 RGB camera frame), `input/<name>`
(the tensor the CLI made of it with the signed runtime spec) and `output/<name>` (ONNX
Runtime's outputs on it): the node preprocesses `frame` itself and checks its tensor
against `input/<name>` (`preprocess-mismatch`), runs the model on its own tensor and
compares the outputs (`output-mismatch`), then decodes them (`decode-failed`). An older
pair has only `input/` and `output/`, already-preprocessed tensors: those are run as they
are. The model comes from a `TrialLoader`: the runtime's own serving session (same
threads, providers and bundle), so the test measures what will serve and that very
session serves after it. `self_test` is blocking (the host runs it in a thread) and
returns a `SelfTestResult` rather than raising: a failing model is an outcome, not an
error; its fields say which tensor, how many elements, which tolerance or limit.
Not here: the hot swap, or deciding to revert.
"""

from __future__ import annotations

import statistics
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from protos.bundle.results import Decoded

__all__ = [
    "INPUT_TOLERANCE",
    "MEMORY_HEADROOM",
    "Comparison",
    "ReferencePair",
    "SelfTestResult",
    "TrialLoader",
    "TrialModel",
    "compare_tensors",
    "load_reference_pair",
    "process_rss",
    "self_test",
]

_INPUT: Final = "input/"
_OUTPUT: Final = "output/"
_FRAME: Final = "frame"
MEMORY_HEADROOM: Final = 0.7
"""A model may use at most 70 % of its memory budget at load: 30 % stays for peaks."""
INPUT_TOLERANCE: Final = (1e-3, 1e-3)
"""(atol, rtol) of the node's tensor against the reference input for a float input. The
CLI and the node run the same preprocessing code, so only float rounding may differ; a
normalisation that differs (a mean of 0.485 against 0.5) is far outside it. An integer
input may differ by one level (rounding)."""

Array = npt.NDArray[Any]


class TrialModel(Protocol):
    """A loaded model as the self-test drives it: the session a trial will serve with."""

    def run_inputs(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run named inputs; outputs by name."""
        ...

    def prepare(self, frame: npt.NDArray[np.uint8]) -> dict[str, Array]:
        """The model's inputs for one HxWx3 uint8 RGB frame, made as served frames are."""
        ...

    def decode(self, outputs: Mapping[str, Array], frame_h: int, frame_w: int) -> Decoded:
        """The outputs of a frame of that size decoded as the version says."""
        ...


TrialLoader = Callable[[], TrialModel]


@dataclass(frozen=True, slots=True)
class SelfTestResult:
    """`reason` is None when ok, else one of load-failed, reference-invalid,
    preprocess-mismatch, run-failed, output-mismatch, decode-failed, latency, memory;
    `detail` says it in words, the other fields in numbers (None where they do not apply):
    `tensor` (`input/<name>` or `output/<name>`) with `mismatched` of its `elements` out
    of `atol`/`rtol` and `max_abs_err`; the median `latency_s` against
    `latency_budget_s`; the RSS growth `rss_delta_bytes` against `memory_limit_bytes`."""

    ok: bool
    reason: str | None
    max_abs_err: float | None = None
    latency_s: float | None = None
    rss_delta_bytes: int | None = None
    detail: str = ""
    tensor: str | None = None
    mismatched: int | None = None
    elements: int | None = None
    atol: float | None = None
    rtol: float | None = None
    latency_budget_s: float | None = None
    memory_limit_bytes: int | None = None

    def details(self) -> dict[str, str | int | float]:
        """The structured fields that are set (for an update status), by name."""
        out: dict[str, str | int | float] = {}
        for f in fields(self):
            if f.name in ("ok", "reason", "detail"):
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out


@dataclass(frozen=True, slots=True)
class ReferencePair:
    inputs: dict[str, Array]
    outputs: dict[str, Array]
    frame: npt.NDArray[np.uint8] | None = None
    """The camera frame the inputs were made of (None: an older, preprocessed-only pair)."""


def load_reference_pair(path: Path) -> ReferencePair:
    """Read `frame`, `input/<name>`, `output/<name>`; ValueError for anything else."""
    inputs: dict[str, Array] = {}
    outputs: dict[str, Array] = {}
    frame: Array | None = None
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                if key.startswith(_INPUT):
                    inputs[key.removeprefix(_INPUT)] = archive[key]
                elif key.startswith(_OUTPUT):
                    outputs[key.removeprefix(_OUTPUT)] = archive[key]
                elif key == _FRAME:
                    frame = archive[key]
                else:
                    raise ValueError(f"unexpected member {key!r}")
    except (OSError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
        raise ValueError(f"cannot read reference pair {path.name}: {exc}") from exc
    if not inputs or not outputs:
        raise ValueError(f"reference pair {path.name} lacks inputs or outputs")
    if frame is not None and (
        frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 or 0 in frame.shape
    ):
        raise ValueError(
            f"reference pair {path.name}: frame is {frame.dtype}{list(frame.shape)}, "
            "expected uint8 [H, W, 3]"
        )
    return ReferencePair(inputs, outputs, frame)


@dataclass(frozen=True, slots=True)
class Comparison:
    """`compare_tensors`' verdict; `tensor` names the worst one out of tolerance (or one
    whose name, dtype or shape differs), with `mismatched` of its `elements` outside."""

    ok: bool
    max_abs_err: float
    message: str
    tensor: str | None = None
    mismatched: int | None = None
    elements: int | None = None


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def compare_tensors(
    expected: Mapping[str, Array], actual: Mapping[str, Array], atol: float, rtol: float
) -> Comparison:
    """`|actual - expected| <= atol + rtol * |expected|` elementwise (NaN equals NaN);
    names, dtypes and shapes must agree; non-numeric tensors must be equal. The message
    names every tensor that differs, and where the largest difference is."""
    problems: list[str] = []
    worst = 0.0
    culprit: tuple[float, str, int | None, int | None] | None = None  # (err, name, bad, size)
    if set(expected) != set(actual):
        problems.append(f"tensors {sorted(actual)} differ from expected {sorted(expected)}")
        missing = sorted(set(expected) ^ set(actual))
        culprit = (np.inf, missing[0], None, None)
    for name in sorted(set(expected) & set(actual)):
        want, got = np.asarray(expected[name]), np.asarray(actual[name])
        if want.dtype != got.dtype or want.shape != got.shape:
            problems.append(
                f"{name!r}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
            )
            if culprit is None or culprit[0] < np.inf:
                culprit = (np.inf, name, None, int(want.size))
            continue
        if want.dtype.kind not in "fiu":
            bad = int(np.count_nonzero(want != got))
            if bad:
                problems.append(f"{name!r}: {bad} of {want.size} elements differ")
                if culprit is None or culprit[0] < np.inf:
                    culprit = (np.inf, name, bad, int(want.size))
            continue
        if want.size == 0:
            continue
        e, a = want.astype(np.float64), got.astype(np.float64)
        close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        with np.errstate(invalid="ignore"):
            diff = np.where(close & ~np.isfinite(a - e), 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        largest = float(diff.max())
        worst = max(worst, largest)
        if not close.all():
            bad = int(close.size - close.sum())
            at = int(diff.argmax())
            problems.append(
                f"{name!r}: {bad} of {close.size} elements out of tolerance, largest "
                f"difference {largest:.4g} at {_index(at, want.shape)} (got "
                f"{a.flat[at]:.6g}, expected {e.flat[at]:.6g})"
            )
            if culprit is None or culprit[0] < largest:
                culprit = (largest, name, bad, int(close.size))
    if problems:
        assert culprit is not None
        _, culprit_name, culprit_bad, culprit_size = culprit
        return Comparison(
            False, worst, "; ".join(problems), culprit_name, culprit_bad, culprit_size
        )
    return Comparison(True, worst, f"{len(expected)} tensor(s) within atol={atol:g}, rtol={rtol:g}")


def _input_tolerance(inputs: Mapping[str, Array]) -> tuple[float, float]:
    if inputs and all(np.asarray(v).dtype.kind in "iu" for v in inputs.values()):
        return 1.0, 0.0
    return INPUT_TOLERANCE


def process_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def self_test(
    load: TrialLoader,
    reference_npz_path: Path,
    *,
    atol: float,
    rtol: float,
    latency_budget_s: float,
    memory_budget_bytes: int,
    runs: int = 5,
    rss: Callable[[], int] = process_rss,
    monotonic: Callable[[], float] = time.perf_counter,
) -> SelfTestResult:
    """Test the model `load()` returns against its reference pair; see `SelfTestResult`.

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
        model = load()
    except Exception as exc:  # ORT raises its own untyped errors for a bad model
        return SelfTestResult(False, "load-failed", detail=f"{type(exc).__name__}: {exc}")
    inputs: Mapping[str, Array] = pair.inputs
    if pair.frame is not None:
        in_atol, in_rtol = _input_tolerance(pair.inputs)
        try:
            inputs = model.prepare(pair.frame)
        except Exception as exc:  # a spec that does not fit the model, a bad frame
            return SelfTestResult(
                False,
                "preprocess-mismatch",
                detail=f"cannot preprocess the reference frame: {type(exc).__name__}: {exc}",
            )
        check = compare_tensors(pair.inputs, inputs, in_atol, in_rtol)
        if not check.ok:
            return SelfTestResult(
                False,
                "preprocess-mismatch",
                max_abs_err=check.max_abs_err,
                detail="the node's preprocessing of the reference frame differs from the "
                f"reference input: {check.message}",
                tensor=None if check.tensor is None else f"{_INPUT}{check.tensor}",
                mismatched=check.mismatched,
                elements=check.elements,
                atol=in_atol,
                rtol=in_rtol,
            )
    try:
        actual = model.run_inputs(inputs)
        timings: list[float] = []
        for _ in range(max(1, runs)):
            start = monotonic()
            model.run_inputs(inputs)
            timings.append(monotonic() - start)
    except Exception as exc:
        return SelfTestResult(False, "run-failed", detail=f"{type(exc).__name__}: {exc}")
    rss_delta = max(0, rss() - before)
    latency = statistics.median(timings)
    limit = int(MEMORY_HEADROOM * memory_budget_bytes)
    comparison = compare_tensors(pair.outputs, actual, atol, rtol)
    measured: dict[str, Any] = {
        "max_abs_err": comparison.max_abs_err,
        "latency_s": latency,
        "rss_delta_bytes": rss_delta,
        "latency_budget_s": latency_budget_s,
        "memory_limit_bytes": limit,
    }
    if not comparison.ok:
        return SelfTestResult(
            False,
            "output-mismatch",
            detail=comparison.message,
            tensor=None if comparison.tensor is None else f"{_OUTPUT}{comparison.tensor}",
            mismatched=comparison.mismatched,
            elements=comparison.elements,
            atol=atol,
            rtol=rtol,
            **measured,
        )
    if pair.frame is not None:
        height, width = pair.frame.shape[:2]
        try:
            model.decode(actual, height, width)
        except Exception as exc:  # the decoder's BundleError, or a bug it has
            return SelfTestResult(
                False,
                "decode-failed",
                detail=f"the outputs do not decode: {type(exc).__name__}: {exc}",
                **measured,
            )
    if latency > latency_budget_s:
        return SelfTestResult(
            False,
            "latency",
            detail=f"median {latency:.4g}s over the {latency_budget_s:g}s budget",
            **measured,
        )
    if rss_delta > limit:
        return SelfTestResult(
            False,
            "memory",
            detail=f"RSS grew {rss_delta} bytes, over {MEMORY_HEADROOM:.0%} of the "
            f"{memory_budget_bytes} byte budget",
            **measured,
        )
    return SelfTestResult(True, None, detail=comparison.message, atol=atol, rtol=rtol, **measured)
