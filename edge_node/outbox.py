"""The edge node's outbox: a durable store-and-forward queue for events, health reports and
sampled inference results.

What it is for (design §4, "Nothing lost"): every record the agent must deliver to the
control plane is written here first, gets a UUIDv7 and a per-node sequence, and stays until
the control plane acks it. What it is not: a transport. It does not send, retry or back
off; the sender reads :meth:`Outbox.pending`, notes :meth:`Outbox.mark_attempt`, and calls
:meth:`Outbox.ack` once the control plane has committed the records.

Guarantees
    * ``append`` either returns a :class:`Record` that is durable (its SQLite transaction
      committed with ``synchronous=FULL`` in WAL mode) or raises; nothing is stored halfway
      and nothing is refused without an exception and a counter.
    * ``seq`` is strictly increasing per node and never reused, across restarts and after
      every row was acked (the high-water mark lives in ``meta``, written in the same
      transaction as the row). ``id`` is a UUIDv7 whose timestamp is ``created_at``, or
      the caller's own id (``append_once``: an event's deterministic id), stored at most
      once while pending. ``append_many_once`` stores many such records in one
      transaction (or parts of half the WAL's reserve, as ``ack`` splits), up to the first
      one refused, and says which.
    * A record leaves the outbox only by ``ack`` or, for health reports and results, by
      the rules below. Stored events are never removed except by ack.
    * After a crash (SIGKILL, power loss) reopening yields exactly the committed state.

Disk budget and the thinning rule
    ``budget_bytes`` bounds the outbox's whole footprint on disk: the database file, its
    write-ahead log (``-wal``) and ``-shm`` file (``stats().disk_bytes``). Two parts:

    * ``wal_reserve_bytes`` (default an eighth of the budget, at most 4 MiB) is the log's.
      After every write that leaves the ``-wal`` file larger than the reserve, the outbox
      runs ``PRAGMA wal_checkpoint(TRUNCATE)`` (the log is copied into the database and cut
      to zero bytes; SQLite's own automatic checkpoint is off, ``journal_size_limit`` is
      the reserve). ``mark_attempt`` and ``ack`` split a large batch into transactions of
      about half the reserve of record bytes each, so one transaction cannot grow the log
      far past it, and deleted rows are not zeroed on disk (``secure_delete = FAST``), so
      a delete logs only the pages it changes.
    * The rest is the *record budget*. Each stored record counts ``len(payload) +
      ROW_OVERHEAD_BYTES`` against it (an estimate of the row and its index entries;
      ``stats().bytes`` is this sum), and the database pages the records really take
      (beyond an empty outbox's; ``stats().stored_bytes``) must fit in it too: thinned
      health leaves partly empty pages beside the events that shared them, which the
      estimate does not see.

    Slack (tested by ``test_the_files_on_disk_stay_within_the_budget_under_a_write_heavy
    _load``): the files may exceed ``budget_bytes`` by an empty outbox's pages (page 1 and
    four b-tree roots, 20 KiB at 4 KiB pages), by the log of one transaction beyond the
    reserve (one record, a thinning pass, or half the reserve for a split batch), and by
    the pages a ``mark_attempt`` adds when rewritten rows no longer fit theirs (the next
    append thins them away). A record fits when, with it, both the estimate and the real
    pages stay within the record budget. When one would not:

    1. If deleting every pending result and health report would still not make room by the
       estimate, go to step 4: nothing is deleted for a record that cannot be stored anyway.
    2. Delete pending results, oldest first, until the record fits or none is left; each
       adds one to ``dropped_results``. Results are best-effort samples: they go first.
    3. Thin health in passes. A pass takes the oldest half (``n // 2``) of the ``n`` pending
       health reports and, counting from the oldest, keeps the 1st, (k+1)-th, (2k+1)-th …
       — one in ``k = health_keep_every`` — and deletes the others. Passes repeat until the
       record fits or a pass deletes nothing. The newest half is never touched by a pass,
       so recent health stays at full resolution while older history gets sparser with age.
       Every deleted report adds one to ``dropped_health`` and sets the alarm (history is
       being lost; the control plane raises ``outbox_near_budget``). ``k = 1`` disables
       thinning. Passes made for the real pages are undone with the record when it still
       does not fit.
    4. If the record still does not fit: a health report is not stored (``dropped_health``
       += 1); an event is refused (``refused_events`` += 1 and the alarm is set). Both raise
       :class:`~edge_node.errors.OutboxFullError`; the caller decides (the agent raises an
       alarm to the control plane). A disk that is physically full is handled the same way.

    Results (kind ``results``) have a share of their own besides: at most
    ``max_pending_results`` of them and ``results_share * budget_bytes`` of their bytes are
    pending at once. A new result makes room by deleting the oldest pending results; one
    that cannot fit even so (the others' records fill the budget, or it is larger than the
    whole share) is not stored. Either way ``dropped_results`` counts what was lost, a
    result never deletes a health report or an event, and never sets the alarm.

    The alarm is persisted and clears on the ack that brings the estimate to at most
    ``alarm_clear_ratio`` of the record budget (hysteresis, so it does not flap at the edge).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, NoReturn, Self, get_args

from edge_node.clock import Clock
from edge_node.errors import (
    ClosedError,
    EdgeNodeError,
    InvalidInputError,
    OutboxCorruptError,
    OutboxFullError,
    OutboxInUseError,
    OutboxNodeMismatchError,
    OutboxVersionError,
    PayloadTooLargeError,
    StorageError,
)
from edge_node.uuid7 import UUIDv7Generator, unix_ms, uuid7_unix_ms

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_ALARM_CLEAR_RATIO",
    "DEFAULT_HEALTH_KEEP_EVERY",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_PENDING_RESULTS",
    "DEFAULT_RESULTS_SHARE",
    "ROW_OVERHEAD_BYTES",
    "SCHEMA_VERSION",
    "BatchAppend",
    "Kind",
    "Outbox",
    "OutboxStats",
    "Record",
    "default_wal_reserve",
]

_log = logging.getLogger(__name__)

Kind = Literal["event", "health", "results"]
_KINDS: Final[tuple[str, ...]] = get_args(Kind)

# 2: kind "results" (a v1 file is migrated when it is opened).
SCHEMA_VERSION: Final = 2
APPLICATION_ID: Final = 0x45464F42  # "EFOB" in SQLite's header: marks the file as ours
DEFAULT_MAX_PAYLOAD_BYTES: Final = 256 * 1024
DEFAULT_HEALTH_KEEP_EVERY: Final = 4
DEFAULT_ALARM_CLEAR_RATIO: Final = 0.8
DEFAULT_RESULTS_SHARE: Final = 0.1
DEFAULT_MAX_PENDING_RESULTS: Final = 1000
ROW_OVERHEAD_BYTES: Final = 128
_WAL_SIZE_LIMIT_BYTES: Final = 4 * 1024 * 1024
_WAL_RESERVE_DIVISOR: Final = 8
_MAX_NODE_ID_CHARS: Final = 256
_CHUNK: Final = 500  # ids per statement, well under SQLite's bound-parameter limit
_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# SQLite primary result codes (the low byte of the extended code Python 3.11 exposes).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 5, 6, 11, 13, 26

_OUTBOX_TABLE: Final = """
    CREATE TABLE {table} (
        seq             INTEGER PRIMARY KEY,
        id              TEXT    NOT NULL UNIQUE,
        kind            TEXT    NOT NULL CHECK (kind IN ('event', 'health', 'results')),
        created_at      INTEGER NOT NULL,               -- unix ms, the id's timestamp
        payload         BLOB    NOT NULL,
        size            INTEGER NOT NULL CHECK (size >= 0),  -- bytes counted in the budget
        attempts        INTEGER NOT NULL DEFAULT 0,
        last_attempt_at INTEGER                         -- unix ms
    )
    """
_OUTBOX_INDEX: Final = "CREATE INDEX outbox_kind_seq ON outbox (kind, seq)"
_SCHEMA: Final = (
    _OUTBOX_TABLE.format(table="outbox"),
    _OUTBOX_INDEX,
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID",
)
_ROW_COLUMNS: Final = "seq, id, kind, created_at, payload, size, attempts, last_attempt_at"
# Version 1 allowed kinds event and health only; SQLite cannot change a CHECK in place.
_MIGRATE_V1: Final = (
    _OUTBOX_TABLE.format(table="outbox_v2"),
    f"INSERT INTO outbox_v2 ({_ROW_COLUMNS}) SELECT {_ROW_COLUMNS} FROM outbox",  # noqa: S608
    "DROP TABLE outbox",
    "ALTER TABLE outbox_v2 RENAME TO outbox",
    _OUTBOX_INDEX,
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('dropped_results', 0)",
)
_COLUMNS: Final = "seq, id, kind, created_at, payload, attempts, last_attempt_at"
_PENDING_ALL: Final = f"SELECT {_COLUMNS} FROM outbox ORDER BY seq LIMIT ?"  # noqa: S608
_PENDING_KINDS: Final = {
    n: f"SELECT {_COLUMNS} FROM outbox WHERE kind IN ({','.join('?' * n)}) "  # noqa: S608
    "ORDER BY seq LIMIT ?"
    for n in range(1, len(_KINDS))
}
_OLDEST_RESULTS: Final = "SELECT seq, size FROM outbox WHERE kind = 'results' ORDER BY seq"
_COUNTER_KEYS: Final = (
    "high_water_seq",
    "dropped_health",
    "refused_events",
    "last_acked_seq",
    "alarm",
    "dropped_results",
)


@dataclass(frozen=True, slots=True)
class Record:
    """One stored event or health report, as the sender reads it."""

    id: str
    seq: int
    kind: Kind
    created_at: datetime
    payload: bytes
    attempts: int = 0
    last_attempt_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What telemetry reports about the outbox; ``bytes`` is the budgeted sum."""

    pending_events: int
    pending_health: int
    bytes: int
    budget_bytes: int
    dropped_health: int
    refused_events: int
    alarm: bool
    oldest_created_at: datetime | None
    high_water_seq: int
    last_acked_seq: int
    disk_bytes: int
    """What the database, its ``-wal`` and ``-shm`` files take on disk now."""
    wal_reserve_bytes: int = 0
    """The part of ``budget_bytes`` set aside for the write-ahead log."""
    stored_bytes: int = 0
    """The database pages the records really take (beyond an empty outbox's)."""
    pending_results: int = 0
    dropped_results: int = 0

    @property
    def record_budget_bytes(self) -> int:
        """The part of the budget the records may fill, by ``bytes`` and by
        ``stored_bytes`` (thinning starts where either would go over)."""
        return self.budget_bytes - self.wal_reserve_bytes


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """What :meth:`Outbox.append_many_once` did with a batch, in the batch's order."""

    records: tuple[Record | None, ...]
    """One per record handled, from the first: the stored record, or ``None`` when one
    with its id was pending already (a replay, stored once). The records after these
    were not stored; the caller holds them."""
    error: EdgeNodeError | None
    """Why ``items[len(records)]`` was not stored (:class:`OutboxFullError` as the single
    form raises it, or a :class:`StorageError`); ``None`` when the whole batch was."""


def default_wal_reserve(budget_bytes: int) -> int:
    """The WAL's share of a disk budget when none is given: an eighth, at most 4 MiB."""
    return min(_WAL_SIZE_LIMIT_BYTES, budget_bytes // _WAL_RESERVE_DIVISOR)


@dataclass(frozen=True, slots=True)
class _Counters:
    high_water_seq: int = 0
    dropped_health: int = 0
    refused_events: int = 0
    last_acked_seq: int = 0
    alarm: bool = False
    dropped_results: int = 0

    def as_rows(self) -> dict[str, int]:
        return {key: int(getattr(self, key)) for key in _COUNTER_KEYS}


@dataclass(frozen=True, slots=True)
class _Backlog:
    """Pending rows per kind and their budgeted bytes, mirrored in memory."""

    events: int = 0
    health: int = 0
    event_bytes: int = 0
    health_bytes: int = 0
    results: int = 0
    results_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.event_bytes + self.health_bytes + self.results_bytes

    def add(self, kind: str, count: int, size: int) -> _Backlog:
        if kind == "event":
            return replace(self, events=self.events + count, event_bytes=self.event_bytes + size)
        if kind == "results":
            return replace(
                self, results=self.results + count, results_bytes=self.results_bytes + size
            )
        return replace(self, health=self.health + count, health_bytes=self.health_bytes + size)


class Outbox:
    """Durable, budgeted, thread-safe outbox over one SQLite file. Use :meth:`open`.

    One process owns the file at a time (SQLite exclusive locking mode); a second opener
    gets :class:`~edge_node.errors.OutboxInUseError`. The API is synchronous; the agent calls
    it from asyncio through a worker thread.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        path: Path,
        node_id: str,
        budget_bytes: int,
        wal_reserve_bytes: int,
        clock: Clock,
        health_keep_every: int,
        max_payload_bytes: int,
        alarm_clear_ratio: float,
        counters: _Counters,
        backlog: _Backlog,
        page_size: int = 4096,
        base_pages: int = 0,
        results_share: float = DEFAULT_RESULTS_SHARE,
        max_pending_results: int = DEFAULT_MAX_PENDING_RESULTS,
    ) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._page_size = page_size
        # An empty outbox's pages (the schema and each table's and index's root), which
        # are not the records' and are never freed.
        self._base_pages = base_pages
        self._path = path
        self._wal_path = path.with_name(path.name + "-wal")
        self._node_id = node_id
        self._budget = budget_bytes
        self._wal_reserve = wal_reserve_bytes
        # The records' logical sum may fill this; the WAL's reserve is the rest.
        self._record_budget = budget_bytes - wal_reserve_bytes
        # A batch of updates or deletes is split into transactions of about this many
        # record bytes, so that one transaction cannot grow the log far past the reserve.
        self._batch_bytes = max(wal_reserve_bytes // 2, 1)
        self._health_keep_every = health_keep_every
        self._max_payload = max_payload_bytes
        self._alarm_clear_bytes = int(self._record_budget * alarm_clear_ratio)
        self._results_budget = int(budget_bytes * results_share)
        self._max_pending_results = max_pending_results
        self._clock = clock
        self._ids = UUIDv7Generator(clock)
        self._counters = counters
        self._persisted = counters
        self._backlog = backlog
        self._lock = threading.Lock()
        # Called after every append that stored something (`on_append`). Their own lock,
        # never held across I/O (`_lock` is held across commits): registering from an
        # event loop does not wait for a write.
        self._listeners: list[Callable[[], None]] = []
        self._listeners_lock = threading.Lock()

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        node_id: str,
        budget_bytes: int,
        clock: Clock,
        health_keep_every: int = DEFAULT_HEALTH_KEEP_EVERY,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        alarm_clear_ratio: float = DEFAULT_ALARM_CLEAR_RATIO,
        busy_timeout_s: float = 1.0,
        wal_reserve_bytes: int | None = None,
        results_share: float = DEFAULT_RESULTS_SHARE,
        max_pending_results: int = DEFAULT_MAX_PENDING_RESULTS,
    ) -> Outbox:
        """Open (creating if absent) the outbox at ``path`` for ``node_id``.

        ``budget_bytes`` bounds the files on disk; ``wal_reserve_bytes`` of it (default
        :func:`default_wal_reserve`) is the WAL's, and 0 checkpoints after every write.
        Raises :class:`InvalidInputError` for unsafe settings, and a :class:`StorageError`
        subclass when the file is corrupt, newer than this agent, held by another process,
        or belongs to another node. A bad file is never deleted or rewritten; a file of an
        older schema version is migrated in one transaction.
        """
        if wal_reserve_bytes is None:
            wal_reserve_bytes = default_wal_reserve(budget_bytes)
        _check_settings(
            node_id,
            budget_bytes,
            wal_reserve_bytes,
            health_keep_every,
            max_payload_bytes,
            alarm_clear_ratio,
        )
        if not 0.0 < results_share <= 1.0:
            raise InvalidInputError("results_share must be in (0, 1]", value=results_share)
        if isinstance(max_pending_results, bool) or max_pending_results < 1:
            raise InvalidInputError("max_pending_results must be >= 1", value=max_pending_results)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        creating = not path.exists() or path.stat().st_size == 0
        try:
            conn = sqlite3.connect(
                str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _translate(exc, path, "open") from exc
        try:
            _configure(conn, path, wal_reserve_bytes)
            _check_integrity(conn, path)
            counters = _ensure_schema(conn, path, node_id)
            backlog = _load_backlog(conn, path, counters)
            page_size, base_pages = _layout(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise _translate(exc, path, "open") from exc
        except BaseException:
            conn.close()
            raise
        if creating:
            _fsync_dir(path.parent)  # the new file's directory entry must survive power loss
        return cls(
            conn,
            path=path,
            node_id=node_id,
            budget_bytes=budget_bytes,
            wal_reserve_bytes=wal_reserve_bytes,
            clock=clock,
            health_keep_every=health_keep_every,
            max_payload_bytes=max_payload_bytes,
            alarm_clear_ratio=alarm_clear_ratio,
            counters=counters,
            backlog=backlog,
            page_size=page_size,
            base_pages=base_pages,
            results_share=results_share,
            max_pending_results=max_pending_results,
        )

    @property
    def path(self) -> Path:
        return self._path

    @property
    def node_id(self) -> str:
        return self._node_id

    # ------------------------------------------------------------------ writing

    def on_append(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` (no arguments, in the appending thread, after the commit,
        outside the outbox's lock) whenever an append stored at least one record, so a
        sender can wake instead of polling (the uplink). It must be quick and must not
        raise (what it raises is logged and ignored). Returns the function that removes
        it again."""
        with self._listeners_lock:
            self._listeners = [*self._listeners, listener]

        def remove() -> None:
            with self._listeners_lock:
                self._listeners = [f for f in self._listeners if f is not listener]

        return remove

    def _appended(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a sender's bug must not fail a write that committed
                _log.exception("an outbox append listener raised")

    def append(self, kind: Kind, payload: bytes) -> Record:
        """Store one record durably and return it; raise if it is not stored.

        :class:`OutboxFullError` when the budget cannot take it (see the module docstring
        for the thinning rule); :class:`PayloadTooLargeError` over ``max_payload_bytes``.
        """
        record = self._append(kind, payload, None)
        assert record is not None  # a fresh UUIDv7 is never pending already
        return record

    def append_once(self, kind: Kind, payload: bytes, record_id: str) -> Record | None:
        """``append`` under the caller's own id (a lowercase UUID): ``None``, and nothing
        stored, when a pending record has that id already.

        For records whose identity is deterministic (an event's uuid5 ``event_id``): a
        replay of the same record is stored once while it waits here, and once at the
        control plane after it was acked (it stores each ``(node, record id)`` once). The
        id is then not a UUIDv7; ``seq`` and ``created_at`` are as for ``append``.
        """
        if not isinstance(record_id, str) or _UUID.match(record_id) is None:
            raise InvalidInputError(
                f"record_id must be a lowercase UUID, got {record_id!r}", record_id=record_id
            )
        return self._append(kind, payload, record_id)

    def _append(self, kind: Kind, payload: bytes, record_id: str | None) -> Record | None:
        if kind not in _KINDS:
            raise InvalidInputError(f"unknown record kind {kind!r}", kind=kind, allowed=_KINDS)
        data = self._check_payload(kind, payload)
        size = len(data) + ROW_OVERHEAD_BYTES
        with self._lock:
            conn = self._open_conn()
            try:
                record = self._append_locked(conn, kind, data, size, record_id)
            except sqlite3.Error as exc:
                if _primary_code(exc) == _SQLITE_FULL:
                    self._refuse_disk_full(conn, kind, size, exc)
                raise _translate(exc, self._path, "append") from exc
            finally:
                self._bound_wal(conn)
        if record is not None:
            self._appended()
        return record

    def append_many_once(self, kind: Kind, items: Sequence[tuple[bytes, str]]) -> BatchAppend:
        """``append_once`` for many ``(payload, record_id)`` pairs, in order, in as few
        transactions as the WAL's reserve allows (one for a batch of up to about half the
        reserve of record bytes, like ``ack``'s and ``mark_attempt``'s parts).

        Each record is stored at most once by its id: one pending already, or earlier in
        the same batch, is ``None`` in :attr:`BatchAppend.records`. The budget, thinning and
        full-disk rules are the single form's, record by record; the first record the
        single form would refuse stops the batch there: the records before it are stored,
        it and every later one are not (``BatchAppend.error`` is the
        :class:`OutboxFullError` the single form would raise for it, or the
        :class:`StorageError` of a part that did not commit) and the caller holds them, in
        order. A refusal counts once, as the single form's would. Invalid input (a bad id,
        a payload over ``max_payload_bytes``) raises before anything is stored.
        """
        if kind not in _KINDS:
            raise InvalidInputError(f"unknown record kind {kind!r}", kind=kind, allowed=_KINDS)
        checked: list[tuple[bytes, int, str]] = []
        for payload, record_id in items:
            if not isinstance(record_id, str) or _UUID.match(record_id) is None:
                raise InvalidInputError(
                    f"record_id must be a lowercase UUID, got {record_id!r}", record_id=record_id
                )
            data = self._check_payload(kind, payload)
            checked.append((data, len(data) + ROW_OVERHEAD_BYTES, record_id))
        if not checked:
            return BatchAppend((), None)
        done = self._append_many_locked(kind, checked)
        if any(record is not None for record in done.records):
            self._appended()
        return done

    def _append_many_locked(
        self, kind: Kind, checked: Sequence[tuple[bytes, int, str]]
    ) -> BatchAppend:
        records: list[Record | None] = []
        with self._lock:
            conn = self._open_conn()
            seen: set[str] = set()
            for part in _size_parts(checked, self._batch_bytes):
                size = part[0][1]
                try:
                    done, error = self._append_part(conn, kind, part, seen)
                except sqlite3.Error as exc:
                    if _primary_code(exc) == _SQLITE_FULL:
                        try:
                            self._refuse_disk_full(conn, kind, size, exc)
                        except OutboxFullError as full:
                            return BatchAppend(tuple(records), full)
                    return BatchAppend(
                        tuple(records), _translate(exc, self._path, "append_many_once")
                    )
                finally:
                    self._bound_wal(conn)
                records += done
                if error is not None:
                    return BatchAppend(tuple(records), error)
        return BatchAppend(tuple(records), None)

    def _append_part(
        self,
        conn: sqlite3.Connection,
        kind: Kind,
        part: Sequence[tuple[bytes, int, str]],
        seen: set[str],
    ) -> tuple[list[Record | None], OutboxFullError | None]:
        """One transaction of ``append_many_once``: the records of ``part`` up to the first
        the budget refuses (which is counted), then the counters."""
        ids = [rid for _, _, rid in part]
        pending: set[str] = set()
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            pending.update(
                row[0]
                for row in conn.execute(
                    f"SELECT id FROM outbox WHERE id IN ({marks})",  # noqa: S608
                    chunk,
                )
            )
        backlog, counters = self._backlog, self._counters
        done: list[Record | None] = []
        refused: int | None = None
        now_ms = unix_ms(self._clock.now())
        with _transaction(conn):
            for data, size, rid in part:
                if rid in pending or rid in seen:
                    done.append(None)  # pending already: the same record, stored once
                    continue
                backlog, counters, fits = self._put(
                    conn, kind, data, size, rid, now_ms, backlog, counters
                )
                if not fits:
                    counters = _refused(counters, kind)
                    refused = size
                    break
                seen.add(rid)
                done.append(
                    Record(
                        id=rid,
                        seq=counters.high_water_seq,
                        kind=kind,
                        created_at=_from_ms(now_ms),
                        payload=data,
                    )
                )
            self._write_counters(conn, counters)
        self._backlog, self._counters = backlog, counters
        self._persisted = counters
        if refused is None:
            return done, None
        return done, self._full_error(
            kind, refused, reason="budget", stored=self._stored_bytes(conn)
        )

    def _check_payload(self, kind: Kind, payload: bytes) -> bytes:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidInputError("payload must be bytes", type=type(payload).__name__)
        data = bytes(payload)
        if len(data) > self._max_payload:
            raise PayloadTooLargeError(
                f"{kind} payload of {len(data)} bytes is over the {self._max_payload}-byte limit",
                kind=kind,
                size=len(data),
                limit=self._max_payload,
            )
        return data

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload one record may carry."""
        return self._max_payload

    def _append_locked(
        self, conn: sqlite3.Connection, kind: Kind, data: bytes, size: int, record_id: str | None
    ) -> Record | None:
        if record_id is not None:
            found = conn.execute("SELECT 1 FROM outbox WHERE id = ?", (record_id,)).fetchone()
            if found is not None:
                return None  # pending already: the same record, stored once
        backlog, counters = self._backlog, self._counters
        if record_id is None:
            uid = self._ids.new()
            rid, created_ms = str(uid), uuid7_unix_ms(uid)
        else:
            rid, created_ms = record_id, unix_ms(self._clock.now())
        # One transaction: deletions, the row, and every counter commit together or not at all.
        with _transaction(conn):
            backlog, counters, fits = self._put(
                conn, kind, data, size, rid, created_ms, backlog, counters
            )
            if not fits:
                counters = _refused(counters, kind)
            self._write_counters(conn, counters)
        self._backlog, self._counters = backlog, counters
        self._persisted = counters
        if not fits:
            raise self._full_error(kind, size, reason="budget", stored=self._stored_bytes(conn))
        return Record(
            id=rid,
            seq=counters.high_water_seq,
            kind=kind,
            created_at=_from_ms(created_ms),
            payload=data,
        )

    def _put(
        self,
        conn: sqlite3.Connection,
        kind: Kind,
        data: bytes,
        size: int,
        rid: str,
        created_ms: int,
        backlog: _Backlog,
        counters: _Counters,
    ) -> tuple[_Backlog, _Counters, bool]:
        """Make room for one record by the module docstring's rules and insert it, inside
        the caller's transaction; whether it fits (when not, its row and the thinning made
        for the real pages are undone, and the caller counts the refusal)."""
        budget = self._record_budget
        # Delete only if dropping every result and health report could make room at all
        # (rule, step 1); a result never deletes anything but older results.
        thinnable = (
            kind != "results"
            and backlog.bytes - backlog.results_bytes - backlog.health_bytes + size <= budget
        )
        if kind == "results":
            backlog, counters = self._room_for_result(conn, size, backlog, counters)
            fits = (
                backlog.bytes + size <= budget
                and backlog.results_bytes + size <= self._results_budget
                and backlog.results < self._max_pending_results
            )
        else:
            over = backlog.bytes + size - budget
            if over > 0 and thinnable:
                backlog, counters = self._drop_results(conn, over, 0, backlog, counters)
                backlog, counters = self._thin_health(
                    conn, backlog, counters, lambda b: b.bytes + size > budget
                )
            fits = backlog.bytes + size <= budget
        if fits:
            before = backlog, counters
            conn.execute("SAVEPOINT record")
            counters = replace(counters, high_water_seq=counters.high_water_seq + 1)
            conn.execute(
                "INSERT INTO outbox (seq, id, kind, created_at, payload, size)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (counters.high_water_seq, rid, kind, created_ms, data, size),
            )
            backlog = backlog.add(kind, 1, size)
            # The estimate fits; the pages the file really uses must fit too (rule, 4).
            if thinnable and self._pages_over(conn):
                backlog, counters = self._thin_health(
                    conn, backlog, counters, lambda _: self._pages_over(conn)
                )
            if self._pages_over(conn):
                conn.execute("ROLLBACK TO record")  # the row and that thinning
                backlog, counters = before
                fits = False
            conn.execute("RELEASE record")
        return backlog, counters, fits

    def _pages_over(self, conn: sqlite3.Connection) -> bool:
        """Whether the pages the records really take (this transaction's view) are over
        the record budget."""
        return self._stored_bytes(conn) > self._record_budget

    def _stored_bytes(self, conn: sqlite3.Connection) -> int:
        """The database's pages in use beyond an empty outbox's, in bytes."""
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        return max(0, int(pages) - int(free) - self._base_pages) * self._page_size

    def _room_for_result(
        self, conn: sqlite3.Connection, size: int, backlog: _Backlog, counters: _Counters
    ) -> tuple[_Backlog, _Counters]:
        """Delete the oldest pending results a new one needs to fit (module docstring)."""
        if size > self._results_budget or backlog.bytes - backlog.results_bytes + size > (
            self._record_budget
        ):
            return backlog, counters  # it cannot fit, whatever is deleted
        need_bytes = max(
            backlog.results_bytes + size - self._results_budget,
            backlog.bytes + size - self._record_budget,
        )
        need_rows = backlog.results + 1 - self._max_pending_results
        return self._drop_results(conn, need_bytes, need_rows, backlog, counters)

    def _drop_results(
        self,
        conn: sqlite3.Connection,
        need_bytes: int,
        need_rows: int,
        backlog: _Backlog,
        counters: _Counters,
    ) -> tuple[_Backlog, _Counters]:
        """Delete pending results, oldest first, until ``need_bytes`` and ``need_rows`` are
        freed or none is left, inside the caller's transaction."""
        if (need_bytes <= 0 and need_rows <= 0) or backlog.results == 0:
            return backlog, counters
        victims: list[int] = []
        freed = 0
        cur = conn.execute(_OLDEST_RESULTS)
        for seq, sz in cur:
            if freed >= need_bytes and len(victims) >= need_rows:
                break
            victims.append(seq)
            freed += sz
        cur.close()
        conn.executemany("DELETE FROM outbox WHERE seq = ?", [(seq,) for seq in victims])
        backlog = backlog.add("results", -len(victims), -freed)
        counters = replace(counters, dropped_results=counters.dropped_results + len(victims))
        return backlog, counters

    def _thin_health(
        self,
        conn: sqlite3.Connection,
        backlog: _Backlog,
        counters: _Counters,
        short_of_room: Callable[[_Backlog], bool],
    ) -> tuple[_Backlog, _Counters]:
        """Apply the module docstring's thinning passes inside the caller's transaction,
        while ``short_of_room(backlog)``."""
        k = self._health_keep_every
        while k > 1 and short_of_room(backlog):
            window = conn.execute(
                "SELECT seq, size FROM outbox WHERE kind = 'health' ORDER BY seq LIMIT ?",
                (backlog.health // 2,),
            ).fetchall()
            victims = [(seq, sz) for i, (seq, sz) in enumerate(window) if i % k != 0]
            if not victims:
                break
            conn.executemany("DELETE FROM outbox WHERE seq = ?", [(seq,) for seq, _ in victims])
            freed = sum(sz for _, sz in victims)
            backlog = backlog.add("health", -len(victims), -freed)
            # History is being lost: the alarm says so until acks make room again.
            counters = replace(
                counters, dropped_health=counters.dropped_health + len(victims), alarm=True
            )
        return backlog, counters

    def _refuse_disk_full(
        self, conn: sqlite3.Connection, kind: Kind, size: int, cause: sqlite3.Error
    ) -> NoReturn:
        """The disk itself is full: count the refusal, persisting it if the disk allows."""
        self._counters = _refused(self._counters, kind)
        try:
            with _transaction(conn):
                self._write_counters(conn, self._counters)
            self._persisted = self._counters
        except sqlite3.Error:
            # Not lost: the counter stays in memory (stats show it) and the next write that
            # succeeds persists it. The error that matters is the refusal raised below.
            pass
        raise self._full_error(kind, size, reason="disk full") from cause

    def _full_error(
        self, kind: Kind, size: int, *, reason: str, stored: int | None = None
    ) -> OutboxFullError:
        what = {
            "event": "event refused",
            "health": "health report dropped",
            "results": "result sample dropped",
        }[kind]
        pages = "" if stored is None else f", {stored} in the database's pages"
        return OutboxFullError(
            f"outbox full ({reason}): {what}; of the records' {self._record_budget} bytes "
            f"({self._budget} with the WAL's reserve), {self._backlog.bytes} in use by the "
            f"estimate{pages}; the record needs {size}",
            kind=kind,
            reason=reason,
            size=size,
            bytes=self._backlog.bytes,
            stored_bytes=stored,
            budget_bytes=self._budget,
            record_budget_bytes=self._record_budget,
            refused_events=self._counters.refused_events,
            dropped_health=self._counters.dropped_health,
            dropped_results=self._counters.dropped_results,
        )

    def mark_attempt(self, ids: Iterable[str]) -> int:
        """Note one more delivery attempt (now) on each record; returns how many exist."""
        id_list = _check_ids(ids)
        if not id_list:
            return 0
        with self._lock:
            conn = self._open_conn()
            now_ms = unix_ms(self._clock.now())
            marked = 0
            # An update rewrites each record's pages into the log: a large batch goes in
            # several transactions, each followed by the WAL's bound (the module docstring).
            for part in self._byte_chunks(conn, id_list, "mark_attempt"):
                with self._guard("mark_attempt"), _transaction(conn):
                    cur = conn.executemany(
                        "UPDATE outbox SET attempts = attempts + 1, last_attempt_at = ?"
                        " WHERE id = ?",
                        [(now_ms, i) for i in part],
                    )
                    marked += max(cur.rowcount, 0)
                self._bound_wal(conn)
            return marked

    def ack(self, ids: Iterable[str] = (), *, up_to_seq: int | None = None) -> int:
        """Delete acked records: the given ids and/or every seq <= ``up_to_seq``.

        Idempotent: unknown or already-acked ids are ignored. Returns rows deleted.
        """
        id_list = _check_ids(ids)
        if up_to_seq is not None and (
            isinstance(up_to_seq, bool) or not isinstance(up_to_seq, int) or up_to_seq < 0
        ):
            raise InvalidInputError("up_to_seq must be a non-negative int", up_to_seq=up_to_seq)
        with self._lock:
            conn = self._open_conn()
            deleted = 0
            if up_to_seq is not None:
                deleted += self._ack_locked(conn, (), up_to_seq)
            # Deletes are cheap in the log (secure_delete = FAST), but a batch of ids is
            # still split like mark_attempt's, each part one transaction with its counters.
            for part in self._byte_chunks(conn, id_list, "ack"):
                deleted += self._ack_locked(conn, part, None)
            return deleted

    def _ack_locked(
        self, conn: sqlite3.Connection, id_list: Sequence[str], up_to_seq: int | None
    ) -> int:
        backlog, counters = self._backlog, self._counters
        with self._guard("ack"), _transaction(conn):
            acked: list[tuple[int, str, int]] = []
            if up_to_seq is not None:
                acked += conn.execute(
                    "SELECT seq, kind, size FROM outbox WHERE seq <= ?", (up_to_seq,)
                ).fetchall()
                conn.execute("DELETE FROM outbox WHERE seq <= ?", (up_to_seq,))
            for chunk in _chunks(id_list):
                marks = ",".join("?" * len(chunk))
                acked += conn.execute(
                    f"SELECT seq, kind, size FROM outbox WHERE id IN ({marks})",  # noqa: S608
                    chunk,
                ).fetchall()
                conn.execute(f"DELETE FROM outbox WHERE id IN ({marks})", chunk)  # noqa: S608
            for _, kind, size in acked:
                backlog = backlog.add(kind, -1, -size)
            top = max((seq for seq, _, _ in acked), default=0)
            if up_to_seq is not None:
                top = max(top, min(up_to_seq, counters.high_water_seq))
            counters = replace(counters, last_acked_seq=max(counters.last_acked_seq, top))
            if counters.alarm and backlog.bytes <= self._alarm_clear_bytes:
                counters = replace(counters, alarm=False)
            self._write_counters(conn, counters)
        self._backlog, self._counters = backlog, counters
        self._persisted = counters
        self._bound_wal(conn)
        return len(acked)

    def _byte_chunks(
        self, conn: sqlite3.Connection, id_list: Sequence[str], op: str
    ) -> Iterator[list[str]]:
        """``id_list`` (the pending ones, in order) in parts of about ``_batch_bytes``
        record bytes each; ids not in the outbox are left out."""
        if not id_list:
            return
        sizes: dict[str, int] = {}
        with self._guard(op):
            for chunk in _chunks(id_list):
                marks = ",".join("?" * len(chunk))
                sizes.update(
                    conn.execute(
                        f"SELECT id, size FROM outbox WHERE id IN ({marks})",  # noqa: S608
                        chunk,
                    ).fetchall()
                )
        part: list[str] = []
        part_bytes = 0
        for rid in dict.fromkeys(id_list):
            size = sizes.get(rid)
            if size is None:
                continue
            if part and part_bytes + size > self._batch_bytes:
                yield part
                part, part_bytes = [], 0
            part.append(rid)
            part_bytes += size
        if part:
            yield part

    # ------------------------------------------------------------------ reading

    def pending(
        self, limit: int, max_bytes: int, kinds: Collection[Kind] | None = None
    ) -> list[Record]:
        """Oldest-first records for one batch: at most ``limit`` of them and ``max_bytes`` of
        payload — except that the first record is always returned, so one large record can
        never wedge the queue.
        """
        if limit < 0 or max_bytes < 0:
            raise InvalidInputError(
                "limit and max_bytes must be >= 0", limit=limit, max_bytes=max_bytes
            )
        if kinds is not None and (unknown := set(kinds) - set(_KINDS)):
            raise InvalidInputError(f"unknown record kinds {sorted(unknown)}", kinds=kinds)
        wanted = _KINDS if kinds is None else tuple(k for k in _KINDS if k in set(kinds))
        if limit == 0 or not wanted:
            return []
        params: tuple[object, ...]
        if len(wanted) == len(_KINDS):
            query, params = _PENDING_ALL, (limit,)
        else:
            query, params = _PENDING_KINDS[len(wanted)], (*wanted, limit)
        records: list[Record] = []
        total = 0
        with self._lock:
            conn = self._open_conn()
            with self._guard("pending"):
                cur = conn.execute(query, params)
                for seq, rid, kind, created, payload, attempts, last in cur:
                    total += len(payload)
                    if records and total > max_bytes:
                        break
                    records.append(
                        Record(
                            id=rid,
                            seq=seq,
                            kind=kind,
                            created_at=_from_ms(created),
                            payload=bytes(payload),
                            attempts=attempts,
                            last_attempt_at=None if last is None else _from_ms(last),
                        )
                    )
                cur.close()
        return records

    def stats(self) -> OutboxStats:
        with self._lock:
            conn = self._open_conn()
            with self._guard("stats"):
                row = conn.execute("SELECT created_at FROM outbox ORDER BY seq LIMIT 1").fetchone()
                stored = self._stored_bytes(conn)
            backlog, counters = self._backlog, self._counters
        return OutboxStats(
            pending_events=backlog.events,
            pending_health=backlog.health,
            bytes=backlog.bytes,
            budget_bytes=self._budget,
            dropped_health=counters.dropped_health,
            refused_events=counters.refused_events,
            alarm=counters.alarm,
            oldest_created_at=None if row is None else _from_ms(row[0]),
            high_water_seq=counters.high_water_seq,
            last_acked_seq=counters.last_acked_seq,
            disk_bytes=_disk_bytes(self._path),
            wal_reserve_bytes=self._wal_reserve,
            stored_bytes=stored,
            pending_results=backlog.results,
            dropped_results=counters.dropped_results,
        )

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the file; safe to call twice."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _open_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ClosedError("outbox is closed", path=str(self._path))
        return self._conn

    def _write_counters(self, conn: sqlite3.Connection, counters: _Counters) -> None:
        """Write the counters that changed since they were last persisted."""
        old, new = self._persisted.as_rows(), counters.as_rows()
        changed = [(value, key) for key, value in new.items() if old[key] != value]
        if changed:
            conn.executemany("UPDATE meta SET value = ? WHERE key = ?", changed)

    def _bound_wal(self, conn: sqlite3.Connection) -> None:
        """After a write: a log larger than its reserve is checkpointed and cut to zero.

        A failed checkpoint (a full disk, say) leaves the log as it is: the records are
        committed either way, and the next write tries again.
        """
        try:
            wal_bytes = self._wal_path.stat().st_size
        except FileNotFoundError:
            return
        if wal_bytes <= self._wal_reserve or conn.in_transaction:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            _log.warning("outbox checkpoint failed at %s (the log stays): %s", self._path, exc)

    @contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise _translate(exc, self._path, op) from exc


# ---------------------------------------------------------------------- helpers


def _refused(counters: _Counters, kind: Kind) -> _Counters:
    if kind == "event":
        return replace(counters, refused_events=counters.refused_events + 1, alarm=True)
    if kind == "results":
        return replace(counters, dropped_results=counters.dropped_results + 1)
    return replace(counters, dropped_health=counters.dropped_health + 1)


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT may leave the transaction open; the original error is what counts.
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _check_settings(
    node_id: str,
    budget_bytes: int,
    wal_reserve_bytes: int,
    health_keep_every: int,
    max_payload_bytes: int,
    alarm_clear_ratio: float,
) -> None:
    if not isinstance(node_id, str) or not 0 < len(node_id) <= _MAX_NODE_ID_CHARS:
        raise InvalidInputError("node_id must be a non-empty string", node_id=node_id)
    if health_keep_every < 1:
        raise InvalidInputError("health_keep_every must be >= 1", value=health_keep_every)
    if max_payload_bytes < 1:
        raise InvalidInputError("max_payload_bytes must be >= 1", value=max_payload_bytes)
    if (
        isinstance(wal_reserve_bytes, bool)
        or not isinstance(wal_reserve_bytes, int)
        or not 0 <= wal_reserve_bytes < budget_bytes
    ):
        raise InvalidInputError(
            f"wal_reserve_bytes must be an int in [0, budget_bytes), got {wal_reserve_bytes!r}",
            wal_reserve_bytes=wal_reserve_bytes,
            budget_bytes=budget_bytes,
        )
    if budget_bytes - wal_reserve_bytes < max_payload_bytes + ROW_OVERHEAD_BYTES:
        # Otherwise a legal record could never fit, and thinning would run for nothing.
        raise InvalidInputError(
            f"budget_bytes {budget_bytes} (less the WAL's reserve of {wal_reserve_bytes}) "
            f"cannot hold one maximal record ({max_payload_bytes} + {ROW_OVERHEAD_BYTES} bytes)",
            budget_bytes=budget_bytes,
            wal_reserve_bytes=wal_reserve_bytes,
            max_payload_bytes=max_payload_bytes,
        )
    if not 0.0 <= alarm_clear_ratio < 1.0:
        raise InvalidInputError("alarm_clear_ratio must be in [0, 1)", value=alarm_clear_ratio)


def _configure(conn: sqlite3.Connection, path: Path, wal_reserve_bytes: int) -> None:
    # Exclusive locking first: one owner per file, and no -shm file to go stale.
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise StorageError(f"{path}: SQLite refused WAL mode (got {mode!r})", path=str(path))
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    # The log's bound is the outbox's own checkpoint after each write (Outbox._bound_wal);
    # SQLite's automatic one would leave the file at its size until the next write.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(f"PRAGMA journal_size_limit = {int(wal_reserve_bytes)}")
    # Acked rows need no zeroing on disk; zeroing freed pages multiplies what a delete logs.
    conn.execute("PRAGMA secure_delete = FAST")


def _check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    problems = [str(row[0]) for row in conn.execute("PRAGMA quick_check(5)").fetchall()]
    if problems != ["ok"]:
        raise OutboxCorruptError(
            f"{path} fails SQLite's integrity check ({'; '.join(problems)}); it was left "
            "in place — move it aside to start a new outbox",
            path=str(path),
            problems=problems,
        )


def _ensure_schema(conn: sqlite3.Connection, path: Path, node_id: str) -> _Counters:
    """Create the schema in a fresh file, or check an existing one; return its counters."""
    with _transaction(conn):
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        (tables,) = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        if app_id == 0 and version == 0 and tables == 0:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("node_id", node_id), *_Counters().as_rows().items()],
            )
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return _Counters()
        if app_id != APPLICATION_ID:
            raise OutboxCorruptError(
                f"{path} is a SQLite database but not an edgefleet outbox "
                f"(application_id {app_id:#x}); it was left in place",
                path=str(path),
                application_id=app_id,
            )
        if version > SCHEMA_VERSION:
            raise OutboxVersionError(
                f"{path} has outbox schema version {version}, newer than this agent's "
                f"{SCHEMA_VERSION}; run a newer agent or move the file aside",
                path=str(path),
                found=version,
                supported=SCHEMA_VERSION,
            )
        if version < 1:
            raise OutboxCorruptError(
                f"{path} has outbox schema version {version}, which never existed",
                path=str(path),
                found=version,
            )
        if version == 1:  # within this transaction: all of it or nothing
            for statement in _MIGRATE_V1:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    missing = {"node_id", *_COUNTER_KEYS} - meta.keys()
    if missing:
        raise OutboxCorruptError(
            f"{path}: outbox meta lacks {sorted(missing)}", path=str(path), missing=missing
        )
    if meta["node_id"] != node_id:
        raise OutboxNodeMismatchError(
            f"{path} belongs to node {meta['node_id']!r}, not {node_id!r}; sequences are "
            "per node, so it cannot be reused",
            path=str(path),
            found=meta["node_id"],
            expected=node_id,
        )
    return _Counters(
        high_water_seq=int(meta["high_water_seq"]),
        dropped_health=int(meta["dropped_health"]),
        refused_events=int(meta["refused_events"]),
        last_acked_seq=int(meta["last_acked_seq"]),
        alarm=bool(meta["alarm"]),
        dropped_results=int(meta["dropped_results"]),
    )


def _load_backlog(conn: sqlite3.Connection, path: Path, counters: _Counters) -> _Backlog:
    backlog = _Backlog()
    for kind, count, size in conn.execute(
        "SELECT kind, count(*), coalesce(sum(size), 0) FROM outbox GROUP BY kind"
    ):
        backlog = backlog.add(kind, count, size)
    (top,) = conn.execute("SELECT coalesce(max(seq), 0) FROM outbox").fetchone()
    if top > counters.high_water_seq:
        raise OutboxCorruptError(
            f"{path}: row seq {top} is above the high-water mark {counters.high_water_seq}",
            path=str(path),
        )
    return backlog


def _layout(conn: sqlite3.Connection) -> tuple[int, int]:
    """The page size and the pages of an empty outbox: page 1 and every b-tree's root."""
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    (roots,) = conn.execute("SELECT count(*) FROM sqlite_schema WHERE rootpage > 0").fetchone()
    return int(page_size), 1 + int(roots)


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def _translate(exc: sqlite3.Error, path: Path, op: str) -> EdgeNodeError:
    code = _primary_code(exc)
    fields = {"path": str(path), "op": op, "sqlite_error": getattr(exc, "sqlite_errorname", "")}
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return OutboxCorruptError(
            f"{path} is not a readable outbox ({exc}); it was left in place — move it "
            "aside to start a new outbox",
            **fields,
        )
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return OutboxInUseError(f"{path} is held by another process ({exc})", **fields)
    return StorageError(f"outbox {op} failed at {path}: {exc}", **fields)


def _check_ids(ids: Iterable[str]) -> list[str]:
    if isinstance(ids, str | bytes):
        raise InvalidInputError("ids must be a collection of strings, not one string")
    id_list = list(ids)
    if not all(isinstance(i, str) for i in id_list):
        raise InvalidInputError("every id must be a string")
    return id_list


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _size_parts(
    items: Sequence[tuple[bytes, int, str]], max_bytes: int
) -> Iterator[Sequence[tuple[bytes, int, str]]]:
    """``items`` in parts of about ``max_bytes`` record bytes each (at least one record)."""
    start, total = 0, 0
    for i, (_, size, _) in enumerate(items):
        if i > start and total + size > max_bytes:
            yield items[start:i]
            start, total = i, 0
        total += size
    yield items[start:]


def _from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _disk_bytes(path: Path) -> int:
    total = 0
    for candidate in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
        try:
            total += candidate.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
