"""The file ring: a reboot (a new buffer over the same directory) gets back exactly what
was not acked, in order; a torn write or a damaged stretch is skipped and counted, never
a crash; the file stays within twice the buffer's bound."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from device_sdk.buffer import Message, Priority, SendBuffer
from device_sdk.ring import _PUT, FileRing, _put_body, _record, read_records

NOW = 1_000.0
CAPACITY = 4096


def open_buffer(directory: Path, capacity: int = CAPACITY) -> SendBuffer:
    return SendBuffer(capacity, journal=FileRing(directory, capacity, sync=True))


def msg(n: int, priority: Priority = Priority.RESULT, ttl: float = 3600) -> Message:
    return Message(
        f"id-{n:04d}",
        "edgefleet/dev/cam/results",
        priority,
        b"p" * 40 + bytes([n % 256]),
        NOW + ttl,
    )


def pending_ids(buffer: SendBuffer) -> list[str]:
    return [m.message_id for m in buffer.take(10_000, NOW)]


def test_a_reboot_gets_back_what_was_not_acked_in_order(tmp_path: Path) -> None:
    before = open_buffer(tmp_path)
    for n in range(6):
        before.put(msg(n, Priority.FRAME if n == 2 else Priority.RESULT), NOW)
    taken = before.take(2, NOW)
    before.ack(taken[0].message_id)  # id-0000 reached the broker
    # taken[1] (id-0001) was in flight at the crash: it comes back, with its id.
    before.close()
    after = open_buffer(tmp_path)
    assert after.stats().dropped["corrupt"] == 0
    assert pending_ids(after) == ["id-0001", "id-0003", "id-0004", "id-0005", "id-0002"]
    assert after.stats().persistent


def test_a_crash_without_close_loses_nothing_that_was_buffered(tmp_path: Path) -> None:
    before = open_buffer(tmp_path)
    for n in range(3):
        before.put(msg(n), NOW)
    # No close(): the process is gone. Every PUT was fsynced when put() returned.
    after = open_buffer(tmp_path)
    assert pending_ids(after) == ["id-0000", "id-0001", "id-0002"]


def test_a_torn_tail_is_skipped_and_counted(tmp_path: Path) -> None:
    before = open_buffer(tmp_path)
    for n in range(4):
        before.put(msg(n), NOW)
    before.close()
    ring = tmp_path / "ring.log"
    data = ring.read_bytes()
    ring.write_bytes(data[: len(data) - 7])  # power lost in the middle of the last append
    after = open_buffer(tmp_path)
    assert pending_ids(after) == ["id-0000", "id-0001", "id-0002"]
    assert after.stats().dropped["corrupt"] == 1
    # The damaged tail is gone from the file: what is appended next reads back.
    after.put(msg(9), NOW)
    after.close()
    again = open_buffer(tmp_path)
    assert again.stats().dropped["corrupt"] == 0
    assert pending_ids(again) == ["id-0000", "id-0001", "id-0002", "id-0009"]


def test_a_damaged_record_in_the_middle_costs_that_record_only(tmp_path: Path) -> None:
    before = open_buffer(tmp_path)
    for n in range(5):
        before.put(msg(n), NOW)
    before.close()
    ring = tmp_path / "ring.log"
    data = bytearray(ring.read_bytes())
    record = len(data) // 5
    data[2 * record + 20] ^= 0xFF  # a flipped bit inside the third record's body
    ring.write_bytes(bytes(data))
    after = open_buffer(tmp_path)
    assert pending_ids(after) == ["id-0000", "id-0001", "id-0003", "id-0004"]
    assert after.stats().dropped["corrupt"] == 1


def test_garbage_is_never_a_crash(tmp_path: Path) -> None:
    (tmp_path / "ring.log").write_bytes(b"EF" + bytes(range(256)) * 4 + b"EFP\x00")
    buffer = open_buffer(tmp_path)
    assert len(buffer) == 0
    assert buffer.stats().dropped["corrupt"] == 1


def test_the_file_stays_within_twice_the_bound_under_churn(tmp_path: Path) -> None:
    ring = FileRing(tmp_path, CAPACITY, sync=False)  # the size is the point, not the fsync
    buffer = SendBuffer(CAPACITY, journal=ring)
    largest = 0
    for n in range(1_000):
        buffer.put(msg(n), NOW)
        for taken in buffer.take(1, NOW) if n % 3 else []:
            buffer.ack(taken.message_id)
        largest = max(largest, ring.file_size(), (tmp_path / "ring.log").stat().st_size)
    assert largest <= 2 * CAPACITY + 200  # one record over the threshold at most
    assert buffer.stats().dropped["overflow"] > 0  # it did fill up
    buffer.close()
    assert open_buffer(tmp_path).stats().queued_bytes == buffer.stats().queued_bytes


def test_a_smaller_bound_after_a_reboot_drops_the_oldest_by_priority(tmp_path: Path) -> None:
    before = open_buffer(tmp_path)
    before.put(msg(0, Priority.FRAME), NOW)
    for n in range(1, 4):
        before.put(msg(n), NOW)
    before.close()
    size = msg(0).size
    after = open_buffer(tmp_path, capacity=2 * size)
    assert pending_ids(after) == ["id-0002", "id-0003"]
    assert after.stats().dropped["overflow"] == 2


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0, max_value=2_000), noise=st.binary(max_size=64))
def test_any_truncation_or_trailing_noise_reads_back_a_prefix(cut: int, noise: bytes) -> None:
    records = b"".join(_record(_PUT, _put_body(msg(n))) for n in range(20))
    recovered = read_records(records[:cut] + noise)
    got = [m.message_id for m in recovered.messages]
    whole = min(cut, len(records)) // (len(records) // 20)
    assert got[:whole] == [f"id-{n:04d}" for n in range(whole)]
