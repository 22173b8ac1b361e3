"""Fuzzing a node's record batch as the control plane decodes it (hypothesis, bounded).

The uplink's path, pure: bytes → `RecordBatch` (protobuf's `DecodeError`) →
`wire.incoming_records` and `records.validate_batch` (`InvalidInputError`,
`PayloadTooLargeError`: the batch refused) → `records.split_results` (an unreadable
results record left out and named, never raised). Nothing else may escape, and every
record of an accepted batch is accounted for.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from google.protobuf.message import DecodeError
from hypothesis import given

from control_plane.errors import InvalidInputError, PayloadTooLargeError
from control_plane.link import wire
from control_plane.link.records import IngestLimits, split_results, validate_batch
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.link.test_results_store import document
from tests.fuzz_support import FUZZ, wire_bytes

LIMITS = IngestLimits()


def _batch() -> bytes:
    batch = link_pb2.RecordBatch()
    for seq, (kind, content_type, payload) in enumerate(
        [
            (link_pb2.RECORD_KIND_HEALTH, "application/json", b'{"rss_mb": 120}'),
            (link_pb2.RECORD_KIND_RESULTS, "application/json", json.dumps(document()).encode()),
            (link_pb2.RECORD_KIND_EVENT, "application/x-protobuf", b"\x0a\x02ev"),
        ],
        start=1,
    ):
        record = batch.records.add(
            id=f"0190a1b2-c3d4-7e5f-8a9b-{seq:012x}",
            seq=seq,
            kind=kind,
            content_type=content_type,
            payload=payload,
        )
        record.created_at.FromDatetime(datetime(2026, 12, 1, 9, seq, tzinfo=UTC))
    return batch.SerializeToString()


VALID = _batch()


def decode(payload: bytes) -> str:
    """What the control plane makes of `payload`: 'refused' or 'accepted'."""
    try:
        batch = link_pb2.RecordBatch.FromString(payload)
        records = wire.incoming_records(batch)
        validate_batch(records, LIMITS)
    except (DecodeError, InvalidInputError, PayloadTooLargeError):
        return "refused"
    others, results, unreadable = split_results(records)
    assert len(others) + len(results) + len(unreadable) == len(records)
    return "accepted"


def test_the_valid_batch_is_accepted_whole() -> None:
    assert decode(VALID) == "accepted"
    records = wire.incoming_records(link_pb2.RecordBatch.FromString(VALID))
    others, results, unreadable = split_results(records)
    assert (len(others), len(results), unreadable) == (2, 1, [])


@FUZZ
@given(payload=wire_bytes(VALID))
def test_any_bytes_are_a_batch_or_a_refusal(payload: bytes) -> None:
    assert decode(payload) in {"accepted", "refused"}


@FUZZ
@given(payload=wire_bytes(VALID))
def test_any_node_message_is_read_or_refused(payload: bytes) -> None:
    # The MQTT uplink reads a NodeMessage; its hello and status go through `wire` too.
    try:
        message = link_pb2.NodeMessage.FromString(payload)
        if message.HasField("hello"):
            wire.hello_state(message)
        if message.HasField("update_status"):
            wire.update_status(message.update_status)
        if message.HasField("records"):
            validate_batch(wire.incoming_records(message.records), LIMITS)
    except (DecodeError, InvalidInputError, PayloadTooLargeError):
        pass
