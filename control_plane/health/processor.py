"""The health processor: turns stored health records into points, roll-ups and alerts.

What it is for: ``process_pending`` walks ``node_records`` (kind "health") behind a durable
cursor and, per batch and in one transaction, stores each report as a raw point, folds it
into its node's minute and hour roll-ups, keeps the node's latest point (with its shadow
section), raises and clears alerts, and moves the cursor (ADR 0018); when due it runs the
retention (``control_plane.health.retention``). Not for reads
(``control_plane.health.queries``) nor for policy: the rules live in
``control_plane.health.alerts`` and the roll-up math in ``control_plane.health.rollup``.

Several replicas may run the processor: the cursor row is locked for the whole batch
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so each record
is processed once, and a record already stored as a raw point is never folded again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.health.alerts import (
    AlertState,
    Condition,
    assignment_condition,
    conditions,
    next_step,
    offline_condition,
)
from control_plane.health.config import HealthConfig
from control_plane.health.report import HealthPoint, MalformedReportError, parse_report
from control_plane.health.retention import HealthRetention
from control_plane.health.rollup import RESOLUTIONS, Rollup, bucket_start
from control_plane.health.rows import (
    CONDITION_ENDED,
    CURSOR_NAME,
    after_position,
    cursor_position,
    locked_cursor,
    percentiles_only,
    write_session,
)
from control_plane.storage.models import (
    HealthAlertRow,
    HealthCursorRow,
    HealthLatestRow,
    HealthPointRow,
    HealthRollupRow,
    NodeRecordRow,
    NodeRow,
)

__all__ = ["BatchResult", "HealthProcessor"]

log = logging.getLogger(__name__)
_UPDATE_STATE: Final = "update"
"""`reported_state` key of the node's latest update status (`control_plane.nodes.model.UPDATE`)."""

# How far ahead of the control plane's clock a report may be dated and still count as a
# node's newest (clocks drift; one set years ahead is wrong).
_CLOCK_AHEAD: Final = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class BatchResult:
    processed: int
    malformed: int
    duplicates: int
    more: bool


class HealthProcessor:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        config: HealthConfig | None = None,
        retention: HealthRetention | None = None,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.config = config or HealthConfig()
        self._retention = retention or HealthRetention(sessions, clock, self.config)
        self._lock = threading.Lock()
        # This process's counters (the durable totals are on the cursor row).
        self.processed = 0
        self.malformed: Counter[str] = Counter()
        self.passes = 0
        self.failed_passes = 0

    def process_pending(self, now: datetime | None = None) -> int:
        """Process up to ``max_batches_per_pass`` batches; returns the records processed.

        Also marks offline alerts and, when due, applies retention. Safe on every replica.
        """
        now = now or self._clock.now()
        with self._lock:
            total = 0
            for _ in range(self.config.max_batches_per_pass):
                result = self.process_batch(now)
                total += result.processed + result.malformed + result.duplicates
                if not result.more:
                    break
            self.sync_offline_alerts(now)
            self._retention.apply_if_due(now)
            self.passes += 1
            return total

    def process_batch(self, now: datetime | None = None) -> BatchResult:
        """One transaction: the next batch of health records after the cursor.

        The records are read and parsed before the write transaction begins (on SQLite
        its lock is the whole database's, and the ingest waits on it); the write then
        checks that the cursor has not moved meanwhile (another replica's batch), and
        gives up the batch if it has.
        """
        now = now or self._clock.now()
        self._ensure_cursor()
        limit = now - self.config.settle
        with self._sessions() as session:
            position = cursor_position(session.get(HealthCursorRow, CURSOR_NAME))
            query = (
                select(
                    NodeRecordRow.node_id,
                    NodeRecordRow.record_id,
                    NodeRecordRow.received_at,
                    NodeRecordRow.created_at,
                    NodeRecordRow.payload,
                )
                .where(NodeRecordRow.kind == "health", NodeRecordRow.received_at <= limit)
                .order_by(NodeRecordRow.received_at, NodeRecordRow.node_id, NodeRecordRow.record_id)
                .limit(self.config.batch_size)
            )
            if position is not None:
                query = query.where(after_position(*position))
            records = session.execute(query).all()
        if not records:
            return BatchResult(0, 0, 0, more=False)

        points: list[tuple[str, str, datetime, HealthPoint]] = []
        reasons: list[str] = []
        first_malformed: tuple[str, str, str] | None = None
        for node_id, record_id, received_at, created_at, payload in records:
            try:
                point = parse_report(bytes(payload), created_at=created_at)
            except MalformedReportError as exc:
                reasons.append(exc.reason)
                if first_malformed is None:
                    first_malformed = (node_id, record_id, exc.reason)
                continue
            except Exception:  # never let one report stop the store
                reasons.append("unreadable")
                log.exception("skipped an unreadable health report %s/%s", node_id, record_id)
                continue
            points.append((node_id, record_id, received_at, point))
        if first_malformed is not None:
            # One line per batch, not per report: a fleet on an old agent sends nothing
            # else, and a line per report cost more than reading the reports.
            node_id, record_id, reason = first_malformed
            log.warning(
                "skipped %d malformed health report(s) of %d in a batch",
                len(reasons),
                len(records),
                extra={
                    "node_id": node_id,
                    "record_id": record_id,
                    "reason": reason,
                    "reasons": dict(Counter(reasons)),
                },
            )

        with write_session(self._sessions) as session:
            cursor = locked_cursor(session)
            if cursor is None:
                return BatchResult(0, 0, 0, more=False)  # another replica holds it
            if cursor_position(cursor) != position:
                return BatchResult(0, 0, 0, more=True)  # it moved meanwhile: read again
            fresh = _without_stored(session, points)
            duplicates = len(points) - len(fresh)
            if fresh:
                self._store_points(session, fresh)
                self._fold_rollups(session, fresh)
                newest_before = self._keep_latest(session, fresh, now)
                # A report older than one already applied (a node's late resend) is a
                # point in the series, but not news: it cannot raise or clear an alert.
                self._report_alerts(
                    session,
                    [
                        p
                        for p in fresh
                        if p[0] not in newest_before or p[3].at >= newest_before[p[0]]
                    ],
                    now,
                )
            last = records[-1]
            cursor.received_at, cursor.node_id, cursor.record_id = last[2], last[0], last[1]
            cursor.processed += len(fresh)
            cursor.malformed += len(reasons)
            cursor.updated_at = now
            session.commit()
        self.processed += len(fresh)
        self.malformed.update(reasons)
        return BatchResult(
            len(fresh), len(reasons), duplicates, more=len(records) == self.config.batch_size
        )

    def _ensure_cursor(self) -> None:
        with self._sessions() as session:
            if session.get(HealthCursorRow, CURSOR_NAME) is not None:
                return
        with write_session(self._sessions) as session:
            if session.get(HealthCursorRow, CURSOR_NAME) is not None:
                return
            session.add(HealthCursorRow(name=CURSOR_NAME))
            try:
                session.commit()
            except IntegrityError:
                session.rollback()  # another replica made it first

    def _store_points(
        self, session: Session, points: Sequence[tuple[str, str, datetime, HealthPoint]]
    ) -> None:
        session.execute(
            insert(HealthPointRow),
            [
                {
                    "node_id": node_id,
                    "record_id": record_id,
                    "at": point.at,
                    "received_at": received_at,
                    "schema": point.schema[:64],
                    "metrics": point.metrics,
                    "latency": point.latency,
                }
                for node_id, record_id, received_at, point in points
            ],
        )

    def _fold_rollups(
        self, session: Session, points: Sequence[tuple[str, str, datetime, HealthPoint]]
    ) -> None:
        for resolution in RESOLUTIONS:
            groups: dict[tuple[str, datetime], Rollup] = defaultdict(Rollup)
            for node_id, _, _, point in points:
                groups[(node_id, bucket_start(point.at, resolution))].add(point)
            nodes = sorted({node for node, _ in groups})
            buckets = sorted({bucket for _, bucket in groups})
            existing = {
                (row.node_id, row.bucket): row
                for row in session.scalars(
                    select(HealthRollupRow).where(
                        HealthRollupRow.resolution == resolution,
                        HealthRollupRow.node_id.in_(nodes),
                        HealthRollupRow.bucket.in_(buckets),
                    )
                )
            }
            for (node_id, bucket), added in groups.items():
                row = existing.get((node_id, bucket))
                if row is None:
                    reports, stats, sketches = added.to_columns()
                    session.add(
                        HealthRollupRow(
                            node_id=node_id,
                            resolution=resolution,
                            bucket=bucket,
                            reports=reports,
                            stats=stats,
                            sketches=sketches,
                        )
                    )
                    continue
                merged = Rollup.from_columns(row.reports, row.stats, row.sketches)
                merged.merge(added)
                row.reports, row.stats, row.sketches = merged.to_columns()
        session.flush()

    def _keep_latest(
        self,
        session: Session,
        points: Sequence[tuple[str, str, datetime, HealthPoint]],
        now: datetime,
    ) -> dict[str, datetime]:
        """Keep each node's newest report; return the time of the one it had before.

        A kept report dated more than `_CLOCK_AHEAD` after `now` gives way to a report
        of a plausible time (a node clock set wrong, then corrected): otherwise it would
        hold the node's latest values and its alerts until real time caught up with it.
        """
        trusted_until = now + _CLOCK_AHEAD
        newest: dict[str, tuple[str, HealthPoint]] = {}
        for node_id, record_id, _, point in points:
            held = newest.get(node_id)
            if held is None or point.at >= held[1].at:
                newest[node_id] = (record_id, point)
        rows = {
            row.node_id: row
            for row in session.scalars(
                select(HealthLatestRow).where(HealthLatestRow.node_id.in_(sorted(newest)))
            )
        }
        # The stored newest is set aside only for a report of a plausible time: a node
        # whose clock runs steadily ahead keeps its own order (and late resends stay out).
        corrected = {
            node_id
            for node_id, row in rows.items()
            if row.at > trusted_until and newest[node_id][1].at <= trusted_until
        }
        before = {node_id: row.at for node_id, row in rows.items() if node_id not in corrected}
        for node_id, (record_id, point) in newest.items():
            row = rows.get(node_id)
            if row is None:
                session.add(
                    HealthLatestRow(
                        node_id=node_id,
                        record_id=record_id,
                        at=point.at,
                        schema=point.schema[:64],
                        metrics=point.metrics,
                        latency=percentiles_only(point.latency),
                        shadow=point.shadow,
                        model_runtime=point.model_runtime,
                    )
                )
            elif point.at >= row.at or node_id in corrected:
                row.record_id, row.at, row.schema = record_id, point.at, point.schema[:64]
                row.metrics, row.latency = point.metrics, percentiles_only(point.latency)
                row.shadow = point.shadow
                row.model_runtime = point.model_runtime
        session.flush()
        return before

    # ----------------------------------------------------------------- alerts

    def _report_alerts(
        self,
        session: Session,
        points: Sequence[tuple[str, str, datetime, HealthPoint]],
        now: datetime,
    ) -> None:
        nodes = sorted({node_id for node_id, _, _, _ in points})
        latest = _live_alerts(session, nodes)
        ordered = sorted(points, key=lambda p: (p[0], p[3].at))
        for node_id, _, _, point in ordered:
            for kind, condition in conditions(point.metrics, self.config.thresholds).items():
                self._apply(session, latest, node_id, kind, condition, point.at)
        session.flush()

    def sync_offline_alerts(self, now: datetime | None = None) -> None:
        """Raise ``node_offline`` for nodes the inventory marked offline; clear it when
        they come back. Runs under the cursor's lock like the report alerts."""
        now = now or self._clock.now()
        self._ensure_cursor()
        with write_session(self._sessions) as session:
            cursor = locked_cursor(session)
            if cursor is None:
                return
            nodes = session.execute(
                select(
                    NodeRow.id,
                    NodeRow.online,
                    NodeRow.last_seen,
                    NodeRow.revoked_at,
                    NodeRow.reported_state,
                )
            ).all()
            latest = _live_alerts(session, None, kind="node_offline")
            refused = _live_alerts(session, None, kind="assignment_refused")
            for node_id, online, last_seen, revoked_at, reported in nodes:
                condition = offline_condition(
                    online=online, ever_seen=last_seen is not None, revoked=revoked_at is not None
                )
                if condition is not None and condition.active:
                    condition = Condition(True, {"online": False, "last_seen": _iso(last_seen)})
                self._apply(session, latest, node_id, "node_offline", condition, now)
                # The director cannot reach the node (ADR 0045): from its update status.
                update = reported.get(_UPDATE_STATE) if isinstance(reported, dict) else None
                revoked = revoked_at is not None
                assignment = Condition(False, {}) if revoked else assignment_condition(update)
                self._apply(session, refused, node_id, "assignment_refused", assignment, now)
            session.commit()

    def _apply(
        self,
        session: Session,
        latest: dict[tuple[str, str], HealthAlertRow],
        node_id: str,
        kind: str,
        condition: Condition | None,
        at: datetime,
    ) -> None:
        row = latest.get((node_id, kind))
        state = (
            None
            if row is None
            else AlertState(
                open=row.cleared_at is None,
                cleared_by_operator=row.cleared_by is not None
                and row.cleared_by != CONDITION_ENDED,
                ended=row.ended_at is not None,
            )
        )
        step = next_step(state, condition)
        if step == "raise":
            assert condition is not None
            new = HealthAlertRow(
                node_id=node_id, kind=kind, since=at, updated_at=at, details=condition.details
            )
            session.add(new)
            latest[(node_id, kind)] = new
            log.info("alert raised", extra={"node_id": node_id, "kind": kind})
        elif step == "update" and row is not None and condition is not None:
            if row.details != condition.details:
                row.details = condition.details
            row.updated_at = max(row.updated_at, at)
        elif step == "clear" and row is not None:
            row.cleared_at = max(at, row.since)
            row.cleared_by = CONDITION_ENDED
            row.ended_at = row.cleared_at
            log.info("alert cleared", extra={"node_id": node_id, "kind": kind})
        elif step == "mark-ended" and row is not None:
            row.ended_at = max(at, row.since)


def _without_stored(
    session: Session, points: list[tuple[str, str, datetime, HealthPoint]]
) -> list[tuple[str, str, datetime, HealthPoint]]:
    """The points not stored yet (a record is folded into roll-ups exactly once)."""
    if not points:
        return []
    nodes = sorted({p[0] for p in points})
    ids = sorted({p[1] for p in points})
    stored = set(
        session.execute(
            select(HealthPointRow.node_id, HealthPointRow.record_id).where(
                HealthPointRow.node_id.in_(nodes), HealthPointRow.record_id.in_(ids)
            )
        ).all()
    )
    seen: set[tuple[str, str]] = set()
    fresh = []
    for point in points:
        key = (point[0], point[1])
        if key not in stored and key not in seen:
            seen.add(key)
            fresh.append(point)
    return fresh


def _live_alerts(
    session: Session, nodes: Sequence[str] | None, kind: str | None = None
) -> dict[tuple[str, str], HealthAlertRow]:
    """The newest alert per (node, kind) that can still change: open, or operator-cleared
    while its condition has not ended. Anything else behaves like no alert at all."""
    query = (
        select(HealthAlertRow)
        .where(or_(HealthAlertRow.cleared_at.is_(None), HealthAlertRow.ended_at.is_(None)))
        .order_by(HealthAlertRow.id)
    )
    if nodes is not None:
        query = query.where(HealthAlertRow.node_id.in_(list(nodes)))
    if kind is not None:
        query = query.where(HealthAlertRow.kind == kind)
    return {(row.node_id, row.kind): row for row in session.scalars(query)}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
