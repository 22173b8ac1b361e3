"""The RSS trend: a robust slope over a sliding window, and when to suspect a leak.

What it is for: telling a leak (RSS that keeps creeping) from what RSS normally does on an
inference box: noise, allocator sawtooth, spikes, a one-off step when a model is swapped
in. The samples of the last ``rss_window_s`` seconds are reduced to at most
``rss_trend_points`` points (median time and median RSS of equal time bins, which irons
out spikes), and the slope is Theil-Sen's: the median of the slopes between every pair of
points, so noise and outliers barely move it.

A step is the hard case: while it sits near the window's middle, up to half the pairs
straddle it and the median tilts, for half an hour in our tests. Growth lifts every part
of the window, a step only the half it falls in; so a leak is suspected when the
window's slope is at or above ``leak_slope_mb_per_h`` *and* each half of the window rises
at least half as fast, and that has held for ``leak_for_s``. Once raised, the flag stays
until the window's slope falls below half the threshold, so a leak near the threshold does
not flap with the noise.

Pure: takes monotonic seconds and byte counts; no psutil here (``probe`` samples).
MB is 10**6 bytes, as in the benchmarks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Final

from edge_node.telemetry.config import TelemetryConfig

__all__ = ["RssTrend", "RssTrendReading", "downsample", "theil_sen_slope"]

MB: Final = 1_000_000
_HOUR_S: Final = 3600.0
_HALF_SLOPE_FRACTION: Final = 0.5
_CLEAR_FRACTION: Final = 0.5


def downsample(points: Sequence[tuple[float, float]], bins: int) -> list[tuple[float, float]]:
    """At most ``bins`` points: per equal-width time bin, the median time and median value.

    ``points`` are ``(t, y)`` in increasing ``t``; empty bins give nothing.
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if len(points) <= bins:
        return list(points)
    start, end = points[0][0], points[-1][0]
    width = (end - start) / bins
    if width <= 0:
        return [(start, median(y for _, y in points))]
    groups: list[list[tuple[float, float]]] = [[] for _ in range(bins)]
    for t, y in points:
        groups[min(int((t - start) / width), bins - 1)].append((t, y))
    return [(median(t for t, _ in group), median(y for _, y in group)) for group in groups if group]


def theil_sen_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The median of the pairwise slopes ``(y_j - y_i) / (t_j - t_i)``, ``t_i < t_j``.

    O(n²) in the number of points: call it on ``downsample``'s output (60 points: 1,770
    pairs). ``None`` with fewer than two distinct times.
    """
    slopes = [
        (y_j - y_i) / (t_j - t_i)
        for i, (t_i, y_i) in enumerate(points)
        for t_j, y_j in points[i + 1 :]
        if t_j > t_i
    ]
    return median(slopes) if slopes else None


@dataclass(frozen=True, slots=True)
class RssTrendReading:
    """The trend as of the last sample.

    ``slope_mb_per_h``: ``None`` until the samples span ``rss_min_span_s``;
    ``half_slopes_mb_per_h``: the same over the first and the second half of the points.
    ``over_threshold_s``: how long the leak condition (see the module docstring) has held
    (0 when it does not); ``leak_suspected`` once that reaches ``leak_for_s``, until the
    slope falls below half the threshold.
    """

    slope_mb_per_h: float | None
    half_slopes_mb_per_h: tuple[float, float] | None
    span_s: float
    samples: int
    points: int
    over_threshold_s: float
    leak_suspected: bool


class RssTrend:
    """Sliding window of RSS samples and the leak judgement over it. Not thread-safe."""

    def __init__(self, config: TelemetryConfig) -> None:
        self._config = config
        self._samples: deque[tuple[float, float]] = deque(maxlen=config.rss_max_samples)
        self._over_since: float | None = None
        self._suspected = False
        self.reading = RssTrendReading(None, None, 0.0, 0, 0, 0.0, leak_suspected=False)

    def add(self, now_s: float, rss_bytes: int) -> RssTrendReading:
        """Take one sample at monotonic ``now_s``; return (and keep) the new reading."""
        samples = self._samples
        if samples and now_s <= samples[-1][0]:
            return self.reading  # a second sample at the same instant adds nothing
        config = self._config
        samples.append((now_s, float(rss_bytes)))
        cutoff = now_s - config.rss_window_s
        while samples[0][0] < cutoff:
            samples.popleft()
        span = now_s - samples[0][0]
        slope: float | None = None
        halves: tuple[float, float] | None = None
        points = 0
        if span >= config.rss_min_span_s and len(samples) >= 2:
            reduced = downsample(list(samples), config.rss_trend_points)
            points = len(reduced)
            slope = _mb_per_h(theil_sen_slope(reduced))
            middle = len(reduced) // 2
            first = _mb_per_h(theil_sen_slope(reduced[: middle + 1]))
            second = _mb_per_h(theil_sen_slope(reduced[middle:]))
            if first is not None and second is not None:
                halves = (first, second)
        limit = config.leak_slope_mb_per_h
        if (
            slope is not None
            and slope >= limit
            and halves is not None
            and min(halves) >= limit * _HALF_SLOPE_FRACTION
        ):
            if self._over_since is None:
                self._over_since = now_s
            over = now_s - self._over_since
        else:
            self._over_since = None
            over = 0.0
        if self._over_since is not None and over >= config.leak_for_s:
            self._suspected = True
        elif self._suspected and (slope is None or slope < limit * _CLEAR_FRACTION):
            self._suspected = False
        self.reading = RssTrendReading(
            slope_mb_per_h=slope,
            half_slopes_mb_per_h=halves,
            span_s=span,
            samples=len(samples),
            points=points,
            over_threshold_s=over,
            leak_suspected=self._suspected,
        )
        return self.reading


def _mb_per_h(bytes_per_s: float | None) -> float | None:
    return None if bytes_per_s is None else bytes_per_s * _HOUR_S / MB
