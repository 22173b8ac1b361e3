"""The release gate of `model push --baseline`: a comparison judged against a threshold.

What it is for: turning `model compare`'s report (the same
:func:`~control_plane.registry.model_compare.compare_models`, on the operator's machine)
into the compact, signed `custom.release_check` (ADR 0048): per output its errors, the
decoded agreement, the one figure the version is judged on and the threshold, the verdict,
whether the operator forced it through, and what it was measured on (the baseline's
sha256, the data set's size and coverage, the ONNX Runtime version, the CPU's int8
features). The figure is the output kind's: top-1 agreement for a classifier, IoU-matched
box recall for a detector, every output's 5th-percentile cosine (the weakest) for raw
outputs. The report is built through the parser the server runs
(:func:`~control_plane.trust.custom.parse_release_check`), so a push never signs what the
server would refuse.

What it is not for: running the models (``model_compare``), or deciding a rollout
(`require_release_check` in the gates file reads the stored report).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from control_plane.errors import InvalidInputError
from control_plane.registry.model_compare import COSINE_WARNING, RECALL_WARNING, TOP1_WARNING
from control_plane.trust.custom import RELEASE_KINDS, ReleaseCheck, parse_release_check

__all__ = [
    "DEFAULT_THRESHOLDS",
    "build_release_check",
    "check_text",
    "refusal",
    "run_release_check",
]

DEFAULT_THRESHOLDS: Final[Mapping[str, float]] = {
    "classification": TOP1_WARNING,
    "detection": RECALL_WARNING,
    "raw": COSINE_WARNING,
}
"""The threshold per output kind when the operator sets none (`--min-agreement`): the
figures below which `model compare` already warns."""


def _decimal(value: Any) -> str:
    """A report figure (a float, or "inf"/"-inf" from `model_compare.number`) as the
    decimal string canonical JSON can sign."""
    if isinstance(value, str):
        return value
    return repr(round(float(value), 6))


def build_release_check(
    comparison: Mapping[str, Any],
    *,
    baseline_sha256: str,
    data: str,
    coverage: Mapping[str, Any] | None,
    onnxruntime: str,
    threshold: float | None = None,
    forced: bool = False,
) -> ReleaseCheck:
    """Judge ``comparison`` (`Comparison.to_report()`, the baseline as A) against
    ``threshold`` (the kind's default when None). ``forced`` is recorded only on a failed
    check: a passed one needs no force."""
    decoded: Mapping[str, Any] = comparison.get("decoded") or {}
    kind = decoded["kind"] if decoded and decoded.get("kind") in RELEASE_KINDS else "raw"
    judged_on = RELEASE_KINDS[kind]
    limit = DEFAULT_THRESHOLDS[kind] if threshold is None else threshold
    outputs = [
        {
            "output": o["output"],
            **{
                k: _decimal(o[k])
                for k in ("max_abs", "mean_abs", "cosine_min", "cosine_p5", "sqnr_db_p5")
            },
        }
        for o in comparison["outputs"]
    ]
    if kind == "raw":
        value = min(float(o["cosine_p5"]) for o in comparison["outputs"])
    else:
        value = float(decoded[judged_on])
    verdict = "passed" if value >= limit else "failed"
    cpu = comparison.get("latency", {}).get("cpu", {})
    report: dict[str, Any] = {
        "verdict": verdict,
        "forced": forced and verdict == "failed",
        "kind": kind,
        "judged_on": judged_on,
        "value": _decimal(value),
        "threshold": _decimal(limit),
        "baseline_sha256": baseline_sha256,
        "samples": int(comparison["samples"]),
        "data": data,
        "outputs": outputs,
        "onnxruntime": onnxruntime,
        "cpu": {
            "machine": str(cpu.get("machine") or "unknown"),
            "int8_features": list(cpu.get("int8_features", [])),
        },
    }
    if kind != "raw":
        report["decoded"] = {
            k: _decimal(v) for k, v in decoded.items() if k not in {"kind", "frames"}
        }
    if coverage is not None:
        report["coverage"] = {
            "images": coverage["images"],
            "classes": coverage.get("classes"),
            "brightness_p5_p50_p95": [_decimal(v) for v in coverage["brightness_p5_p50_p95"]],
            "contrast_p5_p50_p95": [_decimal(v) for v in coverage["contrast_p5_p50_p95"]],
            "warnings": list(coverage.get("warnings", []))[:16],
        }
    return parse_release_check(report)


def check_text(check: ReleaseCheck) -> str:
    """One line: `passed: top1_ratio 1.0 >= 0.99 on 12 images (baseline 3f2a…)`."""
    sign = ">=" if check.verdict == "passed" else "<"
    forced = " (forced through with --force)" if check.forced else ""
    return (
        f"{check.verdict}{forced}: {check.judged_on} {check.value} {sign} {check.threshold} "
        f"on {check.samples} {check.data} (baseline {check.baseline_sha256[:12]}, "
        f"onnxruntime {check.onnxruntime}, {check.machine}, int8 features: "
        f"{', '.join(check.int8_features) or 'none reported'})"
    )


def refusal(check: ReleaseCheck, model: str, baseline: str) -> str:
    """Why a push is refused below its threshold, and the way through."""
    return (
        f"release check failed: {model} against the baseline {baseline}: {check.judged_on} "
        f"{check.value} is below the threshold {check.threshold} on {check.samples} "
        f"{check.data}; nothing was uploaded. Fix the model (e.g. `model quantize "
        "--auto-exclude`), set another threshold with --min-agreement, or push it anyway "
        "with --force (audited, and recorded in the signed report)"
    )


def run_release_check(
    model: Path,
    baseline: Path,
    data: Path,
    runtime: Any,
    *,
    threshold: float | None = None,
    forced: bool = False,
    reference: Path | None = None,
) -> ReleaseCheck:
    """`model compare BASELINE MODEL --data DATA [--runtime]` judged (see the module);
    with ``reference``, the baseline must reproduce it first (`float_baseline`: a float
    model that is already wrong, or wrongly normalised, proves nothing about its INT8).
    InvalidInputError for models that are not two versions of one, a threshold outside
    [0, 1] or a data folder that does not fit (every file is read before anything runs)."""
    import onnxruntime as ort

    from control_plane.registry.model_compare import check_same_signature, compare_models
    from control_plane.registry.model_data import open_samples
    from control_plane.registry.onnx_inspect import inspect_model

    if threshold is not None and not 0 <= threshold <= 1:
        raise InvalidInputError(
            f"--min-agreement is an agreement in [0, 1], got {threshold}", field="min_agreement"
        )
    info, base = inspect_model(model), inspect_model(baseline)
    if base.sha256 == info.sha256:
        raise InvalidInputError(
            f"--baseline {baseline} is the model pushed itself: give the float model it was "
            "made from",
            field="baseline",
        )
    check_same_signature(base, info)
    if reference is not None:
        from control_plane.errors import InvalidModelError
        from control_plane.registry.float_baseline import check_float_baseline, mismatch_message

        found = check_float_baseline(baseline, base, reference, runtime)
        if not found["matches"]:
            raise InvalidModelError(
                f"--baseline {baseline}: {mismatch_message(found)}", path=str(reference)
            )
    samples = open_samples(data, base, runtime)
    comparison = compare_models(baseline, model, samples, a_name="baseline", b_name=model.name)
    return build_release_check(
        comparison.to_report(),
        baseline_sha256=base.sha256,
        data=samples.kind,
        coverage=None if samples.coverage is None else samples.coverage.to_report(),
        onnxruntime=ort.__version__,
        threshold=threshold,
        forced=forced,
    )
