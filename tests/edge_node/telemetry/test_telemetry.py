"""``Telemetry``: the report the agent sends, recording from many threads, bounds, a real leak."""

from __future__ import annotations

import json
import logging
import mmap
import threading
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from edge_node.agent.runtime_host import RuntimeUse
from edge_node.capture import CaptureStats
from edge_node.clock import ManualClock
from edge_node.link.uplink import UplinkStats
from edge_node.outbox import OutboxStats
from edge_node.runtime.streams import StreamStats
from edge_node.runtime.timing import ManualTicker
from edge_node.telemetry import (
    HEALTH_SCHEMA,
    ErrorLogHandler,
    SystemProbe,
    SystemSample,
    Telemetry,
    TelemetryConfig,
    encode_report,
)
from edge_node.telemetry.memory import MB
from edge_node.telemetry.thermal import CpuFreq, ThermalReading, ThermalZone
from protos.bundle.results import Decoded, InferenceResult
from protos.latency_sketch import LatencySketch

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UNKNOWN_THERMAL = ThermalReading(zones=(), cpu_freq=None, throttle_count=None)


class FakeProbe:
    """System samples a test scripts: RSS, CPU seconds and thermal readings."""

    def __init__(self, ticker: ManualTicker) -> None:
        self.ticker = ticker
        self.rss_bytes = 300 * MB
        self.cpu_s = 10.0
        self.thermal = UNKNOWN_THERMAL
        self.samples = 0

    def sample(self) -> SystemSample:
        self.samples += 1
        return SystemSample(
            monotonic_s=self.ticker.monotonic(),
            rss_bytes=self.rss_bytes,
            process_cpu_s=self.cpu_s,
            threads=12,
            system_memory_total_bytes=4000 * MB,
            system_memory_available_bytes=2500 * MB,
            system_cpu_percent=None if self.samples == 1 else 37.5,
            cpu_cores=4,
            boot_time_s=START.timestamp() - 86400.0,
            disk_free_bytes=20_000 * MB,
            disk_total_bytes=64_000 * MB,
            thermal=self.thermal,
        )


class Rig:
    def __init__(self, config: TelemetryConfig | None = None) -> None:
        self.ticker = ManualTicker(0.0)
        self.clock = ManualClock(START)
        self.probe = FakeProbe(self.ticker)
        self.telemetry = Telemetry(
            config or TelemetryConfig(memory_budget_bytes=512 * MB),
            clock=self.clock,
            probe=self.probe,
            ticker=self.ticker,
        )

    def advance(self, seconds: float) -> None:
        self.ticker.advance(seconds)
        self.clock.advance(timedelta(seconds=seconds))

    def report(self, **kw: Any) -> dict[str, Any]:
        kw.setdefault("node_id", "n-1")
        kw.setdefault("agent_version", "0.1.0")
        report = self.telemetry.report(self.clock.now(), **kw)
        json.loads(encode_report(report))  # always valid, finite JSON
        return report


def stream(name: str, **kw: Any) -> StreamStats:
    fields: dict[str, Any] = {
        "stream": name,
        "submitted": 0,
        "accepted": 0,
        "processed": 0,
        "dropped": {},
        "skipped": {},
        "bad": {},
        "failed": {},
        "queued": 0,
    }
    return StreamStats(**(fields | kw))


OUTBOX = OutboxStats(
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
    pending_results=4,
    dropped_results=2,
)


def test_a_report_carries_every_section_with_units_in_the_names() -> None:
    rig = Rig()
    rig.advance(30.0)
    for _ in range(300):
        rig.telemetry.record_frame("det@3", 0.002, 0.020)
    rig.probe.cpu_s += 3.0
    report = rig.report(
        active_model="det@3",
        streams={"gate": stream("gate", submitted=310, processed=300, dropped={"rate": 10})},
        queue_depth_frames=2,
        outbox=OUTBOX,
        uplink=UplinkStats(connects=1, records_sent=50, records_acked=48),
    )
    assert report["schema"] == HEALTH_SCHEMA == "edgefleet.agent.health/2"
    assert (report["node_id"], report["seq"], report["window_s"]) == ("n-1", 1, 30.0)
    assert report["window_start"] == START.isoformat()
    assert report["window_end"] == (START + timedelta(seconds=30)).isoformat()
    assert report["system_uptime_s"] == pytest.approx(86430.0)
    assert report["model_active"] == "det@3"
    version = report["latency"]["det@3"]
    assert version["frames"] == 300 and version["frames_per_s"] == 10.0
    assert version["compute"]["p99_ms"] == pytest.approx(20.0, rel=0.01)
    assert version["queue"]["p50_ms"] == pytest.approx(2.0, rel=0.01)
    assert version["end_to_end"]["max_ms"] == pytest.approx(22.0)
    sketch = LatencySketch.from_wire(version["end_to_end"]["sketch_ms"])
    assert sketch.count == 300
    assert version["drift"]["state"] == "warming_up"
    assert report["throughput"] == {"frames": 300, "frames_per_s": 10.0}
    assert report["drift_suspected"] is False
    assert report["streams"]["gate"]["dropped"] == {"rate": 10}
    assert report["frames_dropped"] == 10 and report["queue_depth_frames"] == 2
    memory = report["memory"]
    assert memory["rss_bytes"] == 300 * MB and memory["budget_bytes"] == 512 * MB
    assert memory["headroom_ratio"] == pytest.approx(0.414, abs=1e-3)
    assert memory["headroom_low"] is False and memory["over_budget"] is False
    assert memory["rss_slope_mb_per_h"] is None and memory["leak_suspected"] is False
    assert report["cpu"]["process_percent"] is None  # one sample: no interval yet
    assert report["disk"] == {
        "data_dir_free_bytes": 20_000 * MB,
        "data_dir_total_bytes": 64_000 * MB,
    }
    assert report["thermal"]["throttled"] is None and report["thermal"]["max_temp_c"] is None
    assert report["outbox"]["fill_ratio"] == 0.25 and report["outbox"]["pending_events"] == 12
    assert report["outbox"]["disk_bytes"] == 65_536
    assert (report["outbox"]["pending_results"], report["outbox"]["dropped_results"]) == (4, 2)
    assert report["uplink"]["records_acked"] == 48
    assert report["errors"] == {"count": 0, "last": None}
    assert report["telemetry"]["sketches_dropped"] is False
    assert report["telemetry"]["inline_folds"] == 0
    assert report["telemetry"]["report_cpu_ms"] >= 0.0


def test_windows_follow_each_other_and_counters_become_deltas() -> None:
    rig = Rig()
    rig.advance(10.0)
    gate = stream("gate", submitted=100, processed=90, dropped={"queue_full": 4}, skipped={})
    first = rig.report(streams={"gate": gate})
    rig.advance(20.0)
    rig.probe.cpu_s += 5.0
    gate = replace(gate, submitted=160, processed=140, dropped={"queue_full": 4, "shed": 2})
    second = rig.report(streams={"gate": gate})
    assert second["seq"] == 2 and second["window_start"] == first["window_end"]
    assert second["window_s"] == 20.0
    assert second["streams"]["gate"]["submitted"] == 60
    assert second["streams"]["gate"]["processed"] == 50
    assert second["streams"]["gate"]["dropped"] == {"shed": 2}  # zero deltas are left out
    assert second["cpu"] == {
        "process_percent": 25.0,
        "system_percent": 37.5,
        "cores": 4,
        "threads": 12,
    }
    # A new pipeline starts its counters again: what it counted is all new.
    third = rig.report(streams={"gate": replace(gate, submitted=7, processed=6, dropped={})})
    assert third["streams"]["gate"]["submitted"] == 7


def test_camera_capture_counts_are_window_deltas_on_streams_with_a_source() -> None:
    rig = Rig()
    gate = stream("gate", submitted=10, processed=10)
    side = stream("side", submitted=5, processed=5)
    captured = CaptureStats("gate", 10, {"timeout": 2}, 0, 0)
    first = rig.report(streams={"gate": gate, "side": side}, capture={"gate": captured})
    assert first["streams"]["gate"]["captured"] == 10
    assert first["streams"]["gate"]["capture_failed"] == {"timeout": 2}
    assert "captured" not in first["streams"]["side"]  # fed by a program, not a camera
    rig.advance(10.0)
    captured = CaptureStats("gate", 14, {"timeout": 2, "http_500": 3}, 0, 3)
    second = rig.report(streams={"gate": gate}, capture={"gate": captured})
    assert second["streams"]["gate"]["captured"] == 4
    assert second["streams"]["gate"]["capture_failed"] == {"http_500": 3}


def test_drop_directory_files_passed_over_are_window_deltas_by_reason() -> None:
    rig = Rig()
    yard = stream("yard", submitted=3, processed=3)
    captured = CaptureStats("yard", 3, {}, 4, 0, {"empty": 1})
    first = rig.report(streams={"yard": yard}, capture={"yard": captured})
    assert first["streams"]["yard"]["capture_passed_over"] == {"empty": 1, "superseded": 4}
    rig.advance(10.0)
    captured = CaptureStats("yard", 5, {}, 6, 0, {"empty": 1, "stale": 2})
    second = rig.report(streams={"yard": yard}, capture={"yard": captured})
    assert second["streams"]["yard"]["capture_passed_over"] == {"stale": 2, "superseded": 2}


def test_the_outbox_fill_is_of_the_records_part_by_estimate_or_real_pages() -> None:
    rig = Rig()
    # 1 MiB budget, 128 KiB of it the WAL's: the records may fill 896 KiB.
    outbox = replace(OUTBOX, budget_bytes=1 << 20, wal_reserve_bytes=128 << 10, bytes=448 << 10)
    assert rig.report(outbox=outbox)["outbox"]["fill_ratio"] == 0.5
    fragmented = replace(outbox, stored_bytes=896 << 10)  # the pages are full: thinning
    assert rig.report(outbox=fragmented)["outbox"]["fill_ratio"] == 1.0


def test_drift_is_reported_per_version_once_its_baseline_is_ready() -> None:
    config = TelemetryConfig(
        drift_warmup_frames=10,
        drift_warmup_s=0.0,
        drift_baseline_frames=200,
        drift_min_window_frames=50,
    )
    rig = Rig(config)
    for i in range(300):
        rig.telemetry.record_frame("a", 0.001, 0.010 + (i % 10) * 0.0001)
    rig.advance(30.0)
    assert rig.report()["latency"]["a"]["drift"]["state"] == "ready"
    for i in range(100):
        rig.telemetry.record_frame("a", 0.001, 0.025 + (i % 10) * 0.0001)
        rig.telemetry.record_frame("b", 0.001, 0.050)
    rig.advance(30.0)
    report = rig.report()
    a, b = report["latency"]["a"]["drift"], report["latency"]["b"]["drift"]
    assert a["suspected"] and a["compute"]["p95_ratio"] == pytest.approx(25.9 / 10.9, rel=0.03)
    assert b["state"] == "collecting" and not b["suspected"]
    assert report["drift_suspected"] is True


def test_an_rss_leak_sets_the_flag_and_memory_headroom_is_judged() -> None:
    config = TelemetryConfig(memory_budget_bytes=512 * MB, rss_min_span_s=600.0, leak_for_s=300.0)
    rig = Rig(config)
    flagged_at = None
    for step in range(1, 121):  # two hours of reports every minute, 2 MB a minute
        rig.advance(60.0)
        rig.probe.rss_bytes += 2 * MB
        memory = rig.report()["memory"]
        if memory["leak_suspected"] and flagged_at is None:
            flagged_at = step
    assert flagged_at is not None and flagged_at <= 60
    assert memory["rss_slope_mb_per_h"] == pytest.approx(120.0, rel=0.01)
    assert memory["rss_bytes"] == 540 * MB
    assert memory["over_budget"] is True and memory["headroom_low"] is True


def test_throttling_from_the_probe_s_thermal_readings() -> None:
    rig = Rig()
    hot_zone = ThermalZone("cpu-thermal", 82.0, 80.0, 95.0)
    freq = CpuFreq(
        cpus=4,
        current_khz=1_200_000,
        lowest_khz=1_000_000,
        limit_khz=1_500_000,
        hardware_max_khz=1_800_000,
    )
    rig.probe.thermal = ThermalReading((replace(hot_zone, temp_c=60.0),), freq, 5)
    cool = rig.report()["thermal"]
    assert cool["throttled"] is False and cool["throttle_events"] is None
    assert cool["zones"] == [{"name": "cpu-thermal", "temp_c": 60.0, "passive_c": 80.0}]
    assert (cool["cpu_freq_khz"], cool["cpu_freq_limit_khz"], cool["cpu_freq_max_khz"]) == (
        1_200_000,
        1_500_000,
        1_800_000,
    )
    rig.probe.thermal = ThermalReading((replace(hot_zone, temp_c=60.0),), freq, 9)
    counted = rig.report()["thermal"]
    assert counted["throttled"] is True and counted["throttle_events"] == 4
    rig.probe.thermal = ThermalReading((hot_zone,), freq, 9)
    hot = rig.report()["thermal"]
    assert hot["throttled"] is True and hot["max_temp_c"] == 82.0 and hot["throttle_events"] == 0


def test_errors_count_per_window_and_the_last_one_is_kept() -> None:
    rig = Rig()
    logger = logging.getLogger("edge_node.test_telemetry")
    handler = ErrorLogHandler(rig.telemetry)
    logger.addHandler(handler)
    try:
        logger.warning("not an error")
        rig.telemetry.record_error("updater", "self-test failed: " + "x" * 2000)
        rig.advance(5.0)
        logger.error("inference failed on %s", "gate")
    finally:
        logger.removeHandler(handler)
    errors = rig.report()["errors"]
    assert errors["count"] == 2
    assert errors["last"] == {
        "at": (START + timedelta(seconds=5)).isoformat(),
        "source": "edge_node.test_telemetry",
        "message": "inference failed on gate",
    }
    later = rig.report()["errors"]
    assert later["count"] == 0 and later["last"] == errors["last"]  # the last error stays shown


def test_recording_from_many_threads_loses_and_doubles_nothing() -> None:
    rig = Rig(TelemetryConfig(pending_frames_limit=1000))
    per_thread, threads = 20_000, 4
    reports: list[dict[str, Any]] = []
    done = threading.Event()

    def record(index: int) -> None:
        for i in range(per_thread):
            rig.telemetry.record_frame(f"m{index % 2}", 0.001, 0.001 * (1 + i % 50))

    def report_meanwhile() -> None:
        while not done.is_set():
            reports.append(rig.report())

    reporter = threading.Thread(target=report_meanwhile)
    reporter.start()
    workers = [threading.Thread(target=record, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    reporter.join()
    reports.append(rig.report())
    frames: Counter[str] = Counter()
    for report in reports:
        for model, version in report["latency"].items():
            frames[model] += version["frames"]
            assert version["end_to_end"]["sketch_ms"]["n"] == version["frames"]
    assert frames == {"m0": 2 * per_thread, "m1": 2 * per_thread}
    assert rig.telemetry.pending_frames == 0


def test_without_reports_the_recording_thread_folds_at_the_bound() -> None:
    rig = Rig(TelemetryConfig(pending_frames_limit=100))
    for _ in range(1050):
        rig.telemetry.record_frame("a", 0.001, 0.002)
        assert rig.telemetry.pending_frames < 100
    report = rig.report()
    assert report["latency"]["a"]["frames"] == 1050
    assert report["telemetry"]["inline_folds"] == 10


def test_a_report_over_its_byte_bound_drops_sketches_then_stream_detail() -> None:
    config = TelemetryConfig(max_report_bytes=6000, max_model_versions=4)
    rig = Rig(config)
    for model in ("a", "b", "c", "d"):
        for i in range(2000):
            rig.telemetry.record_frame(model, 0.0001 * (1 + i), 0.0002 * (1 + i))
    streams = {f"cam-{n:03d}": stream(f"cam-{n:03d}", submitted=n) for n in range(200)}
    report = rig.report(streams=streams)
    assert len(encode_report(report)) <= 6000
    assert report["telemetry"]["sketches_dropped"] is True
    assert "sketch_ms" not in report["latency"]["a"]["compute"]
    assert report["latency"]["a"]["compute"]["p99_ms"] is not None  # percentiles stay
    assert report["streams"] == {} and report["streams_omitted"] == 200


def test_the_agents_payload_is_the_bounded_report_encoded_once() -> None:
    config = TelemetryConfig(max_report_bytes=6000, max_model_versions=4)
    rig = Rig(config)
    for model in ("a", "b", "c", "d"):
        for i in range(2000):
            rig.telemetry.record_frame(model, 0.0001 * (1 + i), 0.0002 * (1 + i))
    streams = {f"cam-{n:03d}": stream(f"cam-{n:03d}", submitted=n) for n in range(200)}
    payload = rig.telemetry.report_payload(
        rig.clock.now(), node_id="n-1", agent_version="0.1.0", streams=streams
    )
    assert len(payload) <= 6000
    report = json.loads(payload)
    assert encode_report(report) == payload  # the outbox's encoding, checked
    assert report["seq"] == 1 and report["node_id"] == "n-1"
    assert report["telemetry"]["sketches_dropped"] is True
    assert report["streams"] == {} and report["streams_omitted"] == 200
    assert report["telemetry"]["report_cpu_ms"] > 0.0  # the check's time is in it


def test_stream_count_is_bounded_and_what_is_left_out_is_counted() -> None:
    rig = Rig(TelemetryConfig(max_streams=3))
    report = rig.report(streams={f"s{n}": stream(f"s{n}", submitted=1) for n in range(5)})
    assert sorted(report["streams"]) == ["s0", "s1", "s2"] and report["streams_omitted"] == 2


def test_a_default_report_of_a_busy_node_is_small() -> None:
    rig = Rig()
    for i in range(6000):  # 200 frames/s for 30 s, two versions during a swap
        rig.telemetry.record_frame(
            "a" if i < 3000 else "b", 0.0005 * (i % 7), 0.015 + 0.00001 * (i % 300)
        )
    streams = {f"cam{n}": stream(f"cam{n}", submitted=750, processed=750) for n in range(8)}
    size = len(encode_report(rig.report(streams=streams, outbox=OUTBOX)))
    assert size < 12_000, size


def test_drift_baselines_can_be_carried_over_a_restart() -> None:
    config = TelemetryConfig(drift_warmup_frames=0, drift_warmup_s=0.0, drift_baseline_frames=100)
    rig = Rig(config)
    for _ in range(200):
        rig.telemetry.record_frame("a", 0.0, 0.010)
    rig.report()
    saved = json.loads(json.dumps(rig.telemetry.export_baselines()))
    restarted = Rig(config)
    restarted.telemetry.import_baselines(saved)
    for _ in range(200):
        restarted.telemetry.record_frame("a", 0.0, 0.030)
    drift = restarted.report()["latency"]["a"]["drift"]
    assert drift["state"] == "ready" and drift["suspected"] is True


def test_an_allocating_test_hook_is_seen_by_the_real_probe_as_a_leak(tmp_path: Path) -> None:
    """The real probe (psutil RSS) while this test allocates 4 MB per simulated minute."""
    ticker = ManualTicker(0.0)
    config = TelemetryConfig(rss_min_span_s=600.0, leak_for_s=300.0, leak_slope_mb_per_h=50.0)
    telemetry = Telemetry(
        config, clock=ManualClock(START), probe=SystemProbe(tmp_path, ticker=ticker), ticker=ticker
    )
    # Fresh anonymous pages, written so resident: a bytearray may reuse heap pages that an
    # earlier test in this worker freed while still resident (glibc raises its mmap
    # threshold after large frees), and then RSS does not grow.
    held: list[mmap.mmap] = []
    flagged = None
    for minute in range(40):
        pages = mmap.mmap(-1, 4 * MB)
        pages.write(b"\x01" * (4 * MB))
        held.append(pages)
        ticker.advance(60.0)
        telemetry.sample()
        if telemetry.report(START, node_id="n", agent_version="t")["memory"]["leak_suspected"]:
            flagged = minute
            break
    assert flagged is not None and flagged <= 30
    for pages in held:
        pages.close()


def test_a_steady_process_under_the_real_probe_is_not_a_leak(tmp_path: Path) -> None:
    """Allocate and free 16 MB every other sample: noisy RSS, no trend."""
    ticker = ManualTicker(0.0)
    config = TelemetryConfig(rss_min_span_s=600.0, leak_for_s=300.0, leak_slope_mb_per_h=50.0)
    telemetry = Telemetry(
        config, clock=ManualClock(START), probe=SystemProbe(tmp_path, ticker=ticker), ticker=ticker
    )
    held: list[bytearray] = []
    for minute in range(40):
        if minute % 2:
            held.append(bytearray(b"\x01") * (16 * MB))
        else:
            held.clear()
        ticker.advance(60.0)
        report = telemetry.report(START, node_id="n", agent_version="t")
        assert not report["memory"]["leak_suspected"]
    assert report["disk"]["data_dir_free_bytes"] > 0
    assert report["cpu"]["process_percent"] is not None


def _result(version: str, compute_s: float, model: str = "det") -> InferenceResult:
    return InferenceResult(
        stream="gate",
        frame_id=0,
        captured_at=START,
        model=model,
        version=version,
        decoded=Decoded("raw"),
        queue_s=0.001,
        preprocess_s=compute_s / 2,
        inference_s=compute_s / 4,
        decode_s=compute_s / 4,
    )


def test_latency_and_drift_baselines_are_kept_per_version_by_name_at_version() -> None:
    config = TelemetryConfig(drift_warmup_frames=0, drift_warmup_s=0.0, drift_baseline_frames=100)
    rig = Rig(config)
    for _ in range(200):
        rig.telemetry.record_result(_result("1.0.0", 0.010))
    rig.advance(30.0)
    first = rig.report()
    assert set(first["latency"]) == {"det@1.0.0"}
    # Compute is preprocess + inference + decode.
    assert first["latency"]["det@1.0.0"]["compute"]["p50_ms"] == pytest.approx(10.0, rel=0.02)
    assert first["latency"]["det@1.0.0"]["drift"]["state"] == "ready"
    # A hot swap to 1.1.0 (the same file name in the store) starts its own baseline.
    for _ in range(50):
        rig.telemetry.record_result(_result("1.1.0", 0.030))
    rig.advance(30.0)
    second = rig.report()
    assert set(second["latency"]) == {"det@1.1.0"}
    assert second["latency"]["det@1.1.0"]["drift"]["state"] == "collecting"
    assert set(rig.telemetry.export_baselines()) == {"det@1.0.0"}


def test_the_report_says_where_the_active_models_runtime_config_comes_from() -> None:
    rig = Rig()
    assert rig.report()["model_runtime"] is None
    use = RuntimeUse("signed", ("intra_op_threads",), node_preprocess_ignored=True)
    report = rig.report(active_model="det@1.1.0", model_runtime=use.to_report())
    assert report["model_active"] == "det@1.1.0"
    assert report["model_runtime"] == {
        "config": "signed",
        "session_overrides": ["intra_op_threads"],
        "node_preprocess_ignored": True,
    }


def test_the_shadow_section_is_carried_and_its_sketch_shed_like_the_others() -> None:
    from edge_node.telemetry.report import sketch_summary
    from protos.latency_sketch import LatencySketch

    rig = Rig(TelemetryConfig(max_report_bytes=4096))
    assert rig.report()["shadow"] is None
    sketch = LatencySketch()
    for i in range(500):
        sketch.add(0.05 * 1.03**i)  # a bucket each
    shadow = {
        "candidate": "det@1.2.0",
        "state": "running",
        "reason": None,
        "detail": "",
        "sample_per_mille": 50,
        "max_cpu_percent": 10,
        "against": "det@1.1.0",
        "frames_compared": 500,
        "cpu_percent": 4.2,
        "agreement": {"kind": "detection", "frames": 500, "incomparable": 0, "recall": 0.97},
        "latency": sketch_summary(sketch, with_sketch=True),
        "rss_delta_bytes": 12 * MB,
    }
    for i in range(2000):
        rig.telemetry.record_frame("det@1.1.0", 0.0001 * (1 + i), 0.0002 * (1 + i))
    report = rig.report(shadow=shadow)
    assert len(encode_report(report)) <= 4096
    assert report["telemetry"]["sketches_dropped"] is True
    assert "sketch_ms" not in report["shadow"]["latency"]
    assert report["shadow"]["latency"]["p99_ms"] is not None
    assert report["shadow"]["agreement"]["recall"] == 0.97
