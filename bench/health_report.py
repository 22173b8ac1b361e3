"""What checking the health report against ``HealthReport`` (health.proto) costs per report.

Measures, in one process, CPU microseconds per report (``time.process_time``, best of
``--rounds`` rounds of ``--number`` calls, so other processes on a shared box count
little), on one busy-window report (two model versions, three sketches each,
four streams, 30 s at 200 frames/s of log-normal latencies):

- node: ``encode`` (the check and the JSON dump) beside its anchor, the dump alone
  (``json.dumps`` as ``encode`` calls it), and ``check_report`` alone;
- control plane: ``parse_report`` beside its anchor, ``json.loads`` of the same bytes,
  and ``conform_report`` alone;
- the alternatives ADR 0024 turned down, for scale: ``json_format.ParseDict`` into a
  ``HealthReport`` (ignoring unknown fields), and the binary protobuf form (size,
  ``SerializeToString``, ``FromString``).

Not a test: it asserts nothing. See docs/adr/0024-health-report-schema.md.

    python -m bench.health_report [--rounds 9] [--number 200]
"""

from __future__ import annotations

import argparse
import json
import random
import time
import timeit
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format

from control_plane.health.report import parse_report
from edge_node.capture import CaptureStats
from edge_node.link.uplink import UplinkStats
from edge_node.outbox import OutboxStats
from edge_node.runtime.streams import StreamStats
from edge_node.telemetry import SystemSample, Telemetry, TelemetryConfig, encode_report
from edge_node.telemetry.thermal import ThermalReading, ThermalZone
from protos.edgefleet.fleet.v1.health_pb2 import HealthReport
from protos.health_schema import check_report, conform_report

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MB = 1_000_000


class _Probe:
    """A fixed system sample: the figures are the report's cost, not psutil's."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def sample(self) -> SystemSample:
        return SystemSample(
            monotonic_s=self.now_s,
            rss_bytes=300 * MB,
            process_cpu_s=self.now_s / 10,
            threads=12,
            system_memory_total_bytes=4000 * MB,
            system_memory_available_bytes=2500 * MB,
            system_cpu_percent=40.0,
            cpu_cores=4,
            boot_time_s=START.timestamp() - 86400.0,
            disk_free_bytes=20_000 * MB,
            disk_total_bytes=64_000 * MB,
            thermal=ThermalReading((ThermalZone("cpu-thermal", 61.0, 80.0, 95.0),), None, None),
        )


class _Ticker:
    def __init__(self, probe: _Probe) -> None:
        self._probe = probe

    def monotonic(self) -> float:
        return self._probe.now_s


class _Clock:
    def __init__(self) -> None:
        self.at = START

    def now(self) -> datetime:
        return self.at


def busy_report() -> dict[str, Any]:
    rng = random.Random(7)
    probe, clock = _Probe(), _Clock()
    telemetry = Telemetry(
        TelemetryConfig(memory_budget_bytes=512 * MB),
        clock=clock,
        probe=probe,
        ticker=_Ticker(probe),
    )
    for _ in range(6000):
        model = "detector/1.4.0" if rng.random() < 0.8 else "detector/1.5.0"
        telemetry.record_frame(model, rng.uniform(0.0005, 0.004), rng.lognormvariate(-4.0, 0.4))
    probe.now_s += 30.0
    clock.at += timedelta(seconds=30)
    streams = {
        f"cam{i}": StreamStats(
            stream=f"cam{i}",
            submitted=1550,
            accepted=1530,
            processed=1500,
            dropped={"rate": 20, "queue_full": 10},
            skipped={"stale": 5},
            bad={},
            failed={},
            queued=1,
        )
        for i in range(4)
    }
    capture = {name: CaptureStats(name, 1550, {"timeout": 3}, 0, 0) for name in streams}
    outbox = OutboxStats(
        pending_events=12,
        pending_health=3,
        bytes=30_000,
        budget_bytes=120_000,
        dropped_health=0,
        refused_events=0,
        alarm=False,
        oldest_created_at=None,
        high_water_seq=40,
        last_acked_seq=25,
        disk_bytes=65_536,
    )
    return telemetry.report(
        clock.at,
        node_id="bench",
        agent_version="bench",
        active_model="detector/1.4.0",
        streams=streams,
        capture=capture,
        queue_depth_frames=2,
        outbox=outbox,
        uplink=UplinkStats(connects=1, records_sent=50, records_acked=48),
    )


def per_call_us(call: Callable[[], object], rounds: int, number: int) -> float:
    best = min(timeit.repeat(call, number=number, repeat=rounds, timer=time.process_time))
    return best / number * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.health_report")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=200)
    args = parser.parse_args(argv)
    report = busy_report()
    data = encode_report(report)
    doc = json.loads(data)
    message = json_format.ParseDict(doc, HealthReport())
    binary = message.SerializeToString()

    def dump() -> bytes:
        return json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    figures = {
        "node encode (check + dump)": lambda: encode_report(report),
        "  anchor: dump alone": dump,
        "  check_report alone": lambda: check_report(report),
        "control plane parse_report": lambda: parse_report(data, created_at=START),
        "  anchor: json.loads alone": lambda: json.loads(data),
        "  conform_report alone": lambda: conform_report(doc),
        "not taken: ParseDict(ignore_unknown_fields)": lambda: json_format.ParseDict(
            doc, HealthReport(), ignore_unknown_fields=True
        ),
        "not taken: binary SerializeToString": message.SerializeToString,
        "not taken: binary FromString": lambda: HealthReport.FromString(binary),
    }
    print(f"one busy report: {len(data)} bytes of JSON, {len(binary)} bytes as binary protobuf")
    for name, call in figures.items():
        print(f"{name:<46} {per_call_us(call, args.rounds, args.number):9.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
