"""Hot swap under a camera: per-frame latency in steady state and around model swaps.

One process, one CPU (pinned, like the other benches), the agent's real pipeline
(``InferencePipeline``, one stream with the default queue of 2, latest frame wins) fed by a
camera thread at a steady frame rate. After a warm-up, a steady block with no swap (the
anchor), then ``--swaps`` hot swaps every ``--every`` seconds between two versions of the
model, each done as the agent does it: load the new ``ModelSession`` in another thread while
the old one serves, then ``swap_session``. Reports:

- P50/P95/P99 of submit → result latency in the steady block;
- the same for the frames of the *swap windows* — a window runs from the swap request (the
  load starting) to the K-th frame served by the new session, and holds every frame
  submitted meanwhile — and for the whole swap phase;
- frames lost to a swap: submitted in a window and never answered (a queue-full drop evicts
  an older frame) or failed — the issue wants none; drops elsewhere are counted apart;
- the verdict: P99 in the windows at most 1.5 x the steady P99 (issue 4 §5).

``--warm-up on|alternate`` prepares the new session before the swap (runs it on a frame,
in its loading thread, optionally at ``--loader-nice``), to compare with the plain swap.

The model is PP-OCRv4's text detector from the ``rapidocr-onnxruntime`` wheel (the ``bench``
extra) found as in ``bench.runtime_overhead``, else its stand-in CNN. The two "versions"
are two copies of the same file: a retrained model costs the same to load and warm up.
Not a test: it asserts nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.hot_swap [--model PATH | --wheel PATH] [--fps 8] [--swaps 12] [--every 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._report import Report, parse_benchmark_args
from bench._util import BENCH_DIR, can_pin, pct, pin_self
from bench.runtime_overhead import build_mid_cnn, find_ppocr, frames_for, onnx_machine
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

GOAL_FACTOR = 1.5
"""Issue goal: P99 during a hot swap at most 1.5 x the steady P99."""


@dataclass
class Swap:
    label: str
    requested: float
    warmed: bool = False
    loaded: float = 0.0
    swapped: float = 0.0
    closed_old: bool = False


@dataclass
class Served:
    frame_id: int
    arrived: float
    model: str
    queue_s: float
    inference_s: float


class Camera:
    """Submits a frame every 1/fps seconds on an absolute schedule (no drift)."""

    def __init__(self, pipeline: InferencePipeline, frames: Sequence[Any], fps: float) -> None:
        self._pipeline = pipeline
        self._frames = frames
        self._period = 1.0 / fps
        self._stop = threading.Event()
        self.submitted: dict[int, float] = {}
        self.refused: list[str] = []
        self.missed_ticks = 0
        self._thread = threading.Thread(target=self._run, name="camera", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        start = time.perf_counter()
        tick = 0
        while not self._stop.is_set():
            delay = start + tick * self._period - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                return
            at = time.perf_counter()
            outcome = self._pipeline.submit("cam", self._frames[tick % len(self._frames)])
            if outcome.queued:
                self.submitted[outcome.frame_id] = at
            else:
                self.refused.append(str(outcome.reason))
            # A camera does not catch up: ticks this thread slept through are lost
            # (counted), not submitted in a burst.
            due = int((time.perf_counter() - start) / self._period) + 1
            self.missed_ticks += max(0, due - tick - 1)
            tick = max(tick + 1, due)


@dataclass
class Results:
    """The raw measurements; the machine, the load and the goals are the report's."""

    model: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    steady: dict[str, float] = field(default_factory=dict)
    windows: dict[str, float] = field(default_factory=dict)
    windows_by_warm_up: dict[str, dict[str, float]] = field(default_factory=dict)
    outside_windows: dict[str, float] = field(default_factory=dict)
    swap_phase: dict[str, float] = field(default_factory=dict)
    swaps: dict[str, Any] = field(default_factory=dict)
    losses: dict[str, Any] = field(default_factory=dict)
    timeline: list[tuple[float, float, float, float, str]] = field(default_factory=list)
    """Per frame: submitted (s since the steady block), latency, queue and inference (ms;
    -1 if unanswered), model label."""


def _major_faults() -> int:
    """Page faults of this process that waited for the disk (e.g. code pages the kernel
    dropped under memory pressure): a stall they explain is the machine's."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def load_session(
    path: Path,
    session_config: SessionConfig,
    preprocess: PreprocessConfig,
    *,
    label: str,
    warm_input: Any,
    warm_runs: int,
    nice: int,
    swap: Swap,
) -> ModelSession:
    """Load (and optionally warm up) the next version in a thread of its own, as the agent
    loads in a worker thread; with `nice`, that thread runs at a lower priority (Linux
    applies a thread's nice value to that thread alone), so the load takes the CPU the
    serving frames leave idle."""
    out: list[ModelSession] = []

    def work() -> None:
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        session = ModelSession.load(path, session_config, preprocess, label=label)
        swap.loaded = time.perf_counter()
        if warm_input is not None:  # before it takes frames, while the old session serves
            batch = session.preprocessor(warm_input)
            for _ in range(warm_runs):
                session.run(batch)
        out.append(session)

    thread = threading.Thread(target=work, name=f"load-{label}")
    thread.start()
    thread.join()
    if not out:
        raise RuntimeError(f"loading {label} failed")
    return out[0]


def summary(values: Sequence[float]) -> dict[str, float]:
    out = {f"p{q}_ms": pct(values, q) * 1000 for q in (50, 95, 99)}
    return out | {"max_ms": max(values) * 1000 if values else float("nan"), "frames": len(values)}


def run(args: argparse.Namespace) -> Results:
    cpu = None if args.cpu < 0 or not can_pin() else args.cpu
    if cpu is None and args.cpu >= 0:
        print("cannot pin to one CPU here; running unpinned")
    pin_self(cpu)
    report = Results()
    threads = args.threads or len(os.sched_getaffinity(0))
    scratch = BENCH_DIR / "hot_swap"
    scratch.mkdir(parents=True, exist_ok=True)
    session_config = SessionConfig(intra_op_threads=threads, inter_op_threads=1)
    path, why = find_ppocr(args.model, args.wheel)
    if path is not None:
        name, source = "PP-OCRv4 det", why
        preprocess = PreprocessConfig(
            size=(args.size, args.size), mean=(0.5,), std=(0.5,), channel_order="BGR"
        )
    else:
        print(f"PP-OCR model not used: {why}; using a mid-size onnx.helper CNN instead")
        name, source = "mid-size CNN (stand-in)", f"built with onnx.helper ({why})"
        path = build_mid_cnn(scratch / "mid_cnn.onnx")
        preprocess = PreprocessConfig(mean=(0.5,), std=(0.5,))
    versions = [scratch / "v1.onnx", scratch / "v2.onnx"]
    for version in versions:
        shutil.copyfile(path, version)
    report.model = {"name": name, "source": source}

    results: list[Served] = []
    lock = threading.Lock()

    def on_result(result: FrameResult) -> None:
        served = Served(
            result.frame_id,
            time.perf_counter(),
            result.model,
            result.queue_s,
            result.inference_s,
        )
        with lock:
            results.append(served)

    first = ModelSession.load(versions[0], session_config, preprocess, label="v1#0")
    size = first.preprocess.size
    assert size is not None
    frames = frames_for(*size)
    stream = StreamConfig("cam", queue_size=args.queue)
    pipeline = InferencePipeline(
        first, [stream], SystemClock(), on_result, scheduler_config=SchedulerConfig()
    )
    pipeline.start()
    camera = Camera(pipeline, frames, args.fps)
    report.settings = {
        "fps": args.fps,
        "queue_size": args.queue,
        "intra_op_threads": threads,
        "warmup_s": args.warmup,
        "steady_s": args.steady,
        "swaps": args.swaps,
        "every_s": args.every,
        "window_first_k": args.k,
        "warm_up": args.warm_up,
        "warm_runs": args.warm_runs,
        "loader_nice": args.loader_nice,
        "input": list(size),
        "pinned_cpu": cpu,
    }
    print(
        f"{name}: {source}; input {list(size)}, {args.fps:g} fps, queue {args.queue}, "
        f"intra_op_threads={threads}, pinned to CPU {cpu}"
    )
    swaps: list[Swap] = []
    retirements = []
    try:
        camera.start()
        time.sleep(args.warmup)
        steady_from = time.perf_counter()
        missed_before = camera.missed_ticks
        faults_before = _major_faults()
        time.sleep(args.steady)
        steady_to = time.perf_counter()
        steady_missed = camera.missed_ticks - missed_before
        steady_faults = _major_faults() - faults_before
        for k in range(1, args.swaps + 1):
            prepared = args.warm_up == "on" or (args.warm_up == "alternate" and k % 2 == 0)
            swap = Swap(label=f"v{k % 2 + 1}#{k}", requested=time.perf_counter(), warmed=prepared)
            session = load_session(
                versions[k % 2],
                session_config,
                preprocess,
                label=swap.label,
                warm_input=frames[0] if prepared else None,
                warm_runs=args.warm_runs,
                nice=args.loader_nice if prepared else 0,
                swap=swap,
            )
            retirements.append(pipeline.swap_session(session))
            swap.swapped = time.perf_counter()
            swaps.append(swap)
            time.sleep(max(0.0, swap.requested + args.every - time.perf_counter()))
        swap_phase_to = time.perf_counter()
        swap_faults = _major_faults() - faults_before - steady_faults
        camera.stop()
        for retirement in retirements:
            retirement.wait(30)
        time.sleep(0.5)
    finally:
        camera.stop()
        pipeline.stop(timeout_s=30)

    for swap, retirement in zip(swaps, retirements, strict=True):
        swap.closed_old = retirement.done
    submitted = dict(camera.submitted)
    with lock:
        served = {r.frame_id: r for r in results}
    latency = {fid: served[fid].arrived - at for fid, at in submitted.items() if fid in served}

    def frames_between(lo: float, hi: float) -> list[int]:
        return [fid for fid, at in submitted.items() if lo <= at < hi]

    window_frames: set[int] = set()
    warm_frames: set[int] = set()
    cold_frames: set[int] = set()
    window_info = []
    for index, swap in enumerate(swaps):
        next_request = swaps[index + 1].requested if index + 1 < len(swaps) else swap_phase_to
        by_new = sorted(
            (fid for fid, r in served.items() if r.model == swap.label),
        )
        # Short of K frames by the end of the run: the window lasts to the end.
        end = swap_phase_to if len(by_new) < args.k else submitted[by_new[args.k - 1]] + 1e-9
        end = min(end, next_request)  # windows never overlap
        ids = frames_between(swap.requested, end)
        window_frames.update(ids)
        (warm_frames if swap.warmed else cold_frames).update(ids)
        first_new = served[by_new[0]] if by_new else None
        window_info.append(
            {
                "label": swap.label,
                "load_ms": (swap.loaded - swap.requested) * 1000,
                "warm_up_and_swap_call_ms": (swap.swapped - swap.loaded) * 1000,
                "window_frames": len(ids),
                "window_p_max_ms": max((latency[f] for f in ids if f in latency), default=0) * 1000,
                "first_new_inference_ms": first_new.inference_s * 1000 if first_new else None,
                "old_session_closed": swap.closed_old,
                "warmed_up": swap.warmed,
            }
        )
    steady_ids = frames_between(steady_from, steady_to)
    phase_ids = frames_between(swaps[0].requested if swaps else steady_to, swap_phase_to)
    outside = [f for f in phase_ids if f not in window_frames]
    report.steady = summary([latency[f] for f in steady_ids if f in latency])
    report.windows = summary([latency[f] for f in sorted(window_frames) if f in latency])
    if warm_frames and cold_frames:
        report.windows_by_warm_up = {
            "cold": summary([latency[f] for f in sorted(cold_frames) if f in latency]),
            "warmed": summary([latency[f] for f in sorted(warm_frames) if f in latency]),
        }
    report.outside_windows = summary([latency[f] for f in outside if f in latency])
    report.swap_phase = summary([latency[f] for f in phase_ids if f in latency])
    steady_inference = [served[f].inference_s for f in steady_ids if f in served]
    report.steady["inference_p50_ms"] = pct(steady_inference, 50) * 1000
    report.swaps = {
        "done": len(swaps),
        "load_ms_median": float(np.median([w["load_ms"] for w in window_info]))
        if window_info
        else float("nan"),
        "each": window_info,
    }
    report.timeline = [
        (
            round(at - steady_from, 4),
            round(latency[fid] * 1000, 2) if fid in latency else -1.0,
            round(served[fid].queue_s * 1000, 2) if fid in served else -1.0,
            round(served[fid].inference_s * 1000, 2) if fid in served else -1.0,
            served[fid].model if fid in served else "",
        )
        for fid, at in sorted(submitted.items())
    ]
    report.swaps["requested_s"] = [round(w.requested - steady_from, 4) for w in swaps]
    stats = pipeline.stats()["cam"]
    unanswered_in_windows = sorted(f for f in window_frames if f not in served)
    report.losses = {
        "submitted": len(submitted),
        "refused_at_admission": len(camera.refused),
        "camera_missed_ticks": camera.missed_ticks,
        "camera_missed_ticks_steady": steady_missed,
        "major_page_faults_steady": steady_faults,
        "major_page_faults_swap_phase": swap_faults,
        "dropped": dict(stats.dropped),
        "failed": dict(stats.failed),
        "bad": dict(stats.bad),
        "unanswered": len([f for f in submitted if f not in served]),
        "unanswered_in_windows": len(unanswered_in_windows),
    }
    # A frame lost to a swap is one submitted in a window that never got a result (a
    # queue_full drop evicts an older queued frame), or one that failed; drops outside the
    # windows are the machine's (a starved worker), and are reported, not judged.
    lost_to_swaps = len(unanswered_in_windows) + sum(stats.failed.values()) + len(camera.refused)
    report.losses["lost_to_swaps"] = lost_to_swaps
    report.losses["unanswered_steady"] = len([f for f in steady_ids if f not in served])
    with_leftovers = scratch.glob("*.onnx")
    for leftover in with_leftovers:
        leftover.unlink(missing_ok=True)
    return report


def print_results(report: Results, written: Report) -> None:
    m, s = written.machine, report.settings
    print()
    print(
        f"machine: {m['cpus']} CPUs ({m['processor']}), pinned to CPU {s['pinned_cpu']}, "
        f"onnxruntime {m['onnxruntime']}; {written.load_line()}"
    )
    print(
        f"model: {report.model['name']} ({report.model['source']}), {s['fps']:g} fps, "
        f"{report.swaps['done']} swaps every {s['every_s']:g} s, window = swap request -> "
        f"frame {s['window_first_k']} of the new session"
    )
    rows = [("frames", "n", "P50 ms", "P95 ms", "P99 ms", "max ms")]
    for label, block in (
        ("steady (no swap)", report.steady),
        ("swap windows", report.windows),
        *(
            (f"  of them {kind}", block)
            for kind, block in (
                ("cold (no warm-up)", report.windows_by_warm_up.get("cold")),
                (
                    f"warmed up ({s['warm_runs']} runs, loader nice {s['loader_nice']})",
                    report.windows_by_warm_up.get("warmed"),
                ),
            )
            if block
        ),
        ("swap phase, outside windows", report.outside_windows),
        ("swap phase, all frames", report.swap_phase),
    ):
        rows.append(
            (
                label,
                str(int(block["frames"])),
                f"{block['p50_ms']:.1f}",
                f"{block['p95_ms']:.1f}",
                f"{block['p99_ms']:.1f}",
                f"{block['max_ms']:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    loads = [w["load_ms"] for w in report.swaps["each"]]
    firsts = [
        w["first_new_inference_ms"] for w in report.swaps["each"] if w["first_new_inference_ms"]
    ]
    print(
        f"    session load ms: median {report.swaps['load_ms_median']:.0f} "
        f"(min {min(loads, default=0):.0f}, max {max(loads, default=0):.0f}); first inference "
        f"on the new session ms: median {float(np.median(firsts)) if firsts else float('nan'):.1f} "
        f"vs steady inference P50 {report.steady['inference_p50_ms']:.1f}"
    )
    print(f"    losses: {report.losses}")
    if report.losses["camera_missed_ticks_steady"] or report.losses["unanswered_steady"]:
        print(
            "    WARNING: frames were late or lost in the steady block, with no swap: something "
            "else held this CPU; the steady anchor measures the machine, not the pipeline"
        )
    if report.losses["camera_missed_ticks"] > report.losses["camera_missed_ticks_steady"]:
        print(
            "    WARNING: the camera thread slept through ticks during the swap phase (nothing "
            "in a swap holds the GIL for a frame period): the machine stalled this process"
        )
    ratio = report.windows["p99_ms"] / report.steady["p99_ms"]
    interleaved = report.windows["p99_ms"] / report.outside_windows["p99_ms"]
    print(f"    P99 in swap windows vs frames between them (same minutes): {interleaved:.2f} x")
    print(
        f"P99 in swap windows {report.windows['p99_ms']:.1f} ms = {ratio:.2f} x steady "
        f"{report.steady['p99_ms']:.1f} ms (goal <= {GOAL_FACTOR}); frames lost to swaps: "
        f"{report.losses['lost_to_swaps'] or 'none'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", help="path of the PP-OCR detection model (or any image model)")
    parser.add_argument("--wheel", help="a downloaded rapidocr_onnxruntime wheel to read it from")
    parser.add_argument("--size", type=int, default=640, help="input side for a dynamic model")
    parser.add_argument("--fps", type=float, default=8.0, help="camera frame rate")
    parser.add_argument("--queue", type=int, default=2, help="the stream's queue size")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--steady", type=float, default=30.0, help="seconds of steady anchor")
    parser.add_argument("--swaps", type=int, default=12)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between swaps")
    parser.add_argument(
        "--k", type=int, default=5, help="window ends at the new session's K-th frame"
    )
    parser.add_argument(
        "--warm-up",
        choices=("off", "on", "alternate"),
        default="off",
        help="run the new session on a frame before the swap (alternate: every other swap)",
    )
    parser.add_argument("--warm-runs", type=int, default=2, help="runs per warm-up")
    parser.add_argument(
        "--loader-nice",
        type=int,
        default=0,
        help="nice value of the loading thread when warming up",
    )
    parser.add_argument(
        "--cpu", type=int, default=-2, help="pin to this CPU (-1: no pin; default: the last)"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: CPUs we may use)"
    )
    args = parse_benchmark_args(
        parser, argv, quick={"size": 64, "warmup": 1.0, "steady": 3.0, "swaps": 2, "every": 1.0}
    )
    if args.cpu == -2:
        args.cpu = max(os.sched_getaffinity(0))
    written = Report("hot_swap", machine=onnx_machine())
    report = run(args)
    written.figure(
        "P99 in swap windows",
        report.windows["p99_ms"],
        "ms",
        anchor=report.steady["p99_ms"],
        anchor_name="steady, no swap",
        goal=f"<= {GOAL_FACTOR} x the anchor",
        met=report.windows["p99_ms"] <= GOAL_FACTOR * report.steady["p99_ms"],
    )
    written.figure(
        "frames lost to swaps",
        float(report.losses["lost_to_swaps"]),
        "frames",
        goal="none",
        met=report.losses["lost_to_swaps"] == 0,
    )
    print_results(report, written)
    return written.finish(args, asdict(report))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
