"""Telemetry cost on the node: per-sample recording cost and CPU share at 200 frames/s.

Measures, in one process and one run:

(a) tight loops, ns per call (median of rounds): ``Telemetry.record_frame`` (what the
    pipeline's worker thread pays per frame) beside two anchors measured the same way, an
    empty method with the same arguments and a bare ``deque.append`` of the same tuple;
    then the fold that the health thread pays per frame (three sketch adds and the drift
    baseline), one ``LatencySketch.add`` alone, and the whole per-frame cost (record+fold);
(b) ``Telemetry.report`` with the real ``SystemProbe`` (psutil, disk, sysfs): CPU ms per
    report, for an empty window and for a window of 30 s at 200 frames/s over two versions;
(c) two paced runs of ``--seconds`` each: one thread hands ``--fps`` frames a second to
    an empty method (the anchor), then to ``record_frame``, sweeping a 2 MB buffer between
    frames as inference would (so both run with cold caches, as they will on a node); in
    the second run another thread reports every ``--report-interval`` seconds. Each call
    is timed with ``perf_counter_ns`` (an empty pair of reads in the same loop is
    subtracted), each report with ``time.thread_time``; record and report time over the
    wall time is the CPU share of one core. The default interval (1 s) is 30 times the
    agent's, so the share is overstated.

Not a test: it asserts nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.telemetry_cost [--seconds 10] [--fps 200] [--rounds 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench._report import Report, parse_benchmark_args
from bench._util import BENCH_DIR
from edge_node.clock import SystemClock
from edge_node.telemetry import (
    LatencyBook,
    SystemProbe,
    Telemetry,
    TelemetryConfig,
)
from protos.latency_sketch import LatencySketch

GOAL_RECORD_NS = 1000.0
GOAL_CPU_SHARE_PERCENT = 1.0
MODELS = ("det@3", "det@4")


def frames(n: int, seed: int = 1) -> list[tuple[str, float, float]]:
    rng = random.Random(seed)
    return [
        (
            MODELS[i * 2 // n] if n > 1 else MODELS[0],
            rng.expovariate(1 / 0.002),
            rng.lognormvariate(math.log(0.015), 0.3),
        )
        for i in range(n)
    ]


def per_call_ns(loop: Callable[[int], None], n: int, rounds: int) -> dict[str, Any]:
    """Median and min of ``rounds`` timings of ``loop(n)``, in ns per call."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter_ns()
        loop(n)
        samples.append((time.perf_counter_ns() - started) / n)
    return {"median_ns": statistics.median(samples), "min_ns": min(samples), "rounds": samples}


class _Empty:
    def record_frame(self, model: str, queue_s: float, compute_s: float) -> None:
        pass


def tight_loops(n: int, rounds: int) -> dict[str, Any]:
    batch = frames(n)
    empty = _Empty()
    pending: deque[tuple[str, float, float]] = deque()
    telemetry = Telemetry(
        TelemetryConfig(pending_frames_limit=n + 16), clock=SystemClock(), probe=SystemProbe()
    )

    def call_empty(count: int) -> None:
        record = empty.record_frame
        for model, queue_s, compute_s in batch[:count]:
            record(model, queue_s, compute_s)

    def call_append(count: int) -> None:
        append = pending.append
        for model, queue_s, compute_s in batch[:count]:
            append((model, queue_s, compute_s))
        pending.clear()

    def call_record(count: int) -> None:
        record = telemetry.record_frame
        for model, queue_s, compute_s in batch[:count]:
            record(model, queue_s, compute_s)
        telemetry._pending.clear()  # the fold is measured on its own below

    book = LatencyBook(TelemetryConfig(drift_warmup_frames=0, drift_warmup_s=0.0))

    def call_fold(count: int) -> None:
        book.add_frames(batch[:count], 0.0)

    sketch = LatencySketch()
    values = [compute_s * 1000.0 for _, _, compute_s in batch]

    def call_sketch(count: int) -> None:
        add = sketch.add
        for value in values[:count]:
            add(value)

    results = {
        "anchor_empty_call": per_call_ns(call_empty, n, rounds),
        "anchor_deque_append": per_call_ns(call_append, n, rounds),
        "record_frame": per_call_ns(call_record, n, rounds),
        "fold_per_frame": per_call_ns(call_fold, n, rounds),
        "sketch_add": per_call_ns(call_sketch, n, rounds),
    }
    results["record_plus_fold_ns"] = (
        results["record_frame"]["median_ns"] + results["fold_per_frame"]["median_ns"]
    )
    return results


def report_costs(rounds: int) -> dict[str, Any]:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    telemetry = Telemetry(TelemetryConfig(), clock=SystemClock(), probe=SystemProbe(BENCH_DIR))
    telemetry.report(datetime.now(UTC), node_id="bench", agent_version="bench")  # prime psutil
    empty: list[float] = []
    busy: list[float] = []
    size = 0
    window = frames(6000)  # 30 s at 200 frames/s
    for _ in range(rounds):
        # The agent's own call: the report built, checked against the schema and encoded once.
        started = time.thread_time()
        telemetry.report_payload(datetime.now(UTC), node_id="bench", agent_version="bench")
        empty.append((time.thread_time() - started) * 1000.0)
        for frame in window:
            telemetry.record_frame(*frame)
        started = time.thread_time()
        payload = telemetry.report_payload(
            datetime.now(UTC), node_id="bench", agent_version="bench"
        )
        busy.append((time.thread_time() - started) * 1000.0)
        size = len(payload)
    return {
        "empty_window_cpu_ms": statistics.median(empty),
        "busy_window_cpu_ms": statistics.median(busy),
        "busy_window_frames": len(window),
        "busy_report_bytes": size,
    }


def paced_run(
    seconds: float, fps: float, report_interval: float, work_kb: int, *, anchor: bool
) -> dict[str, Any]:
    """``anchor``: call an empty method instead of the telemetry, and report nothing."""
    telemetry = Telemetry(TelemetryConfig(), clock=SystemClock(), probe=SystemProbe(BENCH_DIR))
    record = _Empty().record_frame if anchor else telemetry.record_frame
    batch = frames(max(1, int(seconds * fps)) + 1)
    sweep = np.ones(max(1, work_kb * 1024 // 8), dtype=np.float64) if work_kb else None
    stop = threading.Event()
    report_cpu: list[float] = []

    def reporter() -> None:
        while not anchor and not stop.wait(report_interval):
            started = time.thread_time()
            telemetry.report(datetime.now(UTC), node_id="bench", agent_version="bench")
            report_cpu.append(time.thread_time() - started)

    thread = threading.Thread(target=reporter, name="bench-health")
    clock = time.perf_counter_ns  # vDSO: ~50 ns; thread_time is a syscall costing more
    record_ns: list[int] = []
    empty_ns: list[int] = []
    checksum = 0.0
    period = 1.0 / fps
    thread.start()
    started = time.perf_counter()
    try:
        for index, frame in enumerate(batch[:-1]):
            due = started + index * period
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if sweep is not None:
                checksum += float(sweep.sum())  # "inference": evicts the caches between frames
            t0 = clock()
            t1 = clock()  # the empty pair: what reading the clock costs
            record(*frame)
            t2 = clock()
            empty_ns.append(t1 - t0)
            record_ns.append(t2 - t1)
    finally:
        stop.set()
        thread.join()
    wall = time.perf_counter() - started
    count = len(record_ns)
    clock_pair = statistics.median(empty_ns)
    net = [max(0.0, value - clock_pair) for value in record_ns]
    record_cpu_s = sum(net) * 1e-9
    share = (record_cpu_s + sum(report_cpu)) / wall * 100.0
    ordered = sorted(net)
    return {
        "seconds": wall,
        "fps": fps,
        "work_kb": work_kb,
        "frames": count,
        "reports": len(report_cpu),
        "report_interval_s": report_interval,
        "record_ns_median": statistics.median(net),
        "record_ns_p99": ordered[int(0.99 * (count - 1))],
        "record_ns_mean": sum(net) / count,
        "clock_pair_ns": clock_pair,
        "report_cpu_ms_median": statistics.median(report_cpu) * 1000.0 if report_cpu else None,
        "record_cpu_s": record_cpu_s,
        "report_cpu_s": sum(report_cpu),
        "cpu_share_percent": share,
        "checksum": checksum,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    print(f"(a) tight loops: {args.samples} calls x {args.rounds} rounds", flush=True)
    result["tight"] = tight_loops(args.samples, args.rounds)
    print("(b) report() with the real probe", flush=True)
    result["report"] = report_costs(args.rounds)
    print(f"(c) paced: {args.fps:g} frames/s for {args.seconds:g} s, twice", flush=True)
    paced_args = (args.seconds, args.fps, args.report_interval, args.work_kb)
    result["paced_anchor"] = paced_run(*paced_args, anchor=True)
    result["paced"] = paced_run(*paced_args, anchor=False)
    tight, report = result["tight"], result["report"]
    # The share at the goal's rate from the tight-loop figures, beside the paced measurement.
    derived = (
        args.fps * tight["record_plus_fold_ns"] * 1e-9
        + report["busy_window_cpu_ms"] / 1000.0 / 30.0  # one report per 30 s (the default)
    ) * 100.0
    result["derived_cpu_share_percent"] = derived
    return result


def print_result(result: dict[str, Any], written: Report) -> None:
    tight, report, paced = result["tight"], result["report"], result["paced"]
    m = written.machine
    print()
    print(f"commit {m['commit']}; Python {m['python']}; {written.load_line()}")
    print("(a) per call, median of rounds (min)")
    for key, label in (
        ("anchor_empty_call", "anchor: empty method, same arguments"),
        ("anchor_deque_append", "anchor: deque.append of the tuple"),
        ("record_frame", "Telemetry.record_frame (worker thread)"),
        ("fold_per_frame", "fold per frame (health thread)"),
        ("sketch_add", "LatencySketch.add, one value"),
    ):
        row = tight[key]
        print(f"    {label:<42} {row['median_ns']:8.1f} ns  ({row['min_ns']:.1f})")
    print(f"    {'record + fold, per frame':<42} {tight['record_plus_fold_ns']:8.1f} ns")
    print("(b) report() CPU, real probe")
    print(f"    empty window                               {report['empty_window_cpu_ms']:8.3f} ms")
    print(
        f"    {report['busy_window_frames']} frames, 2 versions                   "
        f"{report['busy_window_cpu_ms']:8.3f} ms  ({report['busy_report_bytes']} bytes of JSON)"
    )
    print(
        f"(c) paced {paced['fps']:g} frames/s for {paced['seconds']:.1f} s each, "
        f"{paced['work_kb']} kB swept between frames; "
        f"{paced['reports']} reports every {paced['report_interval_s']:g} s"
    )
    for key, label in (("paced_anchor", "anchor: empty method"), ("paced", "record_frame")):
        run_ = result[key]
        print(
            f"    {label:<22} median {run_['record_ns_median']:6.0f} ns, "
            f"mean {run_['record_ns_mean']:6.0f} ns, p99 {run_['record_ns_p99']:6.0f} ns "
            f"(clock pair {run_['clock_pair_ns']:.0f} ns subtracted)"
        )
    print(
        f"    report {paced['report_cpu_ms_median']:.3f} ms CPU (median); "
        f"CPU share of one core: {paced['cpu_share_percent']:.4f} %"
    )
    print(
        "    derived from (a) and (b) at one report per 30 s (the agent's default): "
        f"{result['derived_cpu_share_percent']:.4f} %"
    )


def add_figures(report: Report, result: dict[str, Any]) -> None:
    """The figures beside their anchors, each with its goal."""
    tight, paced, anchor = result["tight"], result["paced"], result["paced_anchor"]
    report.figure(
        "record_frame (tight loop)",
        tight["record_frame"]["median_ns"],
        "ns",
        anchor=tight["anchor_empty_call"]["median_ns"],
        anchor_name="empty method",
        goal=f"< {GOAL_RECORD_NS:.0f} ns",
        met=tight["record_frame"]["median_ns"] < GOAL_RECORD_NS,
    )
    report.figure(
        "record_frame (in situ, median)",
        paced["record_ns_median"],
        "ns",
        anchor=anchor["record_ns_median"],
        anchor_name="empty method",
        goal=f"over the anchor < {GOAL_RECORD_NS:.0f} ns",
        met=paced["record_ns_median"] - anchor["record_ns_median"] < GOAL_RECORD_NS,
    )
    report.figure(
        f"CPU share at {paced['fps']:g} frames/s",
        paced["cpu_share_percent"],
        "% of a core",
        goal=f"< {GOAL_CPU_SHARE_PERCENT} %",
        met=paced["cpu_share_percent"] < GOAL_CPU_SHARE_PERCENT,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000, help="calls per tight loop")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per tight loop")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each paced run")
    parser.add_argument("--fps", type=float, default=200.0, help="frames per second, paced")
    parser.add_argument("--report-interval", type=float, default=1.0, help="seconds, paced")
    parser.add_argument("--work-kb", type=int, default=2048, help="buffer swept between frames")
    args = parse_benchmark_args(
        parser, argv, quick={"samples": 2000, "rounds": 2, "seconds": 2.0, "report_interval": 0.5}
    )
    report = Report("telemetry_cost")
    result = run(args)
    add_figures(report, result)
    print_result(result, report)
    return report.finish(args, result)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
