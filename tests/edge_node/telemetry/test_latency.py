"""Latency windows per model version and drift against each version's own baseline."""

from __future__ import annotations

import math
import random

import pytest

from edge_node.errors import InvalidInputError
from edge_node.telemetry.config import TelemetryConfig
from edge_node.telemetry.latency import LatencyBook, LatencyWindow

CONFIG = TelemetryConfig(
    drift_warmup_frames=50,
    drift_warmup_s=0.0,
    drift_baseline_frames=600,
    drift_min_window_frames=100,
    drift_alert_ratio=1.5,
)


def frames(
    rng: random.Random, model: str, n: int, *, compute_ms: float = 20.0, queue_ms: float = 2.0
) -> list[tuple[str, float, float]]:
    """Noisy but steady latency: lognormal compute (sigma 0.25), exponential queueing."""
    return [
        (
            model,
            rng.expovariate(1.0 / queue_ms) / 1000.0,
            rng.lognormvariate(math.log(compute_ms), 0.25) / 1000.0,
        )
        for _ in range(n)
    ]


def window(book: LatencyBook, batch: list[tuple[str, float, float]], now_s: float) -> LatencyWindow:
    book.add_frames(batch, now_s)
    return book.close_window()


def ready_book(rng: random.Random, model: str = "a", **kw: float) -> LatencyBook:
    book = LatencyBook(CONFIG)
    window(book, frames(rng, model, 700, **kw), 0.0)  # 50 warm-up + 600 baseline + 50
    return book


def test_frames_land_in_three_sketches_per_version_in_milliseconds() -> None:
    book = LatencyBook(CONFIG)
    book.add_frames([("a", 0.002, 0.010), ("a", 0.004, 0.030)], 0.0)
    version = book.close_window().versions["a"]
    assert version.frames == 2
    assert version.queue.max == pytest.approx(4.0)
    assert version.compute.min == pytest.approx(10.0)
    assert version.end_to_end.max == pytest.approx(34.0)
    assert book.close_window().versions == {}  # the next window starts empty


def test_noisy_but_steady_latency_never_raises_drift() -> None:
    rng = random.Random(1)
    book = ready_book(rng)
    ratios = []
    for _ in range(60):
        drift = window(book, frames(rng, "a", 300), 10.0).versions["a"].drift
        assert drift.state == "ready"
        assert drift.compute is not None and drift.end_to_end is not None
        assert not drift.suspected
        ratios += [drift.compute.p95_ratio, drift.compute.p99_ratio, drift.end_to_end.p95_ratio]
    assert all(r is not None and 0.75 < r < 1.35 for r in ratios), ratios


@pytest.mark.parametrize("slowdown", [1.6, 2.0, 3.0])
def test_an_injected_slowdown_raises_drift_in_the_first_window(slowdown: float) -> None:
    rng = random.Random(2)
    book = ready_book(rng)
    steady = window(book, frames(rng, "a", 300), 10.0).versions["a"].drift
    assert not steady.suspected
    slow = window(book, frames(rng, "a", 300, compute_ms=20.0 * slowdown), 20.0)
    drift = slow.versions["a"].drift
    assert drift.suspected
    assert drift.compute is not None
    assert drift.compute.p95_ratio == pytest.approx(slowdown, rel=0.15)
    assert drift.compute.p99_ratio == pytest.approx(slowdown, rel=0.2)


def test_a_queueing_slowdown_shows_in_end_to_end_drift_only() -> None:
    rng = random.Random(3)
    book = ready_book(rng)
    drift = window(book, frames(rng, "a", 300, queue_ms=60.0), 10.0).versions["a"].drift
    assert drift.suspected
    assert drift.compute is not None and drift.end_to_end is not None
    assert drift.compute.p95_ratio is not None and drift.compute.p95_ratio < 1.3
    assert drift.end_to_end.p95_ratio is not None and drift.end_to_end.p95_ratio > 2.0


def test_the_baseline_waits_for_warm_up_frames_and_seconds() -> None:
    config = TelemetryConfig(drift_warmup_frames=10, drift_warmup_s=30.0, drift_baseline_frames=20)
    book = LatencyBook(config)
    rng = random.Random(4)
    slow_start = [("a", 0.0, 0.5)] * 50  # ORT's first runs: not part of the baseline
    assert window(book, slow_start, 0.0).versions["a"].drift.state == "warming_up"
    assert window(book, slow_start, 29.0).versions["a"].drift.state == "warming_up"
    state = window(book, frames(rng, "a", 5), 31.0).versions["a"].drift
    assert (state.state, state.baseline_frames) == ("collecting", 4)  # one frame ended warm-up
    done = window(book, frames(rng, "a", 100), 40.0).versions["a"].drift
    assert (done.state, done.baseline_frames) == ("ready", 20)
    assert done.compute is not None and done.compute.baseline_p95_ms < 40.0


def test_too_few_frames_in_a_window_give_no_ratio() -> None:
    rng = random.Random(5)
    book = ready_book(rng)
    drift = window(book, frames(rng, "a", 99, compute_ms=80.0), 10.0).versions["a"].drift
    assert drift.state == "ready"
    assert drift.compute is None and not drift.suspected


def test_a_hot_swap_gets_its_own_baseline_and_the_old_version_keeps_its_own() -> None:
    rng = random.Random(6)
    book = ready_book(rng, "a")
    # The new version is three times slower by nature: that is not drift.
    mixed = frames(rng, "a", 150) + frames(rng, "b", 400, compute_ms=60.0)
    swap = window(book, mixed, 10.0)
    assert list(swap.versions) == ["a", "b"]
    assert not swap.versions["a"].drift.suspected
    b = swap.versions["b"].drift
    assert b.state == "collecting" and not b.suspected and b.compute is None
    later = window(book, frames(rng, "b", 400, compute_ms=60.0), 20.0).versions["b"].drift
    assert later.state == "ready" and not later.suspected
    assert later.compute is not None and later.compute.baseline_p95_ms > 60.0
    # A rollback to "a" finds its baseline: judged at once, and steady.
    back = window(book, frames(rng, "a", 300), 30.0).versions["a"].drift
    assert back.state == "ready" and not back.suspected
    assert back.compute is not None and back.compute.baseline_p95_ms < 40.0


def test_baselines_are_kept_for_the_most_recent_versions_only() -> None:
    config = TelemetryConfig(
        drift_warmup_frames=0,
        drift_warmup_s=0.0,
        drift_baseline_frames=10,
        max_baselines=2,
        drift_min_window_frames=1,
    )
    book = LatencyBook(config)
    for model in ("a", "b", "c"):
        window(book, [(model, 0.0, 0.01)] * 20, 0.0)
    assert sorted(book.export_baselines()) == ["b", "c"]
    # "a" comes back as a new version: warm-up and baseline again.
    assert window(book, [("a", 0.0, 0.01)], 1.0).versions["a"].drift.state == "collecting"


def test_versions_past_the_per_window_bound_are_counted_not_sketched() -> None:
    book = LatencyBook(TelemetryConfig(max_model_versions=2))
    batch = [("a", 0.0, 0.01), ("b", 0.0, 0.01), ("c", 0.0, 0.01), ("d", 0.0, 0.01)] * 3
    closed = window(book, batch, 0.0)
    assert list(closed.versions) == ["a", "b"]
    assert (closed.omitted_versions, closed.omitted_frames, closed.frames) == (2, 6, 12)


def test_baselines_survive_a_restart_through_export_and_import() -> None:
    rng = random.Random(8)
    book = ready_book(rng)
    exported = book.export_baselines()
    assert set(exported) == {"a"} and exported["a"]["frames"] == 600
    fresh = LatencyBook(CONFIG)
    fresh.import_baselines(exported, 0.0)
    drift = window(fresh, frames(rng, "a", 300, compute_ms=40.0), 1.0).versions["a"].drift
    assert drift.state == "ready" and drift.suspected  # slower than before the restart


@pytest.mark.parametrize(
    "bad",
    [
        {"a": {"compute_ms": {"v": 9}}},
        {"a": {"frames": 1}},
        {"a": "nope"},
        {"": {}},
    ],
)
def test_a_malformed_baseline_import_is_refused_whole(bad: dict[str, object]) -> None:
    rng = random.Random(9)
    good = ready_book(rng).export_baselines()
    book = LatencyBook(CONFIG)
    with pytest.raises(InvalidInputError, match="drift baseline"):
        book.import_baselines({**good, "b": good["a"], **bad}, 0.0)
    assert book.export_baselines() == {}
