"""An in-memory `NodeLink` for tests of anything above the transport (uplink, updater).

The test plays the control plane through `MemoryLinkPeer`: it reads what the node sent,
answers with control messages, and can drop or refuse the link on demand; with
`ack_records` it stores and acks record batches itself, as the real control plane does.
tests/edge_node/link_contract proves it keeps the port's contract as the gRPC and MQTT
links do. Not a transport: nothing leaves the process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from edge_node.link.base import (
    PROTOCOL_VERSION,
    LinkNotFoundError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    NodeLink,
)
from protos.edgefleet.fleet.v1 import link_pb2

# Control messages waiting for the node, as a real link's incoming queue is bounded.
MAX_PENDING: Final = 100
DEFAULT_CONNECT_TIMEOUT_S: Final = 10.0


class MemoryLinkPeer:
    """The control plane's end: `sent` holds every NodeMessage, `reply()` answers.

    `ack_records`: store every record batch (`stored`, by record id, so a resent record
    is stored once) and ack it at once, as the control plane acks after its commit.
    """

    def __init__(self, *, ack_records: bool = False) -> None:
        self.sent: list[link_pb2.NodeMessage] = []
        self.hellos: list[link_pb2.Hello] = []
        self.stored: dict[str, link_pb2.Record] = {}
        self.ack_records = ack_records
        self.up = True
        self.refuse = False
        # Reachable but silent: a connect waits out its timeout, as against a control plane
        # (or broker) that accepts the connection and never answers.
        self.silent = False
        self.metadata: dict[str, bytes] = {}
        self.artifacts: dict[str, bytes] = {}
        self.received = anyio.Event()
        self._down: MemoryObjectSendStream[link_pb2.ControlMessage] | None = None

    def attach(self, stream: MemoryObjectSendStream[link_pb2.ControlMessage]) -> None:
        """A node connected: from now on its stream is the one the peer answers on."""
        if self._down is not None and self._down is not stream:
            self._down.close()  # a node has one link; the older one ends
        self._down = stream

    def holds(self, stream: MemoryObjectSendStream[link_pb2.ControlMessage] | None) -> bool:
        """Whether `stream` is the link the peer holds now (not dropped or replaced)."""
        return stream is not None and stream is self._down

    def detach(self, stream: MemoryObjectSendStream[link_pb2.ControlMessage]) -> None:
        """The node closed `stream`; answers go nowhere until it connects again."""
        if self._down is stream:
            self._down = None

    async def reply(self, message: link_pb2.ControlMessage) -> None:
        """Send `message` to the connected node; without one it is lost, as on a real link."""
        if self._down is not None:
            try:
                await self._down.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._down = None

    async def drop(self) -> None:
        """Cut the link: the node sees LinkUnavailableError and must reconnect."""
        down, self._down = self._down, None
        if down is not None:
            down.close()

    def record(self, message: link_pb2.NodeMessage) -> None:
        self.sent.append(message)
        if self.ack_records and message.WhichOneof("body") == "records":
            ids = [r.id for r in message.records.records]
            for record in message.records.records:
                self.stored.setdefault(record.id, record)
            ack = link_pb2.ControlMessage(
                protocol_version=PROTOCOL_VERSION, ack=link_pb2.Ack(record_ids=ids)
            )
            if self._down is not None:
                # Acks are safe to lose (the node resends): a full queue drops this one.
                with contextlib.suppress(
                    anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
                ):
                    self._down.send_nowait(ack)
        self.received.set()
        self.received = anyio.Event()


class MemoryNodeLink(NodeLink):
    def __init__(
        self, peer: MemoryLinkPeer, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    ) -> None:
        self.peer = peer
        self.connect_timeout_s = connect_timeout_s
        self._send: MemoryObjectSendStream[link_pb2.ControlMessage] | None = None
        self._receive: MemoryObjectReceiveStream[link_pb2.ControlMessage] | None = None

    async def connect(self, hello: link_pb2.Hello) -> None:
        self._end()  # as the real links do: a new connection replaces the old one
        if self.peer.refuse:
            raise LinkRefusedError("refused by the test peer")
        if not self.peer.up:
            raise LinkUnavailableError("the test peer is down")
        if self.peer.silent:
            await anyio.sleep(self.connect_timeout_s)
            raise LinkUnavailableError(
                f"the test peer did not answer within {self.connect_timeout_s:g}s"
            )
        send, receive = anyio.create_memory_object_stream[link_pb2.ControlMessage](MAX_PENDING)
        self._send, self._receive = send, receive
        self.peer.attach(send)
        self.peer.hellos.append(hello)

    async def send(self, message: link_pb2.NodeMessage) -> None:
        if not self.peer.up or not self.peer.holds(self._send):
            raise LinkUnavailableError("not connected")
        self.peer.record(message)

    async def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        receive = self._receive
        if receive is None:
            raise LinkUnavailableError("not connected")
        try:
            async for message in receive:
                yield message
        except anyio.ClosedResourceError:
            pass  # closed by close() or a new connect() while this reader waited
        # The sending side was closed: dropped by the peer, replaced or closed here.
        if self._receive is receive:
            self._receive = None
        raise LinkUnavailableError("the link was closed or dropped")

    # Downloads do not look at `peer.up`: it models the Sync stream, and gRPC fetches are
    # calls of their own that work while a stream is down (tests rely on it).

    async def fetch_metadata(self, filename: str) -> bytes:
        if filename not in self.peer.metadata:
            raise LinkNotFoundError(f"no metadata {filename}")
        return self.peer.metadata[filename]

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        data = self.peer.artifacts.get(sha256)
        if data is None:
            raise LinkNotFoundError(f"no artifact {target_path}", sha256=sha256)
        if offset > len(data):
            raise LinkRequestError(f"offset {offset} is past the end ({len(data)})", offset=offset)
        yield data[offset:]

    async def close(self) -> None:
        self._end()

    def _end(self) -> None:
        send, self._send = self._send, None
        self._receive = None
        if send is not None:
            send.close()  # a reader waiting in incoming() sees the end at once
            self.peer.detach(send)
