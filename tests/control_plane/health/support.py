"""Health reports as nodes send them (schemas /1 and /2), and a way to store them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from control_plane.link.ingest import RecordIngest
from control_plane.link.records import IncomingRecord
from control_plane.storage.models import FleetRow, NodeRow
from edge_node.telemetry.report import sketch_summary
from protos.latency_sketch import LatencySketch

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def add_nodes(sessions: sessionmaker[Session], *node_ids: str, online: bool = True) -> None:
    with sessions() as session:
        fleet = FleetRow(name="gates", state="active", created_at=START)
        session.add(fleet)
        session.flush()
        for node_id in node_ids:
            session.add(
                NodeRow(
                    id=node_id,
                    fleet_id=fleet.id,
                    labels={},
                    public_key_sha256="0" * 64,
                    created_at=START,
                    last_seen=START,
                    online=online,
                )
            )
        session.commit()


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """What the agent reports for these latencies (`sketch_summary`, sketch included)."""
    sketch = LatencySketch()
    for value in samples:
        sketch.add(value)
    return sketch_summary(sketch, with_sketch=True)


def v2_report(
    at: datetime,
    *,
    samples: Sequence[float] = (10.0, 12.0, 15.0),
    rss_mb: float = 200.0,
    budget_mb: float = 1000.0,
    slope: float | None = 0.5,
    leak: bool = False,
    drift_ratio: float | None = 1.0,
    throttled: bool | None = False,
    outbox_fill: float = 0.1,
    model: str = "detector/1.0.0",
    **extra: Any,
) -> dict[str, Any]:
    rss = int(rss_mb * 1e6)
    budget = int(budget_mb * 1e6)
    return {
        "schema": "edgefleet.agent.health/2",
        "node_id": "ignored",
        "seq": 1,
        "window_start": at.isoformat(),
        "window_end": at.isoformat(),
        "window_s": 10.0,
        "uptime_s": 100.0,
        "latency": {
            model: {
                "frames": len(samples),
                "frames_per_s": len(samples) / 10,
                "queue": summary([1.0 for _ in samples]),
                "compute": summary(samples),
                "end_to_end": summary([s + 1.0 for s in samples]),
                "drift": {
                    "state": "judging",
                    "suspected": False,
                    "compute": None,
                    "end_to_end": None
                    if drift_ratio is None
                    else {"p95_ratio": drift_ratio, "p99_ratio": drift_ratio},
                },
            }
        },
        "throughput": {"frames": len(samples), "frames_per_s": len(samples) / 10},
        "frames_dropped": 2,
        "streams": {"cam1": {"skipped": {"stale": 3}, "dropped": {"full": 2}}},
        "memory": {
            "rss_bytes": rss,
            "budget_bytes": budget,
            "headroom_ratio": round((budget - rss) / budget, 3),
            "rss_slope_mb_per_h": slope,
            "leak_suspected": leak,
            "system_available_bytes": 4_000_000_000,
        },
        "cpu": {"process_percent": 12.5, "system_percent": 30.0},
        "disk": {"data_dir_free_bytes": 10_000_000_000},
        "thermal": {"max_temp_c": 55.0, "throttled": throttled, "throttle_events": 0},
        "outbox": {
            "pending_events": 0,
            "pending_health": 1,
            "bytes": int(outbox_fill * 1_000_000),
            "budget_bytes": 1_000_000,
            "fill_ratio": outbox_fill,
            "alarm": False,
        },
        "errors": {"count": 0, "last": None},
        "a_field_from_the_future": {"x": 1},
        **extra,
    }


def v1_report(rss_bytes: int = 300_000_000, budget: int = 1_000_000_000) -> dict[str, Any]:
    return {
        "schema": "edgefleet.agent.health/1",
        "node_id": "ignored",
        "agent_version": "0.1.0",
        "uptime_s": 5.0,
        "rss_bytes": rss_bytes,
        "memory_budget_bytes": budget,
        "over_memory_budget": rss_bytes > budget,
        "outbox": {
            "pending_events": 0,
            "pending_health": 0,
            "bytes": 100,
            "budget_bytes": 1000,
            "dropped_health": 0,
            "refused_events": 0,
            "alarm": False,
        },
        "uplink": {"connects": 1},
        "runtime": {"model": None, "results": 0},
    }


class Sender:
    """Stores health records through the real ingest, the way the transports do."""

    def __init__(self, ingest: RecordIngest) -> None:
        self.ingest = ingest
        self.seq: dict[str, int] = {}

    def send(self, node_id: str, *reports: dict[str, Any] | bytes) -> list[str]:
        records = []
        for report in reports:
            seq = self.seq.get(node_id, 0) + 1
            self.seq[node_id] = seq
            payload = report if isinstance(report, bytes) else json.dumps(report).encode()
            records.append(
                IncomingRecord(str(uuid.uuid4()), seq, "health", START, "application/json", payload)
            )
        return self.ingest.store(node_id, records)
