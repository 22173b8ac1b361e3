"""Stores node outbox records at most once, so resends after reconnects are harmless.

Both transports call `RecordIngest.store` and ack exactly the ids it returns, after it
returned: the insert has committed by then. Duplicates are part of the contract
(`ON CONFLICT DO NOTHING` on (node, record id)) and are acked again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Insert, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import InvalidInputError, PayloadTooLargeError
from control_plane.storage.models import NodeRecordRow

RECORD_KINDS = frozenset({"event", "health"})
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]{1,32}/[A-Za-z0-9!#$&^_.+-]{1,31}$")


@dataclass(frozen=True, slots=True)
class IncomingRecord:
    id: str
    seq: int
    kind: str
    created_at: datetime
    content_type: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class IngestLimits:
    max_records: int = 1000
    max_payload_bytes: int = 256 * 1024


def validate_batch(records: Sequence[IncomingRecord], limits: IngestLimits) -> None:
    """Refuse a malformed batch whole, naming the first bad record (pure)."""
    if len(records) > limits.max_records:
        raise PayloadTooLargeError(
            f"a batch carries at most {limits.max_records} records, got {len(records)}",
            limit=limits.max_records,
        )
    for index, record in enumerate(records):
        where = f"record {index} ({record.id!r})"
        if not _UUID.match(record.id):
            raise InvalidInputError(f"{where}: id is not a lowercase UUID", index=index)
        if record.kind not in RECORD_KINDS:
            raise InvalidInputError(f"{where}: unknown kind {record.kind!r}", index=index)
        if record.seq < 1:
            raise InvalidInputError(f"{where}: seq must be >= 1", index=index)
        if record.created_at.tzinfo is None:
            raise InvalidInputError(f"{where}: created_at has no time zone", index=index)
        if not _CONTENT_TYPE.match(record.content_type):
            raise InvalidInputError(f"{where}: bad content type", index=index)
        if len(record.payload) > limits.max_payload_bytes:
            raise PayloadTooLargeError(
                f"{where}: payload of {len(record.payload)} bytes is over "
                f"{limits.max_payload_bytes}",
                index=index,
                limit=limits.max_payload_bytes,
            )


class RecordIngest:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, limits: IngestLimits | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.limits = limits or IngestLimits()

    def store(self, node_id: str, records: Sequence[IncomingRecord]) -> list[str]:
        """Insert what is new, ignore what is already stored; return the ids to ack."""
        validate_batch(records, self.limits)
        if not records:
            return []
        received_at = self._clock.now()
        rows = [
            {
                "node_id": node_id,
                "record_id": r.id,
                "seq": r.seq,
                "kind": r.kind,
                "created_at": r.created_at,
                "received_at": received_at,
                "content_type": r.content_type,
                "payload": r.payload,
            }
            for r in records
        ]
        with self._sessions() as session:
            statement = _insert_ignoring_duplicates(session)
            session.execute(statement, rows)
            session.commit()
        return [r.id for r in records]

    def count(self, node_id: str, kind: str | None = None) -> int:
        query = (
            select(func.count()).select_from(NodeRecordRow).where(NodeRecordRow.node_id == node_id)
        )
        if kind is not None:
            query = query.where(NodeRecordRow.kind == kind)
        with self._sessions() as session:
            return int(session.scalar(query) or 0)

    def record_ids(self, node_id: str) -> set[str]:
        with self._sessions() as session:
            return set(
                session.scalars(
                    select(NodeRecordRow.record_id).where(NodeRecordRow.node_id == node_id)
                )
            )


def _insert_ignoring_duplicates(session: Session) -> Insert:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql_insert(NodeRecordRow).on_conflict_do_nothing(
            index_elements=["node_id", "record_id"]
        )
    if dialect == "sqlite":
        return sqlite_insert(NodeRecordRow).on_conflict_do_nothing(
            index_elements=["node_id", "record_id"]
        )
    raise InvalidInputError(f"record ingestion does not support the {dialect} dialect")
