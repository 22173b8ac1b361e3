"""Quantization: FP32 vs INT8 PP-OCR det and cls, agreement and latency, in one run.

For each model case (PP-OCR's text-direction classifier and PP-OCRv4's text detector from
the ``rapidocr-onnxruntime`` wheel, located as ``bench.runtime_overhead`` does; without it,
that benchmark's stand-in CNN), in one process and one run:

1. writes two sets of generated images with text — camera-like scenes for det, text-line
   crops (half turned 180°, in class folders ``0``/``180``) for cls — at several lighting
   conditions: a calibration set and a held-out set from another seed;
2. quantizes the FP32 model through ``edgefleet model quantize``'s own code path
   (``open_samples`` with the runtime spec, read from a ``runtime.yaml`` by the CLI's
   loader, then ``quantize_model``): static INT8 (QDQ, MinMax), static with
   ``--auto-exclude --target T``, static ``--per-channel``, and dynamic;
3. compares each INT8 model with the FP32 one on the held-out set through ``model
   compare``'s code (``compare_models``): per output, the 5th-percentile cosine and SQNR;
   for cls the decoded top-1 agreement; det's probability map goes through the ``raw``
   decoder, for which compare reports the raw per-output figures only, so beside them this
   benchmark adds its own text-pixel IoU (the map thresholded at PP-OCR's 0.3) per sample;
4. times FP32 and every INT8 model with 1 and 2 intra-op threads (the agent's own session
   options), in blocks interleaved round by round (every model at every thread count in
   each round, in a rotating order) so that load on the machine hits all alike, and
   records the CPU's int8 features (avx2/avx512/VNNI): INT8 without VNNI can be slower.

Not a test: nothing is asserted unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.quantization [--cases cls,det] [--wheel PATH] [--det-size 320x448]
        [--calibration 32] [--held-out 32] [--variants static,perchannel,auto,dynamic]
        [--target 0.99]
        [--threads 1,2] [--rounds 7] [--runs 15] [--keep] [--json OUT] [--markdown OUT]
        [--check] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import yaml

from bench._report import Report, machine, parse_benchmark_args
from bench._util import BENCH_DIR, median, pct
from bench.runtime_overhead import (
    PPOCR_CLS,
    PPOCR_DET,
    build_mid_cnn,
    find_ppocr,
    parse_hw,
    ppocr_preprocess,
)
from control_plane.cli.runtime_file import load_runtime_file
from control_plane.errors import InvalidInputError, InvalidModelError
from control_plane.registry.model_compare import (
    COSINE_WARNING,
    TOP1_WARNING,
    check_same_signature,
    compare_models,
    cpu_features,
)
from control_plane.registry.model_data import MIN_CALIBRATION_SAMPLES, open_samples
from control_plane.registry.onnx_inspect import inspect_model
from control_plane.registry.quantization import QuantizeOptions, quantize_model
from edge_node.runtime import SessionConfig
from edge_node.runtime.session import session_options

SEED = 20261201
DB_THRESHOLD = 0.3
"""PP-OCR det's text-pixel threshold (rapidocr's ``thresh``): the map is read at this level."""
CLS_LABELS = ("0", "180")
"""PP-OCR cls's two classes (rapidocr's ``label_list``)."""
CONDITIONS: tuple[tuple[str, float, float], ...] = (
    ("night", 0.25, 0.0),
    ("dusk", 0.55, 0.0),
    ("day", 1.0, 0.0),
    ("glare", 0.8, 70.0),
)
"""Lighting per image, in turn: (name, gain, offset) applied to the rendered scene."""
VARIANTS = (
    "static",
    "perchannel",
    "auto",
    "dynamic",
    "percentile",
    "perchannel-percentile",
    "perchannel-int16",
)
WORDS = ("GATE", "EXIT", "BAY", "DOCK", "ZONE", "LANE", "PARK", "HALL", "WEST", "NORTH")


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    key: str
    name: str
    source: str
    path: Path
    runtime: dict[str, Any]
    """The runtime.yaml written for the CLI's loader: PP-OCR's preprocessing, its decoder."""
    stand_in: bool = False


def ppocr_runtime(key: str, size: tuple[int, int], *, stand_in: bool) -> dict[str, Any]:
    """PP-OCR's preprocessing as ``bench.runtime_overhead`` gives it, as a runtime.yaml."""
    p = ppocr_preprocess(size)
    preprocess = {
        "size": list(size),
        "mean": list(p.mean),
        "std": list(p.std),
        "channel_order": p.channel_order,
    }
    if key == "cls" and not stand_in:
        return {
            "preprocess": preprocess,
            "output": {"decoder": "classification", "top_k": 1, "score_threshold": 0.0},
            "labels": list(CLS_LABELS),
        }
    return {"preprocess": preprocess, "output": {"decoder": "raw", "threshold": DB_THRESHOLD}}


def cases(args: argparse.Namespace, scratch: Path) -> list[Case]:
    out = []
    for key in args.cases:
        member = {"cls": PPOCR_CLS, "det": PPOCR_DET}[key]
        path, why = find_ppocr(None, args.wheel, member)
        size = (48, 192) if key == "cls" else args.det_size
        name = "PP-OCR mobile v2 cls" if key == "cls" else "PP-OCRv4 det"
        if path is None:
            print(f"{name} not used: {why}; using a mid-size onnx.helper CNN instead")
            side = size[0]
            stand_in = build_mid_cnn(scratch / f"mid_cnn_{key}.onnx", size=side)
            out.append(
                Case(
                    key,
                    f"mid-size CNN (stand-in for {name})",
                    f"built with onnx.helper ({why})",
                    stand_in,
                    ppocr_runtime(key, (side, side), stand_in=True),
                    stand_in=True,
                )
            )
            continue
        out.append(Case(key, name, why, path, ppocr_runtime(key, size, stand_in=False)))
    return out


# ----------------------------------------------------------------------------- images


def _font(size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's own (FreeType) font: no system font


def _lit(pixels: npt.NDArray[np.float64], index: int) -> npt.NDArray[np.uint8]:
    _, gain, offset = CONDITIONS[index % len(CONDITIONS)]
    return np.clip(pixels * gain + offset, 0, 255).astype(np.uint8)


def det_frames(folder: Path, count: int, seed: int, camera: tuple[int, int]) -> None:
    """Camera-like JPEG scenes (gradient, texture, noise, signs) with lines of text of
    several sizes and colours, each at one of :data:`CONDITIONS`."""
    from PIL import Image, ImageDraw

    width, height = camera
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    folder.mkdir(parents=True)
    for k in range(count):
        phase = rng.uniform(0, 50)
        texture = 110 + 60 * np.sin((x + phase) / 41.0) * np.cos((y - phase) / 29.0)
        base = np.stack([x * 200 / width + 20, y * 180 / height + 30, texture], axis=-1)
        image = Image.fromarray(np.clip(base + rng.normal(0, 5, base.shape), 0, 255).astype("u1"))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 5))):  # signs: a plate with text on it
            left, top = rng.uniform(0, width * 0.7), rng.uniform(0, height * 0.8)
            size = int(rng.integers(16, 40))
            text = f"{WORDS[int(rng.integers(len(WORDS)))]} {int(rng.integers(1, 99))}"
            right, bottom = left + size * len(text) * 0.62, top + size * 1.4
            plate = tuple(int(v) for v in rng.integers(0, 256, 3))
            ink = tuple(255 - v for v in plate)
            draw.rectangle([left - 6, top - 4, right, bottom], fill=plate)
            draw.text((left, top), text, fill=ink, font=_font(size))
        for _ in range(int(rng.integers(1, 4))):  # loose text on the scene
            size = int(rng.integers(12, 28))
            where = (rng.uniform(0, width * 0.8), rng.uniform(0, height * 0.9))
            words = " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), 2))
            draw.text(where, words, fill=(245, 245, 235), font=_font(size))
        lit = _lit(np.asarray(image, dtype=np.float64), k)
        Image.fromarray(lit).save(folder / f"{k:03d}.jpg", quality=85)


def cls_crops(folder: Path, count: int, seed: int) -> None:
    """Text-line crops (what PP-OCR's det hands its cls), one class folder per direction:
    ``0`` upright, ``180`` turned over; dark on light, light on dark, low contrast."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    for label in CLS_LABELS:
        (folder / label).mkdir(parents=True)
    for k in range(count):
        size = int(rng.integers(24, 36))
        text = f"{WORDS[int(rng.integers(len(WORDS)))]} {int(rng.integers(10, 9999))}"
        font = _font(size)
        left, top, right, bottom = font.getbbox(text)
        width, height = right - left + 12, max(bottom - top + 10, 32)
        paper = int(rng.integers(150, 255))
        ink = int(rng.integers(0, max(1, paper - 60)))
        if k % 3 == 1:
            paper, ink = ink, paper  # light text on a dark plate
        image = Image.new("RGB", (width, height), (paper,) * 3)
        ImageDraw.Draw(image).text((6 - left, 5 - top), text, fill=(ink,) * 3, font=font)
        pixels = np.asarray(image, dtype=np.float64) + rng.normal(0, 6, (height, width, 3))
        lit = Image.fromarray(_lit(pixels, k // 2))
        label = CLS_LABELS[k % 2]
        if label == "180":
            lit = lit.rotate(180)
        lit.save(folder / label / f"{k:03d}.png")


def write_data(case: Case, folder: Path, count: int, seed: int, camera: tuple[int, int]) -> Path:
    if case.key == "cls":
        cls_crops(folder, count, seed)
    else:
        det_frames(folder, count, seed, camera)
    return folder


# ----------------------------------------------------------------------------- quantize


@dataclass
class Variant:
    name: str
    path: Path | None
    seconds: float
    report: dict[str, Any] | None = None
    """`model quantize`'s report (its per-layer rows cut to the worst five)."""
    comparison: dict[str, Any] | None = None
    """`model compare`'s report on the held-out set."""
    error: str | None = None


def options_for(variant: str, target: float) -> QuantizeOptions:
    if variant == "static":
        return QuantizeOptions(method="static")
    if variant == "perchannel":
        return QuantizeOptions(method="static", per_channel=True)
    if variant == "auto":
        return QuantizeOptions(method="static", auto_target=target)
    if variant == "percentile":
        return QuantizeOptions(method="static", calibration="percentile")
    if variant == "perchannel-percentile":
        return QuantizeOptions(method="static", per_channel=True, calibration="percentile")
    if variant == "perchannel-int16":
        return QuantizeOptions(method="static", per_channel=True, activations="int16")
    return QuantizeOptions(method="dynamic")


def quantize_variant(
    case: Case, variant: str, runtime: Path, calibration: Path, out: Path, target: float
) -> Variant:
    """What ``edgefleet model quantize FP32 --calibration DIR --runtime R --out OUT [...]``
    does (control_plane/cli/commands/optimise.py), function by function."""
    started = time.perf_counter()
    try:
        spec = load_runtime_file(runtime)
        info = inspect_model(case.path)
        samples = open_samples(
            calibration, info, spec, minimum=MIN_CALIBRATION_SAMPLES, what="calibration"
        )
        report = quantize_model(case.path, out, samples, options_for(variant, target))
    except (InvalidInputError, InvalidModelError) as exc:
        return Variant(variant, None, time.perf_counter() - started, error=str(exc))
    report["layers"] = (report.get("layers") or [])[:5]
    return Variant(variant, out, time.perf_counter() - started, report)


def compare_variant(case: Case, variant: Variant, runtime: Path, held_out: Path) -> None:
    """What ``edgefleet model compare FP32 INT8 --data DIR --runtime R`` does."""
    assert variant.path is not None
    try:
        spec = load_runtime_file(runtime)
        info = inspect_model(case.path)
        check_same_signature(info, inspect_model(variant.path))
        samples = open_samples(held_out, info, spec)
        variant.comparison = compare_models(
            case.path, variant.path, samples, a_name="FP32", b_name=variant.name
        ).to_report()
    except (InvalidInputError, InvalidModelError) as exc:
        variant.error = f"compare: {exc}"


# ----------------------------------------------------------------------------- latency


def held_out_inputs(case: Case, runtime: Path, held_out: Path) -> tuple[list[Any], list[str]]:
    """The held-out set's input tensors (through the same preprocessing) and their names."""
    samples = open_samples(held_out, inspect_model(case.path), load_runtime_file(runtime))
    loaded = list(samples)
    return [s.inputs for s in loaded], [s.name for s in loaded]


def session(path: Path, threads: int) -> Any:
    """The agent's own session options (edge_node.runtime.session), ``threads`` intra-op."""
    options = session_options(SessionConfig(intra_op_threads=threads, inter_op_threads=1))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure_latency(
    models: dict[str, Path], inputs: list[Any], threads: Sequence[int], rounds: int, runs: int
) -> dict[str, dict[int, list[float]]]:
    """Milliseconds per run, per model and thread count: ``rounds`` rounds, each a block of
    ``runs`` runs of every (model, threads) in a rotating order, after two warm-up runs each."""
    sessions = {(m, t): session(path, t) for m, path in models.items() for t in threads}
    for s in sessions.values():
        for feed in inputs[:2]:
            s.run(None, feed)
    times: dict[str, dict[int, list[float]]] = {m: {t: [] for t in threads} for m in models}
    order = list(sessions)
    for r in range(rounds):
        shift = r % len(order)
        for m, t in order[shift:] + order[:shift]:
            s = sessions[(m, t)]
            for i in range(runs):
                feed = inputs[(r * runs + i) % len(inputs)]
                started = time.perf_counter_ns()
                s.run(None, feed)
                times[m][t].append((time.perf_counter_ns() - started) / 1e6)
    return times


def outputs_of(path: Path, inputs: list[Any]) -> list[npt.NDArray[Any]]:
    s = session(path, 1)
    return [np.asarray(s.run(None, feed)[0]) for feed in inputs]


def text_pixel_iou(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    """IoU of the text pixels (map > :data:`DB_THRESHOLD`) of two det maps; 1 when neither
    has any."""
    ta, tb = a > DB_THRESHOLD, b > DB_THRESHOLD
    union = int(np.count_nonzero(ta | tb))
    return 1.0 if union == 0 else int(np.count_nonzero(ta & tb)) / union


# ----------------------------------------------------------------------------- run


@dataclass
class CaseResult:
    key: str
    name: str
    source: str
    runtime: dict[str, Any]
    calibration: int
    held_out: int
    coverage: dict[str, Any] | None
    variants: list[dict[str, Any]] = field(default_factory=list)
    latency_ms: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """model -> threads -> p50/p99/runs."""
    ratio_p50: dict[str, dict[str, float]] = field(default_factory=dict)
    """INT8 variant -> threads -> its P50 over FP32's P50 (same run)."""
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per model, what this benchmark measures beside compare: accuracy against the true
    direction (cls), text-pixel IoU with FP32 at 0.3 (det)."""


@dataclass
class Results:
    cases: list[CaseResult]
    cpu: dict[str, Any]
    onnxruntime: str
    args: dict[str, Any]


def run_case(case: Case, args: argparse.Namespace, scratch: Path) -> CaseResult:
    folder = scratch / case.key
    folder.mkdir(parents=True)
    runtime = folder / "runtime.yaml"
    runtime.write_text(yaml.safe_dump(case.runtime, sort_keys=False))
    camera = args.camera
    calibration = write_data(case, folder / "calibration", args.calibration, SEED, camera)
    held_out = write_data(case, folder / "held-out", args.held_out, SEED + 1, camera)
    print(f"\n== {case.name} ({case.source})")
    print(f"   {args.calibration} calibration, {args.held_out} held-out images in {folder}")
    variants: list[Variant] = []
    for name in args.variants:
        print(f"   quantizing: {name} ...", flush=True)
        variant = quantize_variant(
            case, name, runtime, calibration, folder / f"int8-{name}.onnx", args.target
        )
        if variant.path is not None:
            compare_variant(case, variant, runtime, held_out)
        print(
            f"   {name}: {variant.seconds:.1f} s" + (f"; {variant.error}" if variant.error else "")
        )
        variants.append(variant)
    coverage = next((v.report["coverage"] for v in variants if v.report), None)
    result = CaseResult(
        case.key,
        case.name,
        case.source,
        case.runtime,
        args.calibration,
        args.held_out,
        coverage,
        [asdict(v) | {"path": str(v.path) if v.path else None} for v in variants],
    )
    models = {"FP32": case.path} | {
        v.name: v.path for v in variants if v.path is not None and v.error is None
    }
    inputs, names = held_out_inputs(case, runtime, held_out)
    print(f"   timing {', '.join(models)} at {args.threads} threads ...", flush=True)
    times = measure_latency(models, inputs, args.threads, args.rounds, args.runs)
    for model, per_thread in times.items():
        result.latency_ms[model] = {
            str(t): {"p50": pct(v, 50), "p99": pct(v, 99), "runs": len(v)}
            for t, v in per_thread.items()
        }
    for model in models:
        if model == "FP32":
            continue
        result.ratio_p50[model] = {
            str(t): pct(times[model][t], 50) / pct(times["FP32"][t], 50) for t in args.threads
        }
    reference = outputs_of(case.path, inputs)
    for model, path in models.items():
        values = reference if model == "FP32" else outputs_of(path, inputs)
        if case.key == "cls" and not case.stand_in:
            truth = [CLS_LABELS.index(n.split("/")[0]) for n in names]
            right = [int(np.argmax(v)) == t for v, t in zip(values, truth, strict=True)]
            result.extra[model] = {"accuracy": sum(right) / len(right)}
        elif case.key == "det" and not case.stand_in:
            ious = [text_pixel_iou(a, b) for a, b in zip(reference, values, strict=True)]
            text = [float(np.mean(v > DB_THRESHOLD)) for v in values]
            result.extra[model] = {
                "text_iou_p5": float(np.percentile(ious, 5, method="lower")),
                "text_iou_median": median(ious),
                "text_pixels_mean": float(np.mean(text)),
            }
    return result


def run(args: argparse.Namespace) -> Results:
    scratch = BENCH_DIR / "quantization"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        results = [run_case(case, args, scratch) for case in cases(args, scratch)]
    finally:
        if not args.keep:
            with contextlib.suppress(OSError):
                shutil.rmtree(scratch)
    return Results(results, cpu_features(), ort.__version__, {"target": args.target})


# ----------------------------------------------------------------------------- report


def _cosine_p5(comparison: dict[str, Any]) -> float:
    return min(float(o["cosine_p5"]) for o in comparison["outputs"])


def _sqnr_p5(comparison: dict[str, Any]) -> float:
    values = [o["sqnr_db_p5"] for o in comparison["outputs"]]
    return min(float("inf") if v == "inf" else float(v) for v in values)


def add_figures(results: Results, report: Report) -> None:
    for case in results.cases:
        for v in case.variants:
            label = f"{case.key} INT8 {v['name']}"
            comparison = v.get("comparison")
            if v.get("error") or comparison is None:
                report.goal(f"{label}: quantized and compared ({v.get('error')})", False)
                continue
            report.figure(
                f"{label}: cosine P5 vs FP32 (held-out)",
                _cosine_p5(comparison),
                "",
                goal=f">= {COSINE_WARNING}",
                met=_cosine_p5(comparison) >= COSINE_WARNING,
            )
            report.figure(f"{label}: SQNR P5 vs FP32", _sqnr_p5(comparison), "dB")
            decoded = comparison.get("decoded") or {}
            if decoded.get("top1_ratio") is not None:
                top1 = float(decoded["top1_ratio"])
                report.figure(
                    f"{label}: top-1 agreement with FP32",
                    top1,
                    "",
                    goal=f">= {TOP1_WARNING}",
                    met=top1 >= TOP1_WARNING,
                )
            extra = case.extra.get(v["name"], {})
            if "text_iou_p5" in extra:
                report.figure(
                    f"{label}: text-pixel IoU P5 at {DB_THRESHOLD}", extra["text_iou_p5"], ""
                )
            if "accuracy" in extra:
                report.figure(
                    f"{label}: direction accuracy",
                    extra["accuracy"],
                    "",
                    anchor=case.extra["FP32"]["accuracy"],
                    anchor_name="FP32's",
                )
            size = v["report"]["size_bytes"]
            report.figure(
                f"{label}: model size",
                size["int8"] / 1e6,
                "MB",
                anchor=size["fp32"] / 1e6,
                anchor_name="FP32",
            )
            for t, lat in case.latency_ms.get(v["name"], {}).items():
                fp32 = case.latency_ms["FP32"][t]
                for q in ("p50", "p99"):
                    report.figure(
                        f"{label}: {q.upper()} latency, {t} thread{'s' if t != '1' else ''}",
                        lat[q],
                        "ms",
                        anchor=fp32[q],
                        anchor_name="FP32 same run",
                    )


def print_results(results: Results, report: Report) -> None:
    cpu = results.cpu
    print(
        f"\nonnxruntime {results.onnxruntime}; {cpu['machine']}, int8 features: "
        f"{', '.join(cpu['int8_features']) or 'none reported'}; {report.load_line()}"
    )
    for case in results.cases:
        print(f"\n{case.name}: {case.calibration} calibration / {case.held_out} held-out")
        if case.coverage:
            b = case.coverage["brightness_p5_p50_p95"]
            print(f"  calibration brightness p5/p50/p95 {b}; bands {case.coverage['bands']}")
            for warning in case.coverage["warnings"]:
                print(f"  coverage warning: {warning}")
        threads = sorted(case.latency_ms.get("FP32", {}), key=int)
        head = "  model     cos P5   SQNR P5  top1/IoU  size MB  " + "  ".join(
            f"P50/P99 {t}t ms " for t in threads
        )
        print(head)
        rows = [("FP32", None)] + [(v["name"], v) for v in case.variants]
        for name, v in rows:
            if v is not None and (v.get("error") or v.get("comparison") is None):
                print(f"  {name:<8}  failed: {v.get('error')}")
                continue
            extra = case.extra.get(name, {})
            if v is None:
                cells = ["1", "inf", "1"]
            else:
                decoded = v["comparison"].get("decoded") or {}
                third = decoded.get("top1_ratio", round(extra.get("text_iou_p5", math.nan), 3))
                cells = [
                    f"{_cosine_p5(v['comparison']):.4f}",
                    f"{_sqnr_p5(v['comparison']):.1f}",
                    str(third),
                ]
            size = "" if v is None else f"{v['report']['size_bytes']['int8'] / 1e6:.2f}"
            lat = "  ".join(
                f"{case.latency_ms[name][t]['p50']:6.2f}/{case.latency_ms[name][t]['p99']:6.2f}  "
                for t in threads
                if name in case.latency_ms
            )
            print(f"  {name:<8} {cells[0]:>7} {cells[1]:>8} {cells[2]:>9} {size:>8}  {lat}")
            if v is not None and v["report"].get("auto_exclude"):
                search = v["report"]["auto_exclude"]
                print(
                    f"           auto-exclude: kept in float {search['kept_in_float'] or 'nothing'}"
                    f" ({search['score_before']} -> {search['score']} on calibration, "
                    f"target {search['target']}, reached {search['reached']}); "
                    f"quantized in {v['seconds']:.0f} s"
                )
        if case.extra:
            print(f"  beside compare: {case.extra}")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--wheel", help="a downloaded rapidocr_onnxruntime wheel to read from")
    parser.add_argument(
        "--cases",
        type=lambda v: [c for c in v.split(",") if c],
        default=["cls", "det"],
        help="PP-OCR models: cls, det (default both)",
    )
    parser.add_argument(
        "--det-size", type=parse_hw, default=(320, 448), help="PP-OCR det input HxW"
    )
    parser.add_argument(
        "--camera",
        type=lambda v: parse_hw(v, order="WxH"),
        default=(640, 480),
        help="det scene WxH",
    )
    parser.add_argument("--calibration", type=int, default=32, help="calibration images")
    parser.add_argument("--held-out", type=int, default=32, help="held-out images")
    parser.add_argument(
        "--variants",
        type=lambda v: [c for c in v.split(",") if c],
        default=list(VARIANTS[:4]),
        help="static, perchannel (static --per-channel), auto (static --auto-exclude), dynamic, "
        "percentile, perchannel-percentile (Percentile calibration), perchannel-int16 "
        "(--per-channel --activations int16); the last three not in the default set",
    )
    parser.add_argument("--target", type=float, default=0.99, help="--auto-exclude's --target")
    parser.add_argument(
        "--threads",
        type=lambda v: [int(c) for c in v.split(",") if c],
        default=[1, 2],
        help="intra-op thread counts to time",
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--runs", type=int, default=15, help="runs per block")
    parser.add_argument("--keep", action="store_true", help="keep the images and models")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={
            "det_size": "96x128",
            "camera": "160x120",
            "calibration": MIN_CALIBRATION_SAMPLES,
            "held_out": 4,
            "target": 0.01,
            "rounds": 1,
            "runs": 2,
        },
    )
    if isinstance(args.det_size, str):  # --quick sets the text
        args.det_size = parse_hw(args.det_size)
    if isinstance(args.camera, str):
        args.camera = parse_hw(args.camera, order="WxH")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or any(c not in ("cls", "det") for c in args.cases):
        parser.error(f"--variants of {VARIANTS}, --cases of cls, det")
    if args.calibration < MIN_CALIBRATION_SAMPLES:
        parser.error(
            f"--calibration: at least {MIN_CALIBRATION_SAMPLES} (model quantize's minimum)"
        )
    report = Report("quantization", machine=machine(onnxruntime=ort.__version__))
    results = run(args)
    add_figures(results, report)
    print_results(results, report)
    return report.finish(args, asdict(results))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
