"""The event store over REST: a fleet's events, newest first or in arrival order, by pages.

`GET /v1/fleets/{fleet}/events` (any valid token, like the other reads): filters `node`,
`type`, `since`/`until` (a duration back from now, or an ISO 8601 time), `limit`, and a
keyset `cursor` from the previous page. `order=arrival` is what `edgefleet events tail`
polls: its `next_cursor` is always set, and a later call with it returns what arrived
since.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from control_plane.api.deps import ClockDep, EventStoreDep, PrincipalDep
from control_plane.events.query import DEFAULT_LIMIT, EventQuery
from control_plane.events.store import StoredEvent

router = APIRouter(prefix="/v1", tags=["events"])


class EventOut(BaseModel):
    event_id: str
    fleet: str
    node: str
    type: str
    rule_id: str
    occurred_at: datetime
    received_at: datetime
    record_id: str
    entities: list[dict[str, Any]]
    evidence: list[dict[str, Any]]
    provenance: list[dict[str, Any]]
    attributes: dict[str, str]
    values: dict[str, float]


class EventPageOut(BaseModel):
    events: list[EventOut]
    next_cursor: str | None


def _out(event: StoredEvent) -> EventOut:
    doc = event.document
    return EventOut(
        event_id=event.event_id,
        fleet=event.fleet,
        node=event.node_id,
        type=event.type,
        rule_id=event.rule_id,
        occurred_at=event.occurred_at,
        received_at=event.received_at,
        record_id=event.record_id,
        entities=list(doc.get("entities", [])),
        evidence=list(doc.get("evidence", [])),
        provenance=list(doc.get("provenance", [])),
        attributes=dict(doc.get("attributes", {})),
        values=dict(doc.get("values", {})),
    )


@router.get("/fleets/{fleet}/events")
def list_events(
    fleet: str,
    _: PrincipalDep,
    events: EventStoreDep,
    clock: ClockDep,
    node: str | None = None,
    type: str | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: Annotated[int, Query(description="1..1000")] = DEFAULT_LIMIT,
    cursor: str | None = None,
    order: Annotated[str, Query(description="newest (by event time) or arrival")] = "newest",
) -> EventPageOut:
    """A page of the fleet's events and the cursor of the next one (null: no more)."""
    query = EventQuery.parse(
        fleet,
        now=clock.now(),
        order=order,
        node=node,
        type=type,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
    )
    page = events.page(query)
    return EventPageOut(events=[_out(e) for e in page.events], next_cursor=page.next_cursor)
