"""How far model B's outputs stray from model A's on the same samples (`model compare`).

What it is for: an operator's check that an optimised model (INT8, pruned, re-exported)
still answers as its float original does, before it is pushed. Both models run in ONNX
Runtime on every sample of a :class:`~control_plane.registry.model_data.SampleSet`; each
output tensor is compared per sample — largest and mean absolute error, cosine similarity
and SQNR (signal-to-quantization-noise ratio, ``10·log10(Σa² / Σ(b-a)²)``) — and judged at
the 5th percentile over samples, not pooled (a pooled figure lets a few ruined frames hide
among many good ones). With a runtime spec, the decoded outputs are compared too, through
the version's own decoder and the shadow stage's agreement rules
(:mod:`protos.bundle.agreement`): top-1 agreement for classifiers, IoU-matched recall and
precision for detectors. A is the reference.

Each run is timed too (one thread each, A and B alternating sample by sample, after one
untimed warm-up run each), and the report names the CPU's int8 dot-product features: INT8
without VNNI (x86) or the dot-product extension (ARM) can be slower than FP32.

What it is not for: deciding whether B may be released (a release gate reads this report),
or a benchmark (a few samples make a rough P99; `bench/` measures properly).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from control_plane.errors import InvalidInputError, InvalidModelError
from control_plane.registry.model_data import SampleSet
from control_plane.registry.onnx_inspect import ModelInfo
from protos.bundle.agreement import AgreementTally, compare_decoded
from protos.bundle.decoders import build_decoder
from protos.bundle.spec import BundleError

__all__ = [
    "COSINE_WARNING",
    "Comparison",
    "OutputErrors",
    "compare_models",
    "number",
    "open_session",
    "percentile",
    "sqnr_db",
]

COSINE_WARNING: Final = 0.99
"""A 5th-percentile cosine similarity below this is flagged in the report."""
TOP1_WARNING: Final = 0.99
RECALL_WARNING: Final = 0.9


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile as one of the values (no interpolation: an infinite SQNR —
    identical outputs — stays infinite, and the figure is a sample that was seen)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="lower"))


def sqnr_db(reference: npt.NDArray[np.float64], error: npt.NDArray[np.float64]) -> float:
    """``10·log10(Σref² / Σerror²)``: +inf without error, -inf for an all-zero reference."""
    signal, noise = float(np.dot(reference, reference)), float(np.dot(error, error))
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def number(value: float, places: int = 6) -> float | str:
    """JSON has no infinity: an infinite SQNR (no error at all) is written as "inf"."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(value, places)


@dataclass
class OutputErrors:
    """One output tensor's errors, sample by sample (constant memory per sample)."""

    name: str
    shape: list[int] = field(default_factory=list)
    samples: int = 0
    max_abs: float = 0.0
    abs_sum: float = 0.0
    values: int = 0
    cosines: list[float] = field(default_factory=list)
    sqnrs: list[float] = field(default_factory=list)

    def add(self, a: npt.NDArray[Any], b: npt.NDArray[Any]) -> None:
        if a.shape != b.shape:
            raise InvalidInputError(
                f"output {self.name!r}: B gave shape {list(b.shape)}, A {list(a.shape)}",
                field="data",
            )
        ref = a.astype(np.float64).ravel()
        diff = b.astype(np.float64).ravel() - ref
        self.shape = [int(d) for d in a.shape]
        self.samples += 1
        if ref.size:
            self.max_abs = max(self.max_abs, float(np.abs(diff).max()))
        self.abs_sum += float(np.abs(diff).sum())
        self.values += ref.size
        cand = ref + diff
        norms = float(np.linalg.norm(ref)) * float(np.linalg.norm(cand))
        if norms > 0:
            cosine = max(-1.0, min(1.0, float(np.dot(ref, cand)) / norms))
        else:
            cosine = 1.0 if not ref.any() and not cand.any() else 0.0
        self.cosines.append(cosine)
        self.sqnrs.append(sqnr_db(ref, diff))

    def to_report(self) -> dict[str, Any]:
        return {
            "output": self.name,
            "shape": self.shape,
            "samples": self.samples,
            "max_abs": number(self.max_abs),
            "mean_abs": number(self.abs_sum / self.values if self.values else 0.0),
            "cosine_min": number(min(self.cosines, default=1.0)),
            "cosine_p5": number(percentile(self.cosines, 5) if self.cosines else 1.0),
            "sqnr_db_p5": number(percentile(self.sqnrs, 5) if self.sqnrs else math.inf, 2),
            "sqnr_db_p50": number(percentile(self.sqnrs, 50) if self.sqnrs else math.inf, 2),
        }


INT8_FEATURES: Final = frozenset(
    {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm", "sve"}
)
"""CPU flags (``/proc/cpuinfo``) that decide how fast int8 kernels run."""


def cpu_features(cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine, and which of :data:`INT8_FEATURES` its CPU has (empty where the OS does
    not say: ``/proc/cpuinfo`` is Linux's)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")[:1_000_000]
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"}:
            flags |= set(value.split())
    return {"machine": platform.machine(), "int8_features": sorted(flags & INT8_FEATURES)}


def latency_report(nanoseconds: list[int]) -> dict[str, Any]:
    millis = [n / 1e6 for n in nanoseconds]
    return {
        "runs": len(millis),
        "p50_ms": round(percentile(millis, 50), 4) if millis else None,
        "p99_ms": round(percentile(millis, 99), 4) if millis else None,
    }


@dataclass(frozen=True)
class Comparison:
    samples: int
    outputs: list[OutputErrors]
    decoded: dict[str, Any] | None
    warnings: list[str]
    latency: dict[str, Any] = field(default_factory=dict)

    def to_report(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "outputs": [o.to_report() for o in self.outputs],
            "decoded": self.decoded,
            "latency": self.latency,
            "warnings": list(self.warnings),
        }


def open_session(path: Path, what: str) -> Any:
    """A CPU session with one thread (the same figures on every machine, as ORT allows)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's exception classes share no base below Exception
        raise InvalidModelError(
            f"ONNX Runtime cannot load {what} {path}: {' '.join(str(exc).split())}",
            path=str(path),
        ) from exc


def _run(
    session: Any,
    inputs: Mapping[str, Any],
    what: str,
    sample: str,
    timer: Callable[[], int],
    times: list[int] | None,
) -> dict[str, Any]:
    names = [o.name for o in session.get_outputs()]
    feed = dict(inputs)
    try:
        started = timer()
        values = session.run(names, feed)
        if times is not None:
            times.append(timer() - started)
    except Exception as exc:
        raise InvalidModelError(
            f"ONNX Runtime failed to run {what} on {sample}: {' '.join(str(exc).split())}"
        ) from exc
    return dict(zip(names, values, strict=True))


def check_same_signature(a: ModelInfo, b: ModelInfo) -> None:
    """Two versions of one model take the same inputs and give the same outputs."""
    for side in ("inputs", "outputs"):
        ours = [(t.name, t.dtype, t.shape) for t in getattr(a, side)]
        theirs = [(t.name, t.dtype, t.shape) for t in getattr(b, side)]
        if ours != theirs:
            raise InvalidInputError(
                f"B's {side} {_sig(theirs)} are not A's {_sig(ours)}: compare two versions of "
                "one model",
                field=side,
            )


def _sig(specs: list[tuple[str, str, tuple[Any, ...]]]) -> str:
    return ", ".join(f"{name} {dtype}{list(shape)}" for name, dtype, shape in specs)


def compare_models(
    a_path: Path,
    b_path: Path,
    samples: SampleSet,
    *,
    a_name: str = "A",
    b_name: str = "B",
    timer: Callable[[], int] = time.perf_counter_ns,
) -> Comparison:
    """Run both models on every sample and compare B's outputs with A's (see the module);
    ``timer`` (nanoseconds) times each run."""
    a = open_session(a_path, a_name)
    b = open_session(b_path, b_name)
    decoder = None
    if samples.runtime is not None and samples.runtime.output.decoder != "raw":
        decoder = build_decoder(samples.runtime)
    tally = AgreementTally()
    errors: dict[str, OutputErrors] = {}
    count = 0
    times_a: list[int] = []
    times_b: list[int] = []
    for sample in samples:
        if count == 0:  # warm-up: the first run allocates and plans
            _run(a, sample.inputs, a_name, sample.name, timer, None)
            _run(b, sample.inputs, b_name, sample.name, timer, None)
        out_a = _run(a, sample.inputs, a_name, sample.name, timer, times_a)
        out_b = _run(b, sample.inputs, b_name, sample.name, timer, times_b)
        count += 1
        for name, value in out_a.items():
            if name not in out_b:
                raise InvalidInputError(
                    f"{b_name} gives no output {name!r} (it gives {sorted(out_b)})",
                    field="outputs",
                )
            errors.setdefault(name, OutputErrors(name)).add(
                np.asarray(value), np.asarray(out_b[name])
            )
        if decoder is not None:
            try:
                tally.add(
                    compare_decoded(
                        decoder.decode(out_a, sample.geometry),
                        decoder.decode(out_b, sample.geometry),
                    )
                )
            except BundleError as exc:
                raise InvalidInputError(
                    f"the {samples.runtime.output.decoder if samples.runtime else ''} decoder "
                    f"cannot read the outputs on {sample.name}: {exc.message}",
                    field=f"runtime.{exc.field}",
                ) from exc
    decoded = None if decoder is None else _decoded(tally)
    latency = {
        "a": latency_report(times_a),
        "b": latency_report(times_b),
        "threads": 1,
        "cpu": cpu_features(),
    }
    return Comparison(count, list(errors.values()), decoded, _warnings(errors, decoded), latency)


def _decoded(tally: AgreementTally) -> dict[str, Any]:
    summary = tally.summary().to_report()
    keep = {
        "classification": ("top1_ratio", "topk_overlap"),
        "detection": ("recall", "precision", "mean_score_diff"),
    }.get(summary["kind"], ())
    return {
        "kind": summary["kind"],
        "frames": summary["frames"],
        **{k: summary[k] for k in keep},
    }


def _warnings(errors: Mapping[str, OutputErrors], decoded: dict[str, Any] | None) -> list[str]:
    found = []
    for output in errors.values():
        p5 = percentile(output.cosines, 5) if output.cosines else 1.0
        if p5 < COSINE_WARNING:
            found.append(
                f"output {output.name!r}: cosine similarity {p5:.4f} at the 5th percentile, "
                f"below {COSINE_WARNING}"
            )
    if decoded is not None:
        top1 = decoded.get("top1_ratio")
        if top1 is not None and top1 < TOP1_WARNING:
            found.append(f"top-1 agrees on {top1:.1%} of the samples, below {TOP1_WARNING:.0%}")
        recall = decoded.get("recall")
        if recall is not None and recall < RECALL_WARNING:
            found.append(f"B finds {recall:.1%} of A's boxes, below {RECALL_WARNING:.0%}")
    return found
