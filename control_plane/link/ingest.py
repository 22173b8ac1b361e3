"""Stores node outbox records at most once, so resends after reconnects are harmless.

Both transports hand batches to `RecordIngest.submit`, which returns a future, and ack
exactly the ids it resolves to, once it resolved: the insert has committed by then.
Duplicates are part of the contract (`ON CONFLICT DO NOTHING` on (node, record id)) and
are acked again.

Group commit: `submit` validates the batch at once (a malformed batch is refused alone)
and queues it for one writer thread. The writer takes everything waiting, up to
`IngestLimits.max_group_rows`, and stores it in one statement and one commit, then
resolves every future of the group. Nothing waits on a timer: while one commit is in
flight the next group gathers, so a quiet fleet gets one commit per batch and a busy one
gets few large commits (a transaction per batch was three quarters of the control plane's
CPU per message; see docs/benchmarks.md). A group that fails on a constraint (a node
deleted meanwhile) is retried batch by batch, so one bad batch fails only itself; a
database outage fails the whole group and every transport keeps its batches unacked.

The insert bypasses the ORM: one `INSERT … SELECT FROM unnest(arrays)` on PostgreSQL (a
constant statement, whatever the number of rows) and one `executemany` on SQLite, with
timestamps written in the form `UTCDateTime` reads back.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import InvalidInputError, PayloadTooLargeError, UnavailableError
from control_plane.storage.models import NodeRecordRow

__all__ = [
    "RECORD_KINDS",
    "IncomingRecord",
    "IngestLimits",
    "RecordIngest",
    "validate_batch",
]

log = logging.getLogger(__name__)

RECORD_KINDS = frozenset({"event", "health"})
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]{1,32}/[A-Za-z0-9!#$&^_.+-]{1,31}$")

_POSTGRESQL_INSERT: Final = (
    "INSERT INTO node_records "
    "(node_id, record_id, seq, kind, created_at, received_at, content_type, payload) "
    "SELECT n, r, s, k, c, %s::timestamptz, t, p FROM unnest("
    "%s::varchar[], %s::varchar[], %s::bigint[], %s::varchar[], %s::timestamptz[], "
    "%s::varchar[], %s::bytea[]) AS u(n, r, s, k, c, t, p) "
    "ON CONFLICT (node_id, record_id) DO NOTHING"
)
_SQLITE_INSERT: Final = (
    "INSERT INTO node_records "
    "(node_id, record_id, seq, kind, created_at, received_at, content_type, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (node_id, record_id) DO NOTHING"
)
# How SQLAlchemy's SQLite DateTime stores a (naive UTC) datetime; UTCDateTime reads it.
_SQLITE_DATETIME: Final = "%Y-%m-%d %H:%M:%S.%f"
_STOP_POLL_S: Final = 0.5


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
    # At most this many rows per group commit (a batch is never split across groups).
    max_group_rows: int = 5000
    # Batches waiting for the writer; `submit` refuses more (UnavailableError).
    max_queued_batches: int = 20_000


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


@dataclass(slots=True)
class _Pending:
    node_id: str
    records: Sequence[IncomingRecord]
    future: Future[list[str]]


class RecordIngest:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, limits: IngestLimits | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.limits = limits or IngestLimits()
        self._queue: queue.Queue[_Pending] = queue.Queue(self.limits.max_queued_batches)
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._closed = threading.Event()
        # Plain counters for benchmarks and logs: groups committed and batches in them.
        self.groups = 0
        self.grouped_batches = 0

    # ------------------------------------------------------------------ writes

    def store(self, node_id: str, records: Sequence[IncomingRecord]) -> list[str]:
        """Insert what is new, ignore what is already stored; return the ids to ack.

        One transaction of its own, in the calling thread (tools and tests; the
        transports use `submit`)."""
        validate_batch(records, self.limits)
        if records:
            self._store_group([(node_id, records)])
        return [r.id for r in records]

    def submit(self, node_id: str, records: Sequence[IncomingRecord]) -> Future[list[str]]:
        """Validate now (raises on a malformed batch), store with the next group commit.

        The future resolves to the ids to ack once the group has committed, or to the
        error that kept it from committing. Raises `UnavailableError` when closed or when
        `max_queued_batches` are already waiting.
        """
        validate_batch(records, self.limits)
        future: Future[list[str]] = Future()
        if not records:
            future.set_result([])
            return future
        if self._closed.is_set():
            raise UnavailableError("record ingestion is closed")
        self._ensure_writer()
        try:
            # Never blocks (the gRPC side calls this on its event loop): a full queue is
            # the database falling behind, answered like an outage.
            self._queue.put_nowait(_Pending(node_id, records, future))
        except queue.Full:
            raise UnavailableError(
                f"{self.limits.max_queued_batches} batches are waiting for the database; "
                "retry later",
                reason="ingest-backlog",
            ) from None
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        """Store what was submitted, then stop the writer; later submits are refused."""
        self._closed.set()
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.join(timeout_s)
            if writer.is_alive():
                log.error("the record writer did not stop within %.1fs", timeout_s)
        self._fail_waiting(UnavailableError("record ingestion is closed"))

    # ------------------------------------------------------------------- reads

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

    # ------------------------------------------------------------------ writer

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_loop, name="record-writer", daemon=True
                )
                self._writer.start()

    def _write_loop(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=_STOP_POLL_S)
            except queue.Empty:
                if self._closed.is_set():
                    return
                continue
            # A future whose caller gave up (a cancelled gRPC stream) is dropped: nobody
            # would ack it, and the node resends what is not acked.
            group = [first] if first.future.set_running_or_notify_cancel() else []
            rows = len(first.records)
            while rows < self.limits.max_group_rows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item.future.set_running_or_notify_cancel():
                    group.append(item)
                    rows += len(item.records)
            if group:
                self._commit(group)

    def _commit(self, group: list[_Pending]) -> None:
        try:
            self._store_group([(p.node_id, p.records) for p in group])
        except IntegrityError:
            if len(group) == 1:
                _fail(group[0], group[0].node_id)
                return
            # One batch broke a constraint (its node was deleted meanwhile): find it.
            for pending in group:
                self._commit([pending])
            return
        except Exception as exc:
            for pending in group:
                pending.future.set_exception(exc)
            return
        self.groups += 1
        self.grouped_batches += len(group)
        for pending in group:
            pending.future.set_result([r.id for r in pending.records])

    def _fail_waiting(self, error: Exception) -> None:
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(error)

    def _store_group(self, batches: Sequence[tuple[str, Sequence[IncomingRecord]]]) -> None:
        received_at = self._clock.now()
        with self._sessions() as session:
            _insert(session.connection(), batches, received_at)
            session.commit()


def _fail(pending: _Pending, node_id: str) -> None:
    pending.future.set_exception(
        InvalidInputError(
            f"records of node {node_id!r} cannot be stored (unknown node?)",
            node_id=node_id,
            reason="constraint",
        )
    )


def _insert(
    connection: Connection,
    batches: Sequence[tuple[str, Sequence[IncomingRecord]]],
    received_at: datetime,
) -> None:
    dialect = connection.dialect.name
    if dialect == "postgresql":
        node_ids: list[str] = []
        for node_id, records in batches:
            node_ids.extend([node_id] * len(records))
        every = [r for _, records in batches for r in records]
        connection.exec_driver_sql(
            _POSTGRESQL_INSERT,
            (
                received_at,
                node_ids,
                [r.id for r in every],
                [r.seq for r in every],
                [r.kind for r in every],
                [r.created_at for r in every],
                [r.content_type for r in every],
                [r.payload for r in every],
            ),
        )
    elif dialect == "sqlite":
        received = _sqlite_datetime(received_at)
        rows: list[tuple[Any, ...]] = [
            (
                node_id,
                r.id,
                r.seq,
                r.kind,
                _sqlite_datetime(r.created_at),
                received,
                r.content_type,
                r.payload,
            )
            for node_id, records in batches
            for r in records
        ]
        connection.exec_driver_sql(_SQLITE_INSERT, rows)
    else:
        raise InvalidInputError(f"record ingestion does not support the {dialect} dialect")


def _sqlite_datetime(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).strftime(_SQLITE_DATETIME)
