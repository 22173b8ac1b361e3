"""The health store on both databases: points, roll-ups, restart safety, retention, alerts."""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.clock import ManualClock
from control_plane.errors import ConflictError, PermissionDeniedError
from control_plane.health.config import HealthConfig
from control_plane.health.processor import HealthProcessor
from control_plane.services import HealthServices, build_health
from control_plane.storage.models import (
    AuditRow,
    HealthCursorRow,
    HealthPointRow,
    HealthRollupRow,
    NodeRow,
)
from tests.control_plane.health.support import START, Sender, v1_report, v2_report

OPERATOR = RequestContext(Principal(token_id="op", name="alice", role=Role.OPERATOR), "req")
VIEWER = RequestContext(Principal(token_id="v", name="victor", role=Role.VIEWER), "req")


def settle(clock: ManualClock, health: HealthServices) -> None:
    clock.advance(health.processor.config.settle + timedelta(seconds=1))


def count(sessions: sessionmaker[Session], row: Any, **where: Any) -> int:
    with sessions() as session:
        query = select(func.count()).select_from(row)
        for name, value in where.items():
            query = query.where(getattr(row, name) == value)
        return int(session.scalar(query) or 0)


def rollup_reports(sessions: sessionmaker[Session], resolution: str) -> int:
    with sessions() as session:
        return int(
            session.scalar(
                select(func.sum(HealthRollupRow.reports)).where(
                    HealthRollupRow.resolution == resolution
                )
            )
            or 0
        )


def test_reports_become_points_and_rollups(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    sender.send(
        "n-a",
        v2_report(START, rss_mb=200, samples=[10, 20]),
        v2_report(START + timedelta(seconds=20), rss_mb=260, samples=[30]),
        v2_report(START + timedelta(seconds=70), rss_mb=230, samples=[5]),
    )
    sender.send("n-b", v1_report())
    settle(clock, health)
    assert health.processor.process_pending() == 4

    raw = health.queries.series("n-a", timedelta(hours=1), now=START + timedelta(minutes=5))
    assert raw.resolution == "raw"
    assert [p["metrics"]["rss_bytes"] for p in raw.points] == [200e6, 260e6, 230e6]
    first = raw.points[0]
    assert first["metrics"]["frames_skipped"] == 3
    # End-to-end of [10, 20] is [11, 21]; the sketch's P99 is sorted[floor(0.99 * 1)].
    assert first["metrics"]["p99_ms"] == pytest.approx(11.0, rel=0.01)
    assert "sketch_ms" not in first["latency"]["detector/1.0.0"]["compute"]

    minute = health.queries.series(
        "n-a", timedelta(hours=1), resolution="minute", now=START + timedelta(minutes=5)
    )
    assert [p["reports"] for p in minute.points] == [2, 1]
    rss = minute.points[0]["metrics"]["rss_bytes"]
    assert (rss["min"], rss["max"], rss["mean"], rss["count"]) == (200e6, 260e6, 230e6, 2)
    compute = minute.points[0]["latency"]["detector/1.0.0"]["compute"]
    assert compute["samples"] == 3
    assert compute["max_ms"] == 30.0
    assert compute["p50_ms"] == pytest.approx(20.0, rel=0.01)

    hour = health.queries.series("n-a", timedelta(days=30), now=START + timedelta(minutes=5))
    assert hour.resolution == "hour"
    assert [p["reports"] for p in hour.points] == [3]
    assert hour.points[0]["latency"]["detector/1.0.0"]["compute"]["samples"] == 4

    old = health.queries.series("n-b", timedelta(hours=1), now=START + timedelta(minutes=5))
    assert old.points[0]["metrics"]["headroom_ratio"] == 0.7
    assert health.queries.latest(["n-a"])["n-a"].metrics["rss_bytes"] == 230e6


def test_rollup_percentiles_come_from_merged_sketches(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    rng = random.Random(5)
    everything: list[float] = []
    reports = []
    for i in range(30):
        # Windows of very different speed: averaging their P99s would be far off.
        scale = 5.0 if i % 3 else 60.0
        samples = [rng.lognormvariate(math.log(scale), 0.4) for _ in range(200)]
        everything += samples
        reports.append(v2_report(START + timedelta(seconds=100 * i), samples=samples))
    for chunk in range(0, 30, 10):
        sender.send("n-a", *reports[chunk : chunk + 10])
    settle(clock, health)
    health.processor.process_pending()

    point = health.queries.series("n-a", timedelta(days=30), now=START + timedelta(hours=1)).points[
        0
    ]
    assert point["reports"] == 30
    compute = point["latency"]["detector/1.0.0"]["compute"]
    ordered = sorted(everything)
    for name, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)):
        exact = ordered[math.floor(q * (len(ordered) - 1))]
        assert abs(compute[name] - exact) <= 0.01 * exact + 1e-9, name
    assert compute["max_ms"] == pytest.approx(max(everything), abs=1e-3)
    assert point["metrics"]["p99_ms"]["max"] >= compute["p99_ms"] * 0.99


def test_settle_leaves_fresh_records_for_the_next_pass(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    sender.send("n-a", v2_report(START))
    assert health.processor.process_pending() == 0
    settle(clock, health)
    assert health.processor.process_pending() == 1


def test_restart_midway_loses_nothing_and_duplicates_nothing(
    sessions: sessionmaker[Session],
    health: HealthServices,
    sender: Sender,
    clock: ManualClock,
    config: HealthConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(7):
        sender.send("n-a" if i % 2 else "n-b", v2_report(START + timedelta(seconds=5 * i)))
    settle(clock, health)
    assert health.processor.process_batch().processed == 3

    # A crash in the middle of the next batch: nothing of it may stay.
    def boom(*_: object) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr(health.processor, "_keep_latest", boom)
    with pytest.raises(RuntimeError):
        health.processor.process_batch()
    assert count(sessions, HealthPointRow) == 3
    assert rollup_reports(sessions, "hour") == 3

    restarted = HealthProcessor(sessions, clock, config)
    restarted.process_pending()
    assert count(sessions, HealthPointRow) == 7
    assert rollup_reports(sessions, "minute") == 7
    assert rollup_reports(sessions, "hour") == 7

    # Replaying everything (a cursor rewound by hand) changes nothing.
    with sessions() as session:
        session.execute(update(HealthCursorRow).values(received_at=None, node_id="", record_id=""))
        session.commit()
    again = HealthProcessor(sessions, clock, config)
    again.process_pending()
    assert count(sessions, HealthPointRow) == 7
    assert rollup_reports(sessions, "hour") == 7
    with sessions() as session:
        assert session.get(HealthCursorRow, "health").processed == 7  # type: ignore[union-attr]


def test_malformed_reports_are_counted_and_skipped(
    sessions: sessionmaker[Session],
    health: HealthServices,
    sender: Sender,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad_sketch = v2_report(START)
    bad_sketch["latency"]["detector/1.0.0"]["compute"]["sketch_ms"]["bins"] = [1, -5]
    sender.send(
        "n-a",
        b"{not json",
        json.dumps([1, 2]).encode(),
        json.dumps({"schema": "someone.else/1"}).encode(),
        b"\xff\xfe",
        bad_sketch,
        v2_report(START + timedelta(seconds=10), window_end="yesterday"),
    )
    settle(clock, health)
    with caplog.at_level(logging.WARNING, logger="control_plane.health.processor"):
        health.processor.process_pending()
    assert sum(health.processor.malformed.values()) == 4
    # One warning per batch that had any (two batches of 3 here), not one per report.
    warnings = [r for r in caplog.records if "malformed health report" in r.getMessage()]
    assert 1 <= len(warnings) <= 2
    reasons: Counter[str] = Counter()
    for warning in warnings:
        reasons.update(warning.reasons)  # type: ignore[attr-defined]
        assert warning.node_id == "n-a"  # type: ignore[attr-defined]
    assert reasons == health.processor.malformed
    assert health.processor.malformed["not-json"] == 2
    with sessions() as session:
        cursor = session.get(HealthCursorRow, "health")
        assert cursor is not None and (cursor.processed, cursor.malformed) == (2, 4)
    points = health.queries.series(
        "n-a", timedelta(hours=1), now=START + timedelta(minutes=1)
    ).points
    assert len(points) == 2
    # The bad sketch lost its merge, not its percentiles.
    assert "p99_ms" in points[0]["latency"]["detector/1.0.0"]["compute"]


def test_retention_deletes_only_what_is_old(
    sessions: sessionmaker[Session], sender: Sender, clock: ManualClock
) -> None:
    config = HealthConfig(
        raw_retention=timedelta(hours=1),
        minute_retention=timedelta(hours=3),
        hour_retention=timedelta(hours=28),
    )
    health = build_health(sessions, clock, config)
    for hours in (0, 2, 4, 30):
        clock.advance(timedelta(hours=hours) - (clock.now() - START))
        sender.send("n-a", v2_report(clock.now()))
        settle(clock, health)
        health.processor.process_batch()
    now = START + timedelta(hours=30, minutes=30)
    deleted = health.retention.apply_retention(now)
    assert deleted["raw"] == 3
    assert deleted["minute"] == 3
    assert deleted["hour"] == 1
    raw = health.queries.series("n-a", timedelta(days=3), resolution="raw", now=now)
    assert [p["at"] for p in raw.points] == [(START + timedelta(hours=30)).isoformat()]
    hourly = health.queries.series("n-a", timedelta(days=3), resolution="hour", now=now)
    assert [p["reports"] for p in hourly.points] == [1, 1, 1]


def kinds(health: HealthServices, node: str = "n-a") -> list[str]:
    return sorted(a.kind for a in health.queries.list_alerts(node_id=node))


def test_alerts_raise_and_clear_with_their_conditions(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    sender.send(
        "n-a",
        v2_report(
            START,
            rss_mb=800,
            leak=True,
            slope=40.0,
            drift_ratio=2.0,
            throttled=True,
            outbox_fill=0.9,
        ),
    )
    sender.send("n-b", v2_report(START))
    settle(clock, health)
    health.processor.process_pending()
    assert kinds(health) == [
        "drift",
        "leak_suspected",
        "memory_headroom_low",
        "outbox_near_budget",
        "throttling",
    ]
    assert kinds(health, "n-b") == []
    (headroom,) = health.queries.list_alerts(node_id="n-a", kind="memory_headroom_low")
    assert headroom.details["headroom_ratio"] == 0.2
    assert headroom.details["threshold"] == 0.3
    assert headroom.since == START

    # The condition ends: the alert clears itself; an unknown value changes nothing.
    sender.send("n-a", v2_report(START + timedelta(seconds=30), throttled=None))
    settle(clock, health)
    health.processor.process_pending()
    assert kinds(health) == ["throttling"]
    cleared = health.queries.list_alerts(node_id="n-a", kind="drift", include_cleared=True)
    assert cleared[0].cleared_by == "condition-ended"
    assert cleared[0].cleared_at == START + timedelta(seconds=30)


def test_a_late_report_is_a_point_but_never_flips_an_alert(
    health: HealthServices, sender: Sender, clock: ManualClock, sessions: sessionmaker[Session]
) -> None:
    def report(seconds: int, drift: float) -> None:
        sender.send("n-a", v2_report(START + timedelta(seconds=seconds), drift_ratio=drift))
        settle(clock, health)
        health.processor.process_pending()

    report(30, 1.0)  # newest: no drift
    report(10, 3.0)  # resent late, from before it: drifting then
    assert health.queries.list_alerts(node_id="n-a", include_cleared=True) == []
    assert count(sessions, HealthPointRow, node_id="n-a") == 2  # still in the series

    report(40, 3.0)
    (alert,) = health.queries.list_alerts(node_id="n-a")
    report(20, 1.0)  # late, and fine then: the alert of 40 s stays open
    assert [a.id for a in health.queries.list_alerts(node_id="n-a")] == [alert.id]
    report(50, 1.0)
    assert health.queries.list_alerts(node_id="n-a") == []


def test_a_report_dated_far_ahead_does_not_hold_a_nodes_alerts(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    # A node whose clock ran a day ahead, then was corrected: its later reports are
    # older than that one, but they are the news.
    sender.send("n-a", v2_report(START + timedelta(days=1), drift_ratio=1.0))
    settle(clock, health)
    health.processor.process_pending()
    sender.send("n-a", v2_report(clock.now(), drift_ratio=3.0))
    settle(clock, health)
    health.processor.process_pending()
    assert kinds(health, "n-a") == ["drift"]
    (latest,) = health.queries.latest(["n-a"]).values()
    assert latest.at < START + timedelta(days=1)


def test_a_node_clock_steadily_ahead_keeps_its_own_order(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    # An hour ahead, always: its reports are not "corrected" ones, and a late resend
    # among them still cannot clear an alert or move the latest values back.
    ahead = timedelta(hours=1)
    sender.send("n-a", v2_report(clock.now() + ahead, drift_ratio=3.0))
    settle(clock, health)
    health.processor.process_pending()
    assert kinds(health, "n-a") == ["drift"]
    sender.send("n-a", v2_report(clock.now() + ahead - timedelta(minutes=10), drift_ratio=1.0))
    settle(clock, health)
    health.processor.process_pending()
    assert kinds(health, "n-a") == ["drift"]
    (latest,) = health.queries.latest(["n-a"]).values()
    assert latest.at == START + ahead  # the report of the first pass, not the resend


def test_the_latest_point_keeps_the_shadow_section_until_a_report_has_none(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    shadow = {
        "candidate": "detector@1.1.0",
        "state": "running",
        "against": "detector@1.0.0",
        "frames_compared": 40,
        "agreement": {"kind": "detection", "frames": 40, "recall": 0.95},
        "latency": {"p99_ms": 12.5, "sketch_ms": {"v": 1, "n": 0}},
    }
    sender.send("n-a", v2_report(START, shadow=shadow))
    # A late resend without a shadow section is not the newest: the section stays.
    sender.send("n-a", v2_report(START - timedelta(minutes=5)))
    sender.send("n-b", v2_report(START))
    settle(clock, health)
    health.processor.process_pending()
    latest = health.queries.latest(["n-a", "n-b"])
    assert latest["n-a"].shadow is not None
    assert (latest["n-a"].shadow["candidate"], latest["n-a"].shadow["state"]) == (
        "detector@1.1.0",
        "running",
    )
    assert latest["n-a"].shadow["latency"] == {"p99_ms": 12.5}  # no sketch kept
    assert latest["n-a"].metrics["shadow_frames_compared"] == 40
    assert latest["n-b"].shadow is None

    sender.send(
        "n-a", v2_report(START + timedelta(minutes=1), shadow={**shadow, "state": "failed"})
    )
    settle(clock, health)
    health.processor.process_pending()
    failed = health.queries.latest(["n-a"])["n-a"].shadow
    assert failed is not None and failed["state"] == "failed"
    # The shadow ended: the node's next report has no section, nor has its latest point.
    sender.send("n-a", v2_report(START + timedelta(minutes=2)))
    settle(clock, health)
    health.processor.process_pending()
    assert health.queries.latest(["n-a"])["n-a"].shadow is None


def test_operator_clear_silences_until_the_condition_ends(
    health: HealthServices, sender: Sender, clock: ManualClock
) -> None:
    def report(seconds: int, drift: float) -> None:
        sender.send("n-a", v2_report(START + timedelta(seconds=seconds), drift_ratio=drift))
        settle(clock, health)
        health.processor.process_pending()

    report(0, 3.0)
    (alert,) = health.queries.list_alerts(node_id="n-a")
    with pytest.raises(PermissionDeniedError):
        health.alerts.clear_alert(VIEWER, alert.id)
    cleared = health.alerts.clear_alert(OPERATOR, alert.id)
    assert cleared.cleared_by == "operator:alice"
    with pytest.raises(ConflictError):
        health.alerts.clear_alert(OPERATOR, alert.id)
    report(10, 3.0)
    assert health.queries.list_alerts(node_id="n-a") == []  # still drifting, but silenced
    report(20, 1.0)
    report(30, 3.0)
    (again,) = health.queries.list_alerts(node_id="n-a")
    assert again.id != alert.id and again.kind == "drift"


def test_alert_clears_are_audited_refused_ones_too(
    health: HealthServices, sender: Sender, clock: ManualClock, sessions: sessionmaker[Session]
) -> None:
    sender.send("n-a", v2_report(START, drift_ratio=3.0))
    settle(clock, health)
    health.processor.process_pending()
    (alert,) = health.queries.list_alerts(node_id="n-a")
    with pytest.raises(PermissionDeniedError):
        health.alerts.clear_alert(VIEWER, alert.id)
    health.alerts.clear_alert(OPERATOR, alert.id)
    with pytest.raises(ConflictError):
        health.alerts.clear_alert(OPERATOR, alert.id)
    with sessions() as session:
        rows = session.scalars(
            select(AuditRow).where(AuditRow.action == "alert.clear").order_by(AuditRow.id)
        ).all()
    assert [(r.actor, r.outcome) for r in rows] == [
        ("victor", "refused"),
        ("alice", "ok"),
        ("alice", "refused"),
    ]


def test_offline_nodes_raise_an_alert_that_clears_when_they_return(
    sessions: sessionmaker[Session], health: HealthServices
) -> None:
    def set_online(online: bool) -> None:
        with sessions() as session:
            session.execute(update(NodeRow).where(NodeRow.id == "n-a").values(online=online))
            session.commit()

    set_online(False)
    health.processor.process_pending()
    health.processor.process_pending()
    assert kinds(health) == ["node_offline"]
    assert kinds(health, "n-b") == []
    set_online(True)
    health.processor.process_pending()
    assert kinds(health) == []
    assert health.queries.list_alerts(include_cleared=True)[0].cleared_by == "condition-ended"


def test_a_node_refusing_assignments_as_stale_raises_an_alert_until_it_accepts_again(
    sessions: sessionmaker[Session], health: HealthServices
) -> None:
    def report(phase: str, reason: str) -> None:
        status = {
            "phase": phase,
            "reason": reason,
            "detail": "assignment sequence 3 is below the last one already accepted (4294967297)",
            "director_sequence": 4294967297,
            "facts": {"sequence": "3", "last_sequence": "4294967297"},
        }
        with sessions() as session:
            session.execute(
                update(NodeRow).where(NodeRow.id == "n-a").values(reported_state={"update": status})
            )
            session.commit()

    report("failed", "self-test-failed")  # a failed update is not the director locked out
    health.processor.process_pending()
    assert kinds(health) == []
    report("failed", "stale")
    health.processor.process_pending()
    assert kinds(health) == ["assignment_refused"]
    alert = health.queries.list_alerts()[0]
    assert (alert.details["reason"], alert.details["director_sequence"]) == ("stale", 4294967297)
    report("active", "")
    health.processor.process_pending()
    assert kinds(health) == []


def test_two_replicas_at_once_process_each_record_once(
    sessions: sessionmaker[Session], sender: Sender, clock: ManualClock, config: HealthConfig
) -> None:
    for i in range(40):
        sender.send("n-a" if i % 2 else "n-b", v2_report(START + timedelta(seconds=i)))
    settle(clock, build_health(sessions, clock, config))
    replicas = [HealthProcessor(sessions, clock, config) for _ in range(2)]
    errors: list[BaseException] = []

    def drain(processor: HealthProcessor) -> None:
        try:
            for _ in range(40):
                processor.process_pending()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(r,)) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert count(sessions, HealthPointRow) == 40
    assert rollup_reports(sessions, "minute") == 40
    assert rollup_reports(sessions, "hour") == 40
    assert sum(r.processed for r in replicas) == 40
