"""Domain events to their wire form, ``edgefleet.fleet.v1.Event`` (events.proto), and back.

Pure mapping: what the outbox stores as an ``events`` record's payload is
``encode_event(event)``. Times keep microseconds (the event id is computed at that
precision too). ``event_from_wire`` is for readers and tests; it takes what it knows.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.timestamp_pb2 import Timestamp

from edge_node.aggregation.model import Entity, Event, Evidence, Provenance
from protos.edgefleet.fleet.v1 import events_pb2

__all__ = ["EVENT_SCHEMA", "decode_event", "encode_event", "event_from_wire", "event_to_wire"]

EVENT_SCHEMA: Final = "edgefleet.event/1"


def _set_time(target: Timestamp, at: float) -> None:
    micros = round(at * 1_000_000)
    seconds = micros // 1_000_000
    target.seconds = seconds
    target.nanos = (micros - seconds * 1_000_000) * 1000


def _time(source: Timestamp) -> float:
    return source.seconds + source.nanos / 1e9


def event_to_wire(event: Event) -> events_pb2.Event:
    message = events_pb2.Event(
        schema=EVENT_SCHEMA, event_id=event.event_id, type=event.type, rule_id=event.rule_id
    )
    _set_time(message.occurred_at, event.at)
    for entity in event.entities:
        message.entities.add(
            kind=entity.kind, id=entity.id, class_name=entity.class_name, camera=entity.camera
        )
    for evidence in event.evidence:
        item = message.evidence.add(
            camera=evidence.camera,
            frame_seq=evidence.frame_seq,
            observation_id=evidence.observation_id,
        )
        _set_time(item.captured_at, evidence.at)
    for provenance in event.provenance:
        message.provenance.add(
            origin=provenance.origin,
            model=provenance.model,
            model_version=provenance.model_version,
            firmware=provenance.firmware,
        )
    message.attributes.update(event.attributes)
    message.values.update(event.values)
    return message


def encode_event(event: Event) -> bytes:
    """The outbox payload of one event (deterministic: map entries in sorted order)."""
    return event_to_wire(event).SerializeToString(deterministic=True)


def event_from_wire(message: events_pb2.Event) -> Event:
    return Event(
        event_id=message.event_id,
        type=message.type,
        rule_id=message.rule_id,
        at=_time(message.occurred_at),
        entities=tuple(Entity(e.kind, e.id, e.class_name, e.camera) for e in message.entities),
        evidence=tuple(
            Evidence(e.camera, e.frame_seq, _time(e.captured_at), e.observation_id)
            for e in message.evidence
        ),
        provenance=tuple(
            Provenance(
                "device" if p.origin == "device" else "node", p.model, p.model_version, p.firmware
            )
            for p in message.provenance
        ),
        attributes=dict(message.attributes),
        values=dict(message.values),
    )


def decode_event(payload: bytes) -> Event:
    return event_from_wire(events_pb2.Event.FromString(payload))
