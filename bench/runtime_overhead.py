"""Runtime overhead: frames/s through the edge agent's inference pipeline vs bare ONNX Runtime.

Measures, in one process and one run, on the same model, the same input frames and the same
session options:

(a) throughput of a real model through ``InferencePipeline`` (scheduler, worker thread,
    preprocessing, result callback) as a ratio to a bare ``InferenceSession.run`` loop on the
    already-preprocessed tensors (goal >= 0.97), and to a bare loop that also preprocesses;
(b) the per-frame overhead in microseconds on a tiny model, where the model costs almost
    nothing and the pipeline's own work shows;
(c) P50/P95/P99 latency in steady state, one frame at a time (a camera slower than the
    model): bare ``run`` vs the pipeline from ``submit`` to the result callback;
(d) RSS of this process after 1,000 and after 10,000 frames through the pipeline.

The real model is PP-OCRv4's text detector as shipped in the ``rapidocr-onnxruntime`` wheel
when it can be found without a download: ``--model PATH``, ``--wheel PATH`` (a downloaded
wheel file; the model is read out of the zip), or the installed package. Otherwise a
mid-size CNN is built with ``onnx.helper``; the report says which was used. Not a test: it
asserts nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.runtime_overhead [--model PATH | --wheel PATH] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import psutil
from onnx import TensorProto, helper, numpy_helper

from bench._report import Report, machine, parse_benchmark_args
from bench._util import BENCH_DIR, median, pct
from edge_node.clock import SystemClock
from edge_node.runtime import (
    FrameResult,
    InferencePipeline,
    ModelSession,
    PreprocessConfig,
    SchedulerConfig,
    SessionConfig,
    StreamConfig,
)
from edge_node.runtime.session import session_options

GOAL_RATIO = 0.97
"""Issue goal: pipeline frames/s at least 0.97 of a bare ``InferenceSession.run`` loop."""
GOAL_RSS_GROWTH_MB = 5.0
"""Our reading of "flat within noise": under 5 MB between 1,000 and 10,000 frames."""

PPOCR_DET = "ch_PP-OCRv4_det_infer.onnx"
SEED = 20261130
N_DISTINCT_FRAMES = 8
MB = 1024 * 1024


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelCase:
    name: str
    source: str
    path: Path
    preprocess: PreprocessConfig
    session: SessionConfig


def find_ppocr(model: str | None, wheel: str | None) -> tuple[Path | None, str]:
    """The PP-OCR detector's path and where it came from, or ``(None, why not)``."""
    if model:
        return Path(model), f"--model {model}"
    if wheel:
        target = BENCH_DIR / "models" / PPOCR_DET
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(PPOCR_DET))
            target.write_bytes(archive.read(member))
        return target, f"{member} read from {Path(wheel).name}"
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # finds it without importing it
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "models" / PPOCR_DET
        if path.exists():
            return path, f"installed rapidocr_onnxruntime ({path})"
    return None, "rapidocr-onnxruntime is not installed in this environment"


def build_mid_cnn(path: Path, size: int = 640) -> Path:
    """A six-conv CNN (~7.5 GFLOP at 640x640) with fixed random weights: a stand-in only."""
    rng = np.random.default_rng(SEED)
    layers = [(3, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1)]
    nodes, inits, previous = [], [], "images"
    for i, (cin, cout, stride) in enumerate(layers):
        w = (rng.standard_normal((cout, cin, 3, 3)) * (2 / (cin * 9)) ** 0.5).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node(
                "Conv",
                [previous, f"w{i}", f"b{i}"],
                [f"c{i}"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            ),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        previous = f"r{i}"
    inits.append(numpy_helper.from_array(rng.standard_normal((128, 10)).astype(np.float32), "fc"))
    nodes += [
        helper.make_node("GlobalAveragePool", [previous], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("MatMul", ["flat", "fc"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mid_cnn",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def build_tiny(path: Path, size: int = 32) -> Path:
    """Conv(3->8) -> Relu -> GlobalAveragePool -> Gemm(8->4) -> Sigmoid on 32x32: ~0.2 MFLOP."""
    rng = np.random.default_rng(SEED)
    graph = helper.make_graph(
        [
            helper.make_node(
                "Conv", ["images", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
            ),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Gemm", ["f", "fw", "fb"], ["l"]),
            helper.make_node("Sigmoid", ["l"], ["scores"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros(8, np.float32), "b"),
            numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "fw"),
            numpy_helper.from_array(np.zeros(4, np.float32), "fb"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


# ----------------------------------------------------------------------------- harness


def frames_for(height: int, width: int, count: int = N_DISTINCT_FRAMES) -> list[npt.NDArray[Any]]:
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


class Harness:
    """One model loaded twice with the same options: bare ``InferenceSession`` and pipeline."""

    def __init__(self, case: ModelCase, depth: int) -> None:
        self.case = case
        self.depth = depth
        self.bare = ort.InferenceSession(
            str(case.path),
            sess_options=session_options(case.session),
            providers=["CPUExecutionProvider"],
        )
        self.model = ModelSession.load(case.path, case.session, case.preprocess, label=case.name)
        self.input_name = self.model.input_name
        self._done = threading.Semaphore(0)
        self._slots: threading.Semaphore | None = None
        self._splits: list[tuple[float, float, float]] = []
        self.keep_splits = False  # timings only: keeping outputs would weigh on RSS
        self._arrivals: list[float] = []
        self.pipeline = InferencePipeline(
            self.model,
            [StreamConfig("cam", queue_size=2 * depth)],
            SystemClock(),
            self._on_result,
            scheduler_config=SchedulerConfig(shed_after_s=None),
        )
        self.pipeline.start()

    def _on_result(self, result: FrameResult) -> None:
        if self.keep_splits:
            self._arrivals.append(time.perf_counter())
            self._splits.append((result.queue_s, result.preprocess_s, result.inference_s))
        self._done.release()
        slots = self._slots
        if slots is not None:
            slots.release()

    def close(self) -> None:
        self.pipeline.stop(timeout_s=30)

    # -- bare anchors ------------------------------------------------------------------

    def bare_fps(self, tensors: Sequence[npt.NDArray[Any]], n: int) -> float:
        run, name = self.bare.run, self.input_name
        started = time.perf_counter()
        for i in range(n):
            run(None, {name: tensors[i % len(tensors)]})
        return n / (time.perf_counter() - started)

    def bare_with_preprocess_fps(self, frames: Sequence[npt.NDArray[Any]], n: int) -> float:
        run, name, pre = self.bare.run, self.input_name, self.model.preprocessor
        started = time.perf_counter()
        for i in range(n):
            run(None, {name: pre(frames[i % len(frames)], reuse=True)})
        return n / (time.perf_counter() - started)

    def bare_latencies(self, tensors: Sequence[npt.NDArray[Any]], n: int) -> list[float]:
        run, name, out = self.bare.run, self.input_name, []
        for i in range(n):
            started = time.perf_counter()
            run(None, {name: tensors[i % len(tensors)]})
            out.append(time.perf_counter() - started)
        return out

    # -- through the pipeline ----------------------------------------------------------

    def pipeline_fps(self, frames: Sequence[npt.NDArray[Any]], n: int) -> float:
        """Closed loop: at most ``depth`` frames submitted and not yet answered, so the worker
        has the next frame queued (for the tiny model the producer thread's wake-up latency
        would otherwise dominate) and nothing is dropped."""
        self._slots = slots = threading.Semaphore(self.depth)
        submit = self.pipeline.submit
        started = time.perf_counter()
        for i in range(n):
            slots.acquire()
            outcome = submit("cam", frames[i % len(frames)])
            if not outcome.queued:
                raise RuntimeError(f"frame not queued: {outcome}")
        for _ in range(n):
            self._done.acquire()
        elapsed = time.perf_counter() - started
        self._slots = None
        stats = self.pipeline.stats()["cam"]
        if stats.dropped or stats.failed or stats.bad:
            raise RuntimeError(f"frames lost in the pipeline: {stats}")
        return n / elapsed

    def pipeline_latencies(
        self, frames: Sequence[npt.NDArray[Any]], n: int
    ) -> tuple[list[float], list[tuple[float, float, float]]]:
        """One frame at a time: submit, wait for its result; end-to-end seconds per frame."""
        self._splits.clear()
        self._arrivals.clear()
        self.keep_splits = True
        e2e = []
        for i in range(n):
            started = time.perf_counter()
            self.pipeline.submit("cam", frames[i % len(frames)])
            self._done.acquire()
            e2e.append(self._arrivals[-1] - started)
        self.keep_splits = False
        splits = list(self._splits)
        self._splits.clear()
        self._arrivals.clear()
        return e2e, splits


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / MB


# ----------------------------------------------------------------------------- report


@dataclass
class Results:
    """The raw measurements; the machine, the load and the goals are the report's."""

    real_model: dict[str, Any] = field(default_factory=dict)
    tiny_model: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    rss: dict[str, Any] = field(default_factory=dict)


def onnx_machine(**extra: Any) -> dict[str, Any]:
    """The machine, and the libraries the ONNX benchmarks' figures depend on."""
    return machine(onnxruntime=ort.__version__, numpy=np.__version__, **extra)


def _block(measure: Callable[[], float], n: int) -> tuple[float, float]:
    """``(frames/s, CPU µs per frame)``; CPU is this process's, all threads (ORT's included)."""
    cpu = time.process_time()
    fps = measure()
    return fps, (time.process_time() - cpu) / n * 1e6


def throughput_rounds(
    harness: Harness, frames: Sequence[npt.NDArray[Any]], n: int, rounds: int
) -> dict[str, Any]:
    """ABC ABC ...: short blocks of bare, bare+preprocess and pipeline in turn, so background
    load hits all three alike; the ratio is the median of the per-round ratios."""
    tensors = [harness.model.preprocessor(f) for f in frames]
    harness.bare_fps(tensors, max(3, n // 5))  # warm-up: arenas, caches, thread pools
    harness.bare_with_preprocess_fps(frames, max(3, n // 5))
    harness.pipeline_fps(frames, max(3, n // 5))
    bare, bare_pre, piped, rss = [], [], [], []
    for _ in range(rounds):
        bare.append(_block(lambda: harness.bare_fps(tensors, n), n))
        bare_pre.append(_block(lambda: harness.bare_with_preprocess_fps(frames, n), n))
        piped.append(_block(lambda: harness.pipeline_fps(frames, n), n))
        rss.append(rss_mb())
    ratios = [p[0] / b[0] for p, b in zip(piped, bare, strict=True)]
    ratios_pre = [p[0] / b[0] for p, b in zip(piped, bare_pre, strict=True)]
    fps = {
        name: [x[0] for x in xs]
        for name, xs in (("bare", bare), ("pre", bare_pre), ("pipe", piped))
    }
    cpu = {
        name: median([x[1] for x in xs])
        for name, xs in (("bare", bare), ("pre", bare_pre), ("pipe", piped))
    }
    return {
        "frames_per_round": n,
        "rounds": rounds,
        "rss_mb_by_round": rss,
        "bare_fps": fps["bare"],
        "bare_preprocess_fps": fps["pre"],
        "pipeline_fps": fps["pipe"],
        "ratio": median(ratios),
        "ratio_p25_p75": [pct(ratios, 25), pct(ratios, 75)],
        "ratio_vs_bare_preprocess": median(ratios_pre),
        "bare_ms": 1000 / median(fps["bare"]),
        "pipeline_ms": 1000 / median(fps["pipe"]),
        "overhead_us": (1 / median(fps["pipe"]) - 1 / median(fps["bare"])) * 1e6,
        "overhead_vs_bare_preprocess_us": (1 / median(fps["pipe"]) - 1 / median(fps["pre"])) * 1e6,
        "cpu_us_per_frame": {
            "bare": cpu["bare"],
            "bare_preprocess": cpu["pre"],
            "pipeline": cpu["pipe"],
        },
    }


def latency_block(harness: Harness, frames: Sequence[npt.NDArray[Any]], n: int) -> dict[str, Any]:
    tensors = [harness.model.preprocessor(f) for f in frames]
    harness.bare_latencies(tensors, max(3, n // 10))
    harness.pipeline_latencies(frames, max(3, n // 10))
    bare = harness.bare_latencies(tensors, n)
    e2e, splits = harness.pipeline_latencies(frames, n)

    def summary(values: Sequence[float]) -> dict[str, float]:
        return {f"p{q}_ms": pct(values, q) * 1000 for q in (50, 95, 99)} | {
            "max_ms": max(values) * 1000
        }

    return {
        "frames": n,
        "bare_run": summary(bare),
        "pipeline_e2e": summary(e2e),
        "pipeline_queue": summary([q for q, _, _ in splits]),
        "pipeline_preprocess": summary([p for _, p, _ in splits]),
        "pipeline_inference": summary([i for _, _, i in splits]),
    }


def run(args: argparse.Namespace) -> Results:
    results = Results()
    threads = args.threads or max(1, len(os.sched_getaffinity(0)))
    scratch = BENCH_DIR / "runtime"

    # (a) the real model (or the stand-in), and (c) its latency
    path, why = find_ppocr(args.model, args.wheel)
    if path is not None:
        case = ModelCase(
            "PP-OCRv4 det",
            why,
            path,
            PreprocessConfig(
                size=(args.size, args.size), mean=(0.5,), std=(0.5,), channel_order="BGR"
            ),
            SessionConfig(intra_op_threads=threads, inter_op_threads=1, allow_spinning=args.spin),
        )
    else:
        print(f"PP-OCR model not used: {why}; using a mid-size onnx.helper CNN instead")
        case = ModelCase(
            "mid-size CNN (stand-in)",
            f"built with onnx.helper ({why})",
            build_mid_cnn(scratch / "mid_cnn.onnx"),
            PreprocessConfig(mean=(0.5,), std=(0.5,)),
            SessionConfig(intra_op_threads=threads, inter_op_threads=1, allow_spinning=args.spin),
        )
    harness = Harness(case, depth=2)
    results.real_model["rss_before_mb"] = rss_mb()
    try:
        size = harness.model.preprocess.size
        assert size is not None
        frames = frames_for(*size)
        print(
            f"(a) {case.name}: {case.source}; input {size}, intra_op_threads={threads}, "
            f"allow_spinning={args.spin}"
        )
        real = throughput_rounds(harness, frames, args.frames, args.rounds)
        real |= {"model": case.name, "source": case.source, "input": list(size)}
        real["rss_before_mb"] = results.real_model["rss_before_mb"]
        real["rss_after_throughput_mb"] = rss_mb()
        real |= {"intra_op_threads": threads, "allow_spinning": args.spin}
        if args.camera:
            cam_frames = frames_for(720, 1280, 4)
            cam = throughput_rounds(harness, cam_frames, args.frames, args.rounds)
            real["camera_720p"] = cam
        results.real_model = real
        results.latency["real"] = latency_block(harness, frames, args.latency_frames)
        real["rss_after_mb"] = rss_mb()
    finally:
        harness.close()

    # (b) the tiny model: the pipeline's own cost per frame, (c) latency, (d) RSS
    tiny_case = ModelCase(
        "tiny CNN 32x32",
        "built with onnx.helper",
        build_tiny(scratch / "tiny.onnx"),
        PreprocessConfig(),
        SessionConfig(intra_op_threads=1, inter_op_threads=1),
    )
    harness = Harness(tiny_case, depth=16)
    try:
        frames = frames_for(32, 32)
        print("(d) RSS over the first 10,000 frames of a fresh pipeline")
        gc.collect()
        rss = {"before_first_frame_mb": rss_mb()}
        harness.pipeline_fps(frames, 1000)
        rss["after_1000_mb"] = rss_mb()
        harness.pipeline_fps(frames, 9000)
        rss["after_10000_mb"] = rss_mb()
        rss["growth_mb"] = rss["after_10000_mb"] - rss["after_1000_mb"]
        results.rss = rss

        print(f"(b) {tiny_case.name}, intra_op_threads=1")
        results.tiny_model = throughput_rounds(harness, frames, args.tiny_frames, args.rounds)
        results.latency["tiny"] = latency_block(harness, frames, args.latency_frames * 10)
        results.rss["after_all_tiny_frames_mb"] = rss_mb()
    finally:
        harness.close()

    return results


def print_results(results: Results, report: Report) -> None:
    real, tiny, lat, rss = results.real_model, results.tiny_model, results.latency, results.rss
    m = report.machine
    print()
    print(
        f"machine: {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, "
        f"onnxruntime {m['onnxruntime']}, numpy {m['numpy']}; {report.load_line()}"
    )
    print(f"real model: {real['model']} ({real['source']})")
    rows = [
        ("measure", "pipeline", "anchor (bare)", "goal", "figure"),
        (
            f"(a) {real['model']} frames/s, ratio",
            f"{median(real['pipeline_fps']):.2f} fps",
            f"{median(real['bare_fps']):.2f} fps",
            f">= {GOAL_RATIO}",
            f"{real['ratio']:.3f} "
            f"(IQR {real['ratio_p25_p75'][0]:.3f}-{real['ratio_p25_p75'][1]:.3f})",
        ),
        (
            "(a) ratio vs bare run + same preprocessing",
            f"{median(real['pipeline_fps']):.2f} fps",
            f"{median(real['bare_preprocess_fps']):.2f} fps",
            "(info)",
            f"{real['ratio_vs_bare_preprocess']:.3f}",
        ),
    ]
    if "camera_720p" in real:
        cam = real["camera_720p"]
        rows.append(
            (
                "(a) 1280x720 frames resized in the pipeline",
                f"{median(cam['pipeline_fps']):.2f} fps",
                f"{median(cam['bare_fps']):.2f} fps",
                "(info)",
                f"{cam['ratio']:.3f} (vs bare+pre {cam['ratio_vs_bare_preprocess']:.3f})",
            )
        )
    rows.append(
        (
            "(a) CPU ms per frame (all threads)",
            f"{real['cpu_us_per_frame']['pipeline'] / 1000:.2f}",
            f"{real['cpu_us_per_frame']['bare'] / 1000:.2f} "
            f"(+pre {real['cpu_us_per_frame']['bare_preprocess'] / 1000:.2f})",
            "(info)",
            "",
        )
    )
    rows += [
        (
            "(b) tiny model, per-frame overhead",
            f"{1e6 / median(tiny['pipeline_fps']):.1f} us/frame",
            f"{1e6 / median(tiny['bare_fps']):.1f} us/frame",
            "(report)",
            f"+{tiny['overhead_us']:.1f} us "
            f"(+{tiny['overhead_vs_bare_preprocess_us']:.1f} vs bare+pre)",
        ),
        (
            "(b) tiny model, CPU us per frame",
            f"{tiny['cpu_us_per_frame']['pipeline']:.1f}",
            f"{tiny['cpu_us_per_frame']['bare']:.1f} "
            f"(+pre {tiny['cpu_us_per_frame']['bare_preprocess']:.1f})",
            "(info)",
            f"+{tiny['cpu_us_per_frame']['pipeline'] - tiny['cpu_us_per_frame']['bare']:.1f} us",
        ),
    ]
    for key, label in (("real", real["model"]), ("tiny", "tiny")):
        block = lat[key]
        p, b = block["pipeline_e2e"], block["bare_run"]
        rows.append(
            (
                f"(c) {label} latency P50/P95/P99 ms",
                f"{p['p50_ms']:.3f}/{p['p95_ms']:.3f}/{p['p99_ms']:.3f}",
                f"{b['p50_ms']:.3f}/{b['p95_ms']:.3f}/{b['p99_ms']:.3f}",
                "(report)",
                "",
            )
        )
    rows.append(
        (
            "(d) RSS after 1,000 -> 10,000 frames",
            f"{rss['after_1000_mb']:.1f} -> {rss['after_10000_mb']:.1f} MB",
            f"before the first frame {rss['before_first_frame_mb']:.1f} MB",
            f"growth < {GOAL_RSS_GROWTH_MB:.0f} MB",
            f"{rss['growth_mb']:+.2f} MB",
        )
    )
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(
        f"    RSS: real model {real['rss_before_mb']:.1f} MB loaded, "
        f"{real['rss_mb_by_round'][0]:.1f} MB after round 1 of (a), "
        f"{real['rss_mb_by_round'][-1]:.1f} MB after round {real['rounds']}, "
        f"{real['rss_after_mb']:.1f} MB after all its runs; tiny model after all its frames "
        f"{rss['after_all_tiny_frames_mb']:.1f} MB"
    )
    for key in ("real", "tiny"):
        block = lat[key]
        print(
            f"    {key} split P50/P99 ms: queue {block['pipeline_queue']['p50_ms']:.3f}/"
            f"{block['pipeline_queue']['p99_ms']:.3f}, preprocess "
            f"{block['pipeline_preprocess']['p50_ms']:.3f}/"
            f"{block['pipeline_preprocess']['p99_ms']:.3f}, inference "
            f"{block['pipeline_inference']['p50_ms']:.3f}/"
            f"{block['pipeline_inference']['p99_ms']:.3f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="path of the PP-OCR detection model (or any image model)")
    parser.add_argument("--wheel", help="a downloaded rapidocr_onnxruntime wheel to read it from")
    parser.add_argument("--size", type=int, default=640, help="input side for a dynamic model")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all CPUs)")
    parser.add_argument("--rounds", type=int, default=15, help="ABC rounds per model")
    parser.add_argument("--frames", type=int, default=10, help="real-model frames per block")
    parser.add_argument("--tiny-frames", type=int, default=2000, help="tiny frames per block")
    parser.add_argument("--latency-frames", type=int, default=200)
    parser.add_argument("--spin", action="store_true", help="real model: allow_spinning=True")
    parser.add_argument("--camera", action="store_true", help="also 1280x720 frames, resized")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={
            "size": 64,
            "rounds": 2,
            "frames": 2,
            "tiny_frames": 200,
            "latency_frames": 20,
        },
    )

    report = Report("runtime_overhead", machine=onnx_machine())
    results = run(args)
    with contextlib.suppress(OSError):
        for leftover in (BENCH_DIR / "runtime").glob("*.onnx"):
            leftover.unlink()
    real = results.real_model
    report.figure(
        f"{real['model']} frames/s",
        median(real["pipeline_fps"]),
        "fps",
        anchor=median(real["bare_fps"]),
        anchor_name="bare InferenceSession.run",
        # judged on the median of the per-round ratios, steadier than a ratio of medians
        goal=f"median per-round ratio {real['ratio']:.3f} >= {GOAL_RATIO}",
        met=real["ratio"] >= GOAL_RATIO,
    )
    report.figure(
        "RSS growth 1,000 -> 10,000 frames",
        results.rss["growth_mb"],
        "MB",
        goal=f"< {GOAL_RSS_GROWTH_MB:.0f} MB",
        met=results.rss["growth_mb"] < GOAL_RSS_GROWTH_MB,
    )
    print_results(results, report)
    return report.finish(args, asdict(results))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
