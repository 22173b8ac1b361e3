"""Latency per model version and report window, and drift against each version's baseline.

What it is for: folding recorded frames (model label, queue seconds, compute seconds) into
three sketches per version — queue, compute, end-to-end, in milliseconds — for the current
window, and judging drift: the window's P95/P99 over the P95/P99 of a baseline captured
after the version's warm-up. Baselines are kept per version, so a hot swap starts a fresh
baseline for the new version while the old one keeps its own (a rollback finds it again).
Pure: takes frames and a monotonic ``now_s``, returns data; no clock, no lock, no I/O (the
caller, ``Telemetry``, serialises access).

What it is not for: timing frames (the pipeline does) or deciding what an operator is
alerted about (the control plane does, from ``drift_suspected`` and the ratios).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from edge_node.errors import InvalidInputError
from edge_node.telemetry.config import TelemetryConfig
from protos.latency_sketch import LatencySketch, SketchError

__all__ = [
    "BaselineState",
    "DriftReading",
    "LatencyBook",
    "LatencyWindow",
    "RatioReading",
    "VersionLatency",
]

BaselineState = Literal["warming_up", "collecting", "ready"]
_WARMING: Final = "warming_up"
_COLLECTING: Final = "collecting"
_READY: Final = "ready"
_MAX_LABEL_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class RatioReading:
    """One latency kind of one version: this window's P95/P99 against the baseline's (ms)."""

    window_p95_ms: float
    window_p99_ms: float
    baseline_p95_ms: float
    baseline_p99_ms: float

    @property
    def p95_ratio(self) -> float | None:
        return self.window_p95_ms / self.baseline_p95_ms if self.baseline_p95_ms > 0 else None

    @property
    def p99_ratio(self) -> float | None:
        return self.window_p99_ms / self.baseline_p99_ms if self.baseline_p99_ms > 0 else None


@dataclass(frozen=True, slots=True)
class DriftReading:
    """Where a version's baseline stands and, once ready, the window against it.

    ``compute`` / ``end_to_end`` are ``None`` until the baseline is ready or when the window
    holds fewer than ``drift_min_window_frames`` frames of the version.
    """

    state: BaselineState
    baseline_frames: int
    compute: RatioReading | None
    end_to_end: RatioReading | None
    suspected: bool


@dataclass(frozen=True, slots=True)
class VersionLatency:
    """One version's frames in one window; sketches hold milliseconds."""

    frames: int
    queue: LatencySketch
    compute: LatencySketch
    end_to_end: LatencySketch
    drift: DriftReading


@dataclass(frozen=True, slots=True)
class LatencyWindow:
    """What ``LatencyBook.close_window`` hands over: versions in first-seen order.

    ``omitted_frames`` / ``omitted_versions``: frames of versions past ``max_model_versions``
    in this window (recorded nowhere but counted).
    """

    versions: Mapping[str, VersionLatency]
    omitted_frames: int
    omitted_versions: int

    @property
    def frames(self) -> int:
        return sum(v.frames for v in self.versions.values()) + self.omitted_frames


class _Window:
    __slots__ = ("compute", "end_to_end", "frames", "queue")

    def __init__(self, accuracy: float, max_buckets: int) -> None:
        self.queue = LatencySketch(accuracy, max_buckets)
        self.compute = LatencySketch(accuracy, max_buckets)
        self.end_to_end = LatencySketch(accuracy, max_buckets)
        self.frames = 0


class _Baseline:
    __slots__ = ("compute", "end_to_end", "first_seen_s", "frames", "state", "warmup_seen")

    def __init__(self, accuracy: float, max_buckets: int, first_seen_s: float) -> None:
        self.state: str = _WARMING
        self.first_seen_s = first_seen_s
        self.warmup_seen = 0
        self.frames = 0
        self.compute = LatencySketch(accuracy, max_buckets)
        self.end_to_end = LatencySketch(accuracy, max_buckets)


class LatencyBook:
    """Window sketches and drift baselines for every model version. Not thread-safe."""

    def __init__(self, config: TelemetryConfig) -> None:
        self._config = config
        self._windows: dict[str, _Window] = {}
        self._baselines: OrderedDict[str, _Baseline] = OrderedDict()
        self._omitted_frames = 0
        self._omitted: set[str] = set()

    def add_frames(self, frames: Iterable[tuple[str, float, float]], now_s: float) -> int:
        """Fold ``(model, queue_s, compute_s)`` frames seen by ``now_s``; return how many.

        Warm-up seconds are judged at ``now_s``, so with frames folded once per report the
        warm-up ends at the first fold after it is due (documented resolution).
        """
        config = self._config
        warmup_frames = config.drift_warmup_frames
        warmup_s = config.drift_warmup_s
        baseline_frames = config.drift_baseline_frames
        last_model: str | None = None
        window: _Window | None = None
        baseline: _Baseline | None = None
        folded = 0
        for model, queue_s, compute_s in frames:
            folded += 1
            if model != last_model:
                last_model = model
                window = self._window(model)
                baseline = self._baseline(model, now_s) if window is not None else None
            if window is None or baseline is None:
                self._omitted_frames += 1
                continue
            queue_ms = queue_s * 1000.0
            compute_ms = compute_s * 1000.0
            total_ms = queue_ms + compute_ms
            window.queue.add(queue_ms)
            window.compute.add(compute_ms)
            window.end_to_end.add(total_ms)
            window.frames += 1
            state = baseline.state
            if state == _READY:
                continue
            if state == _WARMING:
                baseline.warmup_seen += 1
                if (
                    baseline.warmup_seen >= warmup_frames
                    and now_s - baseline.first_seen_s >= warmup_s
                ):
                    baseline.state = _COLLECTING
                continue
            baseline.compute.add(compute_ms)
            baseline.end_to_end.add(total_ms)
            baseline.frames += 1
            if baseline.frames >= baseline_frames:
                baseline.state = _READY
        return folded

    def _window(self, model: str) -> _Window | None:
        window = self._windows.get(model)
        if window is None:
            if len(self._windows) >= self._config.max_model_versions:
                self._omitted.add(model)
                return None
            config = self._config
            window = _Window(config.latency_relative_accuracy, config.latency_max_buckets)
            self._windows[model] = window
        return window

    def _baseline(self, model: str, now_s: float) -> _Baseline:
        baselines = self._baselines
        baseline = baselines.get(model)
        if baseline is None:
            config = self._config
            baseline = _Baseline(
                config.latency_relative_accuracy, config.latency_max_buckets, now_s
            )
            baselines[model] = baseline
            while len(baselines) > config.max_baselines:
                baselines.popitem(last=False)  # the version used least recently
        else:
            baselines.move_to_end(model)
        return baseline

    def close_window(self) -> LatencyWindow:
        """This window's versions with their drift; the next window starts empty."""
        windows, self._windows = self._windows, {}
        omitted_frames, self._omitted_frames = self._omitted_frames, 0
        omitted, self._omitted = self._omitted, set()
        versions = {
            model: VersionLatency(
                frames=window.frames,
                queue=window.queue,
                compute=window.compute,
                end_to_end=window.end_to_end,
                drift=self._drift(model, window),
            )
            for model, window in windows.items()
        }
        return LatencyWindow(versions, omitted_frames, len(omitted))

    def _drift(self, model: str, window: _Window) -> DriftReading:
        baseline = self._baselines.get(model)
        if baseline is None:  # evicted by newer versions within this window
            return DriftReading(_WARMING, 0, None, None, suspected=False)
        state: BaselineState = baseline.state  # type: ignore[assignment]
        if state != _READY or window.frames < self._config.drift_min_window_frames:
            return DriftReading(state, baseline.frames, None, None, suspected=False)
        compute = _ratio(window.compute, baseline.compute)
        end_to_end = _ratio(window.end_to_end, baseline.end_to_end)
        limit = self._config.drift_alert_ratio
        suspected = any(
            reading is not None and (reading.p95_ratio or 0.0) >= limit
            for reading in (compute, end_to_end)
        )
        return DriftReading(state, baseline.frames, compute, end_to_end, suspected)

    # -- baselines across restarts -------------------------------------------------------

    def export_baselines(self) -> dict[str, Any]:
        """Ready baselines as JSON-ready data (persist them to keep drift across restarts)."""
        return {
            model: {
                "frames": baseline.frames,
                "compute_ms": baseline.compute.to_wire(),
                "end_to_end_ms": baseline.end_to_end.to_wire(),
            }
            for model, baseline in self._baselines.items()
            if baseline.state == _READY
        }

    def import_baselines(self, data: Mapping[str, Any], now_s: float) -> None:
        """Take baselines from ``export_baselines`` (of an earlier run) as ready.

        Raises ``InvalidInputError`` on a malformed entry; nothing is taken then.
        """
        config = self._config
        taken: list[tuple[str, _Baseline]] = []
        for model, entry in list(data.items())[-config.max_baselines :]:
            try:
                if not isinstance(model, str) or not 0 < len(model) <= _MAX_LABEL_CHARS:
                    raise SketchError("a baseline needs a model label")
                baseline = _Baseline(
                    config.latency_relative_accuracy, config.latency_max_buckets, now_s
                )
                baseline.compute = LatencySketch.from_wire(
                    entry["compute_ms"], max_buckets=config.latency_max_buckets
                )
                baseline.end_to_end = LatencySketch.from_wire(
                    entry["end_to_end_ms"], max_buckets=config.latency_max_buckets
                )
                if baseline.compute.relative_accuracy != config.latency_relative_accuracy:
                    raise SketchError("the baseline was recorded at another accuracy")
                baseline.frames = baseline.compute.count
                baseline.state = _READY
            except (SketchError, KeyError, TypeError, AttributeError) as exc:
                raise InvalidInputError(
                    f"bad drift baseline for model {model!r}: {exc}", model=str(model)[:64]
                ) from exc
            taken.append((model, baseline))
        for model, baseline in taken:
            self._baselines[model] = baseline
            self._baselines.move_to_end(model)
        while len(self._baselines) > config.max_baselines:
            self._baselines.popitem(last=False)


def _ratio(window: LatencySketch, baseline: LatencySketch) -> RatioReading | None:
    window_p95, window_p99 = window.quantiles((0.95, 0.99))
    baseline_p95, baseline_p99 = baseline.quantiles((0.95, 0.99))
    if window_p95 is None or window_p99 is None or baseline_p95 is None or baseline_p99 is None:
        return None
    return RatioReading(window_p95, window_p99, baseline_p95, baseline_p99)
