"""The edge outbox: durable, budgeted, never loses an event, survives SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edge_node.clock import ManualClock
from edge_node.errors import (
    ClosedError,
    InvalidInputError,
    OutboxCorruptError,
    OutboxFullError,
    OutboxInUseError,
    OutboxNodeMismatchError,
    OutboxVersionError,
    PayloadTooLargeError,
)
from edge_node.outbox import (
    APPLICATION_ID,
    ROW_OVERHEAD_BYTES,
    SCHEMA_VERSION,
    Kind,
    Outbox,
    Record,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# Small records make budget arithmetic readable: one record = ROW bytes of budget.
PAYLOAD = 72
ROW = PAYLOAD + ROW_OVERHEAD_BYTES


OpenOutbox = Callable[..., Outbox]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_outbox(tmp_path: Path, clock: ManualClock) -> Iterator[OpenOutbox]:
    opened: list[Outbox] = []

    def _open(**overrides: Any) -> Outbox:
        options: dict[str, Any] = {
            "node_id": "node-1",
            "budget_bytes": 1_000_000,
            "clock": clock,
            "busy_timeout_s": 0.05,
        }
        options.update(overrides)
        path = options.pop("path", tmp_path / "outbox.db")
        outbox = Outbox.open(path, **options)
        opened.append(outbox)
        return outbox

    yield _open
    for outbox in opened:
        outbox.close()


def everything(outbox: Outbox) -> list[Record]:
    return outbox.pending(limit=1_000_000, max_bytes=1 << 40)


def seqs(records: list[Record]) -> list[int]:
    return [r.seq for r in records]


# ---------------------------------------------------------------- the documented rule


@dataclass
class BudgetModel:
    """The module docstring's budget rule, executable: the tests' reference.

    By the estimate only: the records of these tests fit in the tables' root pages, so the
    real-pages check never binds here (``test_the_records_real_pages_count_against_the_
    budget`` covers it)."""

    budget: int
    keep_every: int
    results_share: float = 0.1
    max_results: int = 1000
    rows: list[tuple[int, str, int]] = field(default_factory=list)  # (seq, kind, size)
    high_water: int = 0
    dropped_health: int = 0
    refused_events: int = 0
    dropped_results: int = 0

    def total(self, kind: str | None = None) -> int:
        return sum(size for _, k, size in self.rows if kind in (None, k))

    def count(self, kind: str) -> int:
        return sum(1 for _, k, _ in self.rows if k == kind)

    def _drop_oldest_result(self) -> None:
        oldest = next(r for r in self.rows if r[1] == "results")
        self.rows.remove(oldest)
        self.dropped_results += 1

    def _append_result(self, size: int) -> int | None:
        share = int(self.budget * self.results_share)
        if size <= share and self.total() - self.total("results") + size <= self.budget:
            while self.count("results") and (
                self.total("results") + size > share
                or self.total() + size > self.budget
                or self.count("results") >= self.max_results
            ):
                self._drop_oldest_result()
        if (
            self.total("results") + size > share
            or self.total() + size > self.budget
            or self.count("results") >= self.max_results
        ):
            self.dropped_results += 1
            return None
        self.high_water += 1
        self.rows.append((self.high_water, "results", size))
        return self.high_water

    def append(self, kind: str, size: int) -> int | None:
        if kind == "results":
            return self._append_result(size)
        if self.total() + size > self.budget:
            reclaimable = self.total("health") + self.total("results")
            if self.total() - reclaimable + size <= self.budget:
                while self.count("results") and self.total() + size > self.budget:
                    self._drop_oldest_result()
                while self.keep_every > 1 and self.total() + size > self.budget:
                    health = [seq for seq, k, _ in self.rows if k == "health"]
                    window = health[: len(health) // 2]
                    victims = {s for i, s in enumerate(window) if i % self.keep_every}
                    if not victims:
                        break
                    self.rows = [r for r in self.rows if r[0] not in victims]
                    self.dropped_health += len(victims)
            if self.total() + size > self.budget:
                if kind == "event":
                    self.refused_events += 1
                else:
                    self.dropped_health += 1
                return None
        self.high_water += 1
        self.rows.append((self.high_water, kind, size))
        return self.high_water

    def ack(self, acked: set[int]) -> None:
        self.rows = [r for r in self.rows if r[0] not in acked]


# ---------------------------------------------------------------- basics


def test_file_is_a_wal_sqlite_outbox_with_a_version(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    open_outbox().close()

    with sqlite3.connect(tmp_path / "outbox.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert raw.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        columns = [row[1] for row in raw.execute("PRAGMA table_info(outbox)")]
    raw.close()
    assert columns == [
        "seq",
        "id",
        "kind",
        "created_at",
        "payload",
        "size",
        "attempts",
        "last_attempt_at",
    ]


def test_append_pending_ack_round_trip(open_outbox: OpenOutbox, clock: ManualClock) -> None:
    outbox = open_outbox()
    event = outbox.append("event", b"gate A crossed")
    clock.advance(timedelta(seconds=1))
    health = outbox.append("health", b"rss=120MB")

    assert (event.seq, health.seq) == (1, 2)
    assert event.created_at == clock.now() - timedelta(seconds=1)
    assert everything(outbox) == [event, health]
    stats = outbox.stats()
    assert (stats.pending_events, stats.pending_health) == (1, 1)
    assert stats.bytes == len(b"gate A crossed") + len(b"rss=120MB") + 2 * ROW_OVERHEAD_BYTES
    assert stats.oldest_created_at == event.created_at

    assert outbox.ack([event.id, health.id]) == 2

    assert everything(outbox) == []
    stats = outbox.stats()
    assert (stats.pending_events, stats.pending_health, stats.bytes) == (0, 0, 0)
    assert stats.oldest_created_at is None
    assert stats.last_acked_seq == 2


def test_a_record_under_its_own_id_is_stored_once_while_pending(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox()
    event_id = "6f1c1d0e-8e2b-5c1a-9d3e-2f4a5b6c7d8e"  # a uuid5, as an event's id is
    first = outbox.append_once("event", b"event", event_id)
    assert first is not None and first.id == event_id
    assert outbox.append_once("event", b"event", event_id) is None  # a replay: not stored
    other = outbox.append("event", b"other")
    assert [r.id for r in outbox.pending(10, 1 << 20)] == [event_id, other.id]
    assert other.seq == first.seq + 1  # the replay took no sequence number
    outbox.ack([event_id])
    # Once acked the record is gone here; the control plane stores each id once.
    again = outbox.append_once("event", b"event", event_id)
    assert again is not None and again.seq == other.seq + 1
    for bad in ("not-a-uuid", event_id.upper()):
        with pytest.raises(InvalidInputError):
            outbox.append_once("event", b"event", bad)


def test_records_survive_reopen_byte_for_byte(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    written = [outbox.append("event", bytes(range(256)) * 4), outbox.append("health", b"")]
    outbox.close()

    assert everything(open_outbox()) == written


def test_sequence_is_never_reused_even_after_everything_was_acked(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox()
    for _ in range(3):
        outbox.append("event", b"e")
    outbox.ack(up_to_seq=3)
    outbox.close()

    reopened = open_outbox()
    assert reopened.stats().high_water_seq == 3
    assert reopened.append("health", b"h").seq == 4


def test_ack_is_idempotent_and_ignores_unknown_ids(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    first, second = outbox.append("event", b"1"), outbox.append("event", b"2")

    assert outbox.ack([first.id]) == 1
    assert outbox.ack([first.id]) == 0
    assert outbox.ack(["01890000-0000-7000-8000-000000000000", "not-a-uuid"]) == 0
    assert outbox.ack(up_to_seq=1) == 0
    assert outbox.ack() == 0
    assert everything(outbox) == [second]


def test_ack_up_to_seq_and_ids_together(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    records = [outbox.append("event", b"x") for _ in range(5)]

    assert outbox.ack([records[4].id], up_to_seq=2) == 3

    assert seqs(everything(outbox)) == [3, 4]
    assert outbox.stats().last_acked_seq == 5


def test_ack_beyond_the_high_water_mark_is_clamped(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    outbox.append("event", b"x")

    assert outbox.ack(up_to_seq=10**9) == 1
    assert outbox.stats().last_acked_seq == 1
    assert outbox.append("event", b"y").seq == 2


def test_payload_over_the_limit_is_refused_and_stores_nothing(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(max_payload_bytes=1024)

    with pytest.raises(PayloadTooLargeError) as caught:
        outbox.append("event", b"x" * 1025)

    assert isinstance(caught.value, InvalidInputError)
    assert caught.value.fields["size"] == 1025
    assert outbox.append("event", b"x" * 1024).seq == 1  # no seq was spent on the refusal


def test_default_payload_limit_is_256_kib(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    outbox.append("event", b"x" * 256 * 1024)
    with pytest.raises(PayloadTooLargeError):
        outbox.append("event", b"x" * (256 * 1024 + 1))


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("alert", b"x"), ("event", "text, not bytes"), ("event", None)],
)
def test_malformed_appends_are_refused(open_outbox: OpenOutbox, kind: Any, payload: Any) -> None:
    outbox = open_outbox()
    with pytest.raises(InvalidInputError):
        outbox.append(kind, payload)
    assert outbox.stats().high_water_seq == 0


def test_pending_respects_limit_max_bytes_and_kinds(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    for i in range(6):
        outbox.append("event" if i % 2 == 0 else "health", b"x" * 100)

    assert seqs(outbox.pending(limit=4, max_bytes=10_000)) == [1, 2, 3, 4]
    assert seqs(outbox.pending(limit=10, max_bytes=250)) == [1, 2]
    assert seqs(outbox.pending(limit=10, max_bytes=300)) == [1, 2, 3]
    assert seqs(outbox.pending(limit=10, max_bytes=10_000, kinds=["health"])) == [2, 4, 6]
    assert seqs(outbox.pending(limit=2, max_bytes=10_000, kinds={"event"})) == [1, 3]
    assert outbox.pending(limit=0, max_bytes=10_000) == []
    assert outbox.pending(limit=10, max_bytes=10_000, kinds=[]) == []
    outbox.append("results", b"r")
    both = outbox.pending(limit=10, max_bytes=10_000, kinds=("event", "health"))
    assert seqs(both) == [1, 2, 3, 4, 5, 6]
    assert seqs(outbox.pending(limit=10, max_bytes=10_000, kinds=["results"])) == [7]
    assert seqs(outbox.pending(limit=10, max_bytes=10_000, kinds=["results", "event"])) == [
        1,
        3,
        5,
        7,
    ]
    with pytest.raises(InvalidInputError):
        outbox.pending(limit=10, max_bytes=10, kinds=["video"])  # type: ignore[list-item]


def test_pending_always_returns_the_oldest_record_even_if_it_is_over_max_bytes(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox()
    outbox.append("event", b"x" * 5000)
    outbox.append("event", b"y")

    assert seqs(outbox.pending(limit=10, max_bytes=100)) == [1]


def test_mark_attempt_counts_and_stamps(open_outbox: OpenOutbox, clock: ManualClock) -> None:
    outbox = open_outbox()
    record = outbox.append("event", b"x")
    clock.advance(timedelta(seconds=30))

    assert outbox.mark_attempt([record.id, "unknown"]) == 1
    outbox.mark_attempt([record.id])

    (stored,) = everything(outbox)
    assert stored.attempts == 2
    assert stored.last_attempt_at == clock.now()


# ---------------------------------------------------------------- budget


def test_health_is_thinned_by_the_documented_rule(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD, health_keep_every=4
    )
    for _ in range(10):
        outbox.append("health", b"h" * PAYLOAD)

    outbox.append("health", b"h" * PAYLOAD)
    # Oldest half = seqs 1..5; one in four kept counting from the oldest: 1 and 5.
    assert seqs(everything(outbox)) == [1, 5, 6, 7, 8, 9, 10, 11]
    assert outbox.stats().dropped_health == 3

    for _ in range(3):
        outbox.append("health", b"h" * PAYLOAD)
    # Second pass over [1, 5, 6, 7, 8]: keeps 1 and 8. Older history gets sparser.
    assert seqs(everything(outbox)) == [1, 8, 9, 10, 11, 12, 13, 14]
    assert outbox.stats().dropped_health == 6
    assert outbox.stats().bytes == 8 * ROW


def test_thinning_makes_room_for_an_event(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=6 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD, health_keep_every=2
    )
    for kind in ["event", "health", "health", "health", "health", "event"]:
        outbox.append(kind, b"x" * PAYLOAD)  # type: ignore[arg-type]

    stored = outbox.append("event", b"x" * PAYLOAD)

    # Four health [2,3,4,5]: oldest half [2,3], keep one in two -> 3 goes.
    assert seqs(everything(outbox)) == [1, 2, 4, 5, 6, stored.seq]
    stats = outbox.stats()
    # Thinning loses history: the alarm says so (it stayed off through 672 thinned reports).
    assert (stats.dropped_health, stats.refused_events, stats.alarm) == (1, 0, True)


def test_events_are_never_dropped_a_full_outbox_refuses_loudly(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(budget_bytes=5 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD)
    events = [outbox.append("event", b"e" * PAYLOAD) for _ in range(5)]

    with pytest.raises(OutboxFullError) as caught:
        outbox.append("event", b"e" * PAYLOAD)

    assert caught.value.fields["kind"] == "event"
    assert caught.value.fields["reason"] == "budget"
    assert everything(outbox) == events
    stats = outbox.stats()
    assert (stats.refused_events, stats.alarm, stats.high_water_seq) == (1, True, 5)


def test_health_is_not_sacrificed_for_an_event_that_cannot_fit_anyway(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox(budget_bytes=6 * ROW, wal_reserve_bytes=0, max_payload_bytes=3 * PAYLOAD)
    for _ in range(4):
        outbox.append("event", b"e" * PAYLOAD)
    outbox.append("health", b"h" * PAYLOAD)

    with pytest.raises(OutboxFullError):
        outbox.append("event", b"e" * 3 * PAYLOAD)  # needs more than all health could free

    assert outbox.stats().pending_health == 1
    assert outbox.stats().dropped_health == 0


def test_health_that_does_not_fit_is_dropped_and_counted_without_alarm(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox(budget_bytes=3 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD)
    for _ in range(3):
        outbox.append("event", b"e" * PAYLOAD)

    with pytest.raises(OutboxFullError) as caught:
        outbox.append("health", b"h" * PAYLOAD)

    assert caught.value.fields["kind"] == "health"
    stats = outbox.stats()
    assert (stats.dropped_health, stats.refused_events, stats.alarm) == (1, 0, False)


def test_alarm_persists_and_clears_once_acks_bring_the_backlog_down(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox(
        budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD, alarm_clear_ratio=0.8
    )
    events = [outbox.append("event", b"e" * PAYLOAD) for _ in range(10)]
    with pytest.raises(OutboxFullError):
        outbox.append("event", b"e" * PAYLOAD)
    outbox.close()

    outbox = open_outbox(
        budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD, alarm_clear_ratio=0.8
    )
    assert outbox.stats().alarm  # a restart does not hide it
    outbox.ack([events[0].id])
    assert outbox.stats().alarm  # 9/10 of the budget: still above the clear mark
    outbox.ack([events[1].id])
    stats = outbox.stats()
    assert not stats.alarm  # 8/10
    assert stats.refused_events == 1  # the counter is history, it stays
    outbox.append("event", b"e" * PAYLOAD)


def test_counters_survive_reopen(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD)
    for _ in range(11):
        outbox.append("health", b"h" * PAYLOAD)
    before = outbox.stats()
    outbox.close()

    after = open_outbox(
        budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD
    ).stats()

    assert after.dropped_health == before.dropped_health > 0
    assert after.bytes == before.bytes


def test_a_physically_full_disk_refuses_the_event_and_counts_it(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox()
    outbox.append("event", b"x")
    conn = outbox._conn
    assert conn is not None
    # SQLite reports SQLITE_FULL once max_page_count is reached: a disk that is full.
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages}")

    with pytest.raises(OutboxFullError) as caught:
        outbox.append("event", b"y" * 200_000)

    assert caught.value.fields["reason"] == "disk full"
    stats = outbox.stats()
    assert (stats.refused_events, stats.alarm, stats.pending_events) == (1, True, 1)
    outbox.close()
    assert open_outbox().stats().refused_events == 1


def test_budget_must_hold_one_maximal_record(open_outbox: OpenOutbox) -> None:
    with pytest.raises(InvalidInputError, match="cannot hold one maximal record"):
        open_outbox(budget_bytes=1000, max_payload_bytes=1000)
    with pytest.raises(InvalidInputError, match="less the WAL's reserve") as caught:
        open_outbox(budget_bytes=2000, max_payload_bytes=1000, wal_reserve_bytes=1000)
    assert caught.value.fields["wal_reserve_bytes"] == 1000
    with pytest.raises(InvalidInputError, match="wal_reserve_bytes"):
        open_outbox(budget_bytes=2000, max_payload_bytes=100, wal_reserve_bytes=-1)


def test_thinning_raises_the_alarm_until_acks_make_room(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD, alarm_clear_ratio=0.5
    )
    stored = [outbox.append("health", b"h" * PAYLOAD) for _ in range(10)]
    assert not outbox.stats().alarm  # full, nothing lost yet

    stored.append(outbox.append("health", b"h" * PAYLOAD))  # thins 3 of the oldest 5
    stats = outbox.stats()
    assert (stats.dropped_health, stats.refused_events, stats.alarm) == (3, 0, True)
    outbox.close()
    outbox = open_outbox(budget_bytes=10 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD)
    assert outbox.stats().alarm  # persisted
    outbox.ack(up_to_seq=stored[5].seq)  # 8 -> 5 of 10: down to the clear mark
    assert not outbox.stats().alarm


def test_the_records_real_pages_count_against_the_budget(open_outbox: OpenOutbox) -> None:
    # Reports of just over half a page each take a page each: twice the estimate. Without
    # the page check the file would grow to twice the record budget.
    budget = 64 * 1024
    outbox = open_outbox(budget_bytes=budget, wal_reserve_bytes=0, max_payload_bytes=4096)
    for _ in range(60):
        outbox.append("health", b"h" * 2100)
    stats = outbox.stats()
    assert stats.stored_bytes <= stats.record_budget_bytes == budget
    assert stats.dropped_health > 0 and stats.alarm
    assert stats.bytes < 0.7 * budget  # the estimate alone would not have thinned yet


def _on_disk(path: Path) -> int:
    names = (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")))
    return sum(p.stat().st_size for p in names if p.exists())


def test_the_files_on_disk_stay_within_the_budget_under_a_write_heavy_load(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    """A 1 MiB budget once used 5.3 MB: the WAL grew to 4 MiB beside a full database.

    Load: a health report (2.5-7 kB) and an event per step; the link is down for 30 steps
    (the budget fills and health is thinned), then up for 30, and so on; while it is up a
    batch is sent (``mark_attempt``) every 4 steps and most batches are acked. The module
    docstring's slack: an empty outbox's pages, one transaction's log beyond the reserve
    (half the reserve for a split batch), one record.
    """
    empty = open_outbox(path=tmp_path / "empty.db")
    empty.close()
    empty_bytes = _on_disk(tmp_path / "empty.db")
    budget, max_payload = 128 * 1024, 8 * 1024
    path = tmp_path / "outbox.db"
    outbox = open_outbox(path=path, budget_bytes=budget, max_payload_bytes=max_payload)
    rng = random.Random(12)
    peak = refused = 0
    for step in range(120):
        for kind, size in (("health", rng.randint(2500, 7000)), ("event", rng.randint(100, 600))):
            try:
                outbox.append(kind, rng.randbytes(size))  # type: ignore[arg-type]
            except OutboxFullError:
                refused += 1
            peak = max(peak, _on_disk(path))
        if (step // 30) % 2 == 1 and step % 4 == 0:
            batch = outbox.pending(500, 1 << 20)
            outbox.mark_attempt([r.id for r in batch])
            peak = max(peak, _on_disk(path))
            if rng.random() < 0.7:
                outbox.ack([r.id for r in batch])
                peak = max(peak, _on_disk(path))
    stats = outbox.stats()
    slack = empty_bytes + budget // 8 // 2 + max_payload + ROW_OVERHEAD_BYTES
    assert stats.dropped_health > 0  # the load did reach the budget
    assert peak <= budget + slack, f"{peak} bytes on disk for a budget of {budget} + {slack}"
    assert stats.wal_reserve_bytes == budget // 8
    assert stats.disk_bytes == _on_disk(path)
    assert refused == stats.refused_events == 0  # thinning health made room for every event


# ---------------------------------------------------------------- concurrency, lifecycle


def test_concurrent_appends_get_unique_contiguous_sequences(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    results: list[list[Record]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def work(out: list[Record]) -> None:
        start.wait()
        for i in range(50):
            out.append(outbox.append("event" if i % 2 else "health", b"x"))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    got = [r for out in results for r in out]
    assert sorted(r.seq for r in got) == list(range(1, 201))
    assert len({r.id for r in got}) == 200
    assert all(seqs(out) == sorted(seqs(out)) for out in results)
    assert seqs(everything(outbox)) == list(range(1, 201))


def test_a_second_process_cannot_open_the_same_outbox(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    open_outbox().append("event", b"x")
    child = subprocess.run(
        [sys.executable, "-c", _OPEN_ONCE, str(tmp_path / "outbox.db")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert child.stdout.strip() == "OutboxInUseError", child.stderr


_OPEN_ONCE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from edge_node.clock import SystemClock
    from edge_node.errors import EdgeNodeError
    from edge_node.outbox import Outbox
    try:
        Outbox.open(Path(sys.argv[1]), node_id="node-1", budget_bytes=10**6,
                    clock=SystemClock(), busy_timeout_s=0.05)
        print("opened")
    except EdgeNodeError as exc:
        print(type(exc).__name__)
    """
)


def test_a_second_open_in_the_same_process_is_refused_too(open_outbox: OpenOutbox) -> None:
    open_outbox()
    with pytest.raises(OutboxInUseError):
        open_outbox()


def test_closed_outbox_refuses_use_and_close_is_idempotent(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    outbox.close()
    outbox.close()
    with pytest.raises(ClosedError):
        outbox.append("event", b"x")
    with pytest.raises(ClosedError):
        outbox.stats()


def test_context_manager_closes(open_outbox: OpenOutbox) -> None:
    with open_outbox() as outbox:
        outbox.append("event", b"x")
    with pytest.raises(ClosedError):
        outbox.pending(limit=1, max_bytes=1)


def test_another_nodes_outbox_is_refused(open_outbox: OpenOutbox) -> None:
    open_outbox(node_id="node-1").close()
    with pytest.raises(OutboxNodeMismatchError, match="node-1"):
        open_outbox(node_id="node-2")


# ---------------------------------------------------------------- bad files


def test_garbage_file_is_reported_corrupt_and_left_in_place(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.db"
    garbage = bytes((i * 37 + 11) % 256 for i in range(16384))
    path.write_bytes(garbage)

    with pytest.raises(OutboxCorruptError, match="move it aside") as caught:
        open_outbox()

    assert caught.value.fields["path"] == str(path)
    assert path.read_bytes() == garbage


def test_damaged_pages_are_reported_corrupt(open_outbox: OpenOutbox, tmp_path: Path) -> None:
    outbox = open_outbox()
    for _ in range(200):
        outbox.append("event", b"payload" * 50)
    outbox.close()
    path = tmp_path / "outbox.db"
    data = bytearray(path.read_bytes())
    page = 4096
    data[2 * page : 6 * page] = b"\xde\xad\xbe\xef" * page  # header intact, b-tree pages not
    path.write_bytes(bytes(data))

    with pytest.raises(OutboxCorruptError):
        open_outbox()


def test_a_foreign_sqlite_database_is_not_taken_over(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    raw.close()

    with pytest.raises(OutboxCorruptError, match="not an edgefleet outbox"):
        open_outbox()


def test_a_newer_schema_version_is_refused_clearly(open_outbox: OpenOutbox, tmp_path: Path) -> None:
    open_outbox().close()
    with sqlite3.connect(tmp_path / "outbox.db") as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()

    with pytest.raises(OutboxVersionError, match="newer than this agent") as caught:
        open_outbox()
    assert caught.value.fields["found"] == SCHEMA_VERSION + 1


# ---------------------------------------------------------------- results


def test_results_go_first_to_make_room_for_health_and_events(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=6 * ROW,
        max_payload_bytes=PAYLOAD,
        health_keep_every=2,
        results_share=0.5,
        wal_reserve_bytes=0,
    )
    for kind in ["results", "health", "results", "event", "results", "health"]:
        outbox.append(kind, b"x" * PAYLOAD)  # type: ignore[arg-type]

    outbox.append("event", b"x" * PAYLOAD)
    # The oldest result (seq 1) made room; no health report was thinned.
    assert seqs(everything(outbox)) == [2, 3, 4, 5, 6, 7]
    outbox.append("health", b"x" * PAYLOAD)
    outbox.append("health", b"x" * PAYLOAD)
    assert [r.kind for r in everything(outbox)].count("results") == 0
    stats = outbox.stats()
    assert (stats.dropped_results, stats.dropped_health, stats.pending_results) == (3, 0, 0)
    assert not stats.alarm


def test_results_keep_to_their_share_and_count_newest_first(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=10 * ROW,
        max_payload_bytes=PAYLOAD,
        results_share=0.3,
        max_pending_results=2,
        wal_reserve_bytes=0,
    )
    outbox.append("event", b"e" * PAYLOAD)
    for _ in range(5):
        outbox.append("results", b"r" * PAYLOAD)

    # At most two results pending (the count), the newest: 5 and 6.
    assert seqs(everything(outbox)) == [1, 5, 6]
    assert outbox.stats().dropped_results == 3

    small = open_outbox(
        path=outbox.path.with_name("small.db"),
        budget_bytes=10 * ROW,
        max_payload_bytes=2 * PAYLOAD,
        results_share=0.12,
        wal_reserve_bytes=0,
    )
    small.append("results", b"r" * PAYLOAD)  # one row fits in 1.2 rows' share
    small.append("results", b"r" * PAYLOAD)  # the share: the older one goes
    assert seqs(everything(small)) == [2]
    with pytest.raises(OutboxFullError, match="result sample dropped"):
        small.append("results", b"r" * (2 * PAYLOAD))  # over the whole share: not stored
    assert seqs(everything(small)) == [2]
    assert small.stats().dropped_results == 2


def test_a_result_never_pushes_out_health_or_events(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(
        budget_bytes=4 * ROW, max_payload_bytes=PAYLOAD, results_share=1.0, wal_reserve_bytes=0
    )
    for kind in ["event", "health", "health", "results"]:
        outbox.append(kind, b"x" * PAYLOAD)  # type: ignore[arg-type]

    outbox.append("results", b"x" * PAYLOAD)  # replaces the older result
    assert seqs(everything(outbox)) == [1, 2, 3, 5]
    outbox.append("health", b"x" * PAYLOAD)  # takes the result's room
    with pytest.raises(OutboxFullError):
        outbox.append("results", b"x" * PAYLOAD)
    assert seqs(everything(outbox)) == [1, 2, 3, 6]
    stats = outbox.stats()
    assert (stats.dropped_results, stats.dropped_health, stats.refused_events) == (3, 0, 0)
    assert not stats.alarm


def test_results_counters_survive_reopen(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(max_pending_results=1)
    outbox.append("results", b"a")
    outbox.append("results", b"b")
    outbox.close()
    reopened = open_outbox(max_pending_results=1)
    stats = reopened.stats()
    assert (stats.pending_results, stats.dropped_results) == (1, 1)
    assert [r.payload for r in everything(reopened)] == [b"b"]


def test_results_settings_are_checked(open_outbox: OpenOutbox) -> None:
    for bad in ({"results_share": 0.0}, {"results_share": 1.5}, {"max_pending_results": 0}):
        with pytest.raises(InvalidInputError):
            open_outbox(**bad)


_V1_SCHEMA = (
    """
    CREATE TABLE outbox (
        seq             INTEGER PRIMARY KEY,
        id              TEXT    NOT NULL UNIQUE,
        kind            TEXT    NOT NULL CHECK (kind IN ('event', 'health')),
        created_at      INTEGER NOT NULL,
        payload         BLOB    NOT NULL,
        size            INTEGER NOT NULL CHECK (size >= 0),
        attempts        INTEGER NOT NULL DEFAULT 0,
        last_attempt_at INTEGER
    )
    """,
    "CREATE INDEX outbox_kind_seq ON outbox (kind, seq)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID",
)


def test_a_version_1_outbox_is_migrated_with_everything_in_it(
    open_outbox: OpenOutbox, tmp_path: Path
) -> None:
    """An agent before results wrote schema 1; its records and counters carry over."""
    path = tmp_path / "outbox.db"
    with sqlite3.connect(path) as raw:
        for statement in _V1_SCHEMA:
            raw.execute(statement)
        raw.execute(
            "INSERT INTO outbox VALUES (7, '01890000-0000-7000-8000-000000000007', 'event', "
            "1700000000000, x'6576', 130, 2, 1700000001000)"
        )
        raw.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("node_id", "node-1"),
                ("high_water_seq", 7),
                ("dropped_health", 4),
                ("refused_events", 1),
                ("last_acked_seq", 6),
                ("alarm", 0),
            ],
        )
        raw.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        raw.execute("PRAGMA user_version = 1")
    raw.close()

    outbox = open_outbox()
    (kept,) = everything(outbox)
    assert (kept.seq, kept.kind, kept.payload, kept.attempts) == (7, "event", b"ev", 2)
    stats = outbox.stats()
    assert (stats.high_water_seq, stats.dropped_health, stats.refused_events) == (7, 4, 1)
    assert (stats.bytes, stats.dropped_results) == (130, 0)
    assert outbox.append("results", b"r").seq == 8
    outbox.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        indexes = [row[1] for row in raw.execute("PRAGMA index_list(outbox)")]
    raw.close()
    assert "outbox_kind_seq" in indexes
    assert [r.seq for r in everything(open_outbox())] == [7, 8]


# ---------------------------------------------------------------- SIGKILL

_APPEND_FOREVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from edge_node.clock import SystemClock
    from edge_node.errors import OutboxFullError
    from edge_node.outbox import Outbox

    outbox = Outbox.open(Path(sys.argv[1]), node_id="node-1", budget_bytes=40_000,
                         clock=SystemClock(), max_payload_bytes=1024, health_keep_every=3)
    unacked_events = []
    for i in range(1_000_000):
        kind = "event" if i % 4 == 0 else "health"
        try:
            record = outbox.append(kind, bytes([i % 256]) * (i % 700))
        except OutboxFullError:
            continue
        print("A", record.seq, record.id, kind, flush=True)
        if kind == "event":
            unacked_events.append(record.id)
        if len(unacked_events) == 8:
            print("ACKING", *unacked_events, flush=True)
            outbox.ack(unacked_events)
            print("ACKED", *unacked_events, flush=True)
            unacked_events = []
    """
)


def test_sigkill_at_any_point_leaves_a_consistent_outbox(tmp_path: Path) -> None:
    rounds = [40, 300, 900]  # appends seen before each kill; three lives on one file
    path = tmp_path / "outbox.db"
    appended: dict[int, tuple[str, str]] = {}  # seq -> (id, kind), as the child reported
    acking: set[str] = set()
    acked: set[str] = set()

    for kill_after in rounds:
        lines = _run_and_kill(path, kill_after)
        life = [int(words[1]) for words in lines if words[0] == "A"]
        # No gaps among the appends this life reported, and none reused from earlier lives.
        assert life == list(range(life[0], life[0] + len(life)))
        assert life[0] > max(appended, default=0)
        for words in lines:
            if words[0] == "A":
                appended[int(words[1])] = (words[2], words[3])
            elif words[0] == "ACKING":
                acking.update(words[1:])
            elif words[0] == "ACKED":
                acked.update(words[1:])

        with Outbox.open(
            path, node_id="node-1", budget_bytes=40_000, clock=ManualClock(), max_payload_bytes=1024
        ) as outbox:
            rows = everything(outbox)
            stats = outbox.stats()
        present = {r.seq: r for r in rows}

        assert seqs(rows) == sorted(set(seqs(rows))), "seqs strictly increasing"
        assert len({r.id for r in rows}) == len(rows), "ids unique"
        top_reported = max(appended)
        # At most one append can have committed without its line reaching us.
        assert all(seq <= top_reported + 1 for seq in present)
        assert stats.high_water_seq >= top_reported
        missing_health = 0
        for seq, (rid, kind) in appended.items():
            if seq in present:
                assert present[seq].id == rid and present[seq].kind == kind
                assert rid not in acked
            elif kind == "event":
                assert rid in acking, f"event seq {seq} vanished without an ack"
            else:
                missing_health += 1
        # Thinning and its counter commit together, so every missing report is counted.
        assert missing_health <= stats.dropped_health
        assert stats.pending_events + stats.pending_health == len(rows)

    assert len(appended) >= sum(rounds)
    assert stats.dropped_health > 0, "the child should have run into thinning"


def _run_and_kill(path: Path, kill_after: int) -> list[list[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _APPEND_FOREVER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert child.stdout is not None
    lines: list[list[str]] = []
    appends = 0
    deadline = time.monotonic() + 60
    try:
        while appends < kill_after:
            line = child.stdout.readline()
            if not line:
                _, err = child.communicate(timeout=10)
                pytest.fail(f"child exited early: {err}")
            if time.monotonic() > deadline:
                pytest.fail("child too slow")
            lines.append(line.split())
            appends += line.startswith("A ")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
    # Whole lines only: one cut mid-write by the kill tells us nothing.
    lines += [line.split() for line in rest.splitlines(keepends=True) if line.endswith("\n")]
    assert child.returncode == -signal.SIGKILL
    return lines


# ---------------------------------------------------------------- property


class OutboxMachine(RuleBasedStateMachine):
    """Random appends, acks and reopens against the documented rule.

    Invariants: pending | acked | dropped health == appended, with no duplicates; events
    are never dropped; pending matches the reference model exactly.
    """

    BUDGET = 12 * ROW
    KEEP_EVERY = 3
    RESULTS_SHARE = 0.34  # four rows of the twelve
    MAX_RESULTS = 3

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "outbox.db"
        self.clock = ManualClock()
        self.outbox = self._open()
        self.model = BudgetModel(self.BUDGET, self.KEEP_EVERY, self.RESULTS_SHARE, self.MAX_RESULTS)
        self.appended: dict[str, tuple[int, Kind]] = {}
        self.acked: set[str] = set()

    def _open(self) -> Outbox:
        return Outbox.open(
            self.path,
            node_id="node-1",
            budget_bytes=self.BUDGET,
            wal_reserve_bytes=0,
            clock=self.clock,
            max_payload_bytes=2 * PAYLOAD,
            health_keep_every=self.KEEP_EVERY,
            results_share=self.RESULTS_SHARE,
            max_pending_results=self.MAX_RESULTS,
        )

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(["event", "health", "health", "results"]),
                st.integers(min_value=0, max_value=2 * PAYLOAD),
            ),
            min_size=1,
            max_size=8,
        )
    )
    def append(self, batch: list[tuple[Kind, int]]) -> None:
        for kind, size in batch:
            self.clock.advance(timedelta(milliseconds=1))
            dropped_before = self.model.dropped_health
            results_before = self.model.dropped_results
            expected_seq = self.model.append(kind, size + ROW_OVERHEAD_BYTES)
            if self.model.dropped_health > dropped_before + (expected_seq is None):
                event("health thinned")
            if self.model.dropped_results > results_before + (expected_seq is None):
                event(f"results dropped for {kind}")
            try:
                record = self.outbox.append(kind, b"p" * size)
            except OutboxFullError:
                assert expected_seq is None
                event(f"{kind} refused")
                continue
            assert record.seq == expected_seq
            assert record.id not in self.appended
            self.appended[record.id] = (record.seq, kind)

    @precondition(lambda self: self.appended)
    @rule(data=st.data())
    def ack_some_ids(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.appended)), max_size=6))
        ids.append("01890000-0000-7000-8000-000000000000")  # unknown: ignored
        pending_before = {r.id for r in everything(self.outbox)}
        deleted = self.outbox.ack(ids)
        assert deleted == len(set(ids) & pending_before)
        self.acked |= set(ids) & pending_before
        self.model.ack({self.appended[i][0] for i in ids if i in self.appended})

    @rule(offset=st.integers(min_value=-3, max_value=2))
    def ack_up_to(self, offset: int) -> None:
        up_to = max(0, self.model.high_water + offset)
        acked_now = {r.id for r in everything(self.outbox) if r.seq <= up_to}
        assert self.outbox.ack(up_to_seq=up_to) == len(acked_now)
        self.acked |= acked_now
        self.model.ack({seq for seq, _, _ in self.model.rows if seq <= up_to})

    @rule()
    def reopen(self) -> None:
        self.outbox.close()
        self.outbox = self._open()

    @invariant()
    def nothing_lost_nothing_duplicated(self) -> None:
        rows = everything(self.outbox)
        stats = self.outbox.stats()
        pending = {r.id for r in rows}
        assert len(pending) == len(rows)
        assert seqs(rows) == [seq for seq, _, _ in self.model.rows]
        assert not pending & self.acked
        dropped = set(self.appended) - pending - self.acked
        assert all(self.appended[i][1] != "event" for i in dropped), "an event was dropped"
        assert pending | self.acked | dropped == set(self.appended)
        dropped_health = [i for i in dropped if self.appended[i][1] == "health"]
        assert stats.dropped_health == self.model.dropped_health >= len(dropped_health)
        assert (
            stats.dropped_results
            == self.model.dropped_results
            >= len(dropped) - len(dropped_health)
        )
        assert stats.pending_results == self.model.count("results") <= self.MAX_RESULTS
        assert stats.refused_events == self.model.refused_events
        assert stats.bytes == self.model.total() <= self.BUDGET
        assert stats.high_water_seq == self.model.high_water

    def teardown(self) -> None:
        self.outbox.close()
        self.dir.cleanup()


OutboxMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_outbox_invariants_under_random_operations = OutboxMachine.TestCase


# ---------------------------------------------------------------- append listeners


def test_append_listeners_hear_of_every_append_that_stored_something(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox(budget_bytes=5 * ROW, wal_reserve_bytes=0, max_payload_bytes=PAYLOAD)
    heard: list[int] = []

    def listener() -> None:
        # After the commit, outside the lock: the record is readable from here.
        heard.append(len(everything(outbox)))

    remove = outbox.on_append(listener)
    outbox.append("health", b"h" * PAYLOAD)
    event_id = "0190f6a0-0000-7000-8000-000000000001"
    assert outbox.append_once("event", b"e" * PAYLOAD, event_id) is not None
    assert outbox.append_once("event", b"e" * PAYLOAD, event_id) is None  # pending: not heard
    ids = [f"0190f6a0-0000-7000-8000-00000000001{i}" for i in range(4)]
    done = outbox.append_many_once("event", [(b"e" * PAYLOAD, i) for i in ids])
    assert len([r for r in done.records if r is not None]) == 3  # the budget takes 3 of 4
    assert isinstance(done.error, OutboxFullError)
    assert heard == [1, 2, 5]
    replay = outbox.append_many_once("event", [(b"e" * PAYLOAD, event_id)])
    assert replay.records == (None,)  # stored nothing: not heard
    with pytest.raises(OutboxFullError):
        outbox.append("event", b"e" * PAYLOAD)  # refused: not heard
    assert heard == [1, 2, 5]
    remove()
    outbox.ack(ids[:1])
    outbox.append("event", b"e" * PAYLOAD)
    assert heard == [1, 2, 5]  # removed


def test_a_listener_that_raises_does_not_fail_the_append(
    open_outbox: OpenOutbox, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = open_outbox()

    def broken() -> None:
        raise RuntimeError("a sender's bug")

    outbox.on_append(broken)
    heard: list[bool] = []
    outbox.on_append(lambda: heard.append(True))
    record = outbox.append("event", b"e")
    assert everything(outbox) == [record]
    assert heard == [True]  # the others are still called
    assert "listener raised" in caplog.text
