"""The send buffer's policy as a pure core: the bound in bytes, priorities, TTL, who is
dropped when it is full (and the counters), and that only a PUBACK removes a message."""

from __future__ import annotations

import pytest

from device_sdk.buffer import RECORD_OVERHEAD, Message, Priority, SendBuffer

NOW = 1_000.0
TOPIC = "edgefleet/dev/cam/results"


def msg(
    name: str, priority: Priority = Priority.RESULT, size: int = 100, ttl: float = 60.0
) -> Message:
    """A message whose buffered size is exactly `size` bytes."""
    payload = b"x" * (size - RECORD_OVERHEAD - len(name) - len(TOPIC))
    return Message(name, TOPIC, priority, payload, NOW + ttl)


def ids(messages: list[Message]) -> list[str]:
    return [m.message_id for m in messages]


def test_a_message_is_sized_as_its_file_record() -> None:
    assert msg("a", size=100).size == 100
    buffer = SendBuffer(1000)
    buffer.put(msg("a", size=100), NOW)
    buffer.put(msg("b", size=250), NOW)
    stats = buffer.stats()
    assert (stats.queued_messages, stats.queued_bytes, stats.capacity_bytes) == (2, 350, 1000)


def test_results_go_before_heartbeats_before_frames_oldest_first() -> None:
    buffer = SendBuffer(10_000)
    for name, priority in [
        ("f1", Priority.FRAME),
        ("h1", Priority.HEARTBEAT),
        ("r1", Priority.RESULT),
        ("f2", Priority.FRAME),
        ("r2", Priority.RESULT),
    ]:
        assert buffer.put(msg(name, priority), NOW)
    assert ids(buffer.take(3, NOW)) == ["r1", "r2", "h1"]
    assert ids(buffer.take(10, NOW)) == ["f1", "f2"]
    assert buffer.take(10, NOW) == []


def test_full_drops_the_oldest_of_the_lowest_priority_first() -> None:
    buffer = SendBuffer(500)
    for name, priority in [
        ("r1", Priority.RESULT),
        ("f1", Priority.FRAME),
        ("h1", Priority.HEARTBEAT),
        ("f2", Priority.FRAME),
        ("r2", Priority.RESULT),
    ]:
        assert buffer.put(msg(name, priority), NOW)
    assert buffer.put(msg("r3"), NOW)  # no room: f1 goes (a frame, the oldest)
    assert buffer.put(msg("r4", size=200), NOW)  # f2 and then h1
    assert ids(buffer.take(10, NOW)) == ["r1", "r2", "r3", "r4"]
    assert buffer.stats().dropped["overflow"] == 3
    assert buffer.stats().queued_bytes == 500


def test_within_one_priority_the_oldest_gives_way_to_the_newest() -> None:
    buffer = SendBuffer(300)
    for n in range(5):
        assert buffer.put(msg(f"r{n}"), NOW)
    assert ids(buffer.take(10, NOW)) == ["r2", "r3", "r4"]
    assert buffer.stats().dropped["overflow"] == 2


def test_a_newcomer_of_lower_priority_is_the_one_dropped() -> None:
    buffer = SendBuffer(300)
    for n in range(3):
        buffer.put(msg(f"r{n}"), NOW)
    assert not buffer.put(msg("f", Priority.FRAME), NOW)
    assert not buffer.put(msg("h", Priority.HEARTBEAT), NOW)
    assert ids(buffer.take(10, NOW)) == ["r0", "r1", "r2"]
    assert buffer.stats().dropped == {
        "overflow": 2,
        "expired": 0,
        "too_large": 0,
        "corrupt": 0,
        "refused": 0,
    }


def test_nothing_is_dropped_in_vain_when_room_cannot_be_made() -> None:
    """A result that would need more than the frames it may displace drops alone."""
    buffer = SendBuffer(400)
    buffer.put(msg("r1", size=300), NOW)
    buffer.put(msg("f1", Priority.FRAME, size=100), NOW)
    buffer.take(1, NOW)  # r1 in flight: never a victim
    assert not buffer.put(msg("r2", size=250), NOW)
    assert set(buffer.message_ids()) == {"r1", "f1"}
    assert buffer.stats().dropped["overflow"] == 1


def test_a_message_bigger_than_the_buffer_is_counted_too_large() -> None:
    buffer = SendBuffer(1024)
    assert not buffer.put(msg("big", Priority.FRAME, size=1025), NOW)
    assert buffer.stats().dropped["too_large"] == 1
    assert len(buffer) == 0


def test_expired_messages_are_dropped_before_sending_and_counted() -> None:
    buffer = SendBuffer(10_000)
    buffer.put(msg("short", ttl=5), NOW)
    buffer.put(msg("long", ttl=500), NOW)
    assert not buffer.put(msg("stale", ttl=-1), NOW)
    assert ids(buffer.take(10, NOW + 10)) == ["long"]
    assert buffer.stats().dropped["expired"] == 2
    assert buffer.stats().queued_bytes == 100


def test_in_flight_messages_leave_only_on_their_puback() -> None:
    buffer = SendBuffer(300)
    for n in range(3):
        buffer.put(msg(f"r{n}", ttl=5), NOW)
    taken = buffer.take(2, NOW)
    # Neither expiry nor a full buffer takes a message the broker may already have.
    assert buffer.expire(NOW + 10) == 1  # r2 only
    assert buffer.put(msg("r3"), NOW + 10)
    assert buffer.put(msg("r4"), NOW + 10)  # full: r3 goes, not r0 or r1
    assert set(buffer.message_ids()) == {*ids(taken), "r4"}
    assert buffer.ack("r0")
    assert not buffer.ack("r0")  # a second PUBACK (a redelivery's) changes nothing
    assert "r0" not in set(buffer.message_ids())
    assert buffer.refuse("r1")
    assert buffer.stats().dropped["refused"] == 1


def test_a_lost_connection_puts_in_flight_messages_back_in_their_place() -> None:
    buffer = SendBuffer(10_000)
    for n in range(4):
        buffer.put(msg(f"r{n}"), NOW)
    buffer.put(msg("f0", Priority.FRAME), NOW)
    assert ids(buffer.take(3, NOW)) == ["r0", "r1", "r2"]
    buffer.ack("r1")
    buffer.requeue()
    assert buffer.stats().in_flight == 0
    assert ids(buffer.take(10, NOW)) == ["r0", "r2", "r3", "f0"]


def test_an_id_is_buffered_once() -> None:
    buffer = SendBuffer(10_000)
    buffer.put(msg("a"), NOW)
    with pytest.raises(ValueError, match="already buffered"):
        buffer.put(msg("a"), NOW)
