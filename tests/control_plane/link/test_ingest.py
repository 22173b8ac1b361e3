"""Idempotent ingestion of node records, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.errors import InvalidInputError, PayloadTooLargeError
from control_plane.link.ingest import IncomingRecord, IngestLimits, RecordIngest, validate_batch
from control_plane.nodes.service import NodeService
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


@pytest.fixture
def node_id(nodes: NodeService) -> str:
    from tests.control_plane.nodes.conftest import OPERATOR

    token, _ = nodes.create_bootstrap_token(OPERATOR, "gates", {}, timedelta(hours=1))
    return nodes.enroll(token, make_csr(), agent_version="0.1.0", transport="grpc").node_id


@pytest.fixture
def ingest(sessions: sessionmaker[Session], clock: ManualClock) -> RecordIngest:
    return RecordIngest(sessions, clock)


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
    ],
)
def test_malformed_records_refuse_the_batch(
    ingest: RecordIngest, node_id: str, bad: IncomingRecord, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ingest.store(node_id, [record(1), bad])
    assert ingest.count(node_id) == 0


def test_limits() -> None:
    limits = IngestLimits(max_records=2, max_payload_bytes=10)
    with pytest.raises(PayloadTooLargeError):
        validate_batch([record(1), record(2), record(3)], limits)
    with pytest.raises(PayloadTooLargeError):
        validate_batch([record(1, payload=b"x" * 11)], limits)
