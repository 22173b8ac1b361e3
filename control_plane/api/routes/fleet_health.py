"""Fleet health for the dashboard and the CLI: health at a glance, a node's series, alerts.

Reads need any valid token (viewer and up); clearing an alert needs operator.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.deps import (
    AlertClearingDep,
    ContextDep,
    HealthQueriesDep,
    NodeInventoryDep,
    PrincipalDep,
)
from control_plane.api.params import RowId
from control_plane.durations import parse_duration
from control_plane.errors import InvalidInputError
from control_plane.health.queries import Alert
from control_plane.identity.bootstrap import parse_selector

_MAX_ID_LIST = 1000

router = APIRouter(prefix="/v1", tags=["health"])

# The numbers `nodes list` shows, taken from each node's latest report.
GLANCE_METRICS = (
    "p99_ms",
    "drift_p99_ratio",
    "rss_bytes",
    "rss_slope_mb_per_h",
    "headroom_ratio",
    "leak_suspected",
    "cpu_process_percent",
    "frames_per_s",
    "outbox_fill_ratio",
    "throttled",
)


class NodeHealthOut(BaseModel):
    id: str
    fleet: str
    online: bool
    revoked: bool
    last_seen: datetime | None
    health_at: datetime | None = Field(description="window end of the latest processed report")
    schema_: str | None = Field(alias="schema", serialization_alias="schema")
    status: str = Field(description="ok | alert | offline | revoked | no-data")
    alerts: list[str]
    metrics: dict[str, float | None]
    latency: dict[str, Any] = Field(description="latest percentiles per model version")


class SeriesOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    node_id: str
    resolution: str
    since: datetime
    until: datetime
    truncated: bool
    points: list[dict[str, Any]]


class AlertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    node_id: str
    kind: str
    since: datetime
    updated_at: datetime
    cleared_at: datetime | None
    cleared_by: str | None
    open: bool
    details: dict[str, Any]


def _alert_out(alert: Alert) -> AlertOut:
    return AlertOut.model_validate(alert)


@router.get("/health/nodes")
def fleet_health(
    _: PrincipalDep,
    inventory: NodeInventoryDep,
    health: HealthQueriesDep,
    selector: str | None = None,
    fleet: str | None = None,
) -> list[NodeHealthOut]:
    """Every node's health at a glance: its latest report's key numbers and open alerts."""
    parsed = parse_selector(selector) if selector else None
    nodes = inventory.list_nodes(parsed, fleet)
    # The whole fleet, or more nodes than an IN list should hold (slow; SQLite and
    # PostgreSQL cap its size): read every node's row and keep the selected ones below.
    ids = None if parsed is None and fleet is None else [n.id for n in nodes]
    if ids is not None and len(ids) > _MAX_ID_LIST:
        ids = None
    latest = health.latest(ids)
    alerts = health.open_alerts(ids)
    out = []
    for node in nodes:
        point = latest.get(node.id)
        kinds = alerts.get(node.id, [])
        if node.revoked:
            status = "revoked"
        elif not node.online and node.last_seen is not None:
            status = "offline"
        elif kinds:
            status = "alert"
        elif point is None:
            status = "no-data"
        else:
            status = "ok"
        out.append(
            NodeHealthOut(
                id=node.id,
                fleet=node.fleet,
                online=node.online,
                revoked=node.revoked,
                last_seen=node.last_seen,
                health_at=None if point is None else point.at,
                schema=None if point is None else point.schema,
                status=status,
                alerts=kinds,
                metrics={
                    name: None if point is None else point.metrics.get(name)
                    for name in GLANCE_METRICS
                },
                latency={} if point is None else point.latency,
            )
        )
    return out


@router.get("/nodes/{node_id}/health")
def node_health(
    node_id: str,
    _: PrincipalDep,
    health: HealthQueriesDep,
    since: str = "6h",
    resolution: str = "auto",
) -> SeriesOut:
    """The node's health series over the last `since` (`90m`, `6h`, `7d`, or seconds):
    raw points up to 6 h, per-minute roll-ups up to 3 days, per-hour beyond (`auto`)."""
    try:
        span = parse_duration(since)
    except ValueError as exc:
        raise InvalidInputError(str(exc), reason="bad-since") from exc
    series = health.series(node_id, span, resolution=resolution)
    return SeriesOut.model_validate(series)


@router.get("/alerts")
def list_alerts(
    _: PrincipalDep,
    health: HealthQueriesDep,
    node: str | None = None,
    kind: str | None = None,
    include_cleared: bool = False,
    limit: int = 200,
) -> list[AlertOut]:
    """Alerts, newest first: open ones only unless `include_cleared`."""
    alerts = health.list_alerts(
        node_id=node, kind=kind, include_cleared=include_cleared, limit=limit
    )
    return [_alert_out(a) for a in alerts]


@router.post("/alerts/{alert_id}/clear")
def clear_alert(alert_id: RowId, ctx: ContextDep, alerts: AlertClearingDep) -> AlertOut:
    """Clear an alert by hand (operator, audited). It stays quiet until its condition
    ends; the condition coming back afterwards raises a new alert."""
    return _alert_out(alerts.clear_alert(ctx, alert_id))
