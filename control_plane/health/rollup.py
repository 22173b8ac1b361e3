"""Roll-ups of a node's health points per minute and per hour, in pure Python.

What it is for: the health processor folds each new point into its minute and its hour
(``Rollup.add``) and the store keeps the result as plain JSON (``to_columns`` /
``from_columns``). A roll-up keeps, per metric, min / max / sum / count, and per model
version and latency kind the merged ``LatencySketch``: a roll-up's P99 is read from the
merged sketch (within the sketch's relative accuracy of the exact P99 of every sample in
it), never an average of the windows' P99s. Not for storage or time: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from control_plane.health.report import LATENCY_KINDS, HealthPoint
from protos.latency_sketch import LatencySketch

__all__ = [
    "QUANTILES",
    "RESOLUTIONS",
    "Resolution",
    "Rollup",
    "bucket_length",
    "bucket_start",
    "latency_summary",
]

Resolution = Literal["minute", "hour"]
RESOLUTIONS: Final[tuple[Resolution, ...]] = ("minute", "hour")
QUANTILES: Final = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99}


def bucket_start(at: datetime, resolution: Resolution) -> datetime:
    """The start of the minute or hour ``at`` falls in (same time zone as ``at``)."""
    if resolution == "minute":
        return at.replace(second=0, microsecond=0)
    return at.replace(minute=0, second=0, microsecond=0)


def bucket_length(resolution: Resolution) -> timedelta:
    return timedelta(minutes=1) if resolution == "minute" else timedelta(hours=1)


def latency_summary(sketch: LatencySketch) -> dict[str, Any]:
    """P50/P95/P99/max and the sample count read from a (merged) sketch."""
    p50, p95, p99 = sketch.quantiles(tuple(QUANTILES.values()))
    return {
        "p50_ms": _round(p50),
        "p95_ms": _round(p95),
        "p99_ms": _round(p99),
        "max_ms": _round(sketch.max) if sketch.count else None,
        "samples": sketch.count,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(slots=True)
class _Stat:
    min: float
    max: float
    sum: float
    count: int

    def add(self, value: float) -> None:
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        self.sum += value
        self.count += 1

    def merge(self, other: _Stat) -> None:
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.sum += other.sum
        self.count += other.count


@dataclass(slots=True)
class Rollup:
    """Everything a minute or an hour of one node's reports keeps."""

    reports: int = 0
    stats: dict[str, _Stat] = field(default_factory=dict)
    sketches: dict[str, dict[str, LatencySketch]] = field(default_factory=dict)

    def add(self, point: HealthPoint) -> None:
        self.reports += 1
        for name, value in point.metrics.items():
            stat = self.stats.get(name)
            if stat is None:
                self.stats[name] = _Stat(value, value, value, 1)
            else:
                stat.add(value)
        for model, kinds in point.sketches().items():
            for kind, sketch in kinds.items():
                self._merge_sketch(model, kind, sketch)

    def merge(self, other: Rollup) -> None:
        self.reports += other.reports
        for name, stat in other.stats.items():
            mine = self.stats.get(name)
            if mine is None:
                self.stats[name] = _Stat(stat.min, stat.max, stat.sum, stat.count)
            else:
                mine.merge(stat)
        for model, kinds in other.sketches.items():
            for kind, sketch in kinds.items():
                self._merge_sketch(model, kind, sketch)

    def _merge_sketch(self, model: str, kind: str, sketch: LatencySketch) -> None:
        held = self.sketches.setdefault(model, {})
        mine = held.get(kind)
        if mine is None:
            held[kind] = sketch.copy()
        elif mine.relative_accuracy == sketch.relative_accuracy:
            mine.merge(sketch)
        # Sketches of another accuracy cannot merge; the first one seen wins the bucket.

    # -- reading ---------------------------------------------------------------------

    def metric(self, name: str) -> dict[str, float] | None:
        stat = self.stats.get(name)
        if stat is None:
            return None
        return {"min": stat.min, "max": stat.max, "mean": stat.sum / stat.count}

    def summary(self) -> dict[str, Any]:
        """Metrics as min/max/mean/count and latency read from the merged sketches."""
        return {
            "reports": self.reports,
            "metrics": {
                name: {
                    "min": stat.min,
                    "max": stat.max,
                    "mean": round(stat.sum / stat.count, 6),
                    "count": stat.count,
                }
                for name, stat in sorted(self.stats.items())
            },
            "latency": {
                model: {
                    kind: latency_summary(kinds[kind]) for kind in LATENCY_KINDS if kind in kinds
                }
                for model, kinds in sorted(self.sketches.items())
            },
        }

    # -- storage form ----------------------------------------------------------------

    def to_columns(self) -> tuple[int, dict[str, Any], dict[str, Any]]:
        stats = {n: [s.min, s.max, s.sum, s.count] for n, s in sorted(self.stats.items())}
        sketches = {
            model: {kind: sketch.to_wire() for kind, sketch in sorted(kinds.items())}
            for model, kinds in sorted(self.sketches.items())
        }
        return self.reports, stats, sketches

    @classmethod
    def from_columns(
        cls, reports: int, stats: Mapping[str, Any], sketches: Mapping[str, Any]
    ) -> Rollup:
        rollup = cls(reports=reports)
        for name, (low, high, total, count) in stats.items():
            rollup.stats[name] = _Stat(float(low), float(high), float(total), int(count))
        for model, kinds in sketches.items():
            rollup.sketches[model] = {
                kind: LatencySketch.from_wire(wire) for kind, wire in kinds.items()
            }
        return rollup

    @classmethod
    def of(cls, points: Iterable[HealthPoint]) -> Rollup:
        rollup = cls()
        for point in points:
            rollup.add(point)
        return rollup
