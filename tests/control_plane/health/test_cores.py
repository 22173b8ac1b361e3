"""The health store's pure cores: report reading, roll-up math, alert rules, config."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from control_plane.durations import parse_duration
from control_plane.health.alerts import AlertState, Condition, conditions, next_step
from control_plane.health.config import AlertThresholds, HealthConfig
from control_plane.health.report import MalformedReportError, parse_report
from control_plane.health.rollup import Rollup, bucket_start
from tests.control_plane.health.support import START, v1_report, v2_report


def parse(report: dict[str, object]) -> object:
    return parse_report(json.dumps(report).encode(), created_at=START)


def test_v2_report_is_read_and_unknown_fields_ignored() -> None:
    report = v2_report(START + timedelta(seconds=5), drift_ratio=1.8, throttled=None)
    report["memory"]["rss_bytes"] = "a lot"  # a wrong type drops that field only
    point = parse_report(json.dumps(report).encode(), created_at=START)
    assert point.at == START + timedelta(seconds=5)
    assert "rss_bytes" not in point.metrics
    assert point.metrics["drift_p99_ratio"] == 1.8
    assert "throttled" not in point.metrics  # unknown, not "not throttled"
    assert point.metrics["outbox_fill_ratio"] == 0.1
    assert set(point.latency["detector/1.0.0"]) == {"queue", "compute", "end_to_end", "drift"}
    assert point.sketches()["detector/1.0.0"]["compute"].count == 3


def test_bad_frames_capture_and_the_outbox_s_counters_are_read() -> None:
    streams = {
        "door": {"bad": {"corrupt": 3, "shape": 1}, "captured": 9, "capture_failed": {"auth": 2}},
        "yard": {
            "bad": {"corrupt": 2},
            "captured": 4,
            "capture_failed": {},
            "capture_passed_over": {"superseded": 5, "stale": 1, "empty": 2},
        },
        "api": {"bad": {}},  # fed by a program: no capture numbers
    }
    report = v2_report(START, streams=streams)
    report["outbox"] |= {"disk_bytes": 900_000, "dropped_health": 672, "refused_events": 0}
    metrics = parse_report(json.dumps(report).encode(), created_at=START).metrics
    assert (metrics["frames_bad"], metrics["frames_corrupt"]) == (6.0, 5.0)
    assert metrics["capture_failed"] == 2.0
    assert (metrics["capture_superseded"], metrics["capture_discarded"]) == (5.0, 3.0)
    assert metrics["outbox_disk_bytes"] == 900_000.0
    assert metrics["outbox_dropped_health"] == 672.0
    # An older node sends no files passed over: unknown, not zero.
    del streams["yard"]["capture_passed_over"]
    older = parse_report(json.dumps(v2_report(START, streams=streams)).encode(), created_at=START)
    assert "capture_superseded" not in older.metrics and older.metrics["capture_failed"] == 2.0


def test_v1_report_and_newer_versions() -> None:
    point = parse_report(json.dumps(v1_report()).encode(), created_at=START)
    assert point.at == START
    assert point.metrics["headroom_ratio"] == 0.7
    assert point.metrics["outbox_fill_ratio"] == 0.1
    newer = v2_report(START)
    newer["schema"] = "edgefleet.agent.health/3"
    assert parse_report(json.dumps(newer).encode(), created_at=START).metrics["frames"] == 3


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"nope", "not-json"),
        (b"[]", "not-an-object"),
        (b'{"schema": "edgefleet.agent.health/x"}', "unknown-schema"),
        (b'{"schema": "edgefleet.agent.health/0"}', "unknown-schema"),
        (b"{}", "unknown-schema"),
    ],
)
def test_unreadable_reports(payload: bytes, reason: str) -> None:
    with pytest.raises(MalformedReportError) as caught:
        parse_report(payload, created_at=START)
    assert caught.value.reason == reason


def test_rollup_keeps_min_max_sum_count_and_survives_storage() -> None:
    points = [
        parse_report(json.dumps(v2_report(START, rss_mb=mb)).encode(), created_at=START)
        for mb in (300, 100, 200)
    ]
    whole = Rollup.of(points)
    halves = Rollup.of(points[:1])
    halves.merge(Rollup.from_columns(*Rollup.of(points[1:]).to_columns()))
    assert whole.to_columns() == halves.to_columns()
    assert whole.metric("rss_bytes") == {"min": 100e6, "max": 300e6, "mean": 200e6}
    assert whole.summary()["latency"]["detector/1.0.0"]["compute"]["samples"] == 9


def test_buckets() -> None:
    at = START + timedelta(minutes=61, seconds=7, microseconds=5)
    assert bucket_start(at, "minute") == START + timedelta(minutes=61)
    assert bucket_start(at, "hour") == START + timedelta(hours=1)


def test_conditions_follow_thresholds() -> None:
    thresholds = AlertThresholds(drift_ratio=1.5, leak_slope_mb_per_h=20.0)
    found = conditions(
        {"drift_p99_ratio": 1.5, "rss_slope_mb_per_h": 25.0, "leak_suspected": 0.0}, thresholds
    )
    assert found["drift"] == Condition(True, {"p99_ratio": 1.5, "threshold": 1.5})
    leak = found["leak_suspected"]
    assert leak is not None and leak.active
    assert found["throttling"] is None and found["memory_headroom_low"] is None
    quiet = conditions({"outbox_fill_ratio": 0.59, "headroom_ratio": 0.3}, thresholds)
    assert quiet["outbox_near_budget"] == Condition(False, quiet["outbox_near_budget"].details)  # type: ignore[union-attr]
    band = conditions({"outbox_fill_ratio": 0.79}, thresholds)["outbox_near_budget"]
    assert band is not None and (band.active, band.holding) == (False, True)
    assert quiet["memory_headroom_low"] is not None
    assert not quiet["memory_headroom_low"].active


def test_alert_life_cycle() -> None:
    on, off = Condition(True, {}), Condition(False, {})
    opened = AlertState(open=True, cleared_by_operator=False, ended=False)
    silenced = AlertState(open=False, cleared_by_operator=True, ended=False)
    done = AlertState(open=False, cleared_by_operator=True, ended=True)
    assert next_step(None, on) == "raise"
    assert next_step(None, off) == "none"
    assert next_step(opened, on) == "update"
    assert next_step(opened, off) == "clear"
    assert next_step(opened, None) == "none"
    assert next_step(silenced, on) == "none"
    assert next_step(silenced, off) == "mark-ended"
    assert next_step(done, on) == "raise"


def test_a_draining_outbox_backlog_raises_one_alert_and_clears_it_once() -> None:
    """The node's reports while its backlog drains after a link outage: acks come in
    bursts and new reports keep arriving, so the fill crosses the raise mark back and
    forth (the alert flapped four times here before it had a clear mark below it)."""
    thresholds = AlertThresholds()  # raise at 0.8, clear below 0.6
    reports = [
        (0.99, True),  # thinning: the node's alarm is on
        (0.93, True),
        (0.85, True),
        (0.79, False),  # an ack took the node under its own clear mark
        (0.82, False),
        (0.78, False),
        (0.81, False),
        (0.76, False),
        (0.80, False),
        (0.70, False),
        (0.66, False),
        (0.61, False),
        (0.55, False),
        (0.30, False),
        (0.12, False),
    ]
    latest: AlertState | None = None
    steps = []
    for fill, alarm in reports:
        condition = conditions(
            {"outbox_fill_ratio": fill, "outbox_alarm": float(alarm)}, thresholds
        )["outbox_near_budget"]
        step = next_step(latest, condition)
        steps.append(step)
        if step == "raise":
            latest = AlertState(open=True, cleared_by_operator=False, ended=False)
        elif step == "clear":
            latest = AlertState(open=False, cleared_by_operator=False, ended=True)
    assert steps.count("raise") == 1 and steps.count("clear") == 1
    assert steps.index("clear") == [fill for fill, _ in reports].index(0.55)
    assert set(steps) == {"raise", "update", "clear", "none"}


def test_the_outbox_band_keeps_an_open_alert_and_raises_none() -> None:
    holding = Condition(False, {}, holding=True)
    opened = AlertState(open=True, cleared_by_operator=False, ended=False)
    silenced = AlertState(open=False, cleared_by_operator=True, ended=False)
    assert next_step(None, holding) == "none"
    assert next_step(opened, holding) == "update"
    assert next_step(silenced, holding) == "none"  # not ended: still silenced
    assert AlertThresholds(outbox_fill_ratio=0.5).outbox_clear_mark == 0.375
    with pytest.raises(ValueError, match="outbox_clear_fill_ratio"):
        AlertThresholds(outbox_fill_ratio=0.5, outbox_clear_fill_ratio=0.6)


def test_config_refuses_unsafe_values_and_durations_parse() -> None:
    with pytest.raises(ValueError, match="retention"):
        HealthConfig(raw_retention=timedelta(days=30))
    with pytest.raises(ValueError):
        AlertThresholds(min_headroom_ratio=0)
    assert parse_duration("6h") == timedelta(hours=6)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("600") == timedelta(minutes=10)
    with pytest.raises(ValueError):
        parse_duration("6 hours")


def test_server_settings_build_the_health_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from control_plane.errors import InvalidInputError
    from control_plane.settings import ServerSettings

    monkeypatch.setenv("EDGEFLEET_HEALTH_RAW_RETENTION_HOURS", "2")
    monkeypatch.setenv("EDGEFLEET_ALERT_MIN_HEADROOM_RATIO", "0.25")
    config = ServerSettings().health_config()
    assert config.raw_retention == timedelta(hours=2)
    assert config.thresholds.min_headroom_ratio == 0.25
    assert config.thresholds.drift_ratio == 1.5
    assert config.thresholds.outbox_clear_mark == 0.6
    monkeypatch.setenv("EDGEFLEET_ALERT_OUTBOX_CLEAR_RATIO", "0.5")
    assert ServerSettings().health_config().thresholds.outbox_clear_mark == 0.5
    monkeypatch.setenv("EDGEFLEET_ALERT_OUTBOX_CLEAR_RATIO", "0.9")
    with pytest.raises(InvalidInputError, match="outbox_clear_fill_ratio"):
        ServerSettings().health_config()
    monkeypatch.delenv("EDGEFLEET_ALERT_OUTBOX_CLEAR_RATIO")
    monkeypatch.setenv("EDGEFLEET_HEALTH_MINUTE_RETENTION_DAYS", "0.01")
    with pytest.raises(InvalidInputError, match="retention"):
        ServerSettings().health_config()
