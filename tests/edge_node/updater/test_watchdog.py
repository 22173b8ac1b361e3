"""The watchdog's verdict on a freshly activated model (pure) and its settings."""

from __future__ import annotations

import pytest

from edge_node.errors import InvalidInputError
from edge_node.updater.watchdog import ModelHealth, WatchdogConfig, judge

CONFIG = WatchdogConfig(window_s=60, max_errors=5, max_error_ratio=0.1, min_frames=20)
START = ModelHealth("/m/new.onnx", frames=3, errors=1)


def after(frames: int, errors: int, model: str = "/m/new.onnx") -> ModelHealth:
    return ModelHealth(model, START.frames + frames, START.errors + errors)


def test_a_healthy_model_passes() -> None:
    assert judge(START, after(1000, 4), CONFIG) is None
    assert judge(START, START, CONFIG) is None


def test_too_many_errors_trip_it_whatever_the_frame_count() -> None:
    verdict = judge(START, after(10_000, 5), CONFIG)
    assert verdict is not None and verdict.reason == "watchdog-errors"
    assert "5 inference errors in 10000 frames" in verdict.detail


def test_an_error_rate_over_the_limit_trips_it_once_enough_frames_ran() -> None:
    assert judge(START, after(19, 4), CONFIG) is None  # 21 % but too few frames to judge
    verdict = judge(START, after(20, 3), CONFIG)
    assert verdict is not None and verdict.reason == "watchdog-error-rate"
    assert verdict.detail == "3 of 20 frames failed (15.0%, limit 10.0%)"
    assert judge(START, after(20, 2), CONFIG) is None  # exactly 10 % is within the limit


def test_counters_of_another_session_judge_nothing() -> None:
    assert judge(START, after(100, 50, model="/m/other.onnx"), CONFIG) is None
    assert judge(START, ModelHealth(START.model, 0, 0), CONFIG) is None  # went backwards


@pytest.mark.parametrize(
    "values",
    [
        {"window_s": -1},
        {"window_s": float("inf")},
        {"max_errors": 0},
        {"max_errors": True},
        {"max_error_ratio": 0},
        {"max_error_ratio": 1.5},
        {"min_frames": 0},
        {"poll_s": 0},
    ],
)
def test_unsafe_settings_are_refused(values: dict[str, float]) -> None:
    with pytest.raises(InvalidInputError):
        WatchdogConfig(**values)  # type: ignore[arg-type]


def test_a_zero_window_turns_it_off() -> None:
    assert not WatchdogConfig(window_s=0).enabled
    assert WatchdogConfig().enabled


@pytest.mark.parametrize("core", ["edge_node/updater/watchdog.py", "edge_node/updater/config.py"])
def test_the_watchdog_rules_and_the_updater_config_are_pure_cores(core: str) -> None:
    """As tests/test_architecture.py checks its PURE_CORES list."""
    from tests.test_architecture import FRAMEWORKS, ROOT, imported_modules

    found = [n for n in imported_modules(ROOT / core) if n.split(".")[0] in FRAMEWORKS]
    assert found == []
