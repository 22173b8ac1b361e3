"""The pure decisions of capture: pacing, backoff and which dropped file to take."""

from __future__ import annotations

import pytest

from edge_node.capture.schedule import (
    CaptureCounters,
    FileEntry,
    FilePick,
    FilePicker,
    FramePacer,
    retry_delay,
)

S = 1_000_000_000  # nanoseconds


def test_the_pacer_keeps_a_grid_and_does_not_burst_after_a_stall() -> None:
    pacer = FramePacer(4.0)
    assert pacer.next_due(10.0) == 10.0
    assert pacer.next_due(10.01) == 10.25
    assert pacer.next_due(10.26) == 10.5
    # A grab took 2 s: the next is now, not eight catch-up frames.
    assert pacer.next_due(12.6) == 12.6
    assert pacer.next_due(12.61) == 12.85


@pytest.mark.parametrize("rng", [0.0, 0.5, 0.999])
def test_the_backoff_doubles_and_is_capped(rng: float) -> None:
    delays = [retry_delay(n, 1.0, 30.0, rng=lambda: rng) for n in range(1, 200)]
    assert all(0.5 <= d <= 30.0 for d in delays)
    assert delays[0] <= 1.0 and delays[4] >= 8.0  # 1, 2, 4, 8, 16 ... ceilings
    assert all(d >= 15.0 for d in delays[5:])  # capped at 30, never under half of it


def entry(name: str, size: int, mtime_s: float) -> FileEntry:
    return FileEntry(name, size, int(mtime_s * S))


def test_a_file_is_taken_once_its_size_held_across_two_scans_and_it_settled() -> None:
    picker = FilePicker(settle_s=1.0)
    assert picker.pick([entry("a.jpg", 100, 10.0)], now_ns=20 * S).take is None  # first sight
    assert picker.pick([entry("a.jpg", 100, 10.0)], now_ns=21 * S).take == entry("a.jpg", 100, 10.0)
    assert picker.pick([entry("a.jpg", 100, 10.0)], now_ns=22 * S).take is None  # not again


def test_a_file_still_being_written_is_not_taken() -> None:
    picker = FilePicker(settle_s=1.0)
    growing = [entry("a.jpg", 10, 10.0), entry("a.jpg", 50, 10.5), entry("a.jpg", 90, 10.9)]
    for now, seen in zip((10.1, 10.6, 11.0), growing, strict=True):
        assert picker.pick([seen], now_ns=int(now * S)).take is None
    # Size held but the mtime is under settle_s old: still not taken.
    assert picker.pick([entry("a.jpg", 90, 10.9)], now_ns=int(11.5 * S)).take is None
    assert picker.pick([entry("a.jpg", 90, 10.9)], now_ns=12 * S).take is not None


def test_the_newest_ready_file_wins_and_the_older_are_superseded() -> None:
    picker = FilePicker(settle_s=0.0)
    files = [entry("1.jpg", 5, 1.0), entry("3.jpg", 5, 3.0), entry("2.jpg", 5, 2.0)]
    picker.pick(files, now_ns=10 * S)
    pick = picker.pick(files, now_ns=10 * S)
    assert pick.take == entry("3.jpg", 5, 3.0)
    assert pick.superseded == (entry("1.jpg", 5, 1.0), entry("2.jpg", 5, 2.0))
    # Kept files are not read again; a newer one is.
    files.append(entry("4.jpg", 5, 4.0))
    assert picker.pick(files, now_ns=11 * S).take is None
    assert picker.pick(files, now_ns=12 * S) == type(pick)(entry("4.jpg", 5, 4.0), ())


def test_empty_files_are_not_taken() -> None:
    picker = FilePicker(settle_s=0.0)
    for _ in range(3):
        assert picker.pick([entry("a.jpg", 0, 1.0)], now_ns=5 * S).take is None


def test_a_file_left_empty_is_set_aside_once_it_is_empty_after_s_old() -> None:
    picker = FilePicker(settle_s=1.0, empty_after_s=30.0)
    empty = entry("a.jpg", 0, 10.0)
    # Just created: a writer may fill it in a moment.
    for now in (10.5, 12.0, 39.9):
        assert picker.pick([empty], now_ns=int(now * S)) == FilePick(None)
    assert picker.pick([empty], now_ns=40 * S) == FilePick(None, empty=(empty,))
    assert picker.pick([empty], now_ns=41 * S) == FilePick(None)  # counted once


def test_an_empty_file_that_fills_is_read_like_any_other() -> None:
    picker = FilePicker(settle_s=1.0, empty_after_s=30.0)
    assert picker.pick([entry("a.jpg", 0, 10.0)], now_ns=10 * S) == FilePick(None)
    assert picker.pick([entry("a.jpg", 0, 10.0)], now_ns=11 * S) == FilePick(None)
    filled = entry("a.jpg", 900, 11.5)
    assert picker.pick([filled], now_ns=12 * S) == FilePick(None)  # changed: not settled
    assert picker.pick([filled], now_ns=13 * S) == FilePick(filled)


def test_a_file_older_than_the_last_frame_is_stale_once_it_settled() -> None:
    picker = FilePicker(settle_s=1.0)
    newest = entry("5.jpg", 10, 5.0)
    picker.pick([newest], now_ns=10 * S)
    assert picker.pick([newest], now_ns=11 * S).take == newest
    late = entry("3.jpg", 10, 3.0)  # dropped after 5.jpg was taken, with an older mtime
    assert picker.pick([newest, late], now_ns=12 * S) == FilePick(None)  # first sight
    assert picker.pick([newest, late], now_ns=13 * S) == FilePick(None, stale=(late,))
    # Kept (``keep`` mode): neither is reported again, and a newer file is still taken.
    assert picker.pick([newest, late], now_ns=14 * S) == FilePick(None)
    fresh = entry("6.jpg", 10, 6.0)
    picker.pick([newest, late, fresh], now_ns=15 * S)
    assert picker.pick([newest, late, fresh], now_ns=16 * S) == FilePick(fresh)


def test_counters_count_failures_in_a_row_until_a_frame_is_captured() -> None:
    counters = CaptureCounters("cam")
    assert counters.count_failure("timeout") == 1
    assert counters.count_failure("http_500") == 2
    counters.count_captured()
    stats = counters.snapshot()
    assert (stats.captured, stats.consecutive_failures) == (1, 0)
    assert stats.failures == {"timeout": 1, "http_500": 1}
