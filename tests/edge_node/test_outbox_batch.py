"""``Outbox.append_many_once``: many records in one transaction, each stored once by its id,
under the single form's budget, full-disk and crash rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_node.clock import ManualClock
from edge_node.errors import InvalidInputError, OutboxFullError, PayloadTooLargeError
from edge_node.outbox import ROW_OVERHEAD_BYTES, Outbox, Record

OpenOutbox = Callable[..., Outbox]
REPO_ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = 72
ROW = PAYLOAD + ROW_OVERHEAD_BYTES


def rid(n: int) -> str:
    return str(uuid.UUID(int=n))


@pytest.fixture
def open_outbox(tmp_path: Path) -> Iterator[OpenOutbox]:
    opened: list[Outbox] = []

    def _open(**overrides: Any) -> Outbox:
        options: dict[str, Any] = {
            "node_id": "node-1",
            "budget_bytes": 1_000_000,
            "clock": ManualClock(),
        }
        options.update(overrides)
        outbox = Outbox.open(tmp_path / "outbox.db", **options)
        opened.append(outbox)
        return outbox

    yield _open
    for outbox in opened:
        outbox.close()


def everything(outbox: Outbox) -> list[Record]:
    return outbox.pending(limit=1_000_000, max_bytes=1 << 40)


def test_a_batch_stores_each_record_once_by_its_id(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox()
    first = outbox.append_once("event", b"a", rid(1))
    assert first is not None

    done = outbox.append_many_once(
        "event", [(b"b", rid(2)), (b"a", rid(1)), (b"c", rid(3)), (b"b again", rid(2))]
    )

    assert done.error is None
    stored = [r.id if r is not None else None for r in done.records]
    assert stored == [rid(2), None, rid(3), None]  # pending already; earlier in the batch
    rows = everything(outbox)
    assert [(r.id, r.payload) for r in rows] == [(rid(1), b"a"), (rid(2), b"b"), (rid(3), b"c")]
    assert [r.seq for r in rows] == [first.seq, first.seq + 1, first.seq + 2]
    assert outbox.stats().high_water_seq == first.seq + 2  # duplicates take no seq
    outbox.close()
    assert [r.id for r in everything(open_outbox())] == [rid(1), rid(2), rid(3)]


@pytest.mark.parametrize("wal_reserve", [0, 4000], ids=["a-transaction-each", "one-transaction"])
def test_a_batch_crossing_the_budget_stores_the_prefix_and_refuses_the_rest(
    open_outbox: OpenOutbox, wal_reserve: int
) -> None:
    outbox = open_outbox(
        budget_bytes=5 * ROW + wal_reserve, wal_reserve_bytes=wal_reserve, max_payload_bytes=PAYLOAD
    )
    for n in range(3):
        outbox.append_once("event", b"e" * PAYLOAD, rid(n))

    done = outbox.append_many_once("event", [(b"e" * PAYLOAD, rid(10 + n)) for n in range(4)])

    assert [r.id for r in done.records if r is not None] == [rid(10), rid(11)]
    assert len(done.records) == 2  # items[2] is the refused one; it and items[3] are held
    assert isinstance(done.error, OutboxFullError)
    # The single form's error for that record, and one refusal counted, as it would.
    with pytest.raises(OutboxFullError) as single:
        outbox.append_once("event", b"e" * PAYLOAD, rid(12))
    assert done.error.fields["reason"] == single.value.fields["reason"] == "budget"
    assert done.error.fields["kind"] == "event"
    stats = outbox.stats()
    assert (stats.pending_events, stats.refused_events, stats.alarm) == (5, 2, True)
    # Room again: the held records go in, the stored ones are not stored twice.
    outbox.ack([rid(0), rid(1)])
    again = outbox.append_many_once("event", [(b"e" * PAYLOAD, rid(10 + n)) for n in range(4)])
    assert again.error is None
    assert [r is None for r in again.records] == [True, True, False, False]
    assert outbox.stats().pending_events == 5


def test_a_full_disk_mid_batch_loses_nothing_and_refuses_like_the_single_form(
    open_outbox: OpenOutbox,
) -> None:
    outbox = open_outbox()  # reserve 125,000: parts of about 62,500 record bytes
    outbox.append_once("event", b"x", rid(0))
    conn = outbox._conn
    assert conn is not None
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    # Room for the first part's 30 KB records, not for the second part's: SQLITE_FULL.
    conn.execute(f"PRAGMA max_page_count = {pages + 20}")
    items = [(bytes([n]) * 30_000, rid(1 + n)) for n in range(4)]  # parts: [1, 2], [3, 4]

    done = outbox.append_many_once("event", items)

    assert isinstance(done.error, OutboxFullError)
    with pytest.raises(OutboxFullError) as single:
        outbox.append_once("event", b"y" * 200_000, rid(99))
    assert done.error.fields["reason"] == single.value.fields["reason"] == "disk full"
    assert [r.id for r in done.records if r is not None] == [rid(1), rid(2)]
    assert len(done.records) == 2
    rows = everything(outbox)
    # What the result says is stored is stored; the rest is not, and the caller holds it.
    assert [r.id for r in rows] == [rid(0), rid(1), rid(2)]
    assert [r.payload for r in rows[1:]] == [items[0][0], items[1][0]]
    stats = outbox.stats()
    assert (stats.pending_events, stats.refused_events, stats.alarm) == (3, 2, True)
    conn.execute("PRAGMA max_page_count = 1000000")
    again = outbox.append_many_once("event", items)
    assert again.error is None
    assert [r is None for r in again.records] == [True, True, False, False]


def test_invalid_input_raises_before_anything_is_stored(open_outbox: OpenOutbox) -> None:
    outbox = open_outbox(max_payload_bytes=100)
    with pytest.raises(InvalidInputError, match="lowercase UUID"):
        outbox.append_many_once("event", [(b"a", rid(1)), (b"b", "not-a-uuid")])
    with pytest.raises(PayloadTooLargeError):
        outbox.append_many_once("event", [(b"a", rid(1)), (b"b" * 101, rid(2))])
    with pytest.raises(InvalidInputError, match="unknown record kind"):
        outbox.append_many_once("nope", [(b"a", rid(1))])  # type: ignore[arg-type]
    assert everything(outbox) == []
    assert outbox.append_many_once("event", []).records == ()


_BATCH_FOREVER = textwrap.dedent(
    """
    import sys, uuid
    from pathlib import Path
    from edge_node.clock import SystemClock
    from edge_node.outbox import Outbox

    outbox = Outbox.open(Path(sys.argv[1]), node_id="node-1", budget_bytes=256 * 1024 * 1024,
                         clock=SystemClock())
    start = int(sys.argv[2])
    for batch in range(start, start + 100_000):
        items = [(bytes([j % 256]) * 600, str(uuid.UUID(int=batch * 10_000 + j)))
                 for j in range(BATCH)]
        print("S", batch, flush=True)
        done = outbox.append_many_once("event", items)
        assert done.error is None, done.error
        print("B", batch, flush=True)
    """
).replace("BATCH", "2000")


def test_sigkill_mid_batch_leaves_all_or_none_of_its_transaction(tmp_path: Path) -> None:
    path = tmp_path / "outbox.db"
    reported: set[int] = set()
    start = 0
    cut: list[int] = []  # the batch each kill landed in (started, not reported done)
    last_start = -1
    for life, wait_s in enumerate((0.0, 0.004, 0.011)):
        child = subprocess.Popen(
            [sys.executable, "-c", _BATCH_FOREVER, str(path), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        assert child.stdout is not None
        try:
            # Let some batches commit, then kill one just after its append began.
            starts = 0
            while starts < 2 + life:
                line = child.stdout.readline()
                if not line:
                    _, err = child.communicate(timeout=10)
                    pytest.fail(f"child exited early: {err}")
                word, number = line.split()
                if word == "B":
                    reported.add(int(number))
                else:
                    starts += 1
                    last_start = int(number)
            time.sleep(wait_s)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            rest, _ = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL
        for x in rest.splitlines(keepends=True):
            if x.endswith("\n") and x.startswith("B "):
                reported.add(int(x.split()[1]))
        if last_start not in reported:
            cut.append(last_start)

        with Outbox.open(
            path, node_id="node-1", budget_bytes=256 * 1024 * 1024, clock=ManualClock()
        ) as outbox:
            rows = everything(outbox)
        per_batch: dict[int, int] = {}
        for row in rows:
            batch = uuid.UUID(row.id).int // 10_000
            per_batch[batch] = per_batch.get(batch, 0) + 1
        # Each batch is one transaction (1.4 MB of records, under half the 4 MiB reserve):
        # all of it or none of it, and every batch the child reported is there in full.
        assert set(per_batch.values()) == {2000}
        assert reported <= per_batch.keys()
        assert max(per_batch) <= max(reported) + 1  # at most one commit not reported
        assert len(rows) == len({r.id for r in rows})
        start = max(per_batch) + 1
    # The kills did land inside an append, not only between them: at least one batch
    # started and was not reported done (it is then wholly there or wholly absent above).
    assert cut, "no kill landed inside an append; the test proved nothing"
