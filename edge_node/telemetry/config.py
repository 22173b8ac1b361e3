"""The node telemetry's settings: one frozen dataclass, checked when built, and its parser.

What it is for: every window, threshold and bound of the health report is written out here
with the unit in its name, so an operator can read what "leak suspected" or "drift" means
on a box. ``parse_telemetry_config`` takes the plain dict of a YAML section and rejects
unknown keys (a misspelt threshold must fail loudly, not fall back to a default).

What it is not for: reading files or the environment (``edge_node.config`` does that and
passes the section here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from edge_node.errors import InvalidInputError

__all__ = ["TelemetryConfig", "parse_telemetry_config"]

_MAX_WINDOW_S: Final = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Latency sketches, drift baselines, the RSS trend and the report's bounds.

    Latency: ``latency_relative_accuracy`` is the sketch's stated error (1 %: a P99 of
    40.0 ms is reported within 39.6-40.4 ms); ``latency_max_buckets`` bounds each sketch
    (and so the report); at most ``max_model_versions`` versions get sketches in one window
    (more — several swaps within one window — are counted, not sketched).

    Drift, per model version: the first ``drift_warmup_frames`` frames and
    ``drift_warmup_s`` seconds after the version's first frame are warm-up (ONNX Runtime's
    first runs allocate and tune); the next ``drift_baseline_frames`` frames are the
    baseline; after that each window's P95/P99 is divided by the baseline's. A window with
    fewer than ``drift_min_window_frames`` frames of that version gets no ratio (too few to
    say). ``drift_suspected`` when the P95 ratio of compute or end-to-end time reaches
    ``drift_alert_ratio``. Baselines of ``max_baselines`` versions are kept (a rollback
    finds its version's baseline again).

    Memory: RSS samples of the last ``rss_window_s`` seconds are reduced to
    ``rss_trend_points`` medians, then a Theil-Sen slope (MB = 10**6 bytes). No slope until
    the samples span ``rss_min_span_s``. ``leak_suspected`` once the slope has stayed at or
    above ``leak_slope_mb_per_h`` for ``leak_for_s`` seconds. ``memory_budget_bytes`` is the
    box's budget for this process (None: not reported); ``min_headroom_ratio`` is the
    headroom below which ``headroom_low`` is set (design §1: keep at least 30 %).

    Bounds: ``max_streams`` streams are listed per report (the rest counted);
    ``pending_frames_limit`` frames may wait between two reports before the recording
    thread folds them itself; a report over ``max_report_bytes`` of JSON drops its sketches
    (keeps the percentiles) and says so.
    """

    latency_relative_accuracy: float = 0.01
    latency_max_buckets: int = 512
    max_model_versions: int = 4
    drift_warmup_frames: int = 200
    drift_warmup_s: float = 30.0
    drift_baseline_frames: int = 2000
    drift_min_window_frames: int = 100
    drift_alert_ratio: float = 1.5
    max_baselines: int = 4
    rss_window_s: float = 3600.0
    rss_trend_points: int = 60
    rss_min_span_s: float = 900.0
    rss_max_samples: int = 4096
    leak_slope_mb_per_h: float = 20.0
    leak_for_s: float = 900.0
    memory_budget_bytes: int | None = None
    min_headroom_ratio: float = 0.30
    max_streams: int = 64
    pending_frames_limit: int = 16384
    max_report_bytes: int = 128 * 1024

    def __post_init__(self) -> None:
        _number("latency_relative_accuracy", self.latency_relative_accuracy, 1e-4, 0.2)
        _integer("latency_max_buckets", self.latency_max_buckets, 16, 4096)
        _integer("max_model_versions", self.max_model_versions, 1, 64)
        _integer("drift_warmup_frames", self.drift_warmup_frames, 0, 10**7)
        _number("drift_warmup_s", self.drift_warmup_s, 0.0, _MAX_WINDOW_S)
        _integer("drift_baseline_frames", self.drift_baseline_frames, 10, 10**7)
        _integer("drift_min_window_frames", self.drift_min_window_frames, 1, 10**7)
        _number("drift_alert_ratio", self.drift_alert_ratio, 1.0, 100.0, low_open=True)
        _integer("max_baselines", self.max_baselines, 1, 64)
        _number("rss_window_s", self.rss_window_s, 60.0, _MAX_WINDOW_S)
        _integer("rss_trend_points", self.rss_trend_points, 5, 500)
        _number("rss_min_span_s", self.rss_min_span_s, 0.0, self.rss_window_s)
        _integer("rss_max_samples", self.rss_max_samples, 10, 10**6)
        _number("leak_slope_mb_per_h", self.leak_slope_mb_per_h, 0.0, 1e6, low_open=True)
        _number("leak_for_s", self.leak_for_s, 0.0, _MAX_WINDOW_S)
        if self.memory_budget_bytes is not None:
            _integer("memory_budget_bytes", self.memory_budget_bytes, 1, 1 << 50)
        _number("min_headroom_ratio", self.min_headroom_ratio, 0.0, 1.0)
        _integer("max_streams", self.max_streams, 1, 4096)
        _integer("pending_frames_limit", self.pending_frames_limit, 16, 10**7)
        _integer("max_report_bytes", self.max_report_bytes, 4096, 16 << 20)


def parse_telemetry_config(
    raw: Mapping[str, Any] | None, *, memory_budget_bytes: int | None = None
) -> TelemetryConfig:
    """Build from a YAML section (``None``: all defaults); unknown keys are refused.

    ``memory_budget_bytes`` (the agent's own setting) applies unless the section sets it.
    """
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise InvalidInputError("telemetry: must be a mapping", field="telemetry")
    known = {f.name: f for f in fields(TelemetryConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise InvalidInputError(
            f"telemetry: unknown keys {', '.join(map(str, unknown))}", field="telemetry"
        )
    values: dict[str, Any] = {"memory_budget_bytes": memory_budget_bytes}
    values.update(raw)
    return TelemetryConfig(**values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(name: str, value: object, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise InvalidInputError(
            f"telemetry.{name}: must be an integer in [{low}, {high}] (got {value!r})",
            field=f"telemetry.{name}",
        )


def _number(name: str, value: object, low: float, high: float, *, low_open: bool = False) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low < value if low_open else low <= value)
        and value <= high
    )
    if not ok:
        bracket = "(" if low_open else "["
        raise InvalidInputError(
            f"telemetry.{name}: must be a number in {bracket}{low}, {high}] (got {value!r})",
            field=f"telemetry.{name}",
        )
