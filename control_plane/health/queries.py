"""Health reads for the REST API, the CLI and ``/metrics``: latest points, series, alerts.

Not for writing: the processor (``control_plane.health.processor``) makes what is read
here, an operator clears alerts through ``control_plane.health.clearing``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import InvalidInputError, NotFoundError
from control_plane.health.alerts import ALERT_KINDS
from control_plane.health.config import HealthConfig
from control_plane.health.rollup import Resolution, Rollup, bucket_length, bucket_start
from control_plane.health.rows import (
    CURSOR_NAME,
    after_position,
    cursor_position,
    percentiles_only,
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

__all__ = ["Alert", "HealthQueries", "LatestHealth", "Series", "alert_from_row"]

SERIES_RESOLUTIONS: Final = ("auto", "raw", "minute", "hour")
# `auto` picks raw up to this span, minute up to the next, hour beyond.
RAW_SPAN: Final = timedelta(hours=6)
MINUTE_SPAN: Final = timedelta(days=3)
MAX_LISTED_ALERTS: Final = 1000


@dataclass(frozen=True, slots=True)
class LatestHealth:
    node_id: str
    at: datetime
    schema: str
    metrics: dict[str, float]
    latency: dict[str, Any]
    # The report's shadow section (a candidate run beside the served model, ADR 0031),
    # without its sketch; None when the report has none.
    shadow: dict[str, Any] | None = None
    # Where the served model's runtime settings come from (the report's model_runtime
    # section: config, session_overrides, node_preprocess_ignored); None when it has none.
    model_runtime: dict[str, Any] | None = None


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


class HealthQueries:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, config: HealthConfig | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.config = config or HealthConfig()

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
            return [alert_from_row(row) for row in session.scalars(query)]

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

    def latest(self, node_ids: Sequence[str] | None = None) -> dict[str, LatestHealth]:
        # Plain rows, not ORM objects: the rollout controller asks for every node in
        # flight each tick (10,000 once a stage of them is out).
        query = select(
            HealthLatestRow.node_id,
            HealthLatestRow.at,
            HealthLatestRow.schema,
            HealthLatestRow.metrics,
            HealthLatestRow.latency,
            HealthLatestRow.shadow,
            HealthLatestRow.model_runtime,
        )
        if node_ids is not None:
            query = query.where(HealthLatestRow.node_id.in_(list(node_ids)))
        with self._sessions() as session:
            return {
                node_id: LatestHealth(
                    node_id=node_id,
                    at=at,
                    schema=schema,
                    metrics=dict(metrics),
                    latency=dict(latency),
                    shadow=None if shadow is None else dict(shadow),
                    model_runtime=None if runtime is None else dict(runtime),
                )
                for node_id, at, schema, metrics, latency, shadow, runtime in session.execute(query)
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
            position = cursor_position(cursor)
            if position is not None:
                pending = pending.where(after_position(*position))
            oldest = session.scalar(pending)
        return {
            "nodes": {state: states.get(state, 0) for state in ("online", "offline", "revoked")},
            "alerts": {kind: int(alerts.get(kind, 0)) for kind in ALERT_KINDS},
            "records": {kind: int(records.get(kind, 0)) for kind in ("event", "health")},
            "processed": 0 if cursor is None else cursor.processed,
            "malformed": 0 if cursor is None else cursor.malformed,
            "lag_s": 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        }


def _raw_point(row: HealthPointRow) -> dict[str, Any]:
    return {
        "at": row.at.isoformat(),
        "reports": 1,
        "metrics": dict(row.metrics),
        "latency": percentiles_only(row.latency),
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


def alert_from_row(row: HealthAlertRow) -> Alert:
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
