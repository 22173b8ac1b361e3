"""The health store's settings as a frozen dataclass: retention, batching, alert thresholds.

Pure: built at the entry point (``server.main`` / tests) and passed down; no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["AlertThresholds", "HealthConfig"]


@dataclass(frozen=True, slots=True)
class AlertThresholds:
    """When a node's report raises an alert (each documented in the operator guide)."""

    # P99 (end-to-end or compute) of a model version over its post-install baseline.
    drift_ratio: float = 1.5
    # (budget - RSS) / budget below this: DESIGN §1 asks for at least 30 % headroom.
    min_headroom_ratio: float = 0.30
    # Outbox bytes / outbox budget at or above this, or the node's own outbox alarm,
    # raises outbox_near_budget; it clears only below outbox_clear_fill_ratio with the
    # alarm off (hysteresis: a draining backlog that crosses the raise mark back and forth
    # is one alert, not several). None: three quarters of outbox_fill_ratio (0.6).
    outbox_fill_ratio: float = 0.8
    outbox_clear_fill_ratio: float | None = None
    # RSS slope (MB/h) that counts as a leak even when the node did not flag one;
    # None: trust the node's own ``leak_suspected`` flag only.
    leak_slope_mb_per_h: float | None = None

    @property
    def outbox_clear_mark(self) -> float:
        """The fill below which ``outbox_near_budget`` clears."""
        if self.outbox_clear_fill_ratio is None:
            return round(0.75 * self.outbox_fill_ratio, 4)
        return self.outbox_clear_fill_ratio

    def __post_init__(self) -> None:
        if not self.drift_ratio > 1.0:
            raise ValueError("drift_ratio must be above 1")
        if not 0.0 < self.min_headroom_ratio < 1.0:
            raise ValueError("min_headroom_ratio must be in (0, 1)")
        if not 0.0 < self.outbox_fill_ratio <= 1.0:
            raise ValueError("outbox_fill_ratio must be in (0, 1]")
        if self.outbox_clear_fill_ratio is not None and not (
            0.0 < self.outbox_clear_fill_ratio <= self.outbox_fill_ratio
        ):
            raise ValueError("outbox_clear_fill_ratio must be in (0, outbox_fill_ratio]")
        if self.leak_slope_mb_per_h is not None and not self.leak_slope_mb_per_h > 0:
            raise ValueError("leak_slope_mb_per_h must be positive")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Retention per resolution, batch sizes and the processor's pace."""

    raw_retention: timedelta = timedelta(hours=12)
    minute_retention: timedelta = timedelta(days=7)
    hour_retention: timedelta = timedelta(days=180)
    # Records per transaction: one cursor move, one batch of inserts.
    batch_size: int = 500
    # Batches per pass before the loop yields (a backlog drains in bounded bites).
    max_batches_per_pass: int = 20
    # Pause between passes when there was nothing left to do (bounded: 0.1 s .. 60 s).
    interval_s: float = 2.0
    # Records younger than this are left for the next pass: a group commit stamps
    # received_at before it commits, so a slow commit (or a replica's clock a little
    # behind) must not land behind the cursor. See ADR 0018.
    settle: timedelta = timedelta(seconds=10)
    retention_every: timedelta = timedelta(minutes=5)
    # At most this many points a series read returns (older ones are left out).
    max_series_points: int = 5000
    thresholds: AlertThresholds = field(default_factory=AlertThresholds)

    def __post_init__(self) -> None:
        if not (self.raw_retention <= self.minute_retention <= self.hour_retention):
            raise ValueError("retention must grow with the resolution: raw <= minute <= hour")
        if self.raw_retention < timedelta(minutes=10):
            raise ValueError("raw retention under 10 minutes leaves nothing to look at")
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be in 1..10000")
        if not 1 <= self.max_batches_per_pass <= 1000:
            raise ValueError("max_batches_per_pass must be in 1..1000")
        if not 0.1 <= self.interval_s <= 60.0:
            raise ValueError("interval_s must be in 0.1..60")
        if self.settle < timedelta(0):
            raise ValueError("settle must not be negative")
