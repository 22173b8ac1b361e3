"""Stores node outbox records at most once, so resends after reconnects are harmless.

The MQTT bridge hands batches to `RecordIngest.submit` (a concurrent future), the gRPC
streams to a `LoopGroupCommit` (an asyncio future); both ack exactly the ids it resolves
to, once it resolved: the insert has committed by then. Duplicates are part of the
contract (`ON CONFLICT DO NOTHING` on (node, record id)) and are acked again.

Group commit: a batch is validated at once (a malformed batch is refused alone) and
queued. A writer takes everything waiting, up to `IngestLimits.max_group_rows`, stores it
in one transaction, then resolves every future of the group. Nothing waits on a timer:
while one commit is in flight the next group gathers, so a quiet fleet gets one commit
per batch and a busy one few large commits (a transaction per batch was three quarters
of the control plane's CPU per message; see docs/benchmarks.md). Two writers (threads for
`submit`, flushers for the loop) commit at once on their own connections, so one writes
while the other waits for its WAL flush. A group the database refuses (a row breaks a
constraint or a column's range) is retried batch by batch, so one bad batch fails only
itself; a database outage fails the whole group and every transport keeps its batches
unacked.

The insert bypasses the ORM: on PostgreSQL a binary `COPY` straight into the table, and
for a group holding a resend (the COPY fails on the primary key) a `COPY` into a
per-connection staging table plus `INSERT … SELECT … ON CONFLICT DO NOTHING`; on SQLite
one `executemany` of `INSERT … ON CONFLICT DO NOTHING` with timestamps written in the
form `UTCDateTime` reads back.

Records of kind ``results`` (sampled inference results) are not raw history: they go to
``node_results`` in the same transaction (`INSERT … ON CONFLICT DO NOTHING` on (node,
record id), so a resend is stored once), and each node keeps only its newest
`IngestLimits.results_per_node` by sequence, pruned as they are inserted. A results
document that cannot be read is acked and left out (`ValidatedBatch.unreadable`; the
inbox counts and logs it).

Records of kind ``event`` stay in ``node_records`` as sent (the raw history) and, read as
``edgefleet.event/1``, also go to the event store (``fleet_events``, see
``control_plane.events``) in the same transaction, once per (fleet, event id). An event
record that cannot be read is stored raw only (`ValidatedBatch.bad_events`; the inbox
counts and logs it as ``bad-event``).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import Connection, Insert, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.events.store import insert_events
from control_plane.events.wire import EventFacts, UnreadableEvent, split_events
from control_plane.link.records import (
    IncomingRecord,
    IngestLimits,
    ResultRow,
    UnreadableResult,
    split_results,
    validate_batch,
)
from control_plane.storage.copy import BinaryCopy, WriteRow, copy_with, server_version
from control_plane.storage.models import NodeRecordRow, NodeResultRow

__all__ = ["LoopGroupCommit", "Outcome", "RecordIngest", "ValidatedBatch"]

log = logging.getLogger(__name__)

# PostgreSQL: a binary COPY straight into node_records (about 1 µs of Python per row
# against 10 µs for a multi-row INSERT or unnest of arrays, and a round trip less than
# staging). COPY has no ON CONFLICT: when a group holds a record stored already (a
# resend), the COPY fails on the primary key and the group goes again through a
# per-connection staging table and one INSERT … SELECT … ON CONFLICT DO NOTHING.
# The stage keeps rows of up to 4 kB uncompressed (as node_records does since migration
# 0008, ADR 0021): a value compressed in the stage would be moved compressed, whatever
# node_records' own settings say. Larger rows are compressed as node_records' payload
# column says where the server can copy that (PostgreSQL 14+), else by its default.
_POSTGRESQL_STAGE: Final = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS node_records_stage "
    "(LIKE node_records INCLUDING DEFAULTS{compression}) "
    "WITH (toast_tuple_target = 4080) ON COMMIT DELETE ROWS"
)
_COPIES_COMPRESSION: Final = 140000  # server_version from which LIKE copies compression
_RECORDS_COPY: Final = BinaryCopy(
    "node_records",
    (
        "node_id",
        "record_id",
        "seq",
        "kind",
        "created_at",
        "received_at",
        "content_type",
        "payload",
    ),
    ("varchar", "varchar", "int8", "varchar", "timestamptz", "timestamptz", "varchar", "bytea"),
)
_STAGE_COPY: Final = _RECORDS_COPY.into("node_records_stage")
_POSTGRESQL_MOVE: Final = (
    "INSERT INTO node_records "
    "(node_id, record_id, seq, kind, created_at, received_at, content_type, payload) "
    "SELECT node_id, record_id, seq, kind, created_at, received_at, content_type, payload "
    "FROM node_records_stage ON CONFLICT (node_id, record_id) DO NOTHING"
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
# A group may not wait on locks or run for long: a record is stamped received_at before
# its group commits, and the health store reads behind a settle window (10 s) on that
# stamp; a group that cannot commit in time fails, and its batches are sent again.
_POSTGRESQL_TIMEOUTS: Final = "SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '4s'"
# Set in a pooled connection's info once its temporary staging table has committed.
_STAGE_READY: Final = "edgefleet.node_records_stage"
_UNIQUE_VIOLATION: Final = "23505"
# Keep a node's newest results: delete those below the K-th highest sequence (none when
# the node has fewer than K; the subquery is then NULL).
_PRUNE_RESULTS: Final = text(
    "DELETE FROM node_results WHERE node_id = :node_id AND seq < ("
    "SELECT seq FROM node_results WHERE node_id = :node_id "
    "ORDER BY seq DESC LIMIT 1 OFFSET :offset)"
)


@dataclass(frozen=True, slots=True)
class ValidatedBatch:
    """A node's batch that passed `validate_batch`; only `RecordIngest.validated` makes one.

    `records` go to ``node_records``, `results` to ``node_results``; `unreadable` results
    are stored nowhere. Every one of them is acked (`ids`) once the batch committed.
    """

    node_id: str
    records: Sequence[IncomingRecord]
    results: Sequence[ResultRow] = ()
    unreadable: Sequence[UnreadableResult] = ()
    # The readable events among `records` (stored raw too), and the unreadable ones.
    events: Sequence[EventFacts] = ()
    bad_events: Sequence[UnreadableEvent] = ()

    @property
    def ids(self) -> list[str]:
        ids = [r.id for r in self.records]
        if self.results or self.unreadable:
            ids += [r.record_id for r in self.results]
            ids += [u.record_id for u in self.unreadable]
        return ids

    @property
    def empty(self) -> bool:
        return not (self.records or self.results or self.unreadable)


# What committing a group gives each of its batches: the ids to ack, or why not.
Outcome = list[str] | InvalidInputError


@dataclass(slots=True)
class _Pending:
    batch: ValidatedBatch
    future: Future[list[str]]


class RecordIngest:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, limits: IngestLimits | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.limits = limits or IngestLimits()
        if self.limits.writers < 1:
            raise ValueError("record ingestion needs at least one writer")
        self._queue: queue.Queue[_Pending] = queue.Queue(self.limits.max_queued_batches)
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []
        self._closed = threading.Event()
        # Plain counters for benchmarks and logs: groups committed and batches in them,
        # and groups that held a record stored already (PostgreSQL's slower path).
        self.groups = 0
        self.grouped_batches = 0
        self.resent_groups = 0

    # ------------------------------------------------------------------ writes

    def store(self, node_id: str, records: Sequence[IncomingRecord]) -> list[str]:
        """Insert what is new, ignore what is already stored; return the ids to ack.

        One transaction of its own, in the calling thread (tools and tests; the
        transports use `submit`)."""
        batch = self.validated(node_id, records)
        if records:
            self._store_group([batch])
        return batch.ids

    def validated(self, node_id: str, records: Sequence[IncomingRecord]) -> ValidatedBatch:
        """The batch, checked against this ingest's limits (raises on a malformed one),
        with its results read (`records.split_results`)."""
        validate_batch(records, self.limits)
        others, results, unreadable = split_results(records)
        events, bad_events = split_events(records)
        return ValidatedBatch(node_id, others, results, unreadable, events, bad_events)

    def commit_group(self, batches: Sequence[ValidatedBatch]) -> list[Outcome]:
        """Store many batches in one transaction; an outcome per batch, in order.

        A row the database refuses (a constraint, a value out of a column's range) fails
        only its batch: the group is retried batch by batch. Anything else (the database
        is down) raises and nothing is stored.
        """
        try:
            self._store_group(batches)
        except (IntegrityError, DataError, OverflowError, ValueError):
            # A row the database (or its driver) refuses: find the batch, it fails alone.
            if len(batches) == 1:
                return [_unstorable(batches[0].node_id)]
            return [outcome for batch in batches for outcome in self.commit_group([batch])]
        self.groups += 1
        self.grouped_batches += len(batches)
        return [batch.ids for batch in batches]

    def submit(self, node_id: str, records: Sequence[IncomingRecord]) -> Future[list[str]]:
        """Validate now (raises on a malformed batch), store with the next group commit.

        The future resolves to the ids to ack once the group has committed, or to the
        error that kept it from committing. Raises `UnavailableError` when closed or when
        `max_queued_batches` are already waiting.
        """
        return self.submit_validated(self.validated(node_id, records))

    def submit_validated(self, batch: ValidatedBatch) -> Future[list[str]]:
        """`submit` for a batch `validated` already (the inbox looks at it first)."""
        future: Future[list[str]] = Future()
        if batch.empty:
            future.set_result([])
            return future
        if self._closed.is_set():
            raise UnavailableError("record ingestion is closed")
        self._ensure_writer()
        try:
            # Never blocks (the gRPC side calls this on its event loop): a full queue is
            # the database falling behind, answered like an outage.
            self._queue.put_nowait(_Pending(batch, future))
        except queue.Full:
            raise _backlog_full(self.limits) from None
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        """Store what was submitted, then stop the writer; later submits are refused."""
        self._closed.set()
        with self._lock:
            writers, self._writers = self._writers, []
        deadline = time.monotonic() + timeout_s
        for writer in writers:
            writer.join(max(0.0, deadline - time.monotonic()))
            if writer.is_alive():
                log.error("a record writer did not stop within %.1fs", timeout_s)
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
        writers = self._writers  # per submit: no lock while every writer is running
        if len(writers) >= self.limits.writers and all(w.is_alive() for w in writers):
            return
        with self._lock:
            self._writers = [w for w in self._writers if w.is_alive()]
            while len(self._writers) < self.limits.writers:
                writer = threading.Thread(
                    target=self._write_loop,
                    name=f"record-writer-{len(self._writers)}",
                    daemon=True,
                )
                writer.start()
                self._writers.append(writer)

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
            rows = _rows(first.batch)
            while rows < self.limits.max_group_rows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item.future.set_running_or_notify_cancel():
                    group.append(item)
                    rows += _rows(item.batch)
            if group:
                self._commit(group)

    def _commit(self, group: list[_Pending]) -> None:
        try:
            outcomes = self.commit_group([p.batch for p in group])
        except Exception as exc:
            for pending in group:
                pending.future.set_exception(exc)
            return
        for pending, outcome in zip(group, outcomes, strict=True):
            _resolve(pending.future, outcome)

    def _fail_waiting(self, error: Exception) -> None:
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(error)

    def _store_group(self, batches: Sequence[ValidatedBatch]) -> None:
        received_at = self._clock.now()
        if not any(batch.records for batch in batches):  # results only: no COPY
            with self._sessions() as session:
                self._store_results(session.connection(), batches, received_at)
                session.commit()
            return
        with self._sessions() as session:
            connection = session.connection()
            if connection.dialect.name == "postgresql":
                try:
                    _copy_postgresql(connection, batches, received_at, staged=False)
                    self._store_results(connection, batches, received_at)
                    _store_events(connection, batches, received_at)
                    session.commit()
                    return
                except IntegrityError as exc:
                    if getattr(exc.orig, "sqlstate", None) != _UNIQUE_VIOLATION:
                        raise
                    self.resent_groups += 1  # a duplicate: store it the careful way
        with self._sessions() as session:
            connection = session.connection()
            info = connection.connection.info  # stays with the pooled DBAPI connection
            _insert(connection, batches, received_at)
            self._store_results(connection, batches, received_at)
            _store_events(connection, batches, received_at)
            session.commit()
            # The staging table exists on this connection from now on (a rollback before
            # this line would have taken it with it).
            info[_STAGE_READY] = True

    def _store_results(
        self, connection: Connection, batches: Sequence[ValidatedBatch], received_at: datetime
    ) -> None:
        """Insert the group's results (a resend is stored once) and keep each node's newest
        `results_per_node`; in the caller's transaction."""
        rows = [
            {
                "node_id": batch.node_id,
                "record_id": r.record_id,
                "seq": r.seq,
                "created_at": r.created_at,
                "received_at": received_at,
                "captured_at": r.captured_at,
                "stream": r.stream,
                "model": r.model,
                "version": r.version,
                "kind": r.kind,
                "document": r.document,
            }
            for batch in batches
            for r in batch.results
        ]
        if not rows:
            return
        dialect = connection.dialect.name
        statement: Insert
        if dialect == "postgresql":
            connection.exec_driver_sql(_POSTGRESQL_TIMEOUTS)
            statement = postgresql.insert(NodeResultRow).on_conflict_do_nothing(
                index_elements=["node_id", "record_id"]
            )
        elif dialect == "sqlite":
            statement = sqlite.insert(NodeResultRow).on_conflict_do_nothing(
                index_elements=["node_id", "record_id"]
            )
        else:
            raise InvalidInputError(f"record ingestion does not support the {dialect} dialect")
        connection.execute(statement, rows)
        offset = self.limits.results_per_node - 1
        for node_id in sorted({batch.node_id for batch in batches if batch.results}):
            connection.execute(_PRUNE_RESULTS, {"node_id": node_id, "offset": offset})


def _store_events(
    connection: Connection, batches: Sequence[ValidatedBatch], received_at: datetime
) -> None:
    """The group's readable events into the event store, in the caller's transaction."""
    if any(batch.events for batch in batches):
        insert_events(connection, [(b.node_id, b.events) for b in batches], received_at)


def _rows(batch: ValidatedBatch) -> int:
    return len(batch.records) + len(batch.results) + len(batch.events)


def _backlog_full(limits: IngestLimits) -> UnavailableError:
    return UnavailableError(
        f"{limits.max_queued_batches} batches are waiting for the database; retry later",
        reason="ingest-backlog",
    )


def _resolve(future: Future[list[str]] | asyncio.Future[list[str]], outcome: Outcome) -> None:
    """A batch's future gets its ids to ack, or why its batch could not be stored."""
    if isinstance(outcome, InvalidInputError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _unstorable(node_id: str) -> InvalidInputError:
    return InvalidInputError(
        f"records of node {node_id!r} cannot be stored (unknown node, or a value the "
        "database refuses)",
        node_id=node_id,
        reason="constraint",
    )


def _insert(
    connection: Connection,
    batches: Sequence[ValidatedBatch],
    received_at: datetime,
) -> None:
    dialect = connection.dialect.name
    if dialect == "postgresql":
        _copy_postgresql(connection, batches, received_at, staged=True)
    elif dialect == "sqlite":
        received = _sqlite_datetime(received_at)
        rows: list[tuple[Any, ...]] = [
            (
                batch.node_id,
                r.id,
                r.seq,
                r.kind,
                _sqlite_datetime(r.created_at),
                received,
                r.content_type,
                r.payload,
            )
            for batch in batches
            for r in batch.records
        ]
        connection.exec_driver_sql(_SQLITE_INSERT, rows)
    else:
        raise InvalidInputError(f"record ingestion does not support the {dialect} dialect")


def _copy_postgresql(
    connection: Connection,
    batches: Sequence[ValidatedBatch],
    received_at: datetime,
    *,
    staged: bool,
) -> None:
    """COPY the rows into node_records, or (`staged`) into the staging table and on.

    The driver's own errors are raised as SQLAlchemy raises them (IntegrityError,
    OperationalError, ...), so callers handle one family of errors.
    """
    before = [_POSTGRESQL_TIMEOUTS]
    if staged and not connection.connection.info.get(_STAGE_READY):
        # Once per connection: a round trip less per group.
        modern = server_version(connection) >= _COPIES_COMPRESSION
        compression = " INCLUDING COMPRESSION" if modern else ""
        before.append(_POSTGRESQL_STAGE.format(compression=compression))

    def fill(write_row: WriteRow) -> None:
        received = received_at
        for batch in batches:
            node_id = batch.node_id
            # Unpacked, not read by field name: six descriptor calls less per row.
            for record_id, seq, kind, created_at, content_type, payload in batch.records:
                write_row(
                    (
                        node_id,
                        record_id,
                        seq,
                        kind,
                        created_at,
                        received,
                        content_type,
                        payload,
                    )
                )

    # ON COMMIT DELETE ROWS empties the stage after the move; a rollback discards it too.
    copy_with(
        connection,
        _STAGE_COPY if staged else _RECORDS_COPY,
        fill,
        before=before,
        after=(_POSTGRESQL_MOVE,) if staged else (),
    )


def _sqlite_datetime(value: datetime) -> str:
    return value.astimezone(UTC).replace(tzinfo=None).strftime(_SQLITE_DATETIME)


class LoopGroupCommit:
    """Group commit for callers on one asyncio loop (the gRPC link server).

    `store` parks the batch with a loop future; a flusher hands everything parked to
    `RecordIngest.commit_group` in a worker thread and resolves the futures on the loop.
    So a message costs the loop a future, not a thread hop of its own; while a group
    commits, the next gathers. Up to `flushers` groups commit at once, on as many
    connections: one waits for its WAL flush while the next is written, which halves
    the time a node waits for its Ack when groups are small. Waiting batches are
    bounded like `submit`'s.
    """

    def __init__(self, ingest: RecordIngest, *, flushers: int = 2) -> None:
        if flushers < 1:
            raise ValueError("a group commit needs at least one flusher")
        self._ingest = ingest
        self._max_flushers = flushers
        self._parked: list[tuple[ValidatedBatch, asyncio.Future[list[str]]]] = []
        self._flushers: set[asyncio.Task[None]] = set()

    async def store(self, node_id: str, records: Sequence[IncomingRecord]) -> list[str]:
        """Validate (raises on a malformed batch), then return the ids once committed."""
        return await self.store_validated(self._ingest.validated(node_id, records))

    async def store_validated(self, batch: ValidatedBatch) -> list[str]:
        """`store` for a batch `RecordIngest.validated` already."""
        if batch.empty:
            return []
        if len(self._parked) >= self._ingest.limits.max_queued_batches:
            raise _backlog_full(self._ingest.limits)
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._parked.append((batch, future))
        if len(self._flushers) < self._max_flushers:
            self._flushers.add(asyncio.create_task(self._flush(), name="record-group-commit"))
        # Shielded: a stream that ends meanwhile must not cancel its neighbours' commit.
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        group: list[tuple[ValidatedBatch, asyncio.Future[list[str]]]] = []
        try:
            while self._parked:
                group = self._take()
                try:
                    outcomes = await asyncio.to_thread(
                        self._ingest.commit_group, [batch for batch, _ in group]
                    )
                except Exception as exc:
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), outcome in zip(group, outcomes, strict=True):
                    if not future.done():
                        _resolve(future, outcome)
        except asyncio.CancelledError:
            # The server is stopping: nobody will commit what is parked; its senders
            # get an error (their nodes resend after reconnecting).
            parked, self._parked = self._parked, []
            for _, future in [*group, *parked]:
                if not future.done():
                    future.set_exception(UnavailableError("the link server is stopping"))
            raise
        finally:
            # Synchronously after the last look at `_parked` (no await in between), so a
            # batch parked later always finds room to start a flusher.
            current = asyncio.current_task()
            if current is not None:
                self._flushers.discard(current)

    def _take(self) -> list[tuple[ValidatedBatch, asyncio.Future[list[str]]]]:
        limit = self._ingest.limits.max_group_rows
        rows = 0
        count = 0
        for batch, _ in self._parked:
            if count and rows + _rows(batch) > limit:
                break
            rows += _rows(batch)
            count += 1
        group, self._parked = self._parked[:count], self._parked[count:]
        return group
