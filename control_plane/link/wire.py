"""Protobuf link messages to the control plane's plain values, for every transport.

Pure: the gRPC servicer and the MQTT bridge both decode `NodeMessage` bodies with these
functions, so a record or a Hello means the same thing whichever way it came. Checks
that need the database (is this node known?) stay in the services.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from control_plane.errors import InvalidInputError
from control_plane.link.records import IncomingRecord
from protos.edgefleet.fleet.v1 import director_pb2, link_pb2

__all__ = [
    "PROTOCOL_VERSION",
    "ack",
    "control_message",
    "desired",
    "hello_state",
    "incoming_records",
    "update_status",
]

PROTOCOL_VERSION: Final = 1
# An UpdateStatus's bounds (link.proto): what a node sends at most.
MAX_STATUS_REASON: Final = 128
MAX_STATUS_FACTS: Final = 32
MAX_FACT_KEY: Final = 64
MAX_FACT_VALUE: Final = 256

_KINDS: Final = {
    link_pb2.RECORD_KIND_EVENT: "event",
    link_pb2.RECORD_KIND_HEALTH: "health",
    link_pb2.RECORD_KIND_RESULTS: "results",
}
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Timestamp's own range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
_MIN_SECONDS: Final = -62_135_596_800
_MAX_SECONDS: Final = 253_402_300_799


def control_message(**body: Any) -> link_pb2.ControlMessage:
    """A ControlMessage with the current protocol version and one body field set."""
    return link_pb2.ControlMessage(protocol_version=PROTOCOL_VERSION, **body)


def desired(signed: director_pb2.SignedDirectorAssignment) -> link_pb2.ControlMessage:
    """The node's desired state: its signed director assignment, exactly as stored."""
    return control_message(desired=link_pb2.DesiredState(assignment=signed))


def ack(record_ids: list[str]) -> link_pb2.ControlMessage:
    return control_message(ack=link_pb2.Ack(record_ids=record_ids))


def incoming_records(batch: link_pb2.RecordBatch) -> list[IncomingRecord]:
    """The batch's records; `RecordIngest.store` validates ids, kinds and sizes.

    An unknown kind is passed through under a name `validate_batch` refuses, so the
    whole batch is refused with the index of the bad record.
    """
    # Per record, so kept lean (it was the largest share of the control plane's Python
    # time at 100 records a batch): plain datetime arithmetic instead of
    # Timestamp.ToDatetime, the tuple built without IncomingRecord's Python-level
    # __new__, and HasField (a third of the loop) asked only of a stamp that reads as
    # the epoch, which is what an unset one reads as.
    records: list[IncomingRecord] = []
    append = records.append
    make = tuple.__new__
    kinds = _KINDS
    epoch = _EPOCH
    delta = timedelta
    for index, record in enumerate(batch.records):
        stamp = record.created_at
        seconds = stamp.seconds
        nanos = stamp.nanos
        if not (0 <= nanos < 1_000_000_000 and _MIN_SECONDS <= seconds <= _MAX_SECONDS):
            raise InvalidInputError(f"record {index}: created_at is out of range", index=index)
        if seconds == 0 and nanos == 0 and not record.HasField("created_at"):
            raise InvalidInputError(f"record {index}: created_at is missing", index=index)
        kind = record.kind
        append(
            make(
                IncomingRecord,
                (
                    record.id,
                    record.seq,
                    kinds.get(kind) or f"unknown-{int(kind)}",
                    epoch + delta(0, seconds, nanos // 1000),  # positional: half the cost
                    record.content_type,
                    record.payload,
                ),
            )
        )
    return records


def hello_state(message: link_pb2.NodeMessage) -> dict[str, Any]:
    """The reported state a Hello carries, as plain JSON for `NodePresence.record_hello`.

    The node's own labels are kept apart from the operator's inventory labels: a node
    reports them, it does not set them.
    """
    hello = message.hello
    return {
        "protocol_version": message.protocol_version,
        "labels": dict(hello.labels),
        "installed_targets": list(hello.installed_targets),
        "active_target": hello.active_target,
        "capabilities": list(hello.capabilities),
        "director_sequence": hello.director_sequence,
    }


def update_status(status: link_pb2.UpdateStatus) -> dict[str, Any]:
    """An UpdateStatus as plain JSON for `NodePresence.record_update_status`.

    `reason` and `facts` are empty from nodes older than these fields (their `detail`
    still starts with the reason). Facts beyond the documented bounds are refused, with
    the field named, rather than cut: a node never sends them.
    """
    at = None
    if status.HasField("at"):
        try:
            at = status.at.ToDatetime(tzinfo=UTC).isoformat()
        except (ValueError, OverflowError) as exc:
            raise InvalidInputError("update status: `at` is out of range") from exc
    if len(status.reason) > MAX_STATUS_REASON:
        raise InvalidInputError(
            f"update status: `reason` is over {MAX_STATUS_REASON} characters", field="reason"
        )
    facts = dict(status.facts)
    if len(facts) > MAX_STATUS_FACTS:
        raise InvalidInputError(
            f"update status: {len(facts)} `facts`, at most {MAX_STATUS_FACTS}", field="facts"
        )
    for key, value in facts.items():
        if not 0 < len(key) <= MAX_FACT_KEY or len(value) > MAX_FACT_VALUE:
            raise InvalidInputError(
                f"update status: fact {key[:MAX_FACT_KEY]!r}: keys are 1..{MAX_FACT_KEY} and "
                f"values up to {MAX_FACT_VALUE} characters",
                field=f"facts.{key[:MAX_FACT_KEY]}",
            )
    return {
        "target_path": status.target_path,
        "phase": status.phase,
        "detail": status.detail,
        "director_sequence": status.director_sequence,
        "at": at,
        "reason": status.reason,
        "facts": dict(sorted(facts.items())),
    }
