"""An ``event`` record's payload (``edgefleet.fleet.v1.Event``, events.proto) read for the
event store.

Pure: bytes in, `EventFacts` (the columns queries use and the event as a JSON document)
out, or `EventWireError` naming what is wrong. Not for storing (``store``) or for the
node's side of the contract (``edge_node.aggregation.wire``, which this never imports).
An event record (``application/x-protobuf``) that cannot be read is not a reason to
refuse its batch: the record stays in ``node_records`` as sent, the event store leaves it
out, the inbox counts it (``bad-event``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, Final, NamedTuple, Protocol

from google.protobuf.message import DecodeError

from protos.edgefleet.fleet.v1 import events_pb2

__all__ = [
    "EVENT_CONTENT_TYPE",
    "EVENT_KIND",
    "EVENT_SCHEMA",
    "EventFacts",
    "EventWireError",
    "UnreadableEvent",
    "read_event",
    "split_events",
]

EVENT_KIND: Final = "event"
EVENT_SCHEMA: Final = "edgefleet.event/1"
EVENT_CONTENT_TYPE: Final = "application/x-protobuf"
# Column widths of fleet_events (migration 0012).
MAX_TYPE: Final = 64
MAX_RULE_ID: Final = 128
_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_TYPE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# An event time the store can sort and keep: after the epoch, before the year 9999.
_MIN_SECONDS: Final = 1
_MAX_SECONDS: Final = 253_402_300_799


class EventWireError(ValueError):
    """The payload is not a readable ``edgefleet.event/1``; the message names the field."""


class _Record(Protocol):
    """What is read of a node record (``link.records.IncomingRecord`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def content_type(self) -> str: ...
    @property
    def payload(self) -> bytes: ...


class EventFacts(NamedTuple):
    """A readable event record: what ``fleet_events`` stores of it."""

    record_id: str
    seq: int
    event_id: str
    type: str
    rule_id: str
    occurred_at: datetime
    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class UnreadableEvent:
    """An event record the store leaves out, and why."""

    index: int
    record_id: str
    message: str


def _time(seconds: int, nanos: int, field: str) -> datetime:
    if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000):
        raise EventWireError(f"event.{field}: not a time after 1970 and before 9999")
    return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)


def _text(value: str, field: str, limit: int = 256) -> str:
    if "\x00" in value:  # PostgreSQL takes no NUL in text or JSONB
        raise EventWireError(f"event.{field}: holds a NUL character")
    if len(value) > limit:
        raise EventWireError(f"event.{field}: longer than {limit} characters")
    return value


def read_event(record: _Record) -> EventFacts:
    """One ``event`` record read as ``edgefleet.event/1``; unknown fields are ignored."""
    if record.content_type != EVENT_CONTENT_TYPE:
        raise EventWireError(
            f"event: content type {record.content_type!r}, expected {EVENT_CONTENT_TYPE}"
        )
    message = events_pb2.Event()
    try:
        message.ParseFromString(record.payload)
    except (DecodeError, RecursionError) as exc:
        raise EventWireError(f"event: the payload is not an Event message ({exc})") from None
    if message.schema != EVENT_SCHEMA:
        raise EventWireError(f"event.schema: {message.schema[:64]!r}, expected {EVENT_SCHEMA}")
    if not _UUID.match(message.event_id):
        raise EventWireError("event.event_id: not a lowercase UUID")
    if not _TYPE.match(message.type):
        raise EventWireError(
            "event.type: expected lowercase letters, digits and . _ - (at most 64)"
        )
    rule_id = _text(message.rule_id, "rule_id", MAX_RULE_ID)
    if not rule_id:
        raise EventWireError("event.rule_id: empty")
    if not message.HasField("occurred_at"):
        raise EventWireError("event.occurred_at: missing")
    occurred_at = _time(message.occurred_at.seconds, message.occurred_at.nanos, "occurred_at")
    return EventFacts(
        record_id=record.id,
        seq=record.seq,
        event_id=message.event_id,
        type=message.type,
        rule_id=rule_id,
        occurred_at=occurred_at,
        document=_document(message, occurred_at),
    )


def _document(message: events_pb2.Event, occurred_at: datetime) -> dict[str, Any]:
    values: dict[str, float] = {}
    for key, value in sorted(message.values.items()):
        if not math.isfinite(value):  # JSON (and JSONB) have no NaN or infinity
            raise EventWireError(f"event.values[{key[:64]!r}]: not a finite number")
        values[_text(key, "values")] = value
    return {
        "schema": EVENT_SCHEMA,
        "event_id": message.event_id,
        "type": message.type,
        "rule_id": message.rule_id,
        "occurred_at": occurred_at.isoformat(),
        "entities": [
            {
                "kind": _text(e.kind, "entities.kind"),
                "id": _text(e.id, "entities.id"),
                "class_name": _text(e.class_name, "entities.class_name"),
                "camera": _text(e.camera, "entities.camera"),
            }
            for e in message.entities
        ],
        "evidence": [
            {
                "camera": _text(e.camera, "evidence.camera"),
                "frame_seq": e.frame_seq,
                "captured_at": _time(
                    e.captured_at.seconds, e.captured_at.nanos, "evidence.captured_at"
                ).isoformat(),
                "observation_id": _text(e.observation_id, "evidence.observation_id"),
            }
            for e in message.evidence
        ],
        "provenance": [
            {
                "origin": _text(p.origin, "provenance.origin"),
                "model": _text(p.model, "provenance.model"),
                "model_version": _text(p.model_version, "provenance.model_version"),
                "firmware": _text(p.firmware, "provenance.firmware"),
            }
            for p in message.provenance
        ],
        "attributes": {
            _text(k, "attributes"): _text(v, "attributes")
            for k, v in sorted(message.attributes.items())
        },
        "values": values,
    }


_KIND_OF: Final = attrgetter("kind")
_TYPE_OF: Final = attrgetter("content_type")


def split_events(
    records: Sequence[_Record],
) -> tuple[list[EventFacts], list[UnreadableEvent]]:
    """The batch's readable events and its unreadable event records (by index).

    Call on a batch that passed ``link.records.validate_batch``; records of other kinds,
    and event records not in `EVENT_CONTENT_TYPE`, are not looked at.
    """
    events: list[EventFacts] = []
    unreadable: list[UnreadableEvent] = []
    # One pass in C over the kinds and content types (this runs for every batch
    # ingested); a batch without protobuf event records is left at that.
    if (EVENT_KIND, EVENT_CONTENT_TYPE) not in set(
        zip(map(_KIND_OF, records), map(_TYPE_OF, records), strict=True)
    ):
        return events, unreadable
    for index, record in enumerate(records):
        # An event record in another content type does not claim to be an
        # edgefleet.event/1 (the link tests' JSON stand-ins, a future encoding): it is
        # kept as raw history in node_records only, and not counted as unreadable.
        if record.kind != EVENT_KIND or record.content_type != EVENT_CONTENT_TYPE:
            continue
        try:
            events.append(read_event(record))
        except EventWireError as exc:
            unreadable.append(UnreadableEvent(index, record.id, str(exc)))
    return events, unreadable
