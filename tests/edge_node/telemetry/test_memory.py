"""The RSS trend: Theil-Sen on down-sampled points, and the leak judgement over time."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from edge_node.telemetry.config import TelemetryConfig
from edge_node.telemetry.memory import MB, RssTrend, downsample, theil_sen_slope

# One hour window, judged after 15 min of samples, leak once 20 MB/h holds for 15 min.
CONFIG = TelemetryConfig()
STEP_S = 30.0  # a sample every 30 s (the default health interval)
BASE = 400 * MB


def noise(rng: random.Random) -> Callable[[float], float]:
    """What RSS does on a healthy box: jitter, a 10-minute allocator sawtooth of 25 MB,
    and now and then a 150 MB spike (a burst of large frames) that is freed at once."""

    def at(t: float) -> float:
        jitter = rng.gauss(0.0, 3 * MB)
        sawtooth = 25 * MB * ((t % 600.0) / 600.0)
        spike = 150 * MB if rng.random() < 0.02 else 0.0
        return jitter + sawtooth + spike

    return at


def run(
    trend: RssTrend, rss: Callable[[float], float], hours: float, start: float = 0.0
) -> list[tuple[float, bool, float | None]]:
    """Feed samples; return (t, leak_suspected, slope) for each."""
    seen = []
    t = start
    while t <= start + hours * 3600.0:
        reading = trend.add(t, int(rss(t)))
        seen.append((t, reading.leak_suspected, reading.slope_mb_per_h))
        t += STEP_S
    return seen


def test_theil_sen_is_exact_on_a_line_and_ignores_a_minority_of_outliers() -> None:
    line = [(float(t), 3.0 * t + 7.0) for t in range(40)]
    assert theil_sen_slope(line) == pytest.approx(3.0)
    rng = random.Random(1)
    spoiled = [
        (t, y + (rng.choice([-1e4, 1e4]) if i % 4 == 0 else 0.0)) for i, (t, y) in enumerate(line)
    ]
    assert theil_sen_slope(spoiled) == pytest.approx(3.0, rel=0.05)
    assert theil_sen_slope([(1.0, 5.0)]) is None
    assert theil_sen_slope([(1.0, 5.0), (1.0, 9.0)]) is None


def test_downsample_takes_medians_of_equal_time_bins() -> None:
    points = [(float(t), float(t % 10 == 5) * 1000.0 + t) for t in range(100)]
    reduced = downsample(points, 10)
    assert len(reduced) == 10
    assert all(abs(t - y) <= 1.0 for t, y in reduced)  # the 1000-byte spikes are gone
    assert downsample(points[:5], 10) == points[:5]
    assert downsample([(1.0, 2.0)] * 20, 5) == [(1.0, 2.0)]
    with pytest.raises(ValueError):
        downsample(points, 0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("leak_mb_per_h", [25.0, 40.0, 100.0, 400.0])
def test_an_injected_leak_is_flagged_within_the_window(seed: int, leak_mb_per_h: float) -> None:
    rng = random.Random(seed)
    jitter = noise(rng)
    trend = RssTrend(CONFIG)
    seen = run(trend, lambda t: BASE + leak_mb_per_h * MB * t / 3600.0 + jitter(t), hours=2)
    flagged = [t for t, leak, _ in seen if leak]
    assert flagged, "the leak was never flagged"
    # Not before the trend has min span + the duration to hold, and within the window.
    assert CONFIG.rss_min_span_s + CONFIG.leak_for_s <= flagged[0] <= CONFIG.rss_window_s
    assert all(leak for t, leak, _ in seen if t >= flagged[0])  # and it stays flagged
    slope = seen[-1][2]
    assert slope is not None and slope == pytest.approx(leak_mb_per_h, rel=0.3)


@pytest.mark.parametrize("seed", range(10))
def test_a_steady_but_noisy_rss_is_never_flagged(seed: int) -> None:
    rng = random.Random(100 + seed)
    jitter = noise(rng)
    trend = RssTrend(CONFIG)
    seen = run(trend, lambda t: BASE + jitter(t), hours=8)
    assert not any(leak for _, leak, _ in seen)
    # Over a full window the slope of noise is small; over a short span it may not be.
    full = [abs(s) for t, _, s in seen if s is not None and t >= CONFIG.rss_window_s]
    assert max(full) < CONFIG.leak_slope_mb_per_h


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("step_mb", [180, 1000])
def test_a_one_off_step_such_as_a_model_swap_is_not_a_leak(seed: int, step_mb: int) -> None:
    rng = random.Random(200 + seed)
    jitter = noise(rng)
    trend = RssTrend(CONFIG)
    seen = run(trend, lambda t: BASE + (step_mb * MB if t >= 5400.0 else 0.0) + jitter(t), hours=5)
    assert not any(leak for _, leak, _ in seen)
    # The step does tilt the whole window's slope for a while: the halves tell it apart.
    assert any(s is not None and s >= CONFIG.leak_slope_mb_per_h for _, _, s in seen)


def test_a_slow_creep_below_the_threshold_is_reported_but_not_flagged() -> None:
    rng = random.Random(5)
    trend = RssTrend(CONFIG)
    seen = run(trend, lambda t: BASE + 8 * MB * t / 3600.0 + rng.gauss(0, 1 * MB), hours=3)
    assert not any(leak for _, leak, _ in seen)
    assert seen[-1][2] == pytest.approx(8.0, rel=0.2)


def test_the_flag_clears_once_the_leak_stops() -> None:
    rng = random.Random(6)
    trend = RssTrend(CONFIG)

    def rss(t: float) -> float:
        return BASE + 100 * MB * min(t, 7200.0) / 3600.0 + rng.gauss(0, 2 * MB)

    seen = run(trend, rss, hours=4)
    assert any(leak for t, leak, _ in seen if t < 7200.0)
    assert not any(leak for t, leak, _ in seen if t > 7200.0 + CONFIG.rss_window_s)
    assert trend.reading.over_threshold_s == 0.0


def test_once_raised_the_flag_holds_until_the_slope_falls_below_half_the_threshold() -> None:
    config = TelemetryConfig(rss_min_span_s=0.0, leak_for_s=0.0, leak_slope_mb_per_h=20.0)
    trend = RssTrend(config)
    rss = 0.0
    for t in range(0, 3600, 60):
        rss += 25 * MB / 60  # 25 MB/h
        reading = trend.add(float(t), int(rss))
    assert reading.leak_suspected
    for t in range(3600, 3600 + 7200, 60):
        rss += 12 * MB / 60  # 12 MB/h: under the threshold, over half of it
        reading = trend.add(float(t), int(rss))
    assert reading.leak_suspected and reading.over_threshold_s == 0.0
    for t in range(10800, 10800 + 7200, 60):
        rss += 5 * MB / 60  # 5 MB/h: under half the threshold
        reading = trend.add(float(t), int(rss))
    assert not reading.leak_suspected


def test_no_slope_before_the_minimum_span_and_a_bounded_window() -> None:
    trend = RssTrend(CONFIG)
    for t in range(0, 900, 30):
        assert trend.add(float(t), BASE + t * MB).slope_mb_per_h is None
    reading = trend.add(900.0, BASE + 900 * MB)
    assert reading.slope_mb_per_h == pytest.approx(3600.0)
    assert reading.points <= CONFIG.rss_trend_points
    for t in range(930, 20000, 30):
        reading = trend.add(float(t), BASE)
    assert reading.span_s <= CONFIG.rss_window_s
    assert reading.samples <= CONFIG.rss_window_s / 30 + 1
    assert reading.points <= CONFIG.rss_trend_points
    # A sample at the same instant (or earlier) changes nothing.
    assert trend.add(float(t), 10 * BASE) is reading


def test_leak_slope_in_megabytes_per_hour_uses_decimal_megabytes() -> None:
    config = TelemetryConfig(rss_min_span_s=0.0, leak_for_s=0.0, leak_slope_mb_per_h=1.0)
    trend = RssTrend(config)
    trend.add(0.0, 0)
    trend.add(1800.0, 1_000_000)
    reading = trend.add(3600.0, 2_000_000)
    assert reading.slope_mb_per_h == pytest.approx(2.0)
    assert reading.leak_suspected
    assert math.isclose(MB, 1e6)
