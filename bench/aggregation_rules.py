"""The rule engine alone: detections per second on one core (issue 14 §4, goal >= 100,000).

One process, one thread, one run. A synthetic site of ``--cameras`` cameras at ``--fps``
for ``--seconds``: ``--objects`` people per camera walking across the picture (boxes
with jitter, a frame missed now and then), plates at the two gate cameras. The rules are
a realistic file's: per camera a zone intrusion, a line crossing and a dwell, counts per
class per 10 s over all cameras, and a gate-a -> gate-b correlation by plate. Frames
arrive out of order within the lateness (50 ms), a few are resent. Measured, best of
``--rounds`` (median also kept):

- **engine, camera track ids**: ``Aggregator.offer`` on every frame (aligner, rules);
- **engine, node tracker**: the same detections without ids, so the node's IoU tracker
  assigns them first;
- **aligner alone**: offer + release, no tracker, no rules;
- anchor, **bare loop**: the same frames, a loop that reads every detection's box and
  computes its anchor point, nothing else (what Python costs per detection at least).

Not a test: asserts nothing unless ``--check``. See docs/benchmarks.md.

    python -m bench.aggregation_rules [--seconds 60] [--cameras 8] [--fps 25] [--objects 6]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from bench._report import Report, machine, parse_benchmark_args
from bench._util import pin_self
from edge_node.aggregation.config import build_aggregator, parse_rules
from edge_node.aggregation.model import Box, Detection, Observation, Provenance
from edge_node.aggregation.timeline import Aligner, AlignerConfig

GOAL_DETECTIONS_PER_S = 100_000.0
T0 = 1_790_000_000.0
PROVENANCE = Provenance("device", "people-det", "1.0", "fw-3.2")


def rules_document(cameras: Sequence[str]) -> dict[str, Any]:
    zone = [[0.3, 0.3], [0.7, 0.3], [0.7, 0.8], [0.3, 0.8]]
    rules: list[dict[str, Any]] = []
    for camera in cameras:
        rules += [
            {"id": f"{camera}-zone", "type": "zone_intrusion", "camera": camera, "zone": zone},
            {
                "id": f"{camera}-door",
                "type": "line_crossing",
                "camera": camera,
                "line": [[0.1, 0.5], [0.9, 0.5]],
            },
            {
                "id": f"{camera}-loiter",
                "type": "dwell",
                "camera": camera,
                "zone": zone,
                "min_time": "5s",
            },
        ]
    rules += [
        {"id": "counts", "type": "count", "interval": "10s", "classes": ["person", "car"]},
        {
            "id": "transit",
            "type": "correlation",
            "entry": [cameras[0]],
            "exit": [cameras[1]],
            "within": "2m",
        },
    ]
    return {"time": {"allowed_lateness": "50ms", "idle_timeout": "2s"}, "rules": rules}


def site(
    cameras: Sequence[str], fps: float, seconds: float, objects: int, seed: int = 1
) -> list[tuple[float, Observation]]:
    """Frames of every camera with their arrival times, in arrival order."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, float, Observation]] = []
    frames = int(seconds * fps)
    for c, camera in enumerate(cameras):
        walkers = [
            [
                rng.uniform(0.1, 0.9),
                rng.uniform(0.25, 0.95),
                rng.uniform(-0.01, 0.01),
                rng.uniform(-0.01, 0.01),
                n,
            ]
            for n in range(objects)
        ]
        next_id = objects
        for seq in range(frames):
            at = T0 + seq / fps + c * 0.003
            detections = []
            for w in walkers:
                w[0] += w[2] + rng.gauss(0, 0.002)
                w[1] += w[3] + rng.gauss(0, 0.002)
                if not (0.05 < w[0] < 0.95 and 0.25 < w[1] < 0.98):  # left: a new one comes
                    next_id += 1
                    w[:] = [
                        rng.uniform(0.1, 0.9),
                        rng.uniform(0.3, 0.9),
                        rng.uniform(-0.01, 0.01),
                        rng.uniform(-0.01, 0.01),
                        next_id,
                    ]
                if rng.random() < 0.03:
                    continue
                x, y = w[0], w[1]
                detections.append(
                    Detection("person", 0.9, Box(x - 0.03, y - 0.15, x + 0.03, y), str(w[4]))
                )
            if c < 2 and seq % 5 == 0:
                plate = f"P{(seq // 50) % 40}"
                detections.append(
                    Detection("car", 0.8, Box(0.4, 0.4, 0.6, 0.6), None, {"plate_text": plate})
                )
            o = Observation(camera, f"{camera}-{seq}", seq, at, tuple(detections), PROVENANCE)
            arrival = at + rng.uniform(0.0, 0.045)
            arrivals.append((arrival, rng.random(), o))
            if rng.random() < 0.01:  # a resend
                arrivals.append((arrival + 0.01, rng.random(), o))
    arrivals.sort(key=lambda a: (a[0], a[1]))
    return [(now, o) for now, _, o in arrivals]


def untracked(arrivals: list[tuple[float, Observation]]) -> list[tuple[float, Observation]]:
    return [
        (now, replace(o, detections=tuple(replace(d, track_id=None) for d in o.detections)))
        for now, o in arrivals
    ]


def timed(work: Callable[[], int], rounds: int) -> dict[str, Any]:
    samples = []
    produced = 0
    for _ in range(rounds):
        gc.collect()
        started = time.process_time()
        produced = work()
        samples.append(time.process_time() - started)
    return {
        "best_s": min(samples),
        "median_s": statistics.median(samples),
        "rounds": samples,
        "out": produced,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="of simulated site time")
    parser.add_argument("--cameras", type=int, default=8)
    parser.add_argument("--fps", type=float, default=25.0)
    parser.add_argument("--objects", type=int, default=6, help="people per camera at a time")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    args = parse_benchmark_args(parser, argv, quick={"seconds": 4.0, "rounds": 1})
    pin_self(args.cpu)
    cameras = [f"cam-{i}" for i in range(args.cameras)]
    doc = rules_document(cameras)
    arrivals = site(cameras, args.fps, args.seconds, args.objects)
    bare_input = untracked(arrivals)
    detections = sum(len(o.detections) for _, o in arrivals)
    print(
        f"{len(arrivals)} frames ({args.cameras} cameras x {args.fps:g} fps x {args.seconds:g} s, "
        f"resends included), {detections} detections, {len(doc['rules'])} rules",
        flush=True,
    )

    def engine(feed: list[tuple[float, Observation]]) -> Callable[[], int]:
        def work() -> int:
            agg = build_aggregator(parse_rules(doc))
            offer = agg.offer
            n = 0
            for now, o in feed:
                n += len(offer(o, now))
            return n + len(agg.flush())

        return work

    def aligner_only() -> int:
        aligner = Aligner(AlignerConfig(allowed_lateness_s=0.05))
        n = 0
        for now, o in arrivals:
            n += len(aligner.offer(o, now))
        return n + len(aligner.flush())

    def bare_loop() -> int:
        n = 0
        total = 0.0
        for _, o in arrivals:
            for d in o.detections:
                b = d.box
                total += (b.x1 + b.x2) * 0.5 + b.y2
                n += 1
        return n

    results = {
        "bare": timed(bare_loop, args.rounds),
        "aligner": timed(aligner_only, args.rounds),
        "engine": timed(engine(arrivals), args.rounds),
        "engine_tracker": timed(engine(bare_input), args.rounds),
    }
    rates = {name: detections / r["best_s"] for name, r in results.items()}
    agg = build_aggregator(parse_rules(doc))
    for now, o in arrivals:
        agg.offer(o, now)
    agg.flush()
    health = agg.health()
    print(f"events: {health['events']}")
    print(
        f"duplicates {health['duplicates']}, late applied {health['late_applied']}, "
        f"too late {health['too_late']}; state after the run: "
        f"{max(v for k, v in health['state'].items() if not k.startswith('aligner'))} "
        f"entries in the largest rule"
    )
    for name, label in (
        ("bare", "bare loop (anchor)"),
        ("aligner", "aligner alone"),
        ("engine", "engine, camera track ids"),
        ("engine_tracker", "engine, node tracker"),
    ):
        r = results[name]
        print(
            f"  {label:<26} {rates[name]:>12,.0f} detections/s  (best {r['best_s']:.3f} s, "
            f"median {r['median_s']:.3f} s of {args.rounds})"
        )
    report = Report(
        "aggregation_rules",
        machine=machine(cpu_pinned=args.cpu, affinity=sorted(os.sched_getaffinity(0))),
    )
    goal = f">= {GOAL_DETECTIONS_PER_S:,.0f} detections/s"
    report.figure(
        "engine, camera track ids",
        rates["engine"],
        "detections/s",
        anchor=rates["bare"],
        anchor_name="bare loop",
        goal=goal,
        met=rates["engine"] >= GOAL_DETECTIONS_PER_S,
    )
    report.figure(
        "engine, node tracker",
        rates["engine_tracker"],
        "detections/s",
        anchor=rates["bare"],
        anchor_name="bare loop",
    )
    report.figure(
        "aligner alone",
        rates["aligner"],
        "detections/s",
        anchor=rates["bare"],
        anchor_name="bare loop",
    )
    print(report.load_line())
    raw = {
        "detections": detections,
        "frames": len(arrivals),
        "rates": rates,
        "timings": results,
        "health": health,
    }
    return report.finish(args, raw)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
