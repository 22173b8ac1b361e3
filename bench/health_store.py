"""The health store's processor: stored health reports per second turned into raw points,
minute and hour roll-ups (merged latency sketches), latest values and alerts, beside a bare
anchor measured in the same run on the same records.

The records are real ``edgefleet.agent.health/2`` reports (three latency sketches of one
model version, about 2.5 KB each) stored through the real ingest (``RecordIngest``) in a
throwaway database. Then ``HealthProcessor.process_pending`` drains them, timed. The anchor
reads the same records in the same batches and stores each as a raw point only (JSON
parse + one insert per record, no roll-ups, no alerts, no cursor): what storing a report
as a row costs at all. The fleet figure is the rate times 10 s (one report per node
every 10 s). Not a test: asserts nothing unless ``--check``. See docs/benchmarks.md.

    python -m bench.health_store [--nodes 200] [--reports 30] [--backends postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select

from bench._harness import database
from bench._report import Report, parse_benchmark_args
from bench._util import BENCH_DIR, git_describe
from control_plane.clock import ManualClock
from control_plane.health.config import HealthConfig
from control_plane.health.processor import HealthProcessor
from control_plane.health.report import parse_report
from control_plane.link.ingest import RecordIngest
from control_plane.link.records import IncomingRecord
from control_plane.storage import create_engine_for, migrate, session_factory
from control_plane.storage.models import (
    FleetRow,
    HealthPointRow,
    HealthRollupRow,
    NodeRecordRow,
    NodeRow,
)
from edge_node.telemetry.report import sketch_summary
from protos.latency_sketch import LatencySketch

REPORT_INTERVAL_S = 10.0
GOAL_NODES = 10_000
"""Goal: one processor keeps up with 10,000 nodes reporting every 10 s (1,000 reports/s)."""
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _summary(samples: Sequence[float]) -> dict[str, Any]:
    """What the agent reports for these latencies (`sketch_summary`, sketch included)."""
    sketch = LatencySketch()
    for value in samples:
        sketch.add(value)
    return sketch_summary(sketch, with_sketch=True)


def report(rng: random.Random, at: datetime, rss_mb: float) -> bytes:
    compute = [rng.lognormvariate(math.log(18), 0.25) for _ in range(300)]
    queue = [rng.lognormvariate(math.log(2), 0.5) for _ in range(300)]
    doc = {
        "schema": "edgefleet.agent.health/2",
        "window_start": (at - timedelta(seconds=10)).isoformat(),
        "window_end": at.isoformat(),
        "window_s": 10.0,
        "uptime_s": 3600.0,
        "latency": {
            "detector/1.0.0": {
                "frames": 300,
                "frames_per_s": 30.0,
                "queue": _summary(queue),
                "compute": _summary(compute),
                "end_to_end": _summary([c + q for c, q in zip(compute, queue, strict=True)]),
                "drift": {
                    "state": "ready",
                    "suspected": False,
                    "compute": {"p95_ratio": 1.02, "p99_ratio": 1.04},
                    "end_to_end": {"p95_ratio": 1.03, "p99_ratio": 1.05},
                },
            }
        },
        "throughput": {"frames": 300, "frames_per_s": 30.0},
        "frames_dropped": 0,
        "streams": {"cam1": {"submitted": 300, "processed": 300, "skipped": {}}},
        "memory": {
            "rss_bytes": int(rss_mb * 1e6),
            "budget_bytes": 1_000_000_000,
            "headroom_ratio": round(1 - rss_mb / 1000, 3),
            "rss_slope_mb_per_h": 0.4,
            "leak_suspected": False,
        },
        "cpu": {"process_percent": 35.0, "system_percent": 40.0},
        "disk": {"data_dir_free_bytes": 20_000_000_000},
        "thermal": {"max_temp_c": 52.0, "throttled": False},
        "outbox": {"bytes": 20_000, "budget_bytes": 64_000_000, "fill_ratio": 0.0},
        "errors": {"count": 0, "last": None},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def fill(engine: Engine, nodes: int, reports: int) -> tuple[int, int]:
    """Store ``nodes * reports`` health records through the real ingest."""
    sessions = session_factory(engine)
    with sessions() as session:
        fleet = FleetRow(name="bench", state="active", created_at=START)
        session.add(fleet)
        session.flush()
        for i in range(nodes):
            session.add(
                NodeRow(
                    id=f"n-{i:012x}",
                    fleet_id=fleet.id,
                    labels={},
                    public_key_sha256="0" * 64,
                    created_at=START,
                    last_seen=START,
                    online=True,
                )
            )
        session.commit()
    rng = random.Random(7)
    ingest = RecordIngest(sessions, ManualClock(START))
    total_bytes = 0
    try:
        for k in range(reports):
            at = START + timedelta(seconds=REPORT_INTERVAL_S * k)
            for i in range(nodes):
                payload = report(rng, at, 300 + rng.random() * 10)
                total_bytes += len(payload)
                ingest.store(
                    f"n-{i:012x}",
                    [
                        IncomingRecord(
                            str(uuid.uuid4()), k + 1, "health", at, "application/json", payload
                        )
                    ],
                )
    finally:
        ingest.close()
    return nodes * reports, total_bytes


def bare_anchor(engine: Engine, batch: int) -> float:
    """Seconds to read every record in batches and store each as a raw point only."""
    sessions = session_factory(engine)
    started = time.perf_counter()
    offset = 0
    while True:
        with sessions() as session:
            rows = session.execute(
                select(
                    NodeRecordRow.node_id,
                    NodeRecordRow.record_id,
                    NodeRecordRow.received_at,
                    NodeRecordRow.created_at,
                    NodeRecordRow.payload,
                )
                .where(NodeRecordRow.kind == "health")
                .order_by(NodeRecordRow.received_at, NodeRecordRow.node_id, NodeRecordRow.record_id)
                .offset(offset)
                .limit(batch)
            ).all()
            if not rows:
                break
            points = []
            for node_id, record_id, received_at, created_at, payload in rows:
                point = parse_report(bytes(payload), created_at=created_at)
                points.append(
                    {
                        "node_id": node_id,
                        "record_id": record_id,
                        "at": point.at,
                        "received_at": received_at,
                        "schema": point.schema,
                        "metrics": point.metrics,
                        "latency": point.latency,
                    }
                )
            session.execute(insert(HealthPointRow), points)
            session.commit()
            offset += len(rows)
    elapsed = time.perf_counter() - started
    with sessions() as session:
        session.execute(delete(HealthPointRow))
        session.commit()
    return elapsed


def processor(engine: Engine, batch: int) -> tuple[float, dict[str, int]]:
    sessions = session_factory(engine)
    config = HealthConfig(batch_size=batch, max_batches_per_pass=1000, settle=timedelta(0))
    store = HealthProcessor(sessions, ManualClock(START + timedelta(hours=1)), config)
    started = time.perf_counter()
    while store.process_pending() > 0:
        pass
    elapsed = time.perf_counter() - started
    with sessions() as session:
        rows = {
            "points": int(session.scalar(select(func.count()).select_from(HealthPointRow)) or 0),
            "rollups": int(session.scalar(select(func.count()).select_from(HealthRollupRow)) or 0),
        }
    return elapsed, rows


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with database(backend, BENCH_DIR, prefix="edgefleet_bench_health") as made:
        engine = create_engine_for(made.url)
        try:
            migrate(engine)
            reports, size = fill(engine, args.nodes, args.reports)
            anchor_s = bare_anchor(engine, args.batch)
            processed_s, rows = processor(engine, args.batch)
        finally:
            engine.dispose()
    return {
        "backend": backend,
        "reports": reports,
        "mean_report_bytes": size // reports,
        "processor_s": round(processed_s, 3),
        "processor_reports_per_s": round(reports / processed_s, 1),
        "processor_rows_per_s": round((rows["points"] + rows["rollups"]) / processed_s, 1),
        "rows": rows,
        "anchor_s": round(anchor_s, 3),
        "anchor_reports_per_s": round(reports / anchor_s, 1),
        "ratio_to_anchor": round(anchor_s / processed_s, 3),
        "nodes_at_10s": int(reports / processed_s * REPORT_INTERVAL_S),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--reports", type=int, default=30, help="reports per node")
    parser.add_argument("--batch", type=int, default=500, help="records per transaction")
    parser.add_argument("--backends", default="postgresql,sqlite")
    args = parse_benchmark_args(
        parser, argv, quick={"nodes": 10, "reports": 3, "backends": "sqlite"}
    )
    report = Report("health_store")
    results = [run_backend(b.strip(), args) for b in args.backends.split(",") if b.strip()]
    print(f"health store processor ({git_describe()}), {args.nodes} nodes x {args.reports}")
    for r in results:
        print(
            f"  {r['backend']:<10} processor {r['processor_reports_per_s']:>8,.0f} reports/s "
            f"({r['processor_rows_per_s']:,.0f} rows/s, {r['rows']['points']} points + "
            f"{r['rows']['rollups']} roll-up rows)  anchor (raw points only) "
            f"{r['anchor_reports_per_s']:>8,.0f} reports/s  ratio {r['ratio_to_anchor']:.2f}  "
            f"= {r['nodes_at_10s']:,} nodes at one report / 10 s "
            f"({r['mean_report_bytes']} B per report)"
        )
        postgres = r["backend"] == "postgresql"
        report.figure(
            f"{r['backend']} processor",
            r["processor_reports_per_s"],
            "reports/s",
            anchor=r["anchor_reports_per_s"],
            anchor_name="raw points only",
            goal=f"{GOAL_NODES:,} nodes at 10 s" if postgres else "",
            met=r["nodes_at_10s"] >= GOAL_NODES if postgres else None,
        )
    return report.finish(args, {"backends": results})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
