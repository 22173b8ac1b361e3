"""The event's wire form (events.proto): every field carried, times to the microsecond,
the same event encoded to the same bytes."""

from __future__ import annotations

from edge_node.aggregation.model import Entity, Event, Evidence, event_id
from edge_node.aggregation.wire import EVENT_SCHEMA, decode_event, encode_event, event_to_wire
from tests.edge_node.aggregation.builders import PROV, PROV_V2, T0

EVENT = Event(
    event_id=event_id("transit", "transit.completed", "AB123", "gate-a", T0),
    type="transit.completed",
    rule_id="transit",
    at=T0 + 840.123456,
    entities=(Entity("plate", "AB123", "vehicle"),),
    evidence=(
        Evidence("gate-a", 17, T0, "m-1"),
        Evidence("gate-b", 9, T0 + 840.123456, "m-2"),
    ),
    provenance=(PROV, PROV_V2),
    attributes={"entered_camera": "gate-a", "left_camera": "gate-b"},
    values={"delta_s": 840.123456, "entered_at": T0},
)


def test_an_event_survives_the_wire() -> None:
    message = event_to_wire(EVENT)
    assert message.schema == EVENT_SCHEMA
    assert message.occurred_at.seconds == int(T0) + 840
    assert message.occurred_at.nanos == 123456000
    back = decode_event(encode_event(EVENT))
    assert back.event_id == EVENT.event_id
    assert back.entities == EVENT.entities
    assert back.provenance == EVENT.provenance
    assert [(e.camera, e.frame_seq, e.observation_id) for e in back.evidence] == [
        ("gate-a", 17, "m-1"),
        ("gate-b", 9, "m-2"),
    ]
    assert abs(back.at - EVENT.at) < 1e-6
    assert back.attributes == EVENT.attributes
    assert back.values == EVENT.values


def test_the_same_event_is_the_same_bytes() -> None:
    reordered = Event(
        **{f: getattr(EVENT, f) for f in EVENT.__dataclass_fields__ if f != "values"},
        values={"entered_at": T0, "delta_s": 840.123456},
    )
    assert encode_event(reordered) == encode_event(EVENT)


def test_event_ids_are_uuid5_of_the_facts() -> None:
    a = event_id("r", "zone.intrusion", "cam/1", 5)
    assert a == event_id("r", "zone.intrusion", "cam/1", 5)
    assert a != event_id("r", "zone.intrusion", "cam/1", 6)
    assert a != event_id("r2", "zone.intrusion", "cam/1", 5)
    assert a[14] == "5"  # the version nibble of a uuid5
