"""UUIDv7 ids: RFC 9562 layout, time order, and strict monotonicity per generator."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from edge_node.clock import ManualClock
from edge_node.uuid7 import UUIDv7Generator, unix_ms, uuid7_unix_ms


def test_layout_matches_rfc_9562_bit_for_bit() -> None:
    ms = 0x0123456789AB
    clock = ManualClock(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms))
    generator = UUIDv7Generator(clock, randbits=lambda bits: 0)

    first, second = generator.new(), generator.new()

    assert first == uuid.UUID("01234567-89ab-7000-8000-000000000000")
    # Same millisecond: the 42-bit counter (rand_a, then the top of rand_b) goes up by one.
    assert second == uuid.UUID("01234567-89ab-7000-8000-000100000000")


def test_version_variant_and_timestamp() -> None:
    clock = ManualClock()
    value = UUIDv7Generator(clock).new()

    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert uuid7_unix_ms(value) == unix_ms(clock.now())


def test_strictly_increasing_within_one_millisecond() -> None:
    generator = UUIDv7Generator(ManualClock())  # the clock never moves

    ids = [generator.new() for _ in range(2000)]

    assert [u.int for u in ids] == sorted({u.int for u in ids})
    assert [str(u) for u in ids] == sorted(str(u) for u in ids)  # text sorts the same way
    assert {uuid7_unix_ms(u) for u in ids} == {uuid7_unix_ms(ids[0])}


def test_ordered_across_milliseconds() -> None:
    clock = ManualClock()
    generator = UUIDv7Generator(clock)
    ids = []
    for _ in range(50):
        ids.append(generator.new())
        clock.advance(timedelta(milliseconds=1))

    assert ids == sorted(ids)
    assert [uuid7_unix_ms(u) - uuid7_unix_ms(ids[0]) for u in ids] == list(range(50))


def test_clock_stepping_back_keeps_ids_increasing() -> None:
    clock = ManualClock()
    generator = UUIDv7Generator(clock)
    before = generator.new()
    clock.advance(timedelta(seconds=-5))

    after = generator.new()

    assert after > before
    assert uuid7_unix_ms(after) == uuid7_unix_ms(before)  # stays on the last millisecond


def test_counter_overflow_moves_to_the_next_millisecond() -> None:
    generator = UUIDv7Generator(ManualClock(), randbits=lambda bits: 0)
    first = generator.new()
    generator._counter = (1 << 42) - 1  # only way to reach 2**41+ ids in one test millisecond

    after = generator.new()

    assert after > first
    assert uuid7_unix_ms(after) == uuid7_unix_ms(first) + 1


def test_unique_across_threads() -> None:
    generator = UUIDv7Generator(ManualClock())
    results: list[list[uuid.UUID]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def work(out: list[uuid.UUID]) -> None:
        start.wait()
        out.extend(generator.new() for _ in range(1000))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    everything = [u for out in results for u in out]
    assert len(set(everything)) == 4000
    assert all(out == sorted(out) for out in results)


def test_clock_before_the_epoch_is_refused() -> None:
    generator = UUIDv7Generator(ManualClock(datetime(1969, 12, 31, tzinfo=UTC)))
    with pytest.raises(ValueError, match="epoch"):
        generator.new()
