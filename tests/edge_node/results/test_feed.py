"""The results feed: the sample into the outbox as `results` records, best effort."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from edge_node.clock import ManualClock
from edge_node.errors import ClosedError
from edge_node.outbox import ROW_OVERHEAD_BYTES, Outbox
from edge_node.results.feed import ResultsFeed, encode_result
from edge_node.results.sampling import ResultSampler, ResultsConfig
from edge_node.runtime.timing import ManualTicker
from protos.bundle.results import RESULTS_SCHEMA, result_from_wire
from tests.edge_node.results.support import result


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    with Outbox.open(
        tmp_path / "outbox.db", node_id="node-1", budget_bytes=1 << 20, clock=ManualClock()
    ) as opened:
        yield opened


def test_the_sample_becomes_results_records_the_control_plane_reads(outbox: Outbox) -> None:
    ticker = ManualTicker()
    sampler = ResultSampler(ResultsConfig(interval_s=5.0))
    feed = ResultsFeed(sampler, outbox, ticker.monotonic)
    sampler.offer(result("gate", 1))
    sampler.offer(result("gate", 2, detections=3))
    sampler.offer(result("yard", 7))

    assert feed.drain_once() == 2
    assert feed.drain_once() == 0  # nothing new, nothing due
    records = outbox.pending(10, 1 << 20)
    assert [r.kind for r in records] == ["results", "results"]
    docs = [result_from_wire(json.loads(r.payload)) for r in records]
    assert [(d["stream"], d["frame_id"]) for d in docs] == [("gate", 2), ("yard", 7)]
    gate = docs[0]
    assert gate["schema"] == RESULTS_SCHEMA
    assert (gate["model"], gate["version"], gate["kind"]) == ("detector", "1.1.0", "detection")
    assert [d["label"] for d in gate["detections"]] == ["person", "car", "plate"]
    assert gate["latency_ms"] == {"queue": 1.0, "preprocess": 2.0, "inference": 10.0, "decode": 0.5}
    assert feed.stats.stored == 2


def test_what_the_outbox_will_not_take_is_dropped_and_counted(tmp_path: Path) -> None:
    sample = encode_result(result("gate", 1))
    # A results share that holds one record: a second one replaces the first (outbox
    # rule), and one of twice the size is refused outright.
    budget = 100 * (len(sample) + ROW_OVERHEAD_BYTES)
    with Outbox.open(
        tmp_path / "small.db",
        node_id="node-1",
        budget_bytes=budget,
        clock=ManualClock(),
        max_payload_bytes=20 * len(sample),
        results_share=1.5 / 100,
    ) as outbox:
        ticker = ManualTicker()
        sampler = ResultSampler(ResultsConfig(interval_s=1.0))
        feed = ResultsFeed(sampler, outbox, ticker.monotonic)
        sampler.offer(result("gate", 1))
        assert feed.drain_once() == 1
        ticker.advance(1.0)
        sampler.offer(result("gate", 2))
        assert feed.drain_once() == 1
        ticker.advance(1.0)
        sampler.offer(result("gate", 3, detections=40))  # far larger than the share
        assert feed.drain_once() == 0
        assert (feed.stats.stored, feed.stats.dropped) == (2, 1)
        stats = outbox.stats()
        assert (stats.pending_results, stats.dropped_results) == (1, 2)
        (kept,) = outbox.pending(10, 1 << 20)
        assert json.loads(kept.payload)["frame_id"] == 2


def test_a_result_json_cannot_carry_is_counted_not_stored(outbox: Outbox) -> None:
    sampler = ResultSampler()
    feed = ResultsFeed(sampler, outbox, ManualTicker().monotonic)
    bad = result("gate", 1)
    object.__setattr__(bad, "frame_id", object())  # a decoder bug upstream
    sampler.offer(bad)
    assert feed.drain_once() == 0
    assert feed.stats.unencodable == 1
    assert outbox.stats().pending_results == 0


def test_run_ends_quietly_when_the_outbox_closes_or_stop_is_set(outbox: Outbox) -> None:
    sampler = ResultSampler(ResultsConfig(drain_interval_s=0.05))
    ticker = ManualTicker()
    feed = ResultsFeed(sampler, outbox, ticker.monotonic)

    async def main() -> None:
        stop = anyio.Event()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(feed.run, stop)
                sampler.offer(result("gate", 1))
                while feed.stats.stored == 0:
                    await anyio.sleep(0.01)
                stop.set()
        outbox.close()
        with pytest.raises(ClosedError):
            outbox.stats()
        sampler.offer(result("gate", 2))
        ticker.advance(sampler.config.interval_s)  # due: the feed appends, and learns
        with anyio.fail_after(10):
            await feed.run(anyio.Event())  # returns: the outbox closed under it

    anyio.run(main)
