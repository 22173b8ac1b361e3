"""Idempotent ingestion of node records, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.errors import InvalidInputError, PayloadTooLargeError, UnavailableError
from control_plane.link.ingest import LoopGroupCommit, RecordIngest, ValidatedBatch
from control_plane.link.records import IncomingRecord, IngestLimits, validate_batch
from control_plane.nodes.wiring import NodeServices
from control_plane.storage.models import NodeRecordRow
from tests.control_plane.identity.helpers import make_csr


def record(seq: int, kind: str = "event", payload: bytes = b"{}") -> IncomingRecord:
    return IncomingRecord(
        id=str(uuid.uuid4()),
        seq=seq,
        kind=kind,
        created_at=datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=seq),
        content_type="application/json",
        payload=payload,
    )


def node_id_of(nodes: NodeServices) -> str:
    """A newly enrolled node's id."""
    from tests.control_plane.nodes.conftest import OPERATOR

    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, timedelta(hours=1))
    return nodes.enrollment.enroll(
        token, make_csr(), agent_version="0.1.0", transport="grpc"
    ).node_id


@pytest.fixture
def node_id(nodes: NodeServices) -> str:
    return node_id_of(nodes)


@pytest.fixture
def ingest(sessions: sessionmaker[Session], clock: ManualClock) -> Iterator[RecordIngest]:
    ingest = RecordIngest(sessions, clock)
    yield ingest
    ingest.close()


def test_a_batch_is_stored_once_however_often_it_is_sent(
    ingest: RecordIngest, node_id: str
) -> None:
    batch = [record(i, "event" if i % 2 else "health") for i in range(1, 11)]
    assert ingest.store(node_id, batch) == [r.id for r in batch]
    # a resend after a lost ack, and an overlapping batch
    assert ingest.store(node_id, batch) == [r.id for r in batch]
    more = [*batch[5:], record(11)]
    assert ingest.store(node_id, more) == [r.id for r in more]
    assert ingest.record_ids(node_id) == {r.id for r in [*batch, more[-1]]}
    assert ingest.count(node_id, "event") == 6
    assert ingest.count(node_id, "health") == 5


def test_an_empty_batch_is_fine(ingest: RecordIngest, node_id: str) -> None:
    assert ingest.store(node_id, []) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            IncomingRecord("not-a-uuid", 1, "event", datetime.now(UTC), "application/json", b""),
            "UUID",
        ),
        (IncomingRecord(str(uuid.uuid4()), 1, "metric", datetime.now(UTC), "a/b", b""), "kind"),
        (IncomingRecord(str(uuid.uuid4()), 0, "event", datetime.now(UTC), "a/b", b""), "seq"),
        (IncomingRecord(str(uuid.uuid4()), 1, "event", datetime(2026, 1, 1), "a/b", b""), "zone"),
        (IncomingRecord(str(uuid.uuid4()), 1, "event", datetime.now(UTC), "nope", b""), "content"),
        (
            IncomingRecord(str(uuid.uuid4()) + "\n", 1, "event", datetime.now(UTC), "a/b", b""),
            "UUID",
        ),
        (
            IncomingRecord(str(uuid.uuid4()), 1, "event", datetime.now(UTC), "a/b\n", b""),
            "content",
        ),
        (
            IncomingRecord(
                str(uuid.uuid4()), 1, "event", datetime.now(UTC), "a/b", b"x" * (256 * 1024 + 1)
            ),
            "payload of 262145 bytes",
        ),
    ],
)
def test_malformed_records_refuse_the_batch(
    ingest: RecordIngest, node_id: str, bad: IncomingRecord, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ingest.store(node_id, [record(1), bad])
    assert ingest.count(node_id) == 0


def test_the_content_types_taken_without_the_regex_would_pass_it() -> None:
    from control_plane.link import records as module

    assert all(module._CONTENT_TYPE.match(t) for t in module._COMMON_CONTENT_TYPES)


def test_limits() -> None:
    limits = IngestLimits(max_records=2, max_payload_bytes=10)
    with pytest.raises(PayloadTooLargeError):
        validate_batch([record(1), record(2), record(3)], limits)
    with pytest.raises(PayloadTooLargeError):
        validate_batch([record(1, payload=b"x" * 11)], limits)


# ------------------------------------------------------------------ group commit


# The tests that hold the first commit up count groups of one writer.
ONE_WRITER = IngestLimits(writers=1)


class GatedSessions:
    """A session factory whose first `gated` transactions wait for `open` (a slow disk)."""

    def __init__(self, sessions: sessionmaker[Session], gated: int = 1) -> None:
        self._sessions = sessions
        self.open = threading.Event()
        self.entered = threading.Event()
        self.gated = gated
        self.calls = 0

    def __call__(self) -> Session:
        self.calls += 1
        if self.calls <= self.gated:
            self.entered.set()
            assert self.open.wait(10), "the test never opened the gate"
        return self._sessions()


def test_batches_waiting_for_a_commit_share_the_next_one(
    sessions: sessionmaker[Session], clock: ManualClock, nodes: NodeServices, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, ONE_WRITER)  # type: ignore[arg-type]
    try:
        first = ingest.submit(node_id, [record(1)])
        assert gate.entered.wait(10)
        # While the first commit is held up, ten more batches arrive.
        batches = [[record(10 * i + j) for j in range(1, 4)] for i in range(1, 11)]
        futures = [ingest.submit(node_id, b) for b in batches]
        assert not any(f.done() for f in futures)
        gate.open.set()
        (first_id,) = first.result(10)
        for future, sent in zip(futures, batches, strict=True):
            assert future.result(10) == [r.id for r in sent]
        assert (ingest.groups, ingest.grouped_batches) == (2, 11)
        assert ingest.count(node_id) == 31
        assert first_id in ingest.record_ids(node_id)
    finally:
        gate.open.set()
        ingest.close()


def _refuse_poison(sessions: sessionmaker[Session]) -> None:
    """A constraint the database enforces and validation does not know: payload "poison"."""
    with sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(
                text(
                    "ALTER TABLE node_records ADD CONSTRAINT no_poison "
                    "CHECK (payload <> 'poison'::bytea)"
                )
            )
        else:
            session.execute(
                text(
                    "CREATE TRIGGER no_poison BEFORE INSERT ON node_records "
                    "WHEN NEW.payload = CAST('poison' AS BLOB) "
                    "BEGIN SELECT RAISE(ABORT, 'poison'); END"
                )
            )
        session.commit()


def test_a_batch_that_breaks_a_constraint_fails_alone(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str, nodes: NodeServices
) -> None:
    _refuse_poison(sessions)
    other = node_id_of(nodes)
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, ONE_WRITER)  # type: ignore[arg-type]
    try:
        held = ingest.submit(node_id, [record(1)])
        assert gate.entered.wait(10)
        good = [record(2), record(3)]
        good_future = ingest.submit(node_id, good)
        poisoned = ingest.submit(other, [record(4), record(5, payload=b"poison")])
        gate.open.set()
        assert held.result(10) and good_future.result(10) == [r.id for r in good]
        with pytest.raises(InvalidInputError, match="cannot be stored"):
            poisoned.result(10)
        assert ingest.count(node_id) == 3
        assert ingest.count(other) == 0  # the batch fails whole, its good record too
    finally:
        gate.open.set()
        ingest.close()


def test_a_database_outage_fails_the_group_and_stores_nothing(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    def down() -> Session:
        raise OperationalError("INSERT", {}, ConnectionRefusedError("database down (test)"))

    ingest = RecordIngest(down, clock)  # type: ignore[arg-type]
    try:
        with pytest.raises(OperationalError):
            ingest.submit(node_id, [record(1)]).result(10)
    finally:
        ingest.close()
    assert RecordIngest(sessions, clock).count(node_id) == 0


def test_a_cancelled_submission_is_not_stored(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, ONE_WRITER)  # type: ignore[arg-type]
    try:
        held = ingest.submit(node_id, [record(1)])
        assert gate.entered.wait(10)
        gave_up = ingest.submit(node_id, [record(2)])
        assert gave_up.cancel()  # a gRPC stream that ended before its commit
        kept = ingest.submit(node_id, [record(3)])
        gate.open.set()
        assert held.result(10) and kept.result(10)
        assert ingest.count(node_id) == 2
    finally:
        gate.open.set()
        ingest.close()


def test_close_stores_what_was_submitted_then_refuses(ingest: RecordIngest, node_id: str) -> None:
    futures = [ingest.submit(node_id, [record(i)]) for i in range(1, 21)]
    ingest.close()
    assert all(f.result(0) for f in futures)
    assert ingest.count(node_id) == 20
    with pytest.raises(UnavailableError, match="closed"):
        ingest.submit(node_id, [record(21)])


def test_a_full_queue_refuses_instead_of_blocking(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, IngestLimits(max_queued_batches=2, writers=1))  # type: ignore[arg-type]
    try:
        ingest.submit(node_id, [record(1)])
        assert gate.entered.wait(10)
        ingest.submit(node_id, [record(2)])
        ingest.submit(node_id, [record(3)])
        with pytest.raises(UnavailableError, match="waiting for the database") as refused:
            ingest.submit(node_id, [record(4)])
        assert refused.value.fields["reason"] == "ingest-backlog"
    finally:
        gate.open.set()
        ingest.close()
    assert RecordIngest(sessions, clock).count(node_id) == 3


def test_a_malformed_batch_is_refused_at_submit(ingest: RecordIngest, node_id: str) -> None:
    with pytest.raises(InvalidInputError, match="seq"):
        ingest.submit(node_id, [record(1), record(0)])
    assert ingest.submit(node_id, []).result(0) == []
    assert ingest.count(node_id) == 0


def test_stored_timestamps_read_back_exactly_through_the_orm(
    ingest: RecordIngest, sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    # The insert bypasses the ORM; the ORM must still read what it wrote, to the microsecond.
    created = datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=timezone(timedelta(hours=2)))
    sent = IncomingRecord(str(uuid.uuid4()), 7, "health", created, "application/json", b"\x00{}")
    ingest.submit(node_id, [sent]).result(10)
    with sessions() as session:
        row = session.scalars(select(NodeRecordRow)).one()
    assert row.created_at == created and row.created_at.tzinfo is not None
    assert row.received_at == clock.now()
    assert (row.node_id, row.record_id, row.seq, row.kind) == (node_id, sent.id, 7, "health")
    assert (row.content_type, row.payload) == ("application/json", b"\x00{}")
    # Reads that compare timestamps in SQL see them in order.
    with sessions() as session:
        later = session.scalars(
            select(NodeRecordRow.record_id).where(NodeRecordRow.created_at > created)
        ).all()
        earlier = session.scalars(
            select(NodeRecordRow.record_id).where(
                NodeRecordRow.created_at > created - timedelta(microseconds=1)
            )
        ).all()
    assert later == [] and earlier == [sent.id]


# ------------------------------------------------------- group commit on a loop


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_streams_on_one_loop_share_group_commits(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock)  # type: ignore[arg-type]
    groups = LoopGroupCommit(ingest, flushers=1)
    first = asyncio.create_task(groups.store(node_id, [record(1)]))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    batches = [[record(10 * i + j) for j in range(1, 4)] for i in range(1, 11)]
    rest = [asyncio.create_task(groups.store(node_id, b)) for b in batches]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in rest)
    gate.open.set()
    assert len(await asyncio.wait_for(first, 10)) == 1
    for task, sent in zip(rest, batches, strict=True):
        assert await asyncio.wait_for(task, 10) == [r.id for r in sent]
    assert (ingest.groups, ingest.grouped_batches) == (2, 11)
    assert ingest.count(node_id) == 31


@pytest.mark.anyio
async def test_a_stream_that_ends_does_not_cancel_its_neighbours(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock)  # type: ignore[arg-type]
    groups = LoopGroupCommit(ingest, flushers=1)
    held = asyncio.create_task(groups.store(node_id, [record(1)]))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    gone = asyncio.create_task(groups.store(node_id, [record(2)]))
    kept = asyncio.create_task(groups.store(node_id, [record(3)]))
    await asyncio.sleep(0.05)
    gone.cancel()  # its stream ended; the group it joined commits anyway
    gate.open.set()
    assert await asyncio.wait_for(held, 10) and await asyncio.wait_for(kept, 10)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert ingest.count(node_id) == 3  # stored, never acked: the node resends, deduplicated


@pytest.mark.anyio
async def test_loop_group_commit_errors_and_limits(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    _refuse_poison(sessions)

    def down() -> Session:
        raise OperationalError("COPY", {}, ConnectionRefusedError("database down (test)"))

    failing = LoopGroupCommit(RecordIngest(down, clock))  # type: ignore[arg-type]
    with pytest.raises(OperationalError):
        await failing.store(node_id, [record(1)])
    with pytest.raises(InvalidInputError, match="seq"):
        await failing.store(node_id, [record(0)])
    assert await failing.store(node_id, []) == []

    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, IngestLimits(max_queued_batches=1))  # type: ignore[arg-type]
    groups = LoopGroupCommit(ingest, flushers=1)
    held = asyncio.create_task(groups.store(node_id, [record(2)]))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    parked = asyncio.create_task(groups.store(node_id, [record(3)]))
    await asyncio.sleep(0.05)
    with pytest.raises(UnavailableError, match="waiting for the database"):
        await groups.store(node_id, [record(4)])
    poisoned = asyncio.create_task(
        LoopGroupCommit(ingest).store(node_id, [record(5, payload=b"poison")])
    )
    gate.open.set()
    assert await asyncio.wait_for(held, 10) and await asyncio.wait_for(parked, 10)
    with pytest.raises(InvalidInputError, match="cannot be stored"):
        await asyncio.wait_for(poisoned, 10)
    assert ingest.count(node_id) == 2


def test_a_failed_first_group_leaves_the_connection_usable(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    # On PostgreSQL the first group of a connection also creates its staging table; a
    # rollback takes the table with it, and the next group must create it again.
    _refuse_poison(sessions)
    ingest = RecordIngest(sessions, clock)
    with pytest.raises(InvalidInputError, match="cannot be stored"):
        ingest.submit(node_id, [record(1, payload=b"poison")]).result(10)
    for seq in range(2, 6):
        assert ingest.submit(node_id, [record(seq)]).result(10)
    ingest.close()
    assert ingest.count(node_id) == 4


@pytest.mark.anyio
async def test_a_second_group_commits_while_the_first_waits(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock)  # type: ignore[arg-type]
    groups = LoopGroupCommit(ingest, flushers=2)
    slow = asyncio.create_task(groups.store(node_id, [record(1)]))
    assert await asyncio.to_thread(gate.entered.wait, 10)
    # The first group is stuck on its connection; the next batches do not wait for it.
    quick = [asyncio.create_task(groups.store(node_id, [record(i)])) for i in range(2, 6)]
    done, _ = await asyncio.wait(quick, timeout=10)
    assert len(done) == 4 and not slow.done()
    gate.open.set()
    assert await asyncio.wait_for(slow, 10)
    assert ingest.count(node_id) == 5
    # Every flusher ended once nothing was parked: later batches start a new one.
    assert await groups.store(node_id, [record(6)])
    assert ingest.count(node_id) == 6
    with pytest.raises(ValueError, match="flusher"):
        LoopGroupCommit(ingest, flushers=0)


def test_a_resent_batch_takes_the_careful_path_on_postgresql(
    ingest: RecordIngest, sessions: sessionmaker[Session], node_id: str
) -> None:
    # PostgreSQL copies a group straight into the table; a record stored already makes
    # that fail on the primary key, and the group is stored again skipping duplicates.
    batch = [record(1), record(2)]
    ingest.store(node_id, batch)
    assert ingest.resent_groups == 0
    more = [batch[1], record(3)]
    assert ingest.store(node_id, more) == [r.id for r in more]
    postgresql = sessions.kw["bind"].dialect.name == "postgresql"
    assert ingest.resent_groups == (1 if postgresql else 0)
    assert ingest.count(node_id) == 3


def test_a_report_through_the_stage_is_stored_as_a_direct_copy_stores_it(
    ingest: RecordIngest, sessions: sessionmaker[Session], node_id: str
) -> None:
    # ADR 0021: reports up to 4 kB are stored uncompressed; a group holding a resend goes
    # through the staging table, which must not compress them on the way.
    if sessions.kw["bind"].dialect.name != "postgresql":
        pytest.skip("PostgreSQL's storage of long values")
    report = b'{"pad": "' + b"ab" * 1300 + b'"}'
    first = record(1, "health", report)
    ingest.store(node_id, [first])
    resent = [first, record(2, "health", report)]
    ingest.store(node_id, resent)
    assert ingest.resent_groups == 1
    with sessions() as session:
        sizes = (
            session.execute(
                text(
                    "SELECT pg_column_size(payload) FROM node_records WHERE node_id = :node "
                    "ORDER BY seq"
                ),
                {"node": node_id},
            )
            .scalars()
            .all()
        )
    assert len(sizes) == 2
    assert all(size >= len(report) for size in sizes)  # not compressed


def test_a_second_writer_commits_while_the_first_waits(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    gate = GatedSessions(sessions)
    ingest = RecordIngest(gate, clock, IngestLimits(writers=2))  # type: ignore[arg-type]
    try:
        slow = ingest.submit(node_id, [record(1)])
        assert gate.entered.wait(10)
        quick = [ingest.submit(node_id, [record(i)]) for i in range(2, 6)]
        for future in quick:
            assert future.result(10)  # not held up by the first writer's stuck commit
        assert not slow.done()
        gate.open.set()
        assert slow.result(10)
        assert ingest.count(node_id) == 5
    finally:
        gate.open.set()
        ingest.close()


def test_a_seq_beyond_the_column_is_refused_and_fails_no_neighbour(
    sessions: sessionmaker[Session], clock: ManualClock, node_id: str
) -> None:
    # seq is uint64 on the wire, a signed 64-bit integer in the table.
    ingest = RecordIngest(sessions, clock)
    huge = IncomingRecord(
        str(uuid.uuid4()), 2**63, "health", datetime.now(UTC), "application/json", b"{}"
    )
    with pytest.raises(InvalidInputError, match="seq"):
        ingest.submit(node_id, [huge])
    # Should one slip past validation, the group finds it and fails it alone.
    good = ingest.validated(node_id, [record(1)])
    bad = ValidatedBatch(node_id, [huge])
    outcomes = ingest.commit_group([good, bad])
    assert outcomes[0] == good.ids
    assert isinstance(outcomes[1], InvalidInputError)
    assert ingest.count(node_id) == 1
    ingest.close()
