"""The health store: turns stored health records into time series and alerts, and reads them.

What it is for: ``process_pending`` walks ``node_records`` (kind "health") behind a durable
cursor and, per batch and in one transaction, stores each report as a raw point, folds it
into its node's minute and hour roll-ups, keeps the node's latest point, raises and clears
alerts, and moves the cursor (ADR 0018). ``apply_retention`` deletes what is older than the
configured retention. Reads (``latest``, ``series``, ``alerts``) serve the REST API, the CLI
and ``/metrics``. Not for policy: the rules live in ``control_plane.health.alerts`` and the
roll-up math in ``control_plane.health.rollup``.

Several replicas may run the processor: the cursor row is locked for the whole batch
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so each record
is processed once, and a record already stored as a raw point is never folded again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext, record_audit
from control_plane.clock import Clock
from control_plane.errors import (
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
)
from control_plane.health.alerts import (
    ALERT_KINDS,
    AlertState,
    Condition,
    conditions,
    next_step,
    offline_condition,
)
from control_plane.health.config import HealthConfig
from control_plane.health.report import HealthPoint, MalformedReportError, parse_report
from control_plane.health.rollup import (
    RESOLUTIONS,
    Resolution,
    Rollup,
    bucket_length,
    bucket_start,
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

__all__ = ["Alert", "BatchResult", "HealthStore", "LatestHealth", "Series"]

log = logging.getLogger(__name__)

CURSOR_NAME: Final = "health"
SERIES_RESOLUTIONS: Final = ("auto", "raw", "minute", "hour")
# `auto` picks raw up to this span, minute up to the next, hour beyond.
RAW_SPAN: Final = timedelta(hours=6)
MINUTE_SPAN: Final = timedelta(days=3)
MAX_LISTED_ALERTS: Final = 1000
CONDITION_ENDED: Final = "condition-ended"
# How far ahead of the control plane's clock a report may be dated and still count as a
# node's newest (clocks drift; one set years ahead is wrong).
_CLOCK_AHEAD: Final = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class BatchResult:
    processed: int
    malformed: int
    duplicates: int
    more: bool


@dataclass(frozen=True, slots=True)
class LatestHealth:
    node_id: str
    at: datetime
    schema: str
    metrics: dict[str, float]
    latency: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Series:
    node_id: str
    resolution: str
    since: datetime
    until: datetime
    points: list[dict[str, Any]]
    truncated: bool


@dataclass(frozen=True, slots=True)
class Alert:
    id: int
    node_id: str
    kind: str
    since: datetime
    updated_at: datetime
    cleared_at: datetime | None
    cleared_by: str | None
    details: dict[str, Any]

    @property
    def open(self) -> bool:
        return self.cleared_at is None


class HealthStore:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, config: HealthConfig | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.config = config or HealthConfig()
        self._lock = threading.Lock()
        # This process's counters (the durable totals are on the cursor row).
        self.processed = 0
        self.malformed: Counter[str] = Counter()
        self.passes = 0
        self.failed_passes = 0

    # ------------------------------------------------------------- processing

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
            self._retention_if_due(now)
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
            position = _position(session.get(HealthCursorRow, CURSOR_NAME))
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
                query = query.where(_after(*position))
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

        with self._write_session() as session:
            cursor = _locked_cursor(session)
            if cursor is None:
                return BatchResult(0, 0, 0, more=False)  # another replica holds it
            if _position(cursor) != position:
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
        with self._write_session() as session:
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
                        latency=_percentiles_only(point.latency),
                    )
                )
            elif point.at >= row.at or node_id in corrected:
                row.record_id, row.at, row.schema = record_id, point.at, point.schema[:64]
                row.metrics, row.latency = point.metrics, _percentiles_only(point.latency)
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
        with self._write_session() as session:
            cursor = _locked_cursor(session)
            if cursor is None:
                return
            nodes = session.execute(
                select(NodeRow.id, NodeRow.online, NodeRow.last_seen, NodeRow.revoked_at)
            ).all()
            latest = _live_alerts(session, None, kind="node_offline")
            for node_id, online, last_seen, revoked_at in nodes:
                condition = offline_condition(
                    online=online, ever_seen=last_seen is not None, revoked=revoked_at is not None
                )
                if condition is not None and condition.active:
                    condition = Condition(True, {"online": False, "last_seen": _iso(last_seen)})
                self._apply(session, latest, node_id, "node_offline", condition, now)
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

    def list_alerts(
        self,
        *,
        node_id: str | None = None,
        kind: str | None = None,
        include_cleared: bool = False,
        limit: int = 200,
    ) -> list[Alert]:
        if kind is not None and kind not in ALERT_KINDS:
            raise InvalidInputError(
                f"unknown alert kind {kind!r}", reason="bad-kind", kinds=list(ALERT_KINDS)
            )
        if not 1 <= limit <= MAX_LISTED_ALERTS:
            raise InvalidInputError(f"limit must be in 1..{MAX_LISTED_ALERTS}", reason="bad-limit")
        query = select(HealthAlertRow).order_by(HealthAlertRow.id.desc()).limit(limit)
        if node_id is not None:
            query = query.where(HealthAlertRow.node_id == node_id)
        if kind is not None:
            query = query.where(HealthAlertRow.kind == kind)
        if not include_cleared:
            query = query.where(HealthAlertRow.cleared_at.is_(None))
        with self._sessions() as session:
            return [_alert(row) for row in session.scalars(query)]

    def clear_alert(self, ctx: RequestContext, alert_id: int) -> Alert:
        """An operator clears an alert (audited, refusals too); it stays silent until its
        condition ends."""
        try:
            return self._clear_alert(ctx, alert_id)
        except EdgefleetError as exc:
            AuditedMutations(self._sessions, self._clock).record_refusal(
                ctx, "alert.clear", f"alert:{alert_id}", exc
            )
            raise

    def _clear_alert(self, ctx: RequestContext, alert_id: int) -> Alert:
        ctx.principal.require(Role.OPERATOR, "alert.clear")
        now = self._clock.now()
        with self._write_session() as session:
            row = session.get(HealthAlertRow, alert_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no alert {alert_id}", alert_id=alert_id)
            if row.cleared_at is not None:
                raise ConflictError(
                    f"alert {alert_id} was already cleared",
                    alert_id=alert_id,
                    cleared_by=row.cleared_by,
                )
            row.cleared_at = max(now, row.since)
            row.cleared_by = f"operator:{ctx.principal.name}"[:160]
            record_audit(
                session,
                ctx,
                at=now,
                action="alert.clear",
                target=f"alert:{alert_id}",
                details={"node_id": row.node_id, "kind": row.kind},
            )
            session.commit()
            return _alert(row)

    def open_alerts(self, node_ids: Sequence[str] | None = None) -> dict[str, list[str]]:
        """Open alert kinds per node."""
        query = select(HealthAlertRow.node_id, HealthAlertRow.kind).where(
            HealthAlertRow.cleared_at.is_(None)
        )
        if node_ids is not None:
            query = query.where(HealthAlertRow.node_id.in_(list(node_ids)))
        found: dict[str, list[str]] = defaultdict(list)
        with self._sessions() as session:
            for node_id, kind in session.execute(query.order_by(HealthAlertRow.kind)):
                found[node_id].append(kind)
        return dict(found)

    # -------------------------------------------------------------- retention

    def apply_retention(self, now: datetime | None = None) -> dict[str, int]:
        """Delete raw points, roll-ups and cleared alerts past their retention."""
        now = now or self._clock.now()
        config = self.config
        raw_cutoff = now - config.raw_retention
        deleted: dict[str, int] = {}
        with self._write_session() as session:
            # A point received recently stays, however old its window: it is what makes
            # reprocessing a record a no-op (see _without_stored).
            deleted["raw"] = _rowcount(
                session.execute(
                    delete(HealthPointRow).where(
                        HealthPointRow.at < raw_cutoff, HealthPointRow.received_at < raw_cutoff
                    )
                )
            )
            kept: tuple[tuple[Resolution, timedelta], ...] = (
                ("minute", config.minute_retention),
                ("hour", config.hour_retention),
            )
            for resolution, keep in kept:
                cutoff = bucket_start(now - keep, resolution)
                deleted[resolution] = _rowcount(
                    session.execute(
                        delete(HealthRollupRow).where(
                            HealthRollupRow.resolution == resolution,
                            HealthRollupRow.bucket < cutoff,
                        )
                    )
                )
            deleted["alerts"] = _rowcount(
                session.execute(
                    delete(HealthAlertRow).where(
                        HealthAlertRow.cleared_at < now - config.hour_retention,
                        HealthAlertRow.ended_at.is_not(None),
                    )
                )
            )
            session.commit()
        if any(deleted.values()):
            log.info("health retention", extra={"deleted": deleted})
        return deleted

    def _retention_if_due(self, now: datetime) -> None:
        with self._write_session() as session:
            cursor = session.get(HealthCursorRow, CURSOR_NAME)
            if cursor is None or (
                cursor.retention_at is not None
                and now - cursor.retention_at < self.config.retention_every
            ):
                return
            cursor.retention_at = now
            session.commit()
        self.apply_retention(now)

    # ------------------------------------------------------------------ reads

    def latest(self, node_ids: Sequence[str] | None = None) -> dict[str, LatestHealth]:
        query = select(HealthLatestRow)
        if node_ids is not None:
            query = query.where(HealthLatestRow.node_id.in_(list(node_ids)))
        with self._sessions() as session:
            return {
                row.node_id: LatestHealth(
                    node_id=row.node_id,
                    at=row.at,
                    schema=row.schema,
                    metrics=dict(row.metrics),
                    latency=dict(row.latency),
                )
                for row in session.scalars(query)
            }

    def series(
        self,
        node_id: str,
        since: timedelta,
        *,
        resolution: str = "auto",
        now: datetime | None = None,
    ) -> Series:
        """The node's points over the last ``since``, oldest first, at the resolution
        asked or (``auto``) the finest one kept that fits the span."""
        if resolution not in SERIES_RESOLUTIONS:
            raise InvalidInputError(
                f"resolution must be one of {', '.join(SERIES_RESOLUTIONS)}",
                reason="bad-resolution",
            )
        if since <= timedelta(0):
            raise InvalidInputError("since must be a positive duration", reason="bad-since")
        now = now or self._clock.now()
        start = now - since
        if resolution == "auto":
            if since <= min(RAW_SPAN, self.config.raw_retention):
                resolution = "raw"
            elif since <= min(MINUTE_SPAN, self.config.minute_retention):
                resolution = "minute"
            else:
                resolution = "hour"
        cap = self.config.max_series_points
        with self._sessions() as session:
            if session.get(NodeRow, node_id) is None:
                raise NotFoundError(f"no node {node_id!r}", node_id=node_id)
            if resolution == "raw":
                rows = session.scalars(
                    select(HealthPointRow)
                    .where(HealthPointRow.node_id == node_id, HealthPointRow.at >= start)
                    .order_by(HealthPointRow.at.desc())
                    .limit(cap + 1)
                ).all()
                points = [_raw_point(row) for row in rows[:cap]]
                truncated = len(rows) > cap
            else:
                level: Resolution = "minute" if resolution == "minute" else "hour"
                first = bucket_start(start, level)
                roll = session.scalars(
                    select(HealthRollupRow)
                    .where(
                        HealthRollupRow.node_id == node_id,
                        HealthRollupRow.resolution == level,
                        HealthRollupRow.bucket >= first,
                    )
                    .order_by(HealthRollupRow.bucket.desc())
                    .limit(cap + 1)
                ).all()
                points = [_rollup_point(row, level) for row in roll[:cap]]
                truncated = len(roll) > cap
        points.reverse()
        return Series(
            node_id=node_id,
            resolution=resolution,
            since=start,
            until=now,
            points=points,
            truncated=truncated,
        )

    # ---------------------------------------------------------------- metrics

    def fleet_snapshot(self, now: datetime | None = None) -> dict[str, Any]:
        """Fleet-level numbers for ``/metrics``: no per-node detail."""
        now = now or self._clock.now()
        with self._sessions() as session:
            states: Counter[str] = Counter()
            for online, revoked_at, count in session.execute(
                select(NodeRow.online, NodeRow.revoked_at.is_not(None), func.count()).group_by(
                    NodeRow.online, NodeRow.revoked_at.is_not(None)
                )
            ):
                state = "revoked" if revoked_at else "online" if online else "offline"
                states[state] += count
            alerts = dict(
                session.execute(
                    select(HealthAlertRow.kind, func.count())
                    .where(HealthAlertRow.cleared_at.is_(None))
                    .group_by(HealthAlertRow.kind)
                ).all()
            )
            records = dict(
                session.execute(
                    select(NodeRecordRow.kind, func.count()).group_by(NodeRecordRow.kind)
                ).all()
            )
            cursor = session.get(HealthCursorRow, CURSOR_NAME)
            pending = select(func.min(NodeRecordRow.received_at)).where(
                NodeRecordRow.kind == "health"
            )
            position = _position(cursor)
            if position is not None:
                pending = pending.where(_after(*position))
            oldest = session.scalar(pending)
        return {
            "nodes": {state: states.get(state, 0) for state in ("online", "offline", "revoked")},
            "alerts": {kind: int(alerts.get(kind, 0)) for kind in ALERT_KINDS},
            "records": {kind: int(records.get(kind, 0)) for kind in ("event", "health")},
            "processed": 0 if cursor is None else cursor.processed,
            "malformed": 0 if cursor is None else cursor.malformed,
            "lag_s": 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        }

    # ---------------------------------------------------------------- helpers

    @contextmanager
    def _write_session(self) -> Iterator[Session]:
        with self._sessions() as session:
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            yield session


def _locked_cursor(session: Session) -> HealthCursorRow | None:
    """The cursor row, locked for this transaction; None while another replica holds it."""
    return session.scalars(
        select(HealthCursorRow)
        .where(HealthCursorRow.name == CURSOR_NAME)
        .with_for_update(skip_locked=True)
    ).first()


def _position(cursor: HealthCursorRow | None) -> tuple[datetime, str, str] | None:
    if cursor is None or cursor.received_at is None:
        return None
    return cursor.received_at, cursor.node_id, cursor.record_id


def _after(received_at: datetime, node_id: str, record_id: str) -> Any:
    """Records strictly after a cursor position in (received_at, node_id, record_id) order."""
    return or_(
        NodeRecordRow.received_at > received_at,
        and_(
            NodeRecordRow.received_at == received_at,
            or_(
                NodeRecordRow.node_id > node_id,
                and_(NodeRecordRow.node_id == node_id, NodeRecordRow.record_id > record_id),
            ),
        ),
    )


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


def _percentiles_only(latency: dict[str, Any]) -> dict[str, Any]:
    return {
        model: {
            kind: {k: v for k, v in values.items() if k != "sketch_ms"}
            for kind, values in kinds.items()
        }
        for model, kinds in latency.items()
    }


def _raw_point(row: HealthPointRow) -> dict[str, Any]:
    return {
        "at": row.at.isoformat(),
        "reports": 1,
        "metrics": dict(row.metrics),
        "latency": _percentiles_only(row.latency),
    }


def _rollup_point(row: HealthRollupRow, resolution: Resolution) -> dict[str, Any]:
    summary = Rollup.from_columns(row.reports, row.stats, row.sketches).summary()
    for stat in summary["metrics"].values():
        stat["sum"] = round(stat["mean"] * stat["count"], 6)
    return {
        "at": row.bucket.isoformat(),
        "until": (row.bucket + bucket_length(resolution)).isoformat(),
        **summary,
    }


def _alert(row: HealthAlertRow) -> Alert:
    return Alert(
        id=row.id,
        node_id=row.node_id,
        kind=row.kind,
        since=row.since,
        updated_at=row.updated_at,
        cleared_at=row.cleared_at,
        cleared_by=row.cleared_by,
        details=dict(row.details),
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _rowcount(result: Any) -> int:
    count = getattr(result, "rowcount", 0)
    return int(count) if count and count > 0 else 0
