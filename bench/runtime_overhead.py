"""Runtime overhead: frames/s through the edge agent's pipeline vs a bare loop doing the same work.

Measures, in one process and one run, on the same model, the same JPEG camera frames and the
same session options, for each model case (PP-OCR's classifier and text detector from the
``rapidocr-onnxruntime`` wheel, or any ``--model`` with its own ``--runtime runtime.yaml``):

(a) throughput on **one core** (the process pinned to one CPU, one intra-op thread): the
    agent's pipeline with preprocessing inline (``preprocess_threads=0``) as a ratio to the
    *bare serial loop* — Pillow decode (at the same reduced size, ``DecodeTarget``) + the
    same numpy ``Preprocessor`` + ``InferenceSession.run``, by hand in one loop (goal
    >= 0.97); beside it the same loop decoding in full, and ``run`` alone on ready tensors;
(b) throughput on **two cores** (one intra-op thread, the agent's default): the staged
    pipeline (``preprocess_threads=1``: decode and preprocess overlap with inference) as a
    ratio to the same bare serial loop (goal > 1 where decode and preprocessing are a large
    share of a frame), and to a bare loop given both cores the only way a serial loop can
    use them (two intra-op threads);
(c) P50/P95/P99 latency one frame at a time (a camera slower than the model), bare loop vs
    the pipeline's submit -> result, with the pipeline's queue/preprocess/inference split;
(d) the per-frame cost of the pipeline itself on a tiny model (arrays, no decode), and RSS
    after 1,000 and after 10,000 frames through it.

Blocks of every variant run in turn, round after round (ABC ABC ...), so background load
hits all alike; a ratio is the median of the per-round ratios. Not a test: it asserts
nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.runtime_overhead [--cases cls,det] [--model PATH --runtime runtime.yaml]
        [--size HxW] [--camera WxH] [--cpus 1,2] [--rounds 9] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import os
import queue
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import psutil
import yaml
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
from edge_node.runtime.preprocess import DecodeTarget, PillowDecoder
from edge_node.runtime.session import session_options
from protos.bundle.spec import parse_runtime_spec

GOAL_SERIAL = 0.97
"""Issue goal: on one core, the agent at least 0.97 of the bare serial loop doing the same work."""
GOAL_PIPELINED = 1.0
"""Issue goal: on two cores the pipelined agent beats the bare serial loop where decode is a
large share of a frame."""
DECODE_SHARE_JUDGED = 0.3
"""Decode + preprocessing at least this share of the bare serial loop's frame: judged."""
GOAL_RSS_GROWTH_MB = 5.0
"""Our reading of "flat within noise": under 5 MB between 1,000 and 10,000 frames."""

PPOCR_DET = "ch_PP-OCRv4_det_infer.onnx"
PPOCR_CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
SEED = 20261130
N_DISTINCT_FRAMES = 8
MB = 1024 * 1024


def ppocr_preprocess(size: tuple[int, int]) -> PreprocessConfig:
    """PP-OCR's det and cls: ``(x / 255 - 0.5) / 0.5`` on BGR (rapidocr's config.yaml)."""
    return PreprocessConfig(size=size, mean=(0.5,), std=(0.5,), channel_order="BGR")


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelCase:
    key: str
    name: str
    source: str
    path: Path
    preprocess: PreprocessConfig


def find_ppocr(
    model: str | None, wheel: str | None, member: str = PPOCR_DET
) -> tuple[Path | None, str]:
    """A PP-OCR model's path and where it came from, or ``(None, why not)``."""
    if model:
        return Path(model), f"--model {model}"
    if wheel:
        target = BENCH_DIR / "models" / member
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(member))
            target.write_bytes(archive.read(name))
        return target, f"{name} read from {Path(wheel).name}"
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # finds it without importing it
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "models" / member
        if path.exists():
            return path, f"installed rapidocr_onnxruntime ({path.name})"
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


def parse_hw(text: str, *, order: str = "HxW") -> tuple[int, int]:
    """``"480x640"`` -> (480, 640) (in ``order``); ``"640"`` -> (640, 640)."""
    parts = text.lower().split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not {order} (e.g. 480x640) or one side")
    return int(parts[0]), int(parts[1])


def model_cases(args: argparse.Namespace, scratch: Path) -> list[ModelCase]:
    """The cases to measure: ``--model`` (with ``--runtime``) alone, else ``--cases``."""
    size: tuple[int, int] | None = args.size
    if args.model:
        if args.runtime:
            raw = yaml.safe_load(Path(args.runtime).read_text())
            preprocess = parse_runtime_spec(raw).preprocess
            source = f"--model {args.model}, --runtime {args.runtime}"
        else:
            preprocess = PreprocessConfig()
            source = f"--model {args.model}, no --runtime: the default preprocessing"
        if size is not None:
            preprocess = replace(preprocess, size=size)
        return [ModelCase("model", Path(args.model).name, source, Path(args.model), preprocess)]
    cases = []
    for key in args.cases:
        member = {"cls": PPOCR_CLS, "det": PPOCR_DET}[key]
        path, why = find_ppocr(None, args.wheel, member)
        if key == "cls":
            case_size = size or (48, 192)
            name = "PP-OCR mobile v2 cls"
        else:
            case_size = size or args.det_size
            name = "PP-OCRv4 det"
        if path is None:
            print(f"{name} not used: {why}; using a mid-size onnx.helper CNN instead")
            stand_in = build_mid_cnn(scratch / f"mid_cnn_{key}.onnx", size=case_size[0])
            cases.append(
                ModelCase(
                    key,
                    f"mid-size CNN (stand-in for {name})",
                    f"built with onnx.helper ({why})",
                    stand_in,
                    ppocr_preprocess((case_size[0], case_size[0])),
                )
            )
            continue
        cases.append(ModelCase(key, name, why, path, ppocr_preprocess(case_size)))
    return cases


# ----------------------------------------------------------------------------- frames


def camera_frames(width: int, height: int, count: int = N_DISTINCT_FRAMES) -> list[bytes]:
    """JPEG frames (quality 85) of a camera-like scene: gradients, texture, shapes and some
    sensor noise, shifted a little from frame to frame; not noise alone (which decodes and
    compresses nothing like a camera frame)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = []
    for k in range(count):
        texture = 128 + 90 * np.sin((x + 7 * k) / 37.0) * np.cos((y - 5 * k) / 23.0)
        base = np.stack([x * 255 / width, y * 255 / height, texture], axis=-1)
        base += rng.normal(0, 4, base.shape)
        image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for i in range(8):
            left = width * (0.04 + 0.12 * i) + 3 * k
            top = height * (0.1 + 0.07 * (i % 5))
            draw.rectangle(
                [left, top, left + width * 0.08, top + height * 0.25],
                fill=(255 - 30 * i, 30 * i, 90 + 10 * k),
            )
            draw.text((left, top + height * 0.3), f"GATE {i}{k}", fill=(250, 250, 250))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return out


def arrays_for(height: int, width: int, count: int = N_DISTINCT_FRAMES) -> list[npt.NDArray[Any]]:
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


# ----------------------------------------------------------------------------- CPUs


def _all_threads_on(cpus: set[int]) -> None:
    """Every thread of this process (and so every thread started later) on ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def on_cpus(count: int) -> Iterator[set[int]]:
    """The process on the last ``count`` CPUs it may use, restored after."""
    allowed = sorted(os.sched_getaffinity(0))
    chosen = set(allowed[-count:])
    _all_threads_on(chosen)
    try:
        yield chosen
    finally:
        _all_threads_on(set(allowed))


# ----------------------------------------------------------------------------- harness


class AgentPath:
    """The agent's real path: an ``InferencePipeline`` fed by a producer (a camera) that
    keeps ``depth`` frames outstanding, so the pipeline always has the next one and none is
    dropped (the pipeline's own scheduler and result callback included)."""

    def __init__(
        self, case: ModelCase, session: SessionConfig, preprocess_threads: int, depth: int
    ) -> None:
        self.model = ModelSession.load(case.path, session, case.preprocess, label=case.key)
        self.depth = depth
        # One token per result. A C queue, not threading.Semaphore (Python, ~3 us a call):
        # the harness's own bookkeeping is not the pipeline's cost.
        self._done: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.keep_splits = False
        self.splits: list[tuple[float, float, float]] = []
        self.arrivals: list[float] = []
        self.pipeline = InferencePipeline(
            self.model,
            [StreamConfig("cam", queue_size=2 * depth)],
            SystemClock(),
            self._on_result,
            scheduler_config=SchedulerConfig(shed_after_s=None),
            preprocess_threads=preprocess_threads,
        )
        self.pipeline.start()

    def _on_result(self, result: FrameResult) -> None:
        if self.keep_splits:
            self.arrivals.append(time.perf_counter())
            self.splits.append((result.queue_s, result.preprocess_s, result.inference_s))
        self._done.put(None)

    def fps(self, frames: Sequence[object], n: int) -> float:
        done, depth = self._done.get, self.depth
        submit = self.pipeline.submit
        started = time.perf_counter()
        for i in range(n):
            if i >= depth:
                done()  # a result came back: one of the depth slots is free
            outcome = submit("cam", frames[i % len(frames)])
            if not outcome.queued:
                raise RuntimeError(f"frame not queued: {outcome}")
        for _ in range(min(n, depth)):
            done()
        elapsed = time.perf_counter() - started
        stats = self.pipeline.stats()["cam"]
        if stats.dropped or stats.failed or stats.bad:
            raise RuntimeError(f"frames lost in the pipeline: {stats}")
        return n / elapsed

    def latencies(
        self, frames: Sequence[object], n: int
    ) -> tuple[list[float], list[tuple[float, float, float]]]:
        """One frame at a time: submit, wait for its result; end-to-end seconds per frame."""
        self.splits.clear()
        self.arrivals.clear()
        self.keep_splits = True
        e2e = []
        for i in range(n):
            started = time.perf_counter()
            self.pipeline.submit("cam", frames[i % len(frames)])
            self._done.get()
            e2e.append(self.arrivals[-1] - started)
        self.keep_splits = False
        return e2e, list(self.splits)

    def close(self) -> None:
        self.pipeline.stop(timeout_s=60)


class BareLoop:
    """The same work by hand in one loop: Pillow decode, the same ``Preprocessor``, ``run``."""

    def __init__(self, case: ModelCase, session: SessionConfig, *, reduced: bool) -> None:
        self.ort = ort.InferenceSession(
            str(case.path),
            sess_options=session_options(session),
            providers=["CPUExecutionProvider"],
        )
        self.input_name = self.ort.get_inputs()[0].name
        self.output_names = [o.name for o in self.ort.get_outputs()]
        # the agent's resolved preprocessing (size filled in from the model if fixed), and
        # the output decoder the agent runs (``decoded``: the loop decodes the outputs too)
        self.session = ModelSession.load(case.path, session, case.preprocess)
        self.preprocessor = self.session.preprocessor
        self.decoder = PillowDecoder(reduce=reduced)
        self.target = DecodeTarget.of(self.preprocessor)

    def decoded_fps(self, frames: Sequence[bytes], n: int) -> float:
        """As :meth:`fps`, and each frame's outputs decoded by the version's decoder (what
        the agent also does for every frame: its results are decoded, not raw tensors)."""
        run, name, pre, decode, target = (
            self.ort.run,
            self.input_name,
            self.preprocessor,
            self.decoder.decode,
            self.target,
        )
        names, outputs_of = self.output_names, self.session.decode
        started = time.perf_counter()
        for i in range(n):
            image = decode(frames[i % len(frames)], target)
            outputs = run(None, {name: pre(image, reuse=True)})
            outputs_of(dict(zip(names, outputs, strict=True)), image.shape[0], image.shape[1])
        return n / (time.perf_counter() - started)

    def fps(self, frames: Sequence[bytes], n: int) -> float:
        run, name, pre, decode, target = (
            self.ort.run,
            self.input_name,
            self.preprocessor,
            self.decoder.decode,
            self.target,
        )
        started = time.perf_counter()
        for i in range(n):
            run(None, {name: pre(decode(frames[i % len(frames)], target), reuse=True)})
        return n / (time.perf_counter() - started)

    def run_fps(self, tensors: Sequence[npt.NDArray[Any]], n: int) -> float:
        run, name = self.ort.run, self.input_name
        started = time.perf_counter()
        for i in range(n):
            run(None, {name: tensors[i % len(tensors)]})
        return n / (time.perf_counter() - started)

    def latencies(self, frames: Sequence[bytes], n: int) -> list[float]:
        out = []
        for i in range(n):
            started = time.perf_counter()
            self.fps([frames[i % len(frames)]], 1)
            out.append(time.perf_counter() - started)
        return out


def _block(measure: Callable[[], float], n: int) -> tuple[float, float]:
    """``(frames/s, CPU µs per frame)``; CPU is this process's, all threads (ORT's included)."""
    cpu = time.process_time()
    fps = measure()
    return fps, (time.process_time() - cpu) / n * 1e6


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / MB


# ----------------------------------------------------------------------------- measuring


def measure_setting(
    case: ModelCase, frames: Sequence[bytes], cores: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One model on ``cores`` CPUs: every variant, ABC rounds, ratios to the bare serial loop."""
    session = SessionConfig(intra_op_threads=1, inter_op_threads=1, allow_spinning=args.spin)
    with on_cpus(cores) as cpus:
        same = BareLoop(case, session, reduced=True)
        full = BareLoop(case, session, reduced=False)
        tensors = [same.preprocessor(same.decoder.decode(f, same.target)) for f in frames]
        agents = {"agent_inline": AgentPath(case, session, 0, args.depth)}
        if cores > 1:
            agents["agent_staged"] = AgentPath(case, session, 1, args.depth)
        wide = (
            BareLoop(case, replace(session, intra_op_threads=cores), reduced=True)
            if cores > 1
            else None
        )
        try:
            variants: dict[str, Callable[[int], float]] = {
                "bare_serial": lambda n: same.fps(frames, n),
                "bare_serial_decoded": lambda n: same.decoded_fps(frames, n),
                "bare_full_decode": lambda n: full.fps(frames, n),
                "bare_run_only": lambda n: same.run_fps(tensors, n),
                **{
                    name: (lambda n, a=agent: a.fps(frames, n))  # type: ignore[misc]
                    for name, agent in agents.items()
                },
            }
            if wide is not None:
                variants[f"bare_serial_{cores}_intra_op"] = lambda n: wide.fps(frames, n)
            # warm-up (arenas, caches, threads), then size blocks to about --block-s each
            warm = max(3, args.min_frames)
            for measure in variants.values():
                measure(warm)
            started = time.perf_counter()
            same.fps(frames, warm)
            per_frame = (time.perf_counter() - started) / warm
            n = max(args.min_frames, round(args.block_s / per_frame))
            blocks: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
            names = list(variants)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate order
                    blocks[name].append(_block(lambda m=variants[name]: m(n), n))  # type: ignore[misc]
            fps = {k: [b[0] for b in v] for k, v in blocks.items()}
            cpu = {k: median([b[1] for b in v]) for k, v in blocks.items()}

            def ratio(name: str, anchor: str = "bare_serial") -> dict[str, Any]:
                rs = [a / b for a, b in zip(fps[name], fps[anchor], strict=True)]
                return {"median": median(rs), "p25": pct(rs, 25), "p75": pct(rs, 75)}

            result: dict[str, Any] = {
                "cores": cores,
                "cpus": sorted(cpus),
                "intra_op_threads": 1,
                "allow_spinning": args.spin,
                "frames_per_block": n,
                "rounds": args.rounds,
                "fps": {k: median(v) for k, v in fps.items()},
                "fps_by_round": fps,
                "cpu_us_per_frame": cpu,
                "ratios": {name: ratio(name) for name in variants if name != "bare_serial"},
                # the part of the bare serial loop that is not run(): decode + preprocess
                "decode_share": 1
                - median(
                    [s / r for s, r in zip(fps["bare_serial"], fps["bare_run_only"], strict=True)]
                ),
                "decoded_shape": list(same.decoder.decode(frames[0], same.target).shape),
            }
            if cores > 1:
                lat: dict[str, Any] = {"frames": args.latency_frames}
                warm_lat = max(3, args.latency_frames // 10)
                same.latencies(frames, warm_lat)
                lat["bare_serial"] = summary(same.latencies(frames, args.latency_frames))
                for name, agent in agents.items():
                    agent.latencies(frames, warm_lat)
                    e2e, splits = agent.latencies(frames, args.latency_frames)
                    lat[name] = summary(e2e) | {
                        "queue": summary([q for q, _, _ in splits]),
                        "preprocess": summary([p for _, p, _ in splits]),
                        "inference": summary([i for _, _, i in splits]),
                    }
                result["latency"] = lat
            result["rss_mb"] = rss_mb()
            return result
        finally:
            for agent in agents.values():
                agent.close()


def summary(values: Sequence[float]) -> dict[str, float]:
    return {f"p{q}_ms": pct(values, q) * 1000 for q in (50, 95, 99)} | {
        "max_ms": max(values) * 1000 if values else float("nan")
    }


def measure_tiny(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """(d) The pipeline's own cost per frame (arrays, no decode) on one core, and RSS."""
    case = ModelCase(
        "tiny",
        "tiny CNN 32x32",
        "built with onnx.helper",
        build_tiny(scratch / "tiny.onnx"),
        PreprocessConfig(),
    )
    session = SessionConfig(intra_op_threads=1, inter_op_threads=1)
    frames = arrays_for(32, 32)
    with on_cpus(1):
        bare = BareLoop(case, session, reduced=True)
        tensors = [bare.preprocessor(f) for f in frames]
        agent = AgentPath(case, session, 0, depth=16)
        try:
            gc.collect()
            rss = {"before_first_frame_mb": rss_mb()}
            agent.fps(frames, 1000)
            rss["after_1000_mb"] = rss_mb()
            agent.fps(frames, 9000)
            rss["after_10000_mb"] = rss_mb()
            rss["growth_mb"] = rss["after_10000_mb"] - rss["after_1000_mb"]
            pipe, run = [], []
            for _ in range(args.rounds):
                run.append(bare.run_fps(tensors, args.tiny_frames))
                pipe.append(agent.fps(frames, args.tiny_frames))
            return {
                "frames_per_round": args.tiny_frames,
                "bare_run_us": 1e6 / median(run),
                "pipeline_us": 1e6 / median(pipe),
                "overhead_us": 1e6 / median(pipe) - 1e6 / median(run),
                "rss": rss,
            }
        finally:
            agent.close()


@dataclass
class Results:
    """The raw measurements; the machine, the load and the goals are the report's."""

    cases: list[dict[str, Any]] = field(default_factory=list)
    tiny: dict[str, Any] = field(default_factory=dict)


def onnx_machine(**extra: Any) -> dict[str, Any]:
    """The machine, the libraries the ONNX benchmarks' figures depend on, and how this
    process was scheduled."""
    from PIL import __version__ as pillow

    return machine(
        onnxruntime=ort.__version__,
        numpy=np.__version__,
        pillow=pillow,
        scheduling=scheduling(),
        **extra,
    )


def scheduling() -> dict[str, Any]:
    """This process's nice and, where the kernel groups processes by session (autogroup),
    its group (``/autogroup-N nice K``): with autogroup on, a nice ranks a process only
    within its own session, and every other session's group gets an equal share."""
    info: dict[str, Any] = {"nice": os.getpriority(os.PRIO_PROCESS, 0)}
    with contextlib.suppress(OSError):
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
        info["autogroup_enabled"] = enabled == "1"
        info["autogroup"] = Path("/proc/self/autogroup").read_text().strip()
    return info


def scheduling_note(info: dict[str, Any]) -> str | None:
    """A warning when a negative nice was asked for but the autogroup's nice is 0: other
    sessions' processes then share the CPUs with this one at equal weight."""
    group = str(info.get("autogroup", ""))
    if info.get("nice", 0) < 0 and info.get("autogroup_enabled") and group.endswith(" nice 0"):
        return (
            f"note: nice {info['nice']} ranks this process only within its session "
            f"({group}, autogroup on): other sessions share the CPUs at equal weight; "
            "see docs/benchmarks.md (bench.runtime_overhead) to raise the group's priority"
        )
    return None


def run(args: argparse.Namespace) -> Results:
    results = Results()
    scratch = BENCH_DIR / "runtime"
    width, height = args.camera
    frames = camera_frames(width, height)
    available = len(os.sched_getaffinity(0))
    for case in model_cases(args, scratch):
        entry: dict[str, Any] = {
            "key": case.key,
            "model": case.name,
            "source": case.source,
            "preprocess": asdict(case.preprocess),
            "camera": [width, height],
            "jpeg_kb": median([len(f) / 1024 for f in frames]),
            "settings": {},
        }
        for cores in args.cpus:
            if cores > available:
                print(f"{case.name}: {cores} cores asked, {available} usable: skipped")
                continue
            print(f"{case.name} on {cores} core(s) ...", flush=True)
            entry["settings"][str(cores)] = measure_setting(case, frames, cores, args)
        results.cases.append(entry)
    print("tiny model: the pipeline's own cost, RSS ...", flush=True)
    results.tiny = measure_tiny(args, scratch)
    return results


# ----------------------------------------------------------------------------- report


def print_results(results: Results, report: Report) -> None:
    m = report.machine
    print()
    print(
        f"machine: {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, onnxruntime "
        f"{m['onnxruntime']}, numpy {m['numpy']}, Pillow {m['pillow']}; {report.load_line()}"
    )
    note = scheduling_note(m["scheduling"])
    if note:
        print(note)
    for case in results.cases:
        size = case["preprocess"]["size"]
        print(
            f"\n{case['model']} ({case['source']}): input {size}, camera "
            f"{case['camera'][0]}x{case['camera'][1]} JPEG ~{case['jpeg_kb']:.0f} KB"
        )
        for cores, s in case["settings"].items():
            fps, cpu, ratios = s["fps"], s["cpu_us_per_frame"], s["ratios"]
            print(
                f"  {cores} core(s) (CPUs {s['cpus']}, 1 intra-op thread), {s['rounds']} rounds "
                f"of {s['frames_per_block']} frames; decoded at {s['decoded_shape'][:2]}; decode"
                f" + preprocess = {s['decode_share']:.0%} of the bare serial loop's frame"
            )
            rows = [("variant", "frames/s", "CPU ms/frame", "vs bare serial (IQR)")]
            for name in fps:
                r = ratios.get(name)
                rows.append(
                    (
                        name,
                        f"{fps[name]:.1f}",
                        f"{cpu[name] / 1000:.2f}",
                        "1 (anchor)"
                        if r is None
                        else f"{r['median']:.3f} ({r['p25']:.3f}-{r['p75']:.3f})",
                    )
                )
            widths = [max(len(row[i]) for row in rows) for i in range(4)]
            for i, row in enumerate(rows):
                print("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
                if i == 0:
                    print("    " + "  ".join("-" * w for w in widths))
            lat = s.get("latency")
            if lat:
                b = lat["bare_serial"]
                print(
                    f"    latency one frame at a time, P50/P95/P99 ms: bare serial "
                    f"{b['p50_ms']:.2f}/{b['p95_ms']:.2f}/{b['p99_ms']:.2f}"
                )
                for name in ("agent_inline", "agent_staged"):
                    if name in lat:
                        a = lat[name]
                        print(
                            f"      {name}: {a['p50_ms']:.2f}/{a['p95_ms']:.2f}/{a['p99_ms']:.2f}"
                            f" (P50 queue {a['queue']['p50_ms']:.2f}, preprocess "
                            f"{a['preprocess']['p50_ms']:.2f}, inference "
                            f"{a['inference']['p50_ms']:.2f})"
                        )
    t = results.tiny
    print(
        f"\ntiny model, 1 core: pipeline {t['pipeline_us']:.1f} us/frame vs bare run "
        f"{t['bare_run_us']:.1f} us (+{t['overhead_us']:.1f} us); RSS "
        f"{t['rss']['after_1000_mb']:.1f} -> {t['rss']['after_10000_mb']:.1f} MB "
        f"after 1,000 -> 10,000 frames"
    )


def add_figures(results: Results, report: Report) -> None:
    for case in results.cases:
        settings = case["settings"]
        if "1" in settings:
            s = settings["1"]
            r = s["ratios"]["agent_inline"]["median"]
            report.figure(
                f"{case['model']}, 1 core, agent (inline) frames/s",
                s["fps"]["agent_inline"],
                "fps",
                anchor=s["fps"]["bare_serial"],
                anchor_name="bare serial loop, same work",
                goal=f"median per-round ratio {r:.3f} >= {GOAL_SERIAL}",
                met=r >= GOAL_SERIAL,
            )
            d = s["ratios"]["agent_inline"]["median"] / s["ratios"]["bare_serial_decoded"]["median"]
            report.figure(
                f"{case['model']}, 1 core, agent (inline) vs a loop that also decodes outputs",
                s["fps"]["agent_inline"],
                "fps",
                anchor=s["fps"]["bare_serial_decoded"],
                anchor_name="bare serial loop + the version's output decoder",
                goal=f"report (ratio of medians {d:.3f})",
                met=None,
            )
        for cores, s in settings.items():
            if cores == "1" or "agent_staged" not in s["fps"]:
                continue
            r = s["ratios"]["agent_staged"]["median"]
            judged = s["decode_share"] >= DECODE_SHARE_JUDGED
            report.figure(
                f"{case['model']}, {cores} cores, agent (staged) frames/s",
                s["fps"]["agent_staged"],
                "fps",
                anchor=s["fps"]["bare_serial"],
                anchor_name="bare serial loop, same work",
                goal=(
                    f"median per-round ratio {r:.3f} > {GOAL_PIPELINED} (decode "
                    f"{s['decode_share']:.0%} of a frame)"
                    if judged
                    else f"report (decode {s['decode_share']:.0%} of a frame: not judged)"
                ),
                met=(r > GOAL_PIPELINED) if judged else None,
            )
    growth = results.tiny["rss"]["growth_mb"]
    report.figure(
        "RSS growth 1,000 -> 10,000 frames",
        growth,
        "MB",
        goal=f"< {GOAL_RSS_GROWTH_MB:.0f} MB",
        met=growth < GOAL_RSS_GROWTH_MB,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", help="any single-image-input ONNX model (instead of PP-OCR)")
    parser.add_argument("--runtime", help="its runtime.yaml (preprocess + output), as pushed")
    parser.add_argument("--wheel", help="a downloaded rapidocr_onnxruntime wheel to read from")
    parser.add_argument(
        "--cases",
        type=lambda v: [c for c in v.split(",") if c],
        default=["cls", "det"],
        help="PP-OCR models to measure: cls, det (default both)",
    )
    parser.add_argument(
        "--size", type=parse_hw, default=None, help="model input HxW (a dynamic model's size)"
    )
    parser.add_argument(
        "--det-size", type=parse_hw, default=(480, 640), help="PP-OCR det input HxW"
    )
    parser.add_argument(
        "--camera",
        type=lambda v: parse_hw(v, order="WxH"),
        default=(640, 480),
        help="camera frame WxH (JPEG)",
    )
    parser.add_argument(
        "--cpus",
        type=lambda v: [int(c) for c in v.split(",") if c],
        default=[1, 2],
        help="core counts to measure (1: the serial goal, 2: the pipelined one)",
    )
    parser.add_argument("--spin", action="store_true", help="allow_spinning=True (ADR 0011)")
    parser.add_argument("--rounds", type=int, default=9, help="ABC rounds per setting")
    parser.add_argument("--block-s", type=float, default=0.6, help="seconds per block")
    parser.add_argument("--min-frames", type=int, default=5, help="frames per block at least")
    parser.add_argument("--depth", type=int, default=4, help="frames kept outstanding")
    parser.add_argument("--latency-frames", type=int, default=200)
    parser.add_argument("--tiny-frames", type=int, default=2000, help="tiny frames per round")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={
            "det_size": "96x128",
            "rounds": 2,
            "block_s": 0.05,
            "min_frames": 2,
            "latency_frames": 10,
            "tiny_frames": 200,
        },
    )
    if isinstance(args.det_size, str):  # --quick sets the text
        args.det_size = parse_hw(args.det_size)
    if args.runtime and not args.model:
        parser.error("--runtime goes with --model")

    report = Report("runtime_overhead", machine=onnx_machine())
    results = run(args)
    with contextlib.suppress(OSError):
        for leftover in (BENCH_DIR / "runtime").glob("*.onnx"):
            leftover.unlink()
    add_figures(results, report)
    print_results(results, report)
    return report.finish(args, asdict(results))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
