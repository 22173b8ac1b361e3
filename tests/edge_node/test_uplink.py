"""The uplink drains the outbox through any NodeLink and survives drops and resends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from edge_node.clock import SystemClock
from edge_node.link.base import Backoff, LinkRefusedError
from edge_node.link.uplink import Uplink, UplinkConfig, to_wire
from edge_node.outbox import Outbox
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from protos.edgefleet.fleet.v1 import link_pb2

pytestmark = pytest.mark.anyio

FAST = UplinkConfig(
    batch_records=7,
    idle_poll_s=0.01,
    heartbeat_s=0.05,
    ack_timeout_s=0.3,
    backoff=Backoff(initial_s=0.01, cap_s=0.05),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    box = Outbox.open(
        tmp_path / "outbox.db", node_id="n-1", budget_bytes=8 << 20, clock=SystemClock()
    )
    yield box
    box.close()


def hello() -> link_pb2.Hello:
    return link_pb2.Hello(agent_version="0.1.0")


async def control_plane(
    peer: MemoryLinkPeer, stored: set[str], acking: dict[str, bool] | None = None
) -> None:
    """Stores every record it sees and acks the batch, like the real one."""
    seen = 0
    while True:
        await peer.received.wait()
        for message in peer.sent[seen:]:
            seen += 1
            if message.WhichOneof("body") != "records":
                continue
            ids = [r.id for r in message.records.records]
            stored.update(ids)
            if acking is None or acking["on"]:
                await peer.reply(link_pb2.ControlMessage(ack=link_pb2.Ack(record_ids=ids)))


async def until(condition: object, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.01)


async def test_everything_is_delivered_once_acked_and_removed(outbox: Outbox) -> None:
    sent = {outbox.append("event", b'{"n": %d}' % i).id for i in range(30)}
    peer = MemoryLinkPeer()
    stored: set[str] = set()
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(control_plane, peer, stored)
        tasks.start_soon(uplink.run, hello, stop)
        await until(lambda: outbox.stats().pending_events == 0)
        stop.set()
        tasks.cancel_scope.cancel()
    assert stored == sent
    assert uplink.stats.records_acked == 30
    assert peer.hellos[0].agent_version == "0.1.0"


async def test_a_dropped_link_is_resumed_and_unacked_records_resent(outbox: Outbox) -> None:
    first = {outbox.append("event", b"x").id for _ in range(5)}
    peer = MemoryLinkPeer()
    stored: set[str] = set()
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        # a control plane that stores but never acks: the batch stays pending
        acking = {"on": False}
        tasks.start_soon(control_plane, peer, stored, acking)
        tasks.start_soon(uplink.run, hello, stop)
        await until(lambda: stored == first)
        assert outbox.stats().pending_events == 5
        peer.up = False
        await peer.drop()
        await anyio.sleep(0.1)
        acking["on"] = True
        peer.up = True
        await until(lambda: outbox.stats().pending_events == 0)
        stop.set()
        tasks.cancel_scope.cancel()
    assert stored == first
    assert uplink.stats.connects >= 2
    assert len(peer.hellos) >= 2


async def test_a_refused_node_stops_instead_of_spinning(outbox: Outbox) -> None:
    peer = MemoryLinkPeer()
    peer.refuse = True
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    with pytest.raises(LinkRefusedError):
        await uplink.run(hello, anyio.Event())


async def test_heartbeats_flow_while_idle(outbox: Outbox) -> None:
    peer = MemoryLinkPeer()
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(uplink.run, hello, stop)
        await until(lambda: sum(m.WhichOneof("body") == "heartbeat" for m in peer.sent) >= 2)
        stop.set()


async def test_a_full_disk_under_the_outbox_does_not_stop_the_uplink(outbox: Outbox) -> None:
    """Recording an attempt or deleting acked records fails (SQLite: disk full): the
    records stay, are sent again after the ack timeout, and go once the disk has room."""
    from edge_node.errors import StorageError

    sent = {outbox.append("event", b"x").id for _ in range(3)}
    full = {"on": True}
    real_ack, real_mark = outbox.ack, outbox.mark_attempt

    def ack(ids: object = (), **kwargs: object) -> int:
        if full["on"]:
            raise StorageError("outbox ack failed: database or disk is full")
        return real_ack(ids, **kwargs)  # type: ignore[arg-type]

    def mark_attempt(ids: object) -> int:
        if full["on"]:
            raise StorageError("outbox mark_attempt failed: database or disk is full")
        return real_mark(ids)  # type: ignore[arg-type]

    outbox.ack = ack  # type: ignore[method-assign]
    outbox.mark_attempt = mark_attempt  # type: ignore[method-assign]
    peer = MemoryLinkPeer()
    stored: set[str] = set()
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(control_plane, peer, stored)
        tasks.start_soon(uplink.run, hello, stop)
        await until(lambda: uplink.stats.batches_sent >= 2)  # sent again after the timeout
        assert outbox.stats().pending_events == 3 and uplink.stats.connects == 1
        full["on"] = False
        await until(lambda: outbox.stats().pending_events == 0)
        stop.set()
        tasks.cancel_scope.cancel()
    assert stored == sent


async def test_results_go_last_and_a_plane_that_refuses_them_holds_up_only_results(
    outbox: Outbox,
) -> None:
    results = {outbox.append("results", b'{"r": %d}' % i).id for i in range(3)}
    first = {outbox.append("event", b"e").id, outbox.append("health", b"h").id}
    peer = MemoryLinkPeer()
    batches: list[set[str]] = []

    async def older_control_plane() -> None:
        """Acks events and health; refuses (never acks) a kind it does not know."""
        seen = 0
        while True:
            await peer.received.wait()
            for message in peer.sent[seen:]:
                seen += 1
                if message.WhichOneof("body") != "records":
                    continue
                sent = message.records.records
                batches.append({r.id for r in sent})
                if all(r.kind != link_pb2.RECORD_KIND_RESULTS for r in sent):
                    ids = [r.id for r in sent]
                    await peer.reply(link_pb2.ControlMessage(ack=link_pb2.Ack(record_ids=ids)))

    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=FAST)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(older_control_plane)
        tasks.start_soon(uplink.run, hello, stop)
        await until(lambda: any(b <= results for b in batches))  # results go out once idle
        later = outbox.append("event", b"later").id  # while the results batch waits
        await until(lambda: outbox.stats().pending_events == 0)
        stop.set()
        tasks.cancel_scope.cancel()
    assert batches[0] == first  # before the older results
    assert {later} in batches
    assert all(b <= results or not b & results for b in batches)  # never mixed
    assert outbox.stats().pending_results == 3  # kept: best effort, until the outbox drops them


async def test_events_go_as_protobuf_and_the_rest_as_the_configured_type(outbox: Outbox) -> None:
    event = outbox.append_once("event", b"\x0a\x01x", "6f1c1d0e-8e2b-5c1a-9d3e-2f4a5b6c7d8e")
    assert event is not None
    health = outbox.append("health", b"{}")
    assert to_wire(event, "application/json").content_type == "application/x-protobuf"
    assert to_wire(health, "application/json").content_type == "application/json"


async def test_an_idle_uplink_sends_a_new_record_when_it_is_stored_not_at_the_next_poll(
    outbox: Outbox,
) -> None:
    # A poll of 30 s: only the outbox's append wakes the uplink in time.
    config = UplinkConfig(
        batch_records=7, idle_poll_s=30.0, heartbeat_s=5.0, backoff=Backoff(0.01, 0.05)
    )
    peer = MemoryLinkPeer()
    stored: set[str] = set()
    uplink = Uplink(outbox, MemoryNodeLink(peer), clock=SystemClock(), config=config)
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(control_plane, peer, stored)
        tasks.start_soon(uplink.run, hello, stop)
        first = (await anyio.to_thread.run_sync(outbox.append, "event", b"1")).id
        await until(lambda: first in stored, timeout=5.0)
        await anyio.sleep(0.3)  # idle now, waiting on its 30 s poll
        for n in range(3):
            # Stored from another thread, as the aggregation's drain stores events.
            record = await anyio.to_thread.run_sync(outbox.append, "event", b"%d" % n)
            started = anyio.current_time()
            await until(lambda r=record: r.id in stored, timeout=5.0)
            assert anyio.current_time() - started < 1.0
        stop.set()
        tasks.cancel_scope.cancel()
    assert outbox.stats().pending_events == 0
    assert uplink.stats.records_acked == 4
