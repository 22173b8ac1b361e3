"""The telemetry section of node.yaml: defaults, checks, unknown keys refused."""

from __future__ import annotations

from typing import Any

import pytest

from edge_node.errors import InvalidInputError
from edge_node.telemetry import TelemetryConfig, parse_telemetry_config


def test_defaults_follow_the_design() -> None:
    config = parse_telemetry_config(None, memory_budget_bytes=512 << 20)
    assert config == TelemetryConfig(memory_budget_bytes=512 << 20)
    assert config.min_headroom_ratio == 0.30  # design section 1: keep 30 % headroom
    assert config.latency_relative_accuracy == 0.01


def test_a_section_overrides_and_yaml_integers_pass_for_seconds() -> None:
    config = parse_telemetry_config(
        {"leak_slope_mb_per_h": 5, "rss_window_s": 7200, "memory_budget_bytes": 1 << 30},
        memory_budget_bytes=512 << 20,
    )
    assert config.leak_slope_mb_per_h == 5 and config.rss_window_s == 7200
    assert config.memory_budget_bytes == 1 << 30


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"leak_slope_mbph": 5}, "telemetry"),
        ({"latency_relative_accuracy": 0.5}, "telemetry.latency_relative_accuracy"),
        ({"latency_max_buckets": 8}, "telemetry.latency_max_buckets"),
        ({"drift_alert_ratio": 1.0}, "telemetry.drift_alert_ratio"),
        ({"drift_warmup_frames": -1}, "telemetry.drift_warmup_frames"),
        ({"rss_window_s": float("nan")}, "telemetry.rss_window_s"),
        ({"rss_min_span_s": 4000.0}, "telemetry.rss_min_span_s"),
        ({"leak_slope_mb_per_h": 0}, "telemetry.leak_slope_mb_per_h"),
        ({"max_streams": True}, "telemetry.max_streams"),
        ({"memory_budget_bytes": 0}, "telemetry.memory_budget_bytes"),
        ({"min_headroom_ratio": "30%"}, "telemetry.min_headroom_ratio"),
    ],
)
def test_bad_settings_fail_loudly_with_their_field(section: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_telemetry_config(section)
    assert caught.value.fields["field"] == field


def test_a_section_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        parse_telemetry_config(["leak_for_s", 5])  # type: ignore[arg-type]
