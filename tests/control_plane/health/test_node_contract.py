"""The contract between the node's report and the control plane's reader: a report the
real ``edge_node.telemetry`` builds is read with every number the health store keeps.

(Tests may import both sides; the packages never import each other.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from control_plane.health.report import parse_report
from control_plane.health.rollup import Rollup
from edge_node.telemetry.config import TelemetryConfig
from edge_node.telemetry.probe import SystemProbe
from edge_node.telemetry.report import encode
from edge_node.telemetry.telemetry import Telemetry


class FixedClock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def test_a_real_node_report_is_read_and_rolled_up(tmp_path: Path) -> None:
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    telemetry = Telemetry(TelemetryConfig(), clock=clock, probe=SystemProbe(tmp_path))
    points = []
    for _ in range(2):
        for i in range(400):
            telemetry.record_frame("detector/1.0.0", 0.002, 0.010 + (i % 50) * 1e-4)
        clock.at += timedelta(seconds=10)
        report = telemetry.report(clock.at, node_id="n-x", agent_version="0.2.0")
        point = parse_report(encode(report), created_at=clock.at)
        assert point.schema == "edgefleet.agent.health/2"
        assert point.at == clock.at
        points.append(point)
    metrics = points[-1].metrics
    for name in ("rss_bytes", "frames", "frames_per_s", "p99_ms", "disk_free_bytes", "uptime_s"):
        assert name in metrics, name
    latency = points[-1].latency["detector/1.0.0"]
    assert {"end_to_end", "compute", "queue"} <= set(latency)
    assert "sketch_ms" in latency["compute"]
    rolled = Rollup.of(points).summary()
    compute = rolled["latency"]["detector/1.0.0"]["compute"]
    assert compute["samples"] == 800
    assert abs(compute["max_ms"] - 14.9) < 0.01
