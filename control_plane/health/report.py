"""Reading a node's health report (``edgefleet.agent.health/1`` and ``/2``) into one point.

What it is for: the health processor hands it a stored record's payload and gets a
``HealthPoint``: a flat map of numbers (names below, units in the names) and, per model
version, the latency percentiles with the mergeable sketch when the node sent one. A ``/2``
report is read through its definition, ``HealthReport`` in
``protos/edgefleet/fleet/v1/health.proto`` (``protos.health_schema.conform_report``, ADR
0024): fields it does not declare are ignored and a field of the wrong type is left out, so
mixed fleets and newer agents are read as far as they are understood; a schema version above
2 is read like 2. ``/1`` predates the definition and is read by hand. Only a report that
cannot be read at all (over 512 KiB, not JSON, not an object, no
``edgefleet.agent.health/N`` schema) raises ``MalformedReportError``.

The ``shadow`` section (a candidate run beside the active model, ADR 0031) becomes
``shadow_*`` numbers among the metrics, so they reach the series, roll-ups and latest
values like any other, and ``HealthPoint.shadow``: the section as read (candidate, state,
reason, the figures), without its sketch. The ``model_runtime`` section (issue 12 §1:
whether the served version runs with its signed runtime spec or node.yaml's preprocess,
and which session settings node.yaml overrides on the box) becomes
``HealthPoint.model_runtime``, bounded text.

Pure: no I/O, no clock (the caller passes the record's ``created_at`` for reports that
carry no window end).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from protos.bundle.levels import ABS_DIFF_LEVELS, COSINE_LEVELS
from protos.health_schema import SCHEMA_PREFIX, conform_report
from protos.latency_sketch import LatencySketch, SketchError

__all__ = [
    "LATENCY_KINDS",
    "METRICS",
    "SCHEMA_PREFIX",
    "HealthPoint",
    "MalformedReportError",
    "parse_report",
    "shadow_abs_diff_metric",
    "shadow_cosine_metric",
]

LATENCY_KINDS: Final = ("end_to_end", "compute", "queue")
_PERCENTILES: Final = ("p50_ms", "p95_ms", "p99_ms", "max_ms")
MAX_VERSIONS: Final = 16
MAX_PAYLOAD_BYTES: Final = 512 * 1024


def shadow_cosine_metric(level: float) -> str:
    """The metric of raw frames with a cosine similarity of at least `level`."""
    return f"shadow_cosine_at_least_{level:g}"


def shadow_abs_diff_metric(level: float) -> str:
    """The metric of raw frames with a largest absolute difference of at most `level`."""
    return f"shadow_abs_diff_at_most_{level:g}"


METRICS: Final = {
    "uptime_s": "seconds since the agent started",
    "window_s": "length of the report window",
    "p99_ms": "worst P99 end-to-end latency over the model versions (compute when absent)",
    "drift_p95_ratio": "worst P95 ratio to the post-install baseline",
    "drift_p99_ratio": "worst P99 ratio to the post-install baseline",
    "drift_suspected": "1 when the node flagged drift",
    "rss_bytes": "process resident memory",
    "memory_budget_bytes": "the node's memory budget",
    "headroom_ratio": "(budget - RSS) / budget",
    "rss_slope_mb_per_h": "robust RSS slope over the node's trend window",
    "leak_suspected": "1 when the node flagged a leak",
    "system_available_bytes": "memory the OS could still give",
    "cpu_process_percent": "agent CPU, percent of one core",
    "cpu_system_percent": "whole-system CPU percent",
    "frames": "frames inferred in the window",
    "frames_per_s": "throughput",
    "frames_dropped": "frames dropped in the window (all streams)",
    "frames_skipped": "frames skipped in the window (all streams)",
    "frames_bad": "frames the runtime could not use in the window (corrupt or wrong; all streams)",
    "frames_corrupt": "of frames_bad, those whose bytes did not decode (bad{corrupt})",
    "capture_failed": "failed grabs from camera sources in the window (all streams)",
    "capture_superseded": "drop-directory files passed over for a newer one in the window",
    "capture_discarded": "drop-directory files set aside unread in the window (empty, stale)",
    "queue_depth_frames": "frames waiting at the end of the window",
    "outbox_pending_events": "events waiting for their ack",
    "outbox_pending_health": "health reports waiting for their ack",
    "outbox_bytes": "outbox size",
    "outbox_budget_bytes": "outbox disk budget",
    "outbox_fill_ratio": "the records' share of the outbox budget in use",
    "outbox_disk_bytes": "what the outbox's files take on disk",
    "outbox_dropped_health": "health reports thinned or not stored (since the outbox began)",
    "outbox_refused_events": "events refused for want of room (since the outbox began)",
    "outbox_alarm": "1 when the outbox refused events or thinned health",
    "disk_free_bytes": "free space of the data directory",
    "max_temp_c": "hottest thermal zone",
    "throttled": "1 when the CPU was throttled in the window",
    "throttle_events": "throttle events counted in the window",
    "cpu_freq_khz": "current CPU frequency",
    "errors": "errors logged in the window",
    "shadow_running": "1 while a shadow candidate runs, 0 when it failed or is not running yet",
    "shadow_frames_compared": "frames the shadow candidate was compared on (since it started)",
    "shadow_samples_dropped": "sampled frames dropped: the candidate was busy",
    "shadow_samples_skipped_cpu": "sampled frames skipped to keep under the CPU cap",
    "shadow_cpu_percent": "the shadow candidate's CPU, percent of one core",
    "shadow_top1_ratio": "classification: share of frames with the active model's top class",
    "shadow_topk_overlap": "classification: mean share of top-k classes in common",
    "shadow_recall": "detection: share of the active model's boxes the candidate found",
    "shadow_precision": "detection: share of the candidate's boxes the active model found",
    "shadow_mean_score_diff": "detection: mean score difference of matched boxes",
    "shadow_max_abs_diff": "raw: largest absolute output difference",
    "shadow_min_cosine": "raw: lowest cosine similarity of the outputs",
    **{
        shadow_cosine_metric(level): f"raw: frames with a cosine similarity of at least {level:g}"
        for level in COSINE_LEVELS
    },
    **{
        shadow_abs_diff_metric(level): f"raw: frames with a largest difference of at most {level:g}"
        for level in ABS_DIFF_LEVELS
    },
    "shadow_p99_ms": "the shadow candidate's P99 time per sampled frame (its CPU time)",
    "shadow_reference_p99_ms": "the served model's P99 timed as the candidate is, same frames",
    "shadow_latency_ratio_p50": "median per-frame ratio of the candidate's time to the reference's",
    "shadow_rss_delta_bytes": "RSS growth while the candidate loaded and self-tested",
}
_SHADOW_AGREEMENT: Final = (
    "top1_ratio",
    "topk_overlap",
    "recall",
    "precision",
    "mean_score_diff",
    "max_abs_diff",
    "min_cosine",
)


class MalformedReportError(ValueError):
    """A health record that cannot be read as a report at all; ``reason`` says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HealthPoint:
    """One report, as the health store keeps it."""

    schema: str
    at: datetime
    metrics: dict[str, float] = field(default_factory=dict)
    # model version -> kind ("end_to_end", "compute", "queue") -> {"p50_ms", ..., "sketch_ms"}
    # and model version -> "drift" -> {"p95_ratio", "p99_ratio"}
    latency: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # The sketches of ``latency``, decoded once (decoding is most of a report's cost).
    decoded: dict[str, dict[str, LatencySketch]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # The report's ``shadow`` section without its sketch; None when it has none.
    shadow: dict[str, Any] | None = None
    # The report's ``model_runtime`` section, bounded; None when it has none.
    model_runtime: dict[str, Any] | None = None

    def sketches(self) -> dict[str, dict[str, LatencySketch]]:
        """The decoded sketches per model version and kind (only those sent)."""
        if self.decoded or not self.latency:
            return self.decoded
        found: dict[str, dict[str, LatencySketch]] = {}
        for model, kinds in self.latency.items():
            for kind in LATENCY_KINDS:
                wire = kinds.get(kind, {}).get("sketch_ms")
                if isinstance(wire, Mapping):
                    found.setdefault(model, {})[kind] = LatencySketch.from_wire(wire)
        return found


def parse_report(payload: bytes, *, created_at: datetime) -> HealthPoint:
    """Read one stored health record; raise ``MalformedReportError`` when it is unreadable."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedReportError("too-large", f"report over {MAX_PAYLOAD_BYTES} bytes")
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedReportError("not-json", f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise MalformedReportError("not-an-object", "a report must be a JSON object")
    schema = doc.get("schema")
    version = _schema_version(schema)
    if version is None:
        raise MalformedReportError("unknown-schema", f"unknown report schema {schema!r}")
    assert isinstance(schema, str)
    if version == 1:
        return HealthPoint(schema=schema, at=created_at, metrics=_v1_metrics(doc))
    # What the definition does not know, or not as this type, is left out here, so
    # the reading below sees declared fields of their declared types (or null).
    doc, _left_out = conform_report(doc)
    at = _timestamp(doc.get("window_end")) or created_at
    decoded: dict[str, dict[str, LatencySketch]] = {}
    latency = _latency(doc.get("latency"), decoded)
    metrics = _v2_metrics(doc)
    metrics.update(_latency_summary(latency))
    shadow = _shadow(doc.get("shadow"), metrics)
    return HealthPoint(
        schema=schema,
        at=at,
        metrics=metrics,
        latency=latency,
        decoded=decoded,
        shadow=shadow,
        model_runtime=_model_runtime(doc.get("model_runtime")),
    )


# -- helpers ---------------------------------------------------------------------------


def _schema_version(schema: object) -> int | None:
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        return None
    tail = schema[len(SCHEMA_PREFIX) :]
    if not tail.isdigit() or len(tail) > 4:
        return None
    version = int(tail)
    return version if version >= 1 else None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _section(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc.get(name)
    return value if isinstance(value, Mapping) else {}


def _put(metrics: dict[str, float], name: str, value: object) -> None:
    number = _number(value)
    if number is not None:
        metrics[name] = number


def _outbox(metrics: dict[str, float], outbox: Mapping[str, Any]) -> None:
    _put(metrics, "outbox_pending_events", outbox.get("pending_events"))
    _put(metrics, "outbox_pending_health", outbox.get("pending_health"))
    _put(metrics, "outbox_bytes", outbox.get("bytes"))
    _put(metrics, "outbox_budget_bytes", outbox.get("budget_bytes"))
    _put(metrics, "outbox_alarm", outbox.get("alarm"))
    _put(metrics, "outbox_fill_ratio", outbox.get("fill_ratio"))
    _put(metrics, "outbox_disk_bytes", outbox.get("disk_bytes"))
    _put(metrics, "outbox_dropped_health", outbox.get("dropped_health"))
    _put(metrics, "outbox_refused_events", outbox.get("refused_events"))
    if "outbox_fill_ratio" not in metrics:
        size, budget = metrics.get("outbox_bytes"), metrics.get("outbox_budget_bytes")
        if size is not None and budget:
            metrics["outbox_fill_ratio"] = round(size / budget, 3)


def _headroom(metrics: dict[str, float]) -> None:
    rss, budget = metrics.get("rss_bytes"), metrics.get("memory_budget_bytes")
    if "headroom_ratio" not in metrics and rss is not None and budget:
        metrics["headroom_ratio"] = round((budget - rss) / budget, 3)


def _v1_metrics(doc: Mapping[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    _put(metrics, "uptime_s", doc.get("uptime_s"))
    _put(metrics, "rss_bytes", doc.get("rss_bytes"))
    _put(metrics, "memory_budget_bytes", doc.get("memory_budget_bytes"))
    _headroom(metrics)
    _outbox(metrics, _section(doc, "outbox"))
    return metrics


def _v2_metrics(doc: Mapping[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name in ("uptime_s", "window_s", "queue_depth_frames", "frames_dropped"):
        _put(metrics, name, doc.get(name))
    _put(metrics, "drift_suspected", doc.get("drift_suspected"))
    throughput = _section(doc, "throughput")
    _put(metrics, "frames", throughput.get("frames"))
    _put(metrics, "frames_per_s", throughput.get("frames_per_s"))
    metrics.update(_stream_totals(_section(doc, "streams")))
    memory = _section(doc, "memory")
    _put(metrics, "rss_bytes", memory.get("rss_bytes"))
    _put(metrics, "memory_budget_bytes", memory.get("budget_bytes"))
    _put(metrics, "headroom_ratio", memory.get("headroom_ratio"))
    _put(metrics, "rss_slope_mb_per_h", memory.get("rss_slope_mb_per_h"))
    _put(metrics, "leak_suspected", memory.get("leak_suspected"))
    _put(metrics, "system_available_bytes", memory.get("system_available_bytes"))
    _headroom(metrics)
    cpu = _section(doc, "cpu")
    _put(metrics, "cpu_process_percent", cpu.get("process_percent"))
    _put(metrics, "cpu_system_percent", cpu.get("system_percent"))
    disk = _section(doc, "disk")
    _put(metrics, "disk_free_bytes", disk.get("data_dir_free_bytes"))
    thermal = _section(doc, "thermal")
    _put(metrics, "max_temp_c", thermal.get("max_temp_c"))
    _put(metrics, "throttled", thermal.get("throttled"))
    _put(metrics, "throttle_events", thermal.get("throttle_events"))
    _put(metrics, "cpu_freq_khz", thermal.get("cpu_freq_khz"))
    _outbox(metrics, _section(doc, "outbox"))
    _put(metrics, "errors", _section(doc, "errors").get("count"))
    return metrics


_MAX_OVERRIDES: Final = 32
_MAX_NAME_CHARS: Final = 64


def _model_runtime(section: object) -> dict[str, Any] | None:
    """The model_runtime section (conformed already), its text bounded: ``config``,
    ``session_overrides`` (names), ``node_preprocess_ignored``."""
    if not isinstance(section, Mapping):
        return None
    overrides = section.get("session_overrides") or []
    return {
        "config": str(section.get("config") or "")[:_MAX_NAME_CHARS],
        "session_overrides": [str(name)[:_MAX_NAME_CHARS] for name in overrides][:_MAX_OVERRIDES],
        "node_preprocess_ignored": section.get("node_preprocess_ignored") is True,
    }


def _shadow(section: object, metrics: dict[str, float]) -> dict[str, Any] | None:
    """The shadow section (conformed already) without its sketch; its numbers into
    `metrics` as `shadow_*`."""
    if not isinstance(section, Mapping):
        return None
    shadow = {
        key: value for key, value in section.items() if key not in ("latency", "reference_latency")
    }
    for kind, p99_name in (
        ("latency", "shadow_p99_ms"),
        ("reference_latency", "shadow_reference_p99_ms"),
    ):
        latency = section.get(kind)
        if isinstance(latency, Mapping):
            shadow[kind] = {k: v for k, v in latency.items() if k != "sketch_ms"}
            _put(metrics, p99_name, latency.get("p99_ms"))
    _put(metrics, "shadow_latency_ratio_p50", section.get("latency_ratio_p50"))
    metrics["shadow_running"] = 1.0 if section.get("state") == "running" else 0.0
    for name in ("frames_compared", "samples_dropped", "samples_skipped_cpu", "cpu_percent"):
        _put(metrics, f"shadow_{name}", section.get(name))
    _put(metrics, "shadow_rss_delta_bytes", section.get("rss_delta_bytes"))
    agreement = section.get("agreement")
    if isinstance(agreement, Mapping):
        for name in _SHADOW_AGREEMENT:
            _put(metrics, f"shadow_{name}", agreement.get(name))
        for levels, counts, metric in (
            (COSINE_LEVELS, agreement.get("cosine_at_least"), shadow_cosine_metric),
            (ABS_DIFF_LEVELS, agreement.get("abs_diff_at_most"), shadow_abs_diff_metric),
        ):
            # Counted at the levels this control plane knows, in their order, or not at all.
            if isinstance(counts, list) and len(counts) == len(levels):
                for level, count in zip(levels, counts, strict=True):
                    _put(metrics, metric(level), count)
    return shadow


def _total(counts: Mapping[str, Any], only: str | None = None) -> float:
    return sum(
        _number(count) or 0.0 for reason, count in counts.items() if only is None or reason == only
    )


def _stream_totals(streams: Mapping[str, Any]) -> dict[str, float]:
    """The per-stream counters summed over the streams; a capture number only where some
    stream has a camera source (and, for files passed over, a node that counts them)."""
    if not streams:
        return {}
    entries = [s for s in streams.values() if isinstance(s, Mapping)]
    totals = {
        "frames_skipped": sum(_total(_section(s, "skipped")) for s in entries),
        "frames_bad": sum(_total(_section(s, "bad")) for s in entries),
        "frames_corrupt": sum(_total(_section(s, "bad"), "corrupt") for s in entries),
    }
    if any("captured" in s for s in entries):
        totals["capture_failed"] = sum(_total(_section(s, "capture_failed")) for s in entries)
    passed_over = [_section(s, "capture_passed_over") for s in entries]
    if any("capture_passed_over" in s for s in entries):
        superseded = sum(_total(p, "superseded") for p in passed_over)
        totals["capture_superseded"] = superseded
        totals["capture_discarded"] = sum(_total(p) for p in passed_over) - superseded
    return totals


def _latency(
    section: object, decoded: dict[str, dict[str, LatencySketch]]
) -> dict[str, dict[str, dict[str, Any]]]:
    if not isinstance(section, Mapping):
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for model in sorted(section)[:MAX_VERSIONS]:
        entry = section[model]
        if not isinstance(model, str) or not isinstance(entry, Mapping) or len(model) > 200:
            continue
        kinds: dict[str, dict[str, Any]] = {}
        for kind in LATENCY_KINDS:
            summary = entry.get(kind)
            if not isinstance(summary, Mapping):
                continue
            values: dict[str, Any] = {}
            # The schema left only numbers (or null) here: a boolean is not a latency.
            for name in _PERCENTILES:
                number = _number(summary.get(name))
                if number is not None:
                    values[name] = number
            wire = summary.get("sketch_ms")
            if isinstance(wire, Mapping):
                # A bad sketch loses the merge, not the percentiles.
                with contextlib.suppress(SketchError):
                    decoded.setdefault(model, {})[kind] = LatencySketch.from_wire(wire)
                    values["sketch_ms"] = dict(wire)  # checked by from_wire
            if values:
                kinds[kind] = values
        drift = _section(entry, "drift")
        ratios: dict[str, Any] = {}
        for kind in ("end_to_end", "compute"):
            reading = _section(drift, kind)
            for name in ("p95_ratio", "p99_ratio"):
                number = _number(reading.get(name))
                if number is not None:
                    ratios[f"{kind}_{name}"] = number
        if ratios:
            kinds["drift"] = ratios
        if kinds:
            out[model] = kinds
    return out


def _latency_summary(latency: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, float]:
    """The fleet-at-a-glance numbers: worst P99 and worst drift over the versions."""
    summary: dict[str, float] = {}
    for kinds in latency.values():
        p99 = kinds.get("end_to_end", {}).get("p99_ms", kinds.get("compute", {}).get("p99_ms"))
        if p99 is not None:
            summary["p99_ms"] = max(summary.get("p99_ms", p99), p99)
        for name, value in kinds.get("drift", {}).items():
            key = "drift_p99_ratio" if name.endswith("p99_ratio") else "drift_p95_ratio"
            summary[key] = max(summary.get(key, value), value)
    return summary
