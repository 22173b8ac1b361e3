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

The report comes from a real ``Telemetry`` with this machine's ``SystemProbe`` and a real
``Outbox`` (in ``.bench/``), on a ``ManualClock``. Not a test: it holds no goal. See
docs/adr/0024-health-report-schema.md.

    python -m bench.health_report [--rounds 9] [--number 200] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format

from bench._report import Report, parse_benchmark_args
from bench._util import BENCH_DIR
from control_plane.health.report import parse_report
from edge_node.capture import CaptureStats
from edge_node.clock import ManualClock
from edge_node.link.uplink import UplinkStats
from edge_node.outbox import Outbox, OutboxStats
from edge_node.runtime.streams import StreamStats
from edge_node.telemetry import Telemetry, TelemetryConfig, encode_report
from edge_node.telemetry.probe import SystemProbe
from protos.edgefleet.fleet.v1.health_pb2 import HealthReport
from protos.health_schema import check_report, conform_report

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MB = 1_000_000
SCRATCH = BENCH_DIR / "health_report"


def outbox_stats(clock: ManualClock) -> OutboxStats:
    """The stats of a real outbox with a backlog: some records sent and acked, some not."""
    shutil.rmtree(SCRATCH, ignore_errors=True)
    outbox = Outbox.open(
        SCRATCH / "outbox.sqlite",
        node_id="bench",
        budget_bytes=120_000,
        clock=clock,
        max_payload_bytes=4096,
    )
    try:
        for i in range(40):
            outbox.append("health" if i % 3 else "event", b"x" * 700)
        outbox.ack(up_to_seq=25)
        return outbox.stats()
    finally:
        outbox.close()
        shutil.rmtree(SCRATCH, ignore_errors=True)


def busy_report() -> dict[str, Any]:
    """One report of a busy 30 s window: two model versions, four streams."""
    rng = random.Random(7)
    clock = ManualClock(START)
    telemetry = Telemetry(
        TelemetryConfig(memory_budget_bytes=512 * MB),
        clock=clock,
        probe=SystemProbe(BENCH_DIR, ticker=clock),
        ticker=clock,
    )
    for _ in range(6000):
        model = "detector/1.4.0" if rng.random() < 0.8 else "detector/1.5.0"
        telemetry.record_frame(model, rng.uniform(0.0005, 0.004), rng.lognormvariate(-4.0, 0.4))
    clock.advance(timedelta(seconds=30))
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
    return telemetry.report(
        clock.now(),
        node_id="bench",
        agent_version="bench",
        active_model="detector/1.4.0",
        streams=streams,
        capture=capture,
        queue_depth_frames=2,
        outbox=outbox_stats(clock),
        uplink=UplinkStats(connects=1, records_sent=50, records_acked=48),
    )


def per_call_us(call: Callable[[], object], rounds: int, number: int) -> float:
    best = min(timeit.repeat(call, number=number, repeat=rounds, timer=time.process_time))
    return best / number * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="rounds per call (best of)")
    parser.add_argument("--number", type=int, default=200, help="calls per round")
    args = parse_benchmark_args(parser, argv, quick={"rounds": 2, "number": 20})
    report = Report("health_report")
    health = busy_report()
    data = encode_report(health)
    doc = json.loads(data)
    message = json_format.ParseDict(doc, HealthReport())
    binary = message.SerializeToString()

    def dump() -> bytes:
        return json.dumps(health, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    # (name, call, the anchor's name or "" for a figure read alone); an anchor comes first
    calls: list[tuple[str, Callable[[], object], str]] = [
        ("dump alone (json.dumps)", dump, ""),
        # What the agent's Telemetry.report_payload adds to building the report: one schema
        # check and one dump.
        ("node encode (check + dump)", lambda: encode_report(health), "dump alone (json.dumps)"),
        ("check_report alone", lambda: check_report(health), ""),
        ("json.loads alone", lambda: json.loads(data), ""),
        (
            "control plane parse_report",
            lambda: parse_report(data, created_at=START),
            "json.loads alone",
        ),
        ("conform_report alone", lambda: conform_report(doc), ""),
        (
            "not taken: ParseDict(ignore_unknown_fields)",
            lambda: json_format.ParseDict(doc, HealthReport(), ignore_unknown_fields=True),
            "",
        ),
        ("not taken: binary SerializeToString", message.SerializeToString, ""),
        ("not taken: binary FromString", lambda: HealthReport.FromString(binary), ""),
    ]
    print(f"one busy report: {len(data)} bytes of JSON, {len(binary)} bytes as binary protobuf")
    per_call: dict[str, float] = {}
    for name, call, anchor in calls:
        per_call[name] = per_call_us(call, args.rounds, args.number)
        print(f"{name:<46} {per_call[name]:9.1f} us CPU")
        report.figure(
            name,
            per_call[name],
            "us CPU",
            anchor=per_call[anchor] if anchor else None,
            anchor_name=anchor,
        )
    print(report.load_line())
    return report.finish(
        args,
        {"json_bytes": len(data), "binary_bytes": len(binary), "per_call_us": per_call},
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
