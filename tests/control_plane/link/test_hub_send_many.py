"""`LinkHub.send_many`: a whole wave of downlink messages in one hop into the event loop,
from a worker thread or on the loop itself, with the same per-node rules as `send`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

import pytest

from control_plane.link import hub as hub_module
from control_plane.link import wire
from control_plane.link.desired import HubDelivery
from control_plane.link.hub import SEND_MANY_SLICE, DownlinkSession, LinkHub
from protos.edgefleet.fleet.v1 import link_pb2
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment


def command(name: str) -> link_pb2.ControlMessage:
    return wire.control_message(command=link_pb2.Command(name=name))


def drain(session: DownlinkSession) -> list[str]:
    names: list[str] = []
    while not session.queue.empty():
        names.append(session.queue.get_nowait().command.name)
    return names


def test_from_a_thread_it_is_one_hop_for_the_whole_list(monkeypatch: pytest.MonkeyPatch) -> None:
    hops: list[object] = []
    real = asyncio.run_coroutine_threadsafe

    def counting(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> Future[Any]:
        hops.append(coro)
        return real(coro, loop)

    monkeypatch.setattr(hub_module.asyncio, "run_coroutine_threadsafe", counting)
    count = 3 * SEND_MANY_SLICE + 5

    async def scenario() -> None:
        hub = LinkHub(max_pending=4)
        sessions = {f"n-{i}": hub.attach(f"n-{i}") for i in range(count)}
        seen: set[int] = set()
        stop = asyncio.Event()

        async def watcher() -> None:
            # What another task on the loop (a stream writing) sees while the list goes in.
            while not stop.is_set():
                seen.add(sum(s.queue.qsize() for s in sessions.values()))
                await asyncio.sleep(0)

        watching = asyncio.create_task(watcher())
        await asyncio.sleep(0)
        items = [(f"n-{i}", command(f"c-{i}")) for i in range(count)]
        items.append(("n-absent", command("lost")))
        queued = await asyncio.to_thread(hub.send_many, items)
        stop.set()
        await watching

        assert queued == [True] * count + [False]
        assert len(hops) == 1
        assert all(drain(sessions[f"n-{i}"]) == [f"c-{i}"] for i in range(count))
        # The loop was handed back between slices: other tasks ran with part of it queued.
        assert seen & set(range(1, count))

    asyncio.run(scenario())


def test_on_the_loop_it_queues_at_once_and_keeps_sends_rules() -> None:
    async def scenario() -> None:
        hub = LinkHub(max_pending=2)
        assert hub.send_many([("n-1", command("a"))]) == [False]  # no loop known yet
        first = hub.attach("n-1")
        ended = hub.attach("n-2")
        ended.end()
        items = [
            ("n-1", command("a")),
            ("n-1", command("b")),
            ("n-1", command("c")),  # over the bound: dropped and counted
            ("n-2", command("d")),  # its stream has ended
            ("n-3", command("e")),  # not connected here
        ]
        assert hub.send_many(items) == [True, True, False, False, False]
        assert hub.dropped == 1
        assert drain(first) == ["a", "b"]
        assert hub.send_many([]) == []

    asyncio.run(scenario())


def test_a_closed_loop_queues_nothing() -> None:
    hub = LinkHub()

    async def attach() -> None:
        hub.attach("n-1")

    asyncio.run(attach())
    assert hub.send_many([("n-1", command("a"))]) == [False]


def test_hub_delivery_reports_the_nodes_it_queued_for() -> None:
    async def scenario() -> None:
        hub = LinkHub()
        session = hub.attach("n-1")
        signed = SignedDirectorAssignment(assignment=b"x", keyid="k", signature=b"s")
        delivery = HubDelivery(hub)
        got = await asyncio.to_thread(
            delivery.deliver_many, "gates", [("n-1", signed), ("n-2", signed)]
        )
        assert got == {"n-1": ("grpc",)}
        message = session.queue.get_nowait()
        assert message.desired.assignment == signed

    asyncio.run(scenario())
