"""The shipped simulator: many nodes over memory links, and one over a real gRPC control plane."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from edge_node.link.base import LinkUnavailableError
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from edge_node.testing.simulator import SimulatedFleet, SimulatorConfig
from protos.edgefleet.fleet.v1 import link_pb2
from tests.edge_node.link_contract._kits import GrpcKit

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Ticks:
    """A timer that moves one second per reading: windows without sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_every_node_says_hello_and_a_refused_one_is_listed() -> None:
    peers = [MemoryLinkPeer() for _ in range(5)]
    peers[3].refuse = True
    fleet = SimulatedFleet(
        [MemoryNodeLink(p) for p in peers],
        SimulatorConfig(agent_version="sim-9", connect_attempts=3),
    )
    outcome = await fleet.connect_all()
    assert outcome.connected == 4
    assert len(outcome.failed) == 1 and "node 3: LinkRefusedError" in outcome.failed[0]
    assert [len(p.hellos) for p in peers] == [1, 1, 1, 0, 1]
    assert all(h.agent_version == "sim-9" for p in peers for h in p.hellos)


class CountingLink(MemoryNodeLink):
    def __init__(self, peer: MemoryLinkPeer) -> None:
        super().__init__(peer)
        self.attempts = 0

    async def connect(self, hello: link_pb2.Hello) -> None:
        self.attempts += 1
        await super().connect(hello)


async def test_an_outage_is_retried_up_to_the_attempts_and_a_refusal_never() -> None:
    down, refusing = MemoryLinkPeer(), MemoryLinkPeer()
    down.up = False
    refusing.refuse = True
    links = [CountingLink(down), CountingLink(refusing)]
    fleet = SimulatedFleet(links, SimulatorConfig(connect_attempts=3, retry_delay_s=0))
    outcome = await fleet.connect_all()
    assert outcome.connected == 0
    assert [link.attempts for link in links] == [3, 1]
    assert "node 0: LinkUnavailableError" in sorted(outcome.failed)[0]


async def test_stop_and_wait_counts_what_was_acked_inside_the_window() -> None:
    peers = [MemoryLinkPeer(ack_records=True) for _ in range(3)]
    ticks = Ticks()
    fleet = SimulatedFleet([MemoryNodeLink(p) for p in peers], timer=ticks)
    assert (await fleet.connect_all()).connected == 3
    result = await fleet.stop_and_wait(
        batch=4, payload=lambda i: b'{"node": %d}' % i, window_start=10.0, window_end=40.0
    )
    stored = [len(p.stored) for p in peers]
    assert result.errors == []
    assert result.acked_total == sum(stored) > result.records > 0
    assert result.records == 4 * result.messages == 4 * len(result.rtts_s)
    # Every record is the node's own, numbered in order, with the payload asked for.
    for index, peer in enumerate(peers):
        records = list(peer.stored.values())
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        assert {r.payload for r in records} == {b'{"node": %d}' % index}
        assert {r.kind for r in records} == {link_pb2.RECORD_KIND_HEALTH}
    assert result.rtt_quantile(0.5) > 0


async def test_a_node_without_acks_is_an_error_not_a_hang() -> None:
    peer = MemoryLinkPeer()  # stores nothing, acks nothing
    fleet = SimulatedFleet([MemoryNodeLink(peer)], SimulatorConfig(ack_timeout_s=0.05))
    await fleet.connect_all()
    result = await asyncio.wait_for(
        fleet.stop_and_wait(batch=1, payload=lambda i: b"{}", window_start=0, window_end=1e12),
        timeout=5,
    )
    assert result.acked_total == 0 and result.errors and "TimeoutError" in result.errors[0]


async def test_listen_all_hands_over_control_messages_until_told_to_stop() -> None:
    peers = [MemoryLinkPeer() for _ in range(2)]
    fleet = SimulatedFleet([MemoryNodeLink(p) for p in peers])
    await fleet.connect_all()
    seen: list[tuple[int, str]] = []
    done = asyncio.Event()

    def on_message(index: int, message: link_pb2.ControlMessage, at: float) -> None:
        seen.append((index, message.command.name))
        if len(seen) == 2:
            done.set()

    async def ring() -> None:
        for index, peer in enumerate(peers):
            await peer.reply(link_pb2.ControlMessage(command=link_pb2.Command(name=f"for-{index}")))
        await asyncio.wait_for(done.wait(), 5)

    await fleet.listen_all(on_message, ring)
    assert sorted(seen) == [(0, "for-0"), (1, "for-1")]
    await fleet.close()
    with pytest.raises(LinkUnavailableError):
        await fleet.nodes[0].link.send(link_pb2.NodeMessage())


async def test_the_simulator_speaks_the_real_protocol(tmp_path: Path) -> None:
    kit = await GrpcKit(tmp_path).start()
    try:
        fleet = SimulatedFleet([kit.link()], SimulatorConfig(agent_version="sim-grpc"))
        assert (await fleet.connect_all()).connected == 1
        assert await kit.hello_seen("sim-grpc")
        result = await fleet.stop_and_wait(
            batch=5, payload=lambda i: b"{}", window_start=0, window_end=time.monotonic() + 0.5
        )
        assert result.errors == []
        assert result.acked_total == await kit.stored() > 0
        await fleet.close()
    finally:
        await kit.close()
