"""Simulated edge nodes: many nodes in one process, each speaking the real protocol over
its own `NodeLink` (Hello, record batches acked one at a time, control messages in).

For benchmarks, e2e tests and the demo fleet, which all need "N nodes" without N agents.
Not an agent: no outbox, updater or runtime; a simulated node sends what it is told and
reports what came back. It never builds a link itself (the caller passes gRPC, MQTT or
memory links), so it imports no transport and nothing of the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.timestamp_pb2 import Timestamp

from edge_node.clock import Clock, SystemClock
from edge_node.link.base import LinkError, LinkRefusedError, NodeLink, node_message
from edge_node.uuid7 import UUIDv7Generator
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = [
    "ConnectOutcome",
    "LoadResult",
    "SimulatedFleet",
    "SimulatedNode",
    "SimulatorConfig",
]

DEFAULT_AGENT_VERSION: Final = "sim-0.1.0"
# The most errors a fleet keeps (as text) from one run: enough to see why, bounded.
MAX_ERRORS: Final = 20


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """How the simulated nodes behave; every wait is bounded."""

    agent_version: str = DEFAULT_AGENT_VERSION
    # Nodes connecting at once: keeps a server's listen backlog from overflowing.
    connect_concurrency: int = 16
    connect_timeout_s: float = 60.0
    # Attempts per node before it counts as failed (a refusal is never retried).
    connect_attempts: int = 1
    retry_delay_s: float = 0.5
    ack_timeout_s: float = 30.0
    close_timeout_s: float = 20.0
    kind: int = link_pb2.RECORD_KIND_HEALTH
    content_type: str = "application/json"


@dataclass
class ConnectOutcome:
    connected: int = 0
    failed: list[str] = field(default_factory=list)


@dataclass
class LoadResult:
    """What a stop-and-wait run acked: all of it, and what fell inside the window."""

    acked_total: int = 0
    records: int = 0  # acked inside the window
    messages: int = 0  # batches acked inside the window
    rtts_s: list[float] = field(default_factory=list)  # batch sent -> its Ack, in the window
    errors: list[str] = field(default_factory=list)

    def rtt_quantile(self, q: float) -> float:
        """The `q` quantile of the round trips (0.0 without any)."""
        if not self.rtts_s:
            return 0.0
        ordered = sorted(self.rtts_s)
        return ordered[int(q * (len(ordered) - 1))]


class SimulatedNode:
    """One node: its link, its record sequence and ids, its Hello."""

    def __init__(
        self,
        index: int,
        link: NodeLink,
        config: SimulatorConfig,
        *,
        clock: Clock,
        timer: Callable[[], float],
    ) -> None:
        self.index = index
        self.link = link
        self.config = config
        self._clock = clock
        self._timer = timer
        self._ids = UUIDv7Generator(clock)
        self._seq = 0
        self._incoming: AsyncIterator[link_pb2.ControlMessage] | None = None

    def hello(self) -> link_pb2.Hello:
        return link_pb2.Hello(agent_version=self.config.agent_version)

    async def connect(self) -> None:
        """Connect and say Hello, retrying an outage up to `connect_attempts` times."""
        config = self.config
        for attempt in range(config.connect_attempts):
            try:
                async with asyncio.timeout(config.connect_timeout_s):
                    await self.link.connect(self.hello())
                self._incoming = None
                return
            except LinkRefusedError:
                raise
            except (LinkError, TimeoutError):
                if attempt == config.connect_attempts - 1:
                    raise
                await asyncio.sleep(config.retry_delay_s * (attempt + 1))

    def records(self, count: int, payload: bytes) -> list[link_pb2.Record]:
        """`count` new records (the node's next sequence numbers, UUIDv7 ids)."""
        created = Timestamp()
        created.FromDatetime(self._clock.now())
        batch = []
        for _ in range(count):
            self._seq += 1
            batch.append(
                link_pb2.Record(
                    id=str(self._ids.new()),
                    seq=self._seq,
                    kind=self.config.kind,  # type: ignore[arg-type]
                    created_at=created,
                    content_type=self.config.content_type,
                    payload=payload,
                )
            )
        return batch

    async def send_and_wait(self, records: Sequence[link_pb2.Record]) -> float:
        """Send one batch and wait for the Ack of exactly these records: the round trip."""
        ids = {r.id for r in records}
        incoming = self._reader()
        sent = self._timer()
        await self.link.send(node_message(records=link_pb2.RecordBatch(records=records)))
        async with asyncio.timeout(self.config.ack_timeout_s):
            while True:
                message = await anext(incoming)
                if message.WhichOneof("body") == "ack" and set(message.ack.record_ids) == ids:
                    return self._timer() - sent

    async def listen(
        self, on_message: Callable[[int, link_pb2.ControlMessage, float], None]
    ) -> None:
        """Hand every control message to `on_message(index, message, at)` until the link
        ends (a link error ends it quietly: the caller counts what arrived)."""
        with contextlib.suppress(LinkError):
            async for message in self._reader():
                on_message(self.index, message, self._timer())

    def _reader(self) -> AsyncIterator[link_pb2.ControlMessage]:
        # One iterator per connection: a second `incoming()` would race the first for
        # the messages.
        if self._incoming is None:
            self._incoming = self.link.incoming().__aiter__()
        return self._incoming


class SimulatedFleet:
    """N simulated nodes over the links given, one per node."""

    def __init__(
        self,
        links: Sequence[NodeLink],
        config: SimulatorConfig | None = None,
        *,
        clock: Clock | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or SimulatorConfig()
        self._timer = timer
        clock = clock or SystemClock()
        self.nodes = [
            SimulatedNode(i, link, self.config, clock=clock, timer=timer)
            for i, link in enumerate(links)
        ]

    async def connect_all(
        self, on_settled: Callable[[SimulatedNode, BaseException | None], None] | None = None
    ) -> ConnectOutcome:
        """Connect every node, `connect_concurrency` at a time; the failures are listed."""
        gate = asyncio.Semaphore(self.config.connect_concurrency)
        outcome = ConnectOutcome()

        async def one(node: SimulatedNode) -> None:
            async with gate:
                try:
                    await node.connect()
                except (LinkError, TimeoutError) as exc:
                    outcome.failed.append(f"node {node.index}: {type(exc).__name__}: {exc}")
                    if on_settled is not None:
                        on_settled(node, exc)
                    return
            outcome.connected += 1
            if on_settled is not None:
                on_settled(node, None)

        await asyncio.gather(*(one(node) for node in self.nodes))
        return outcome

    async def stop_and_wait(
        self,
        *,
        batch: int,
        payload: Callable[[int], bytes],
        window_start: float,
        window_end: float,
    ) -> LoadResult:
        """Every node sends batches of `batch` records, each after the previous one's Ack,
        until `window_end` (a `timer` reading); what is acked inside the window counts.
        `payload(index)` is the body of each of node `index`'s records."""
        result = LoadResult()

        async def one(node: SimulatedNode) -> None:
            body = payload(node.index)
            while self._timer() < window_end:
                records = node.records(batch, body)
                rtt = await node.send_and_wait(records)
                acked = self._timer()
                result.acked_total += len(records)
                if window_start <= acked < window_end:
                    result.records += len(records)
                    result.messages += 1
                    result.rtts_s.append(rtt)

        outcomes = await asyncio.gather(*(one(n) for n in self.nodes), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and len(result.errors) < MAX_ERRORS:
                result.errors.append(f"{type(outcome).__name__}: {outcome}")
        return result

    async def listen_all(
        self,
        on_message: Callable[[int, link_pb2.ControlMessage, float], None],
        until: Callable[[], Awaitable[object]],
    ) -> None:
        """Every node hands its control messages to `on_message` until `until()` returns."""
        tasks = [asyncio.create_task(node.listen(on_message)) for node in self.nodes]
        try:
            await until()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Close every link, within `close_timeout_s` all together."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.close_timeout_s):
                await asyncio.gather(
                    *(node.link.close() for node in self.nodes), return_exceptions=True
                )
