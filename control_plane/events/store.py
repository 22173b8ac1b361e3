"""The event store over SQLAlchemy: pages of a fleet's events, retention, and the insert
the record ingest runs inside its group commit.

Not for policy: what a query may ask, its cursors and the retention span are ``query``'s;
reading a record's payload is ``wire``'s. Inserts are ON CONFLICT DO NOTHING on (fleet,
event id), so a resent record, or an event raised again from replayed input, is stored
once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Insert, and_, delete, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import InvalidInputError
from control_plane.events.query import EventQuery, EventsConfig, Position, encode_cursor
from control_plane.events.wire import EventFacts
from control_plane.nodes.rows import fleet_row
from control_plane.storage.models import FleetEventRow, NodeRow

__all__ = ["EventPage", "EventStore", "StoredEvent", "insert_events"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    fleet: str
    node_id: str
    event_id: str
    type: str
    rule_id: str
    occurred_at: datetime
    received_at: datetime
    record_id: str
    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EventPage:
    """A page and where the next one starts: for ``newest``, None once the last page is
    read; for ``arrival``, always a cursor (poll it again for what arrives later)."""

    events: list[StoredEvent]
    next_cursor: str | None


class EventStore:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, config: EventsConfig | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.config = config or EventsConfig()

    def page(self, query: EventQuery, now: datetime | None = None) -> EventPage:
        """One page of `query`; NotFoundError for an unknown fleet."""
        now = now or self._clock.now()
        row = FleetEventRow
        arrival = query.order == "arrival"
        at = row.received_at if arrival else row.occurred_at
        with self._sessions() as session:
            fleet_id = fleet_row(session, query.fleet).id
            statement = select(row).where(row.fleet_id == fleet_id)
            if query.node is not None:
                statement = statement.where(row.node_id == query.node)
            if query.type is not None:
                statement = statement.where(row.type == query.type)
            if query.since is not None:
                statement = statement.where(at >= query.since)
            if query.until is not None:
                statement = statement.where(at < query.until)
            after = query.after
            cutoff = now - self.config.settle
            if arrival:
                statement = statement.where(row.received_at <= cutoff)
                if after is not None:
                    statement = statement.where(
                        or_(at > after.at, and_(at == after.at, row.id > after.row_id))
                    )
                statement = statement.order_by(at, row.id)
            else:
                if after is not None:
                    statement = statement.where(
                        or_(at < after.at, and_(at == after.at, row.id < after.row_id))
                    )
                statement = statement.order_by(at.desc(), row.id.desc())
            rows = list(session.scalars(statement.limit(query.limit)))
        events = [_stored(query.fleet, r) for r in rows]
        last = Position(_at(rows[-1], arrival), rows[-1].id) if rows else None
        if not arrival:
            full = last is not None and len(rows) == query.limit
            return EventPage(events, encode_cursor("newest", last) if full and last else None)
        # Arrival: a short page read everything settled, so the next poll may start at
        # the cutoff (never before where this one started or ended).
        candidates = [p for p in (after, last) if p is not None]
        if len(rows) < query.limit:
            candidates.append(Position(cutoff, 0))
        if query.since is not None:  # what arrived before `since` stays out later too
            candidates.append(Position(query.since, 0))
        return EventPage(events, encode_cursor("arrival", max(candidates)))

    def apply_retention(self, now: datetime | None = None) -> int:
        """Delete events older than the retention by event time that were also received
        that long ago (a late event is kept a full retention after it arrived); at most
        `prune_chunk` times `prune_max_chunks` rows a pass. Returns how many went."""
        now = now or self._clock.now()
        cutoff = now - self.config.retention
        row = FleetEventRow
        deleted = 0
        for _ in range(self.config.prune_max_chunks):
            with self._sessions() as session:
                ids = select(row.id).where(row.occurred_at < cutoff, row.received_at < cutoff)
                result = session.execute(
                    delete(row).where(
                        row.id.in_(ids.limit(self.config.prune_chunk).scalar_subquery())
                    )
                )
                session.commit()
            count = int(getattr(result, "rowcount", 0) or 0)
            deleted += count
            if count < self.config.prune_chunk:
                break
        if deleted:
            log.info("deleted %d events past their retention", deleted)
        return deleted


def _at(row: FleetEventRow, arrival: bool) -> datetime:
    return row.received_at if arrival else row.occurred_at


def _stored(fleet: str, row: FleetEventRow) -> StoredEvent:
    return StoredEvent(
        fleet=fleet,
        node_id=row.node_id,
        event_id=row.event_id,
        type=row.type,
        rule_id=row.rule_id,
        occurred_at=row.occurred_at,
        received_at=row.received_at,
        record_id=row.record_id,
        document=dict(row.document),
    )


def insert_events(
    connection: Connection,
    events: Sequence[tuple[str, Sequence[EventFacts]]],
    received_at: datetime,
) -> int:
    """Insert each node's readable events in the caller's transaction; returns how many
    rows were offered. Events of a node that has no row any more are left out (logged):
    there is no fleet to file them under."""
    node_ids = sorted({node_id for node_id, facts in events if facts})
    if not node_ids:
        return 0
    found = connection.execute(select(NodeRow.id, NodeRow.fleet_id).where(NodeRow.id.in_(node_ids)))
    fleets: dict[str, int] = {node_id: fleet_id for node_id, fleet_id in found}
    rows: list[dict[str, Any]] = []
    for node_id, facts in events:
        fleet_id = fleets.get(node_id)
        if fleet_id is None:
            if facts:
                log.warning("%d events of unknown node %r left out", len(facts), node_id)
            continue
        rows.extend(
            {
                "fleet_id": fleet_id,
                "node_id": node_id,
                "event_id": f.event_id,
                "type": f.type,
                "rule_id": f.rule_id,
                "occurred_at": f.occurred_at,
                "received_at": received_at,
                "record_id": f.record_id,
                "seq": f.seq,
                "document": f.document,
            }
            for f in facts
        )
    if not rows:
        return 0
    dialect = connection.dialect.name
    statement: Insert
    if dialect == "postgresql":
        statement = postgresql.insert(FleetEventRow).on_conflict_do_nothing(
            index_elements=["fleet_id", "event_id"]
        )
    elif dialect == "sqlite":
        statement = sqlite.insert(FleetEventRow).on_conflict_do_nothing(
            index_elements=["fleet_id", "event_id"]
        )
    else:
        raise InvalidInputError(f"the event store does not support the {dialect} dialect")
    connection.execute(statement, rows)
    return len(rows)
