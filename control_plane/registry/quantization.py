"""FP32 → INT8 with ONNX Runtime's own quantizer, every setting pinned (`model quantize`).

What it is for: calling ``onnxruntime.quantization.quantize_static`` (or ``quantize_dynamic``)
with every argument written out — QDQ format, QInt8 activations and weights, MinMax
calibration, per-channel only when asked — because the library's defaults changed between
releases (older ones made QOperator/QUInt8 models; ADR 0046). Calibration batches are the
samples of a :class:`~control_plane.registry.model_data.SampleSet`, read through the
node's own preprocessing; weights an exporter wrote as ``Constant`` nodes are made
initializers first (ORT quantizes no other weight), and a model older than opset 13 is
converted to it for ``--per-channel``. The result is checked before it is
kept: ``onnx.checker``, loaded and run by ONNX Runtime, compared with the FP32 model on the
calibration samples (:func:`~control_plane.registry.model_compare.compare_models`); only
then is it moved into place (temp file in the same folder, fsync, ``os.replace``). A
refused run writes nothing.
Beside it: the per-layer SQNR (``qdq_loss_debug``'s matching, judged per sample) and
``--auto-exclude``, a bounded search for the nodes to keep in float.

What it is not for: writing a quantizer, or deciding whether the result may be released.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from control_plane.errors import InvalidInputError, InvalidModelError
from control_plane.fsutil import fsync_dir
from control_plane.registry.model_compare import compare_models, number, percentile, sqnr_db
from control_plane.registry.model_data import Sample, SampleSet
from control_plane.registry.onnx_inspect import inspect_model

__all__ = [
    "MAX_LAYERS_SHOWN",
    "QUANTIZED_OPS",
    "QuantizeOptions",
    "layer_errors",
    "opset_for_per_channel",
    "quantize_model",
    "weights_as_initializers",
]

MAX_LAYERS_SHOWN: Final = 20
"""The report lists this many tensors, worst first."""
AUTO_MAX_TRIALS: Final = 16
"""Nodes tried per round of `--auto-exclude` (each trial quantizes and compares once)."""
AUTO_MAX_ROUNDS: Final = 8
"""Nodes `--auto-exclude` keeps in float at most, beyond --exclude."""

Method = Literal["static", "dynamic"]
QUANTIZED_OPS: Final = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "ConvInteger",
        "MatMulInteger",
    }
)
"""Ops that only a quantized model holds: a model with one is not quantized again."""


Calibration = Literal["minmax", "percentile", "entropy"]
CALIBRATION_NAMES: Final[dict[str, str]] = {
    "minmax": "MinMax",
    "percentile": "Percentile",
    "entropy": "Entropy",
}
"""Each calibration method and ORT's ``CalibrationMethod`` member of that name."""

Activations = Literal["int8", "int16"]
ACTIVATION_TYPES: Final[dict[str, str]] = {"int8": "QInt8", "int16": "QInt16"}
"""Each activation type and ORT's ``QuantType`` member of that name (ADR 0046: int8 is the
default; int16 is for heavy-tailed activations and needs the com.microsoft Q/DQ ops)."""


@dataclass(frozen=True, slots=True)
class QuantizeOptions:
    method: Method = "static"
    per_channel: bool = False
    exclude: tuple[str, ...] = ()
    auto_target: float | None = None
    """With a target, `--auto-exclude`: nodes are kept in float until agreement reaches it."""
    calibration: Calibration = "minmax"
    """Static only: how activation ranges are read from the calibration set (ADR 0046 pins
    MinMax; ``percentile`` clips the rare extremes a heavy-tailed activation has)."""
    activations: Activations = "int8"
    """Static only: int16 keeps a heavy-tailed activation's small values distinct, at the
    cost of com.microsoft Q/DQ nodes (ONNX Runtime only) and a slower model."""


def settings_of(options: QuantizeOptions) -> dict[str, Any]:
    """What is passed to ONNX Runtime, as the report shows it."""
    settings: dict[str, Any] = {
        "method": options.method,
        "weight_type": "QInt8",
        "per_channel": options.per_channel,
        "reduce_range": False,
        "nodes_excluded": list(options.exclude),
    }
    if options.method == "static":
        settings |= {
            "format": "QDQ",
            "activation_type": ACTIVATION_TYPES[options.activations],
            "calibration": CALIBRATION_NAMES[options.calibration],
        }
    else:
        settings |= {"format": "QOperator (dynamic: activations quantized at run time)"}
    return settings


def _reader(samples: Iterable[Sample]) -> Any:
    """ONNX Runtime's ``CalibrationDataReader`` over the samples (lazily)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._samples = iter(samples)

        def get_next(self) -> dict[str, Any] | None:
            sample = next(self._samples, None)
            return None if sample is None else sample.inputs

    return Reader()


def typed_contrib_dequantize(qdq: Path, target: Path) -> Path:
    """``qdq`` with a value_info for each com.microsoft ``DequantizeLinear`` output (the
    16-bit activations' Q/DQ): onnx's shape inference does not type contrib ops, and
    ``qdq_loss_debug`` only collects tensors it knows to be float, so without these every
    int16 layer would silently drop out of the SQNR table. ``qdq`` itself if it has none."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(qdq))
    scales = {t.name: t.data_type for t in model.graph.initializer}
    typed = {vi.name for vi in model.graph.value_info} | {o.name for o in model.graph.output}
    added = [
        helper.make_tensor_value_info(
            node.output[0], scales.get(node.input[1], TensorProto.FLOAT), None
        )
        for node in model.graph.node
        if node.op_type == "DequantizeLinear"
        and node.domain == "com.microsoft"
        and node.output[0] not in typed
    ]
    if not added:
        return qdq
    model.graph.value_info.extend(added)
    onnx.save(model, str(target))
    return target


def layer_errors(
    fp32: Path, qdq: Path, samples: SampleSet, *, limit: int | None = MAX_LAYERS_SHOWN
) -> list[dict[str, Any]]:
    """Per tensor of the FP32 graph that the QDQ model quantizes: the SQNR of its
    dequantized value against the float one, per sample (``qdq_loss_debug``'s matching,
    judged at the 5th percentile here rather than pooled), worst first.

    Each tensor's error is what quantization left there, upstream layers included, so the
    first rows are where the damage shows, not always where it starts; and a tensor that
    joins large and small values (boxes and scores) can look fine while its small part is
    ruined — `model compare`'s decoded figures are the judge."""
    import onnx
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    producers = {out: node for node in onnx.load(str(fp32)).graph.node for out in node.output}
    per_tensor: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="edgefleet-layers-") as tmp:
        float_aug, qdq_aug = f"{tmp}/float.onnx", f"{tmp}/qdq.onnx"
        modify_model_output_intermediate_tensors(str(fp32), float_aug)
        modify_model_output_intermediate_tensors(
            str(typed_contrib_dequantize(qdq, Path(tmp) / "qdq-typed.onnx")), qdq_aug
        )
        # One sample at a time: every intermediate tensor of both models is held for the
        # sample being matched only (all of them at once, PP-OCRv4 det's 16 samples at
        # 480x640 took 24 GB and were killed).
        for sample in samples:
            matched = create_activation_matching(
                collect_activations(qdq_aug, _reader([sample])),
                collect_activations(float_aug, _reader([sample])),
            )
            for tensor, values in matched.items():
                if "post_qdq" not in values or "float" not in values:
                    continue
                per_tensor.setdefault(tensor, []).extend(
                    sqnr_db(ref.astype("float64").ravel(), (q.astype("float64") - ref).ravel())
                    for q, ref in zip(values["post_qdq"], values["float"], strict=True)
                )
            del matched
    rows: list[dict[str, Any]] = []
    for tensor, sqnrs in per_tensor.items():
        node = producers.get(tensor)
        rows.append(
            {
                "tensor": tensor,
                "node": "(input)" if node is None else node.name,
                "op": "-" if node is None else node.op_type,
                "p5": percentile(sqnrs, 5),
                "p50": percentile(sqnrs, 50),
            }
        )
    rows.sort(key=lambda row: row["p5"])
    return [
        {
            "tensor": row["tensor"],
            "node": row["node"],
            "op": row["op"],
            "sqnr_db_p5": number(row["p5"], 2),
            "sqnr_db_p50": number(row["p50"], 2),
        }
        for row in rows[:limit]
    ]


class _DropPreprocessAdvice(logging.Filter):
    """ORT logs "Please consider to run pre-processing" on the root logger at every call;
    the graph is quantized as the operator gave it (node names stay those of --exclude)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()


@contextmanager
def _quiet_advice() -> Iterator[None]:
    root = logging.getLogger()
    dropped = _DropPreprocessAdvice()
    root.addFilter(dropped)
    try:
        # The percentile and entropy calibrators print their progress: stdout is the
        # report's (-o json), so that goes to stderr.
        with redirect_stdout(sys.stderr):
            yield
    finally:
        root.removeFilter(dropped)


def weights_as_initializers(source: Path, target: Path) -> tuple[Path, int]:
    """``source`` with its ``Constant`` nodes' tensors turned into initializers, written to
    ``target``: the model ONNX Runtime's quantizer is given, and how many were lifted.

    ORT quantizes a weight only when it is an initializer; exporters that write every weight
    as a ``Constant`` node (paddle2onnx: PP-OCR's det and cls hold no initializer at all)
    would otherwise get float weights wrapped in calibrated Q/DQ pairs — a model larger and
    slower than the FP32 one — and unquantized biases. The values and every other node (and
    so every name --exclude may give) are unchanged; ``source`` itself is returned when
    there is nothing to lift, or for IR < 4, whose initializers must also be graph inputs."""
    import onnx

    model = onnx.load(str(source))
    graph = model.graph
    lifted = {
        i
        for i, node in enumerate(graph.node)
        if node.op_type == "Constant"
        and node.domain in ("", "ai.onnx")
        and len(node.attribute) == 1
        and node.attribute[0].name == "value"
        and len(node.output) == 1
    }
    if not lifted or model.ir_version < 4:
        return source, 0
    kept = []
    for i, node in enumerate(graph.node):
        if i not in lifted:
            kept.append(node)
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
    del graph.node[:]
    graph.node.extend(kept)
    onnx.save(model, str(target))
    return target, len(lifted)


PER_CHANNEL_OPSET: Final = 13
"""The opset from which QuantizeLinear/DequantizeLinear take ``axis``: per-channel needs it."""


def opset_for_per_channel(source: Path, target: Path) -> tuple[Path, int | None]:
    """``source`` converted to opset :data:`PER_CHANNEL_OPSET` (``onnx.version_converter``)
    into ``target`` when its opset is older, and the opset it had; else ``(source, None)``.

    ORT's quantizer writes per-channel DequantizeLinear nodes with an ``axis`` whatever the
    model's opset, and onnx.checker refuses them below 13 (PP-OCR's cls is opset 11, its
    det 12). InvalidModelError when the converter cannot convert the model."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(source))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= PER_CHANNEL_OPSET:
        return source, None
    try:
        converted = version_converter.convert_version(model, PER_CHANNEL_OPSET)
        onnx.checker.check_model(converted)
    except Exception as exc:  # the converter raises what its adapters raise
        raise InvalidModelError(
            f"--per-channel needs opset {PER_CHANNEL_OPSET} (QuantizeLinear's axis); {source} "
            f"is opset {opset} and onnx's version converter cannot convert it: "
            f"{' '.join(str(exc).split())}; quantize per tensor, or convert the model",
            path=str(source),
        ) from exc
    onnx.save(converted, str(target))
    return target, opset


def _quantize(source: Path, staged: Path, samples: SampleSet, options: QuantizeOptions) -> None:
    """One run of ORT's quantizer into ``staged``, checked by ``onnx.checker``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    try:
        with _quiet_advice():
            if options.method == "static":
                quantize_static(
                    model_input=str(source),
                    model_output=str(staged),
                    calibration_data_reader=_reader(samples),
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=None,
                    per_channel=options.per_channel,
                    reduce_range=False,
                    activation_type=getattr(QuantType, ACTIVATION_TYPES[options.activations]),
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=None,
                    nodes_to_exclude=list(options.exclude),
                    use_external_data_format=False,
                    calibrate_method=getattr(
                        CalibrationMethod, CALIBRATION_NAMES[options.calibration]
                    ),
                    extra_options={
                        "ActivationSymmetric": False,
                        "WeightSymmetric": True,
                        # 16-bit Q/DQ exist in the ONNX domain only from opset 21: below it
                        # ORT writes its own com.microsoft QuantizeLinear/DequantizeLinear.
                        "UseQDQContribOps": options.activations == "int16",
                    },
                )
            else:
                quantize_dynamic(
                    model_input=str(source),
                    model_output=str(staged),
                    op_types_to_quantize=None,
                    per_channel=options.per_channel,
                    reduce_range=False,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=None,
                    nodes_to_exclude=list(options.exclude),
                    use_external_data_format=False,
                    extra_options={"WeightSymmetric": True},
                )
    except InvalidInputError:
        raise
    except Exception as exc:  # the quantizer raises what its internals raise
        raise InvalidModelError(
            f"ONNX Runtime's quantizer failed on {source}: {' '.join(str(exc).split())}",
            path=str(source),
        ) from exc
    try:
        onnx.checker.check_model(str(staged), full_check=True)
    except Exception as exc:
        raise InvalidModelError(
            f"the quantized model fails onnx.checker: {' '.join(str(exc).split())}"
        ) from exc


def agreement_score(report: dict[str, Any]) -> float:
    """The weakest figure of a comparison: every output's 5th-percentile cosine, and the
    decoded top-1 agreement or box recall when there is a decoder."""
    figures = [float(o["cosine_p5"]) for o in report["outputs"]]
    decoded = report.get("decoded") or {}
    figures += [float(decoded[k]) for k in ("top1_ratio", "recall") if decoded.get(k) is not None]
    return min(figures, default=1.0)


def _auto_exclude(
    source: Path, staged: Path, samples: SampleSet, options: QuantizeOptions, tmp: Path
) -> tuple[QuantizeOptions, dict[str, Any]]:
    """Keep nodes in float, one per round, until the agreement reaches the target.

    Each round tries, one at a time, the quantized nodes whose tensors have the lowest
    per-sample SQNR (at most AUTO_MAX_TRIALS of them) and keeps the one whose exclusion
    raises the agreement most; a round that raises nothing ends the search. Tried by
    measurement rather than taken from the ranking: a concatenated head's scores are ruined
    while its tensor's SQNR stays high (ADR 0046). ``staged`` ends as the chosen model."""
    target = options.auto_target
    assert target is not None
    samples = samples.hold()  # each trial passes over them three times
    score = agreement_score(compare_models(source, staged, samples).to_report())
    search: dict[str, Any] = {
        "target": target,
        "score_before": round(score, 6),
        "kept_in_float": [],
        "rounds": [],
    }
    trial = tmp / "trial.onnx"
    for _ in range(AUTO_MAX_ROUNDS):
        if score >= target:
            break
        tried = set(options.exclude)
        candidates = [
            row["node"]
            for row in layer_errors(source, staged, samples, limit=None)
            if row["node"] not in tried and row["node"] != "(input)"
        ]
        candidates = list(dict.fromkeys(candidates))[:AUTO_MAX_TRIALS]
        best: tuple[str, float] | None = None
        for node in candidates:
            attempt = replace(options, exclude=(*options.exclude, node))
            _quantize(source, trial, samples, attempt)
            value = agreement_score(compare_models(source, trial, samples).to_report())
            if best is None or value > best[1]:
                best = (node, value)
        if best is None or best[1] <= score:
            break
        options = replace(options, exclude=(*options.exclude, best[0]))
        score = best[1]
        search["kept_in_float"].append(best[0])
        search["rounds"].append({"kept_in_float": best[0], "tried": len(candidates),
                                 "score": round(score, 6)})  # fmt: skip
        _quantize(source, staged, samples, options)
    search["score"] = round(score, 6)
    search["reached"] = score >= target
    return options, search


def quantize_model(
    source: Path, output: Path, samples: SampleSet, options: QuantizeOptions
) -> dict[str, Any]:
    """Quantize ``source`` into ``output`` and report what was done and how far the result
    agrees with ``source`` on ``samples``. InvalidInputError / InvalidModelError on a model,
    an option or a result that cannot be used; ``output`` is then left untouched."""
    import onnx
    import onnxruntime as ort

    info = inspect_model(source)
    if output.resolve() == source.resolve():
        raise InvalidInputError("--out must name a new file, not the FP32 model", field="output")
    if options.calibration not in CALIBRATION_NAMES:
        raise InvalidInputError(
            f"the calibration method must be one of {', '.join(CALIBRATION_NAMES)}, "
            f"got {options.calibration!r}",
            field="calibration_method",
        )
    if options.calibration != "minmax" and options.method != "static":
        raise InvalidInputError(
            "a calibration method other than minmax needs --method static: dynamic "
            "quantization reads activation ranges at run time",
            field="calibration_method",
        )
    if options.activations not in ACTIVATION_TYPES:
        raise InvalidInputError(
            f"--activations must be one of {', '.join(ACTIVATION_TYPES)}, "
            f"got {options.activations!r}",
            field="activations",
        )
    if options.activations != "int8" and options.method != "static":
        raise InvalidInputError(
            "--activations int16 needs --method static: dynamic quantization quantizes "
            "activations at run time, to 8 bits",
            field="activations",
        )
    if options.auto_target is not None:
        if options.method != "static":
            raise InvalidInputError(
                "--auto-exclude needs --method static: it keeps QDQ nodes in float",
                field="auto_exclude",
            )
        if not 0 < options.auto_target <= 1:
            raise InvalidInputError(
                f"--target is an agreement in (0, 1], got {options.auto_target}", field="target"
            )
    if not output.parent.is_dir():
        raise InvalidInputError(
            f"the folder of {output} does not exist", field="output", path=str(output)
        )
    graph = onnx.load(str(source)).graph
    ops = {node.op_type for node in graph.node}
    if ops & QUANTIZED_OPS:
        raise InvalidModelError(
            f"{source} is quantized already (it holds {', '.join(sorted(ops & QUANTIZED_OPS))})",
            path=str(source),
        )
    names = [node.name for node in graph.node]
    unknown = [n for n in options.exclude if n not in names]
    if unknown:
        shown = ", ".join(n for n in names[:20] if n)
        raise InvalidInputError(
            f"--exclude {unknown[0]!r}: the model has no node of that name (its nodes: {shown}"
            + (", …" if len(names) > 20 else "")
            + ")",
            field="exclude",
        )
    with tempfile.TemporaryDirectory(prefix=".edgefleet-quantize-", dir=output.parent) as tmp:
        staged = Path(tmp) / output.name
        # The same float model, its weights where the quantizer looks for them.
        prepared, lifted = weights_as_initializers(source, Path(tmp) / "fp32-initializers.onnx")
        converted_from = None
        if options.per_channel:
            prepared, converted_from = opset_for_per_channel(prepared, Path(tmp) / "fp32-13.onnx")
        _quantize(prepared, staged, samples, options)
        search: dict[str, Any] | None = None
        if options.auto_target is not None:
            options, search = _auto_exclude(prepared, staged, samples, options, Path(tmp))
        comparison = compare_models(prepared, staged, samples, a_name="FP32", b_name="INT8")
        layers = layer_errors(prepared, staged, samples) if options.method == "static" else None
        quantized_model = onnx.load(str(staged))
        quantized, quantized_opsets = quantized_model.graph, quantized_model.opset_import
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        length = staged.stat().st_size
        staged.replace(output)
        fsync_dir(output.parent)
    counts: dict[str, int] = {}
    for node in quantized.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return {
        "model": str(source),
        "output": str(output),
        "onnxruntime": ort.__version__,
        "settings": settings_of(options),
        "samples": len(samples),
        "data": samples.kind,
        "coverage": None if samples.coverage is None else samples.coverage.to_report(),
        "size_bytes": {"fp32": info.length, "int8": length},
        "constants_lifted": lifted,
        "opset_converted_from": converted_from,
        # The written model's: ORT raises it to 21 itself for int16 activations.
        "opset": next((o.version for o in quantized_opsets if o.domain in ("", "ai.onnx")), None),
        "quantize_nodes": counts.get("QuantizeLinear", 0) + counts.get("DynamicQuantizeLinear", 0),
        "dequantize_nodes": counts.get("DequantizeLinear", 0),
        # Judged on the calibration samples themselves: an optimistic figure; run
        # `model compare` on held-out frames before a release.
        "agreement": comparison.to_report(),
        # Static only: a dynamic model has no QuantizeLinear/DequantizeLinear pairs to match.
        "layers": layers,
        "auto_exclude": search,
    }
