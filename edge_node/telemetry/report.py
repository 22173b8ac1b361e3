"""The health report's sections, built from plain data: schema ``edgefleet.agent.health/2``.

What it is for: turning one window's numbers (latency sketches and drift, the RSS trend,
stream counters, a system sample, the outbox and uplink counters the agent passes in) into
the JSON document the agent appends to its outbox, with units in every name (``_ms``,
``_bytes``, ``_s``, ``_c``, ``_khz``, ``_mb_per_h``, ``_percent``, ``_ratio``) and a bounded
size: a report over ``max_report_bytes`` first loses its sketches (percentiles stay), then
its per-stream detail, and says so. The document is the JSON form of ``HealthReport``
(``protos/edgefleet/fleet/v1/health.proto``, ADR 0024): ``encode`` and ``bound_size`` check
it against that definition and refuse one that does not fit (``ReportSchemaError``), so
nothing the control plane's schema does not know leaves the node. Every field is described
in docs/operator-guide.md ("Node health reports"); readers must ignore fields they do not
know (mixed fleets).

Pure: no clock, no I/O, no psutil; ``Telemetry`` gathers the inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from edge_node.telemetry.latency import DriftReading, LatencyWindow, RatioReading
from edge_node.telemetry.memory import RssTrendReading
from edge_node.telemetry.thermal import ThermalReading
from protos.health_schema import SCHEMA, ReportSchemaError, check_report
from protos.latency_sketch import LatencySketch

__all__ = [
    "HEALTH_SCHEMA",
    "CaptureCounts",
    "ErrorNote",
    "OutboxCounts",
    "ReportSchemaError",
    "StreamCounts",
    "StreamTotals",
    "UplinkCounts",
    "bound_size",
    "cpu_section",
    "encode",
    "errors_section",
    "fit_checked",
    "latency_section",
    "memory_section",
    "outbox_section",
    "sketch_summary",
    "stream_section",
    "thermal_section",
    "uplink_section",
]

HEALTH_SCHEMA: Final = SCHEMA
_QUANTILES: Final = (0.5, 0.95, 0.99)
_COUNTER_GROUPS: Final = ("dropped", "skipped", "bad", "failed")
_MAX_REASONS: Final = 32


class StreamCounts(Protocol):
    """One stream's cumulative counters (``edge_node.runtime.StreamStats`` fits)."""

    @property
    def submitted(self) -> int: ...
    @property
    def processed(self) -> int: ...
    @property
    def dropped(self) -> Mapping[str, int]: ...
    @property
    def skipped(self) -> Mapping[str, int]: ...
    @property
    def bad(self) -> Mapping[str, int]: ...
    @property
    def failed(self) -> Mapping[str, int]: ...
    @property
    def queued(self) -> int: ...


class CaptureCounts(Protocol):
    """One stream's camera capture counters (``edge_node.capture.CaptureStats`` fits)."""

    @property
    def captured(self) -> int: ...
    @property
    def failures(self) -> Mapping[str, int]: ...
    @property
    def superseded(self) -> int: ...
    @property
    def discarded(self) -> Mapping[str, int]: ...


class OutboxCounts(Protocol):
    """The outbox's counters (``edge_node.outbox.OutboxStats`` fits)."""

    @property
    def pending_events(self) -> int: ...
    @property
    def pending_health(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def dropped_health(self) -> int: ...
    @property
    def refused_events(self) -> int: ...
    @property
    def alarm(self) -> bool: ...
    @property
    def disk_bytes(self) -> int: ...
    @property
    def wal_reserve_bytes(self) -> int: ...
    @property
    def stored_bytes(self) -> int: ...
    @property
    def pending_results(self) -> int: ...
    @property
    def dropped_results(self) -> int: ...


class UplinkCounts(Protocol):
    """The uplink's counters (``edge_node.link.uplink.UplinkStats`` fits)."""

    @property
    def connects(self) -> int: ...
    @property
    def disconnects(self) -> int: ...
    @property
    def records_sent(self) -> int: ...
    @property
    def records_acked(self) -> int: ...
    @property
    def ack_timeouts(self) -> int: ...


StreamTotals = dict[str, Any]
"""A stream's cumulative counters as last reported (the base of the next window's deltas)."""


@dataclass(frozen=True, slots=True)
class ErrorNote:
    at: datetime
    source: str
    message: str


# -- latency ---------------------------------------------------------------------------


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def sketch_summary(sketch: LatencySketch, *, with_sketch: bool) -> dict[str, Any]:
    p50, p95, p99 = sketch.quantiles(_QUANTILES)
    summary: dict[str, Any] = {
        "p50_ms": _ms(p50),
        "p95_ms": _ms(p95),
        "p99_ms": _ms(p99),
        "max_ms": _ms(sketch.max) if sketch.count else None,
        "mean_ms": _ms(sketch.mean),
    }
    if with_sketch:
        summary["sketch_ms"] = sketch.to_wire()
    return summary


def _ratio_section(reading: RatioReading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {
        "p95_ratio": _ratio(reading.p95_ratio),
        "p99_ratio": _ratio(reading.p99_ratio),
        "baseline_p95_ms": _ms(reading.baseline_p95_ms),
        "baseline_p99_ms": _ms(reading.baseline_p99_ms),
    }


def _drift_section(drift: DriftReading) -> dict[str, Any]:
    return {
        "state": drift.state,
        "baseline_frames": drift.baseline_frames,
        "suspected": drift.suspected,
        "compute": _ratio_section(drift.compute),
        "end_to_end": _ratio_section(drift.end_to_end),
    }


def latency_section(window: LatencyWindow, window_s: float) -> dict[str, Any]:
    """``latency`` (per version), ``latency_omitted``, ``throughput``, ``drift_suspected``."""
    per_s = 1.0 / window_s if window_s > 0 else 0.0
    versions = {
        model: {
            "frames": version.frames,
            "frames_per_s": round(version.frames * per_s, 3),
            "queue": sketch_summary(version.queue, with_sketch=True),
            "compute": sketch_summary(version.compute, with_sketch=True),
            "end_to_end": sketch_summary(version.end_to_end, with_sketch=True),
            "drift": _drift_section(version.drift),
        }
        for model, version in window.versions.items()
    }
    return {
        "latency": versions,
        "latency_omitted": {
            "versions": window.omitted_versions,
            "frames": window.omitted_frames,
        },
        "throughput": {
            "frames": window.frames,
            "frames_per_s": round(window.frames * per_s, 3),
        },
        "drift_suspected": any(v.drift.suspected for v in window.versions.values()),
    }


# -- streams ---------------------------------------------------------------------------


def _delta(current: int, previous: int) -> int:
    # A counter below its last value was reset (a new pipeline): all of it is new.
    return current - previous if current >= previous else current


def _reason_deltas(current: Mapping[str, int], previous: Mapping[str, int]) -> dict[str, int]:
    deltas = {
        str(reason)[:64]: _delta(count, previous.get(reason, 0))
        for reason, count in current.items()
    }
    kept = sorted((r for r, n in deltas.items() if n), key=lambda r: -deltas[r])[:_MAX_REASONS]
    return {reason: deltas[reason] for reason in sorted(kept)}


def stream_section(
    current: Mapping[str, StreamCounts],
    previous: Mapping[str, StreamTotals],
    max_streams: int,
    capture: Mapping[str, CaptureCounts] | None = None,
) -> tuple[dict[str, Any], dict[str, StreamTotals]]:
    """``streams`` (this window's counts per stream, with ``captured``,
    ``capture_failed`` and ``capture_passed_over`` for a stream with a camera source),
    ``streams_omitted``, ``frames_dropped``; and the totals to diff the next window
    against."""
    streams: dict[str, Any] = {}
    totals: dict[str, StreamTotals] = {}
    dropped = 0
    for name in sorted(current):
        counts = current[name]
        before = previous.get(name, {})
        total: StreamTotals = {
            "submitted": counts.submitted,
            "processed": counts.processed,
            **{group: dict(getattr(counts, group)) for group in _COUNTER_GROUPS},
        }
        totals[name] = total
        entry: dict[str, Any] = {
            "submitted": _delta(counts.submitted, before.get("submitted", 0)),
            "processed": _delta(counts.processed, before.get("processed", 0)),
        }
        for group in _COUNTER_GROUPS:
            entry[group] = _reason_deltas(total[group], before.get(group, {}))
        entry["queued"] = counts.queued
        captured = (capture or {}).get(name)
        if captured is not None:
            total["captured"] = captured.captured
            total["capture_failed"] = dict(captured.failures)
            entry["captured"] = _delta(captured.captured, before.get("captured", 0))
            entry["capture_failed"] = _reason_deltas(
                total["capture_failed"], before.get("capture_failed", {})
            )
            passed_over = {**captured.discarded, "superseded": captured.superseded}
            total["capture_passed_over"] = passed_over
            entry["capture_passed_over"] = _reason_deltas(
                passed_over, before.get("capture_passed_over", {})
            )
        dropped += sum(entry["dropped"].values())
        if len(streams) < max_streams:
            streams[str(name)[:128]] = entry
    return (
        {
            "streams": streams,
            "streams_omitted": len(current) - len(streams),
            "frames_dropped": dropped,
        },
        totals,
    )


# -- memory, cpu, disk, thermal ----------------------------------------------------------


def memory_section(
    *,
    rss_bytes: int,
    budget_bytes: int | None,
    min_headroom_ratio: float,
    system_total_bytes: int,
    system_available_bytes: int,
    trend: RssTrendReading,
) -> dict[str, Any]:
    headroom = None if budget_bytes is None else (budget_bytes - rss_bytes) / budget_bytes
    slope = trend.slope_mb_per_h
    return {
        "rss_bytes": rss_bytes,
        "budget_bytes": budget_bytes,
        "over_budget": None if budget_bytes is None else rss_bytes > budget_bytes,
        "headroom_ratio": _ratio(headroom),
        "headroom_low": None if headroom is None else headroom < min_headroom_ratio,
        "system_total_bytes": system_total_bytes,
        "system_available_bytes": system_available_bytes,
        "rss_slope_mb_per_h": None if slope is None else round(slope, 3),
        "rss_trend_span_s": round(trend.span_s, 1),
        "rss_trend_points": trend.points,
        "rss_over_threshold_s": round(trend.over_threshold_s, 1),
        "leak_suspected": trend.leak_suspected,
    }


def cpu_section(
    *,
    process_cpu_s: float,
    previous_cpu_s: float | None,
    elapsed_s: float,
    system_percent: float | None,
    cores: int,
    threads: int,
) -> dict[str, Any]:
    process = None
    if previous_cpu_s is not None and elapsed_s > 0:
        process = round(max(0.0, process_cpu_s - previous_cpu_s) / elapsed_s * 100.0, 1)
    return {
        "process_percent": process,
        "system_percent": None if system_percent is None else round(system_percent, 1),
        "cores": cores,
        "threads": threads,
    }


def thermal_section(
    reading: ThermalReading, previous: ThermalReading | None, throttled: bool | None
) -> dict[str, Any]:
    freq = reading.cpu_freq
    events = None
    before = None if previous is None else previous.throttle_count
    if reading.throttle_count is not None and before is not None:
        events = _delta(reading.throttle_count, before)
    return {
        "max_temp_c": reading.max_temp_c,
        "zones": [
            {"name": zone.name, "temp_c": zone.temp_c, "passive_c": zone.passive_c}
            for zone in reading.zones
        ],
        "cpu_freq_khz": None if freq is None else freq.current_khz,
        "cpu_freq_lowest_khz": None if freq is None else freq.lowest_khz,
        "cpu_freq_limit_khz": None if freq is None else freq.limit_khz,
        "cpu_freq_max_khz": None if freq is None else freq.hardware_max_khz,
        "throttle_events": events,
        "throttled": throttled,
    }


# -- what the agent passes through -------------------------------------------------------


def outbox_section(outbox: OutboxCounts | None) -> dict[str, Any] | None:
    if outbox is None:
        return None
    budget = outbox.budget_bytes
    # The records' part of the budget (the rest is the WAL's), filled by the estimate or
    # by the pages the records really take, whichever is more: thinning starts at 1.0.
    records = budget - outbox.wal_reserve_bytes
    used = max(outbox.bytes, outbox.stored_bytes)
    return {
        "pending_events": outbox.pending_events,
        "pending_health": outbox.pending_health,
        "bytes": outbox.bytes,
        "budget_bytes": budget,
        "fill_ratio": _ratio(used / records) if records > 0 else None,
        "dropped_health": outbox.dropped_health,
        "refused_events": outbox.refused_events,
        "alarm": outbox.alarm,
        "disk_bytes": outbox.disk_bytes,
        "pending_results": outbox.pending_results,
        "dropped_results": outbox.dropped_results,
    }


def uplink_section(uplink: UplinkCounts | None) -> dict[str, Any] | None:
    if uplink is None:
        return None
    return {
        "connects": uplink.connects,
        "disconnects": uplink.disconnects,
        "records_sent": uplink.records_sent,
        "records_acked": uplink.records_acked,
        "ack_timeouts": uplink.ack_timeouts,
    }


def errors_section(count: int, last: ErrorNote | None) -> dict[str, Any]:
    return {
        "count": count,
        "last": None
        if last is None
        else {"at": last.at.isoformat(), "source": last.source, "message": last.message},
    }


# -- size ------------------------------------------------------------------------------


def encode(report: Mapping[str, Any]) -> bytes:
    """The report as the outbox stores it: compact, sorted JSON, UTF-8; checked against
    ``HealthReport`` first (``ReportSchemaError`` names each field that does not fit)."""
    check_report(report)
    return _dump(report)


def _dump(report: Mapping[str, Any]) -> bytes:
    return json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _sketch_holders(report: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    for version in report.get("latency", {}).values():
        for kind in ("queue", "compute", "end_to_end"):
            holder = version.get(kind)
            if isinstance(holder, dict):
                yield holder
    shadow = report.get("shadow")
    if isinstance(shadow, dict):
        for kind in ("latency", "reference_latency"):
            if isinstance(shadow.get(kind), dict):
                yield shadow[kind]


def bound_size(report: dict[str, Any], max_bytes: int) -> bytes:
    """Check and encode ``report``, shedding detail until it fits in ``max_bytes``; mark
    what went.

    First the sketches (``telemetry.sketches_dropped``), then the per-stream detail
    (``streams`` emptied, ``streams_omitted`` counts them). Mutates ``report``. Checked
    once, before shedding: shedding only removes fields and sets ones the schema has.
    """
    check_report(report)
    return fit_checked(report, max_bytes)


def fit_checked(report: dict[str, Any], max_bytes: int) -> bytes:
    """``bound_size`` of a report its caller has just passed through ``check_report``
    (``Telemetry`` does, so that the check is inside the report's own CPU time)."""
    data = _dump(report)
    if len(data) <= max_bytes:
        return data
    for holder in _sketch_holders(report):
        holder.pop("sketch_ms", None)
    report.setdefault("telemetry", {})["sketches_dropped"] = True
    data = _dump(report)
    if len(data) <= max_bytes:
        return data
    streams = report.get("streams") or {}
    report["streams_omitted"] = report.get("streams_omitted", 0) + len(streams)
    report["streams"] = {}
    return _dump(report)
