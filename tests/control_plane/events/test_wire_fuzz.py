"""Fuzzing an event record's payload as the event store reads it (hypothesis, bounded).

`events.wire.read_event` answers `EventFacts` or raises `EventWireError` (a ValueError
naming the field), and `split_events` turns that into an `UnreadableEvent` the inbox
counts; no other exception, whatever the node sent.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from control_plane.events.wire import EventWireError, read_event, split_events
from edge_node.aggregation.wire import encode_event
from protos.edgefleet.fleet.v1 import events_pb2
from tests.control_plane.events.support import event, event_record
from tests.fuzz_support import FUZZ, wire_bytes

VALID = encode_event(event(1))


def test_the_valid_event_is_read() -> None:
    facts = read_event(event_record(1, VALID))
    assert (facts.type, facts.rule_id) == ("line.crossed", "gate-a-line")


@FUZZ
@given(payload=wire_bytes(VALID))
def test_any_payload_is_an_event_or_an_event_wire_error(payload: bytes) -> None:
    try:
        facts = read_event(event_record(1, payload))
    except EventWireError as exc:
        assert str(exc).startswith("event")
    else:
        # Stored as JSON(B): finite numbers, and no NUL in a string (PostgreSQL refuses it).
        stored = json.dumps(facts.document, allow_nan=False)
        assert "\\u0000" not in stored
        assert facts.document["event_id"] == facts.event_id


@FUZZ
@given(payload=wire_bytes(VALID))
def test_an_unreadable_event_is_left_out_and_counted_not_raised(payload: bytes) -> None:
    events, unreadable = split_events([event_record(1, VALID), event_record(2, payload)])
    assert len(events) + len(unreadable) == 2
    assert events[0].seq == 1
    assert [u.index for u in unreadable] in ([], [1])


@st.composite
def field_mutated_events(draw: st.DrawFn) -> bytes:
    """The valid event with fields set to hostile values (past the byte level, where
    most mutations stop at protobuf's own checks)."""
    message = events_pb2.Event.FromString(VALID)
    text = st.text(max_size=300)
    stamp = st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
    field = draw(st.sampled_from(("rule_id", "type", "attributes", "values", "times", "lists")))
    if field in ("rule_id", "type"):
        setattr(message, field, draw(text))
    elif field == "attributes":
        message.attributes[draw(text)] = draw(text)
    elif field == "values":
        message.values[draw(text)] = draw(st.floats(allow_nan=True, allow_infinity=True))
    elif field == "times":
        seconds, nanos = draw(stamp)
        target = draw(st.sampled_from(("occurred_at", "evidence")))
        at = message.occurred_at if target == "occurred_at" else message.evidence[0].captured_at
        at.seconds, at.nanos = seconds, nanos
    else:
        message.entities.add(kind=draw(text), id=draw(text))
        message.provenance.add(origin=draw(text), model=draw(text))
    return message.SerializeToString()


@FUZZ
@given(payload=field_mutated_events())
def test_hostile_field_values_are_read_or_refused_by_field(payload: bytes) -> None:
    try:
        facts = read_event(event_record(1, payload))
    except EventWireError as exc:
        assert str(exc).startswith("event")
    else:
        stored = json.dumps(facts.document, allow_nan=False)
        assert "\\u0000" not in stored
