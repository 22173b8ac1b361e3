"""The event store's pure cores: reading an event record, the query's rules, cursors."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from control_plane.errors import InvalidInputError
from control_plane.events.query import (
    EventQuery,
    EventsConfig,
    Position,
    decode_cursor,
    encode_cursor,
    time_bound,
)
from control_plane.events.wire import EventWireError, read_event, split_events
from edge_node.aggregation.wire import event_to_wire
from tests.control_plane.events.support import T0, event, event_record

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_an_event_is_read_as_the_node_wrote_it() -> None:
    sent = event(7)
    facts = read_event(event_record(3, sent))
    assert (facts.event_id, facts.type, facts.rule_id, facts.seq) == (
        sent.event_id,
        "line.crossed",
        "gate-a-line",
        3,
    )
    assert facts.occurred_at == T0 + timedelta(seconds=7)
    doc = facts.document
    assert doc["entities"] == [
        {"kind": "track", "id": "cam-1/7", "class_name": "person", "camera": "cam-1"}
    ]
    assert doc["evidence"][0]["frame_seq"] == 107
    assert doc["provenance"] == [
        {"origin": "node", "model": "detector", "model_version": "1.1.0", "firmware": ""}
    ]
    assert (doc["attributes"], doc["values"]) == (
        {"camera": "cam-1", "direction": "in"},
        {"count": 1.0},
    )


def _wire(**changes: object) -> bytes:
    message = event_to_wire(event(1))
    for name, value in changes.items():
        if name == "occurred_at":
            message.occurred_at.seconds = value  # type: ignore[assignment]
        elif name == "value":
            message.values["x"] = value  # type: ignore[assignment]
        else:
            setattr(message, name, value)
    return message.SerializeToString()


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (b"\xff\xff\xff", "not an Event message"),
        (_wire(schema="edgefleet.event/0"), "event.schema"),
        (_wire(event_id="not-a-uuid"), "event.event_id"),
        (_wire(type="Zone Intrusion"), "event.type"),
        (_wire(type=""), "event.type"),
        (_wire(rule_id=""), "event.rule_id"),
        (_wire(rule_id="r\x00"), "NUL"),
        (_wire(occurred_at=-5), "event.occurred_at"),
        (_wire(occurred_at=10**12), "event.occurred_at"),
        (_wire(value=float("nan")), "not a finite number"),
    ],
)
def test_what_makes_an_event_unreadable_is_named(payload: bytes, named: str) -> None:
    with pytest.raises(EventWireError, match=named):
        read_event(event_record(1, payload))
    events, unreadable = split_events([event_record(1, event(2)), event_record(2, payload)])
    assert (len(events), [u.index for u in unreadable]) == (1, [1])
    assert named in unreadable[0].message


def test_a_protobuf_event_with_unknown_fields_is_read() -> None:
    # A newer node's field 99 (varint 1): readers ignore what they do not know.
    facts = read_event(event_record(1, _wire() + b"\x98\x06\x01"))
    assert facts.type == "line.crossed"


def test_only_protobuf_event_records_are_read() -> None:
    json_event = event_record(1, b"{}", content_type="application/json")
    health = event_record(2, b"{}", kind="health", content_type="application/json")
    assert split_events([json_event, health]) == ([], [])
    with pytest.raises(EventWireError, match="content type"):
        read_event(json_event)


def test_cursors_round_trip_and_are_refused_across_orders() -> None:
    at = Position(T0 + timedelta(microseconds=5), 42)
    assert decode_cursor(encode_cursor("newest", at), "newest") == at
    assert decode_cursor(encode_cursor("arrival", at), "arrival") == at
    for bad, order in [(encode_cursor("newest", at), "arrival"), ("%%%", "newest"), ("", "newest")]:
        with pytest.raises(InvalidInputError) as caught:
            decode_cursor(bad, order)  # type: ignore[arg-type]
        assert caught.value.fields["reason"] == "bad-cursor"


def test_time_bounds_are_durations_back_from_now_or_iso_times() -> None:
    assert time_bound("1h", NOW, "since") == NOW - timedelta(hours=1)
    assert time_bound("2026-12-01T10:00:00Z", NOW, "since") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    for bad in ("yesterday", "2026-12-01T10:00:00", "-1h"):
        with pytest.raises(InvalidInputError) as caught:
            time_bound(bad, NOW, "since")
        assert caught.value.fields["reason"] == "bad-since"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"limit": 0}, "bad-limit"),
        ({"limit": 1001}, "bad-limit"),
        ({"order": "oldest"}, "bad-order"),
        ({"node": "n a"}, "bad-node"),
        ({"type": "Zone"}, "bad-type"),
        ({"since": "1h", "until": "2h"}, "bad-until"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "bad-cursor"),
    ],
)
def test_a_query_out_of_bounds_is_refused_by_reason(
    changes: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        EventQuery.parse("gates", now=NOW, **changes)  # type: ignore[arg-type]
    assert caught.value.fields["reason"] == reason


def test_a_query_in_bounds_is_kept_as_asked() -> None:
    query = EventQuery.parse(
        "gates", now=NOW, order="arrival", node="n-1", type="zone.intrusion", since="30m", limit=5
    )
    assert query == EventQuery(
        "gates", "arrival", "n-1", "zone.intrusion", NOW - timedelta(minutes=30), None, 5, None
    )


def test_unsafe_event_settings_fail_at_start() -> None:
    config = EventsConfig()
    with pytest.raises(InvalidInputError, match="retention"):
        replace(config, retention=timedelta(minutes=5))
    with pytest.raises(InvalidInputError, match="settle"):
        replace(config, settle=timedelta(hours=1))
    with pytest.raises(InvalidInputError, match="pruning"):
        replace(config, prune_chunk=0)


def test_the_servers_event_settings_reach_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from control_plane.settings import ServerSettings

    monkeypatch.setenv("EDGEFLEET_EVENT_RETENTION_DAYS", "7")
    monkeypatch.setenv("EDGEFLEET_EVENT_PRUNE_INTERVAL_S", "60")
    config = ServerSettings().events_config()
    assert (config.retention, config.prune_interval_s) == (timedelta(days=7), 60)
    monkeypatch.setenv("EDGEFLEET_EVENT_RETENTION_DAYS", "0.01")  # 14 minutes
    with pytest.raises(InvalidInputError, match="at least 1 h"):
        ServerSettings().events_config()
