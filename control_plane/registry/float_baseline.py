"""Float baseline first: does ONNX Runtime's FP32 model answer as the reference says?

What it is for: before `model quantize` calibrates anything, the FP32 model is run in ONNX
Runtime on a reference pair (``--reference ref.npz``: ``input/<name>`` and
``output/<name>`` arrays, as `model push` writes ``reference.npz``, optionally the
``frame`` the input was made from) and its outputs compared with the reference's. With a
frame and a runtime spec, the frame also goes through the node's own preprocessing
(:class:`~protos.bundle.preprocess.Preprocessor`): when that tensor is not the reference's
input, the runtime spec normalises differently from whoever made the reference, and the
obvious alternatives (pixels in [0, 1], [0, 255], ImageNet mean/std, 0.5/0.5; RGB or BGR)
are tried, the one that reproduces the reference input named. A quantized model judged
against a float model that is already wrong measures nothing.

What it is not for: quantizing or comparing two models (``quantization``,
``model_compare``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from control_plane.errors import InvalidInputError
from control_plane.registry.model_compare import open_session
from control_plane.registry.onnx_inspect import ModelInfo, load_reference
from control_plane.trust.custom import check_runtime
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import BundleError, ChannelOrder, PreprocessConfig, RuntimeSpec

__all__ = ["NORMALISATIONS", "check_float_baseline"]

COSINE_MATCH: Final = 0.9999
"""An output whose cosine similarity with the reference's reaches this agrees with it."""
NORMALISATIONS: Final[dict[str, tuple[float, tuple[float, ...], tuple[float, ...]]]] = {
    "[0,1] (scale 1/255, mean 0, std 1)": (1 / 255, (0.0,), (1.0,)),
    "[0,255] (scale 1, mean 0, std 1)": (1.0, (0.0,), (1.0,)),
    "ImageNet (scale 1/255, mean 0.485/0.456/0.406, std 0.229/0.224/0.225)": (
        1 / 255,
        (0.485, 0.456, 0.406),
        (0.229, 0.224, 0.225),
    ),
    "[-1,1] (scale 1/255, mean 0.5, std 0.5)": (1 / 255, (0.5,), (0.5,)),
}


def _cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(x)) * float(np.linalg.norm(y))
    if norms == 0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float(np.dot(x, y)) / norms


def _close(a: npt.NDArray[Any], b: npt.NDArray[Any], atol: float) -> bool:
    return a.shape == b.shape and bool(np.allclose(a.astype(np.float64), b, atol=atol, rtol=0))


def check_float_baseline(
    model: Path, info: ModelInfo, reference: Path, runtime: RuntimeSpec | None
) -> dict[str, Any]:
    """The FP32 model's outputs on ``reference``'s inputs against its outputs, per output
    (max abs error, cosine), and with a frame and ``runtime`` whether the preprocessing
    reproduces its input (and if not, which alternative does). ``matches`` is False when
    either fails; the caller refuses then. InvalidInputError for a pair that does not fit
    the model."""
    pair = load_reference(reference)
    names = [t.name for t in info.inputs]
    if sorted(pair.inputs) != sorted(names) or not pair.outputs:
        raise InvalidInputError(
            f"reference {reference} holds inputs {sorted(pair.inputs)} and outputs "
            f"{sorted(pair.outputs)}; the model takes {names} (give input/<name> and "
            "output/<name> arrays)",
            field="reference",
            path=str(reference),
        )
    session = open_session(model, "the FP32 model")
    wanted = [o for o in pair.outputs if o in {t.name for t in info.outputs}]
    if len(wanted) != len(pair.outputs):
        raise InvalidInputError(
            f"reference {reference} holds outputs the model does not give: "
            f"{sorted(set(pair.outputs) - set(wanted))}",
            field="reference",
            path=str(reference),
        )
    try:
        got = dict(zip(wanted, session.run(wanted, dict(pair.inputs)), strict=True))
    except Exception as exc:  # ORT's exceptions share no base below Exception
        raise InvalidInputError(
            f"ONNX Runtime cannot run the FP32 model on reference {reference}: "
            f"{' '.join(str(exc).split())}",
            field="reference",
            path=str(reference),
        ) from exc
    outputs = []
    for name in wanted:
        expected, actual = pair.outputs[name], np.asarray(got[name])
        if expected.shape != actual.shape:
            raise InvalidInputError(
                f"reference output {name!r} is {list(expected.shape)}; the model gives "
                f"{list(actual.shape)}",
                field="reference",
                path=str(reference),
            )
        error = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        cosine = _cosine(expected, actual)
        outputs.append(
            {
                "output": name,
                "max_abs": round(float(error.max()) if error.size else 0.0, 6),
                "cosine": round(cosine, 6),
                "matches": cosine >= COSINE_MATCH,
            }
        )
    report: dict[str, Any] = {
        "reference": str(reference),
        "outputs": outputs,
        "outputs_match": all(o["matches"] for o in outputs),
        "preprocess": None,
    }
    if pair.frame is not None and runtime is not None:
        report["preprocess"] = _preprocess_check(pair.frame, pair.inputs[names[0]], info, runtime)
    report["matches"] = report["outputs_match"] and (
        report["preprocess"] is None or report["preprocess"]["matches"]
    )
    return report


def _preprocess_check(
    frame: npt.NDArray[Any],
    expected: npt.NDArray[Any],
    info: ModelInfo,
    runtime: RuntimeSpec,
) -> dict[str, Any]:
    """The frame through the runtime spec against the reference input; on a mismatch, the
    alternative normalisations and channel orders that reproduce it."""
    resolved, channels = check_runtime(
        runtime,
        [t.to_sig() for t in info.inputs],
        [t.to_sig() for t in info.outputs],
        where="runtime",
        metadata=info.metadata,
    )
    atol = 1e-3 * max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
    ours = Preprocessor(resolved, channels)(frame)
    if _close(ours, expected, atol):
        return {"matches": True}
    found = []
    orders: tuple[ChannelOrder, ...] = (
        ("RGB", "BGR") if channels == 3 else (resolved.channel_order,)
    )
    for label, (scale, mean, std) in NORMALISATIONS.items():
        for order in orders:
            try:
                config: PreprocessConfig = replace(
                    resolved, scale=scale, mean=mean, std=std, channel_order=order
                )
                theirs = Preprocessor(config, channels)(frame)
            except (BundleError, ValueError):  # e.g. a uint8 input takes raw pixels only
                continue
            if _close(theirs, expected, atol):
                found.append(f"{label}, {order}")
    current = (
        f"scale {resolved.scale:.6g}, mean {list(resolved.mean)}, std {list(resolved.std)}, "
        f"{resolved.channel_order}"
    )
    return {
        "matches": False,
        "runtime": current,
        "max_abs": round(float(np.abs(ours.astype(np.float64) - expected).max()), 6)
        if ours.shape == expected.shape
        else None,
        "reproduced_by": found,
    }


def mismatch_message(report: dict[str, Any]) -> str:
    """Why the float baseline is refused, in one line."""
    pre = report.get("preprocess")
    if pre is not None and not pre["matches"]:
        named = (
            f"the reference input is reproduced by {pre['reproduced_by'][0]}"
            if pre["reproduced_by"]
            else "none of [0,1], [0,255], ImageNet or [-1,1] in RGB or BGR reproduces it"
        )
        return (
            f"normalisation mismatch: the reference frame through the runtime spec "
            f"({pre['runtime']}) is not the reference input; {named}. Fix the runtime spec's "
            "preprocess before quantizing: calibrating on wrongly normalised inputs "
            "measures nothing"
        )
    bad = [o for o in report["outputs"] if not o["matches"]]
    worst = min(bad, key=lambda o: o["cosine"])
    return (
        f"the FP32 model in ONNX Runtime does not reproduce the reference outputs: "
        f"{worst['output']!r} has cosine {worst['cosine']} (max abs error {worst['max_abs']}), "
        f"below {COSINE_MATCH}; check the export (opset, dynamic shapes) before quantizing"
    )
