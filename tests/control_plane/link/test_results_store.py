"""Sampled inference results: read at ingest, stored once, the newest K per node, on SQLite
and PostgreSQL; a document that cannot be read is acked, left out and named."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.errors import InvalidInputError, NotFoundError
from control_plane.link.ingest import LoopGroupCommit, RecordIngest
from control_plane.link.records import IncomingRecord, IngestLimits, read_result, split_results
from control_plane.nodes.results import NodeResults
from control_plane.nodes.wiring import NodeServices
from control_plane.storage.models import NodeResultRow
from protos.bundle.results import ResultWireError
from tests.control_plane.link.test_ingest import node_id_of, record

KEEP = 3


def document(stream: str = "gate", frame_id: int = 1, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "edgefleet.agent.results/1",
        "stream": stream,
        "frame_id": frame_id,
        "captured_at": "2026-12-01T09:00:00.040000Z",
        "model": "detector",
        "version": "1.1.0",
        "kind": "detection",
        "latency_ms": {"queue": 1.0, "preprocess": 2.0, "inference": 10.0, "decode": 0.5},
        "detections": [
            {"class_id": 0, "label": "person", "score": 0.91, "box": [0.1, 0.2, 0.3, 0.4]}
        ],
        "detections_total": 1,
        "tensors": [],
    }
    doc.update(changes)
    return doc


def results_record(seq: int, doc: dict[str, Any] | None = None, **kw: Any) -> IncomingRecord:
    payload = json.dumps(doc if doc is not None else document(frame_id=seq)).encode()
    return IncomingRecord(
        id=str(uuid.uuid4()),
        seq=seq,
        kind="results",
        created_at=datetime(2026, 12, 1, tzinfo=UTC) + timedelta(seconds=seq),
        content_type=kw.get("content_type", "application/json"),
        payload=kw.get("payload", payload),
    )


@pytest.fixture
def node_id(nodes: NodeServices) -> str:
    return node_id_of(nodes)


@pytest.fixture
def ingest(sessions: sessionmaker[Session], clock: ManualClock) -> Iterator[RecordIngest]:
    ingest = RecordIngest(sessions, clock, IngestLimits(results_per_node=KEEP))
    yield ingest
    ingest.close()


def stored(sessions: sessionmaker[Session], node_id: str) -> list[int]:
    with sessions() as session:
        return list(
            session.scalars(
                select(NodeResultRow.seq)
                .where(NodeResultRow.node_id == node_id)
                .order_by(NodeResultRow.seq)
            )
        )


def test_results_are_kept_apart_newest_k_per_node_and_stored_once(
    ingest: RecordIngest, sessions: sessionmaker[Session], nodes: NodeServices, node_id: str
) -> None:
    other = node_id_of(nodes)
    batch = [record(1, "health"), results_record(2), record(3), results_record(4)]
    assert set(ingest.store(node_id, batch)) == {r.id for r in batch}
    assert ingest.count(node_id) == 2  # node_records: the event and the health report only
    assert stored(sessions, node_id) == [2, 4]

    later = [results_record(seq) for seq in range(5, 9)]
    ingest.store(node_id, later)
    ingest.store(other, [results_record(1)])
    assert stored(sessions, node_id) == [6, 7, 8]  # the newest three by sequence
    assert stored(sessions, other) == [1]  # per node

    # A resend after a lost ack: acked again, stored once; an old one comes back and goes.
    assert ingest.store(node_id, later) == [r.id for r in later]
    assert ingest.store(node_id, [batch[1]]) == [batch[1].id]
    assert stored(sessions, node_id) == [6, 7, 8]
    with sessions() as session:
        rows = session.scalar(select(func.count()).select_from(NodeResultRow))
    assert rows == KEEP + 1


def test_the_group_commit_paths_store_results_too(
    ingest: RecordIngest, sessions: sessionmaker[Session], node_id: str
) -> None:
    # A results-only batch (the node sends results apart), through both group commits.
    only = [results_record(1), results_record(2)]
    assert sorted(ingest.submit(node_id, only).result(timeout=30)) == sorted(r.id for r in only)

    async def on_the_loop() -> list[str]:
        return await LoopGroupCommit(ingest).store(node_id, [record(3), results_record(4)])

    assert len(asyncio.run(on_the_loop())) == 2
    assert stored(sessions, node_id) == [1, 2, 4]
    assert ingest.count(node_id, "event") == 1


def test_an_unreadable_result_is_acked_and_left_out_the_rest_stored(
    ingest: RecordIngest, sessions: sessionmaker[Session], node_id: str
) -> None:
    bad = results_record(2, document(captured_at="yesterday"))
    batch = [record(1), bad, results_record(3)]
    validated = ingest.validated(node_id, batch)
    assert [u.record_id for u in validated.unreadable] == [bad.id]
    assert "results.captured_at" in validated.unreadable[0].message
    assert set(ingest.store(node_id, batch)) == {r.id for r in batch}
    assert stored(sessions, node_id) == [3]
    assert ingest.count(node_id) == 1


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (results_record(1, document(schema="edgefleet.agent.results/0")), "not an edgefleet"),
        (results_record(1, document(stream="")), "results.stream"),
        (results_record(1, document(frame_id="7")), "results.frame_id"),
        (results_record(1, document(version=7)), "results.version"),
        (results_record(1, document(detections={"a": 1})), "results.detections"),
        (results_record(1, document(captured_at="2026-12-01T09:00:00")), "results.captured_at"),
        (results_record(1, document(model="m\x00")), "NUL"),
        (results_record(1, payload=b'{"schema": NaN}'), "not JSON"),
        (results_record(1, payload=b"\xff\xfe"), "not JSON"),
        (results_record(1, payload=b"[" * 100_000), "not JSON"),
        (results_record(1, payload=b"[1, 2]"), "not a JSON object"),
        (results_record(1, content_type="application/x-protobuf"), "content type"),
    ],
)
def test_what_makes_a_results_document_unreadable_is_named(bad: IncomingRecord, named: str) -> None:
    with pytest.raises(ResultWireError, match=named):
        read_result(bad)
    others, results, unreadable = split_results([record(1), bad])
    assert (len(others), results, [u.index for u in unreadable]) == (1, [], [1])


def test_a_batch_without_results_passes_through_untouched() -> None:
    batch = [record(1), record(2, "health")]
    others, results, unreadable = split_results(batch)
    assert others is batch and results == [] and unreadable == []


def test_reading_them_back_newest_first_by_stream(
    ingest: RecordIngest, sessions: sessionmaker[Session], node_id: str
) -> None:
    ingest.store(
        node_id,
        [
            results_record(1, document("gate", 1)),
            results_record(2, document("yard", 2, version=None)),
            results_record(3, document("gate", 3)),
        ],
    )
    reader = NodeResults(sessions)
    newest = reader.recent(node_id)
    assert [(r.seq, r.stream, r.model_label) for r in newest] == [
        (3, "gate", "detector@1.1.0"),
        (2, "yard", "detector"),
        (1, "gate", "detector@1.1.0"),
    ]
    assert newest[0].captured_at == datetime(2026, 12, 1, 9, 0, 0, 40_000, tzinfo=UTC)
    assert newest[0].document["detections"][0]["label"] == "person"
    assert [r.seq for r in reader.recent(node_id, stream="gate", limit=1)] == [3]
    assert reader.recent(node_id, stream="nowhere") == []
    with pytest.raises(NotFoundError):
        reader.recent("n-000000000000")
    with pytest.raises(InvalidInputError) as caught:
        reader.recent(node_id, limit=0)
    assert caught.value.fields["reason"] == "bad-limit"


def test_keep_bounds_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="results_per_node"):
        IngestLimits(results_per_node=0)
