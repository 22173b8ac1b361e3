"""An in-memory `NodeLink` for tests of anything above the transport (uplink, updater).

The test plays the control plane through `MemoryLinkPeer`: it reads what the node sent,
answers with control messages, and can drop or refuse the link on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from edge_node.link.base import (
    LinkNotFoundError,
    LinkRefusedError,
    LinkUnavailableError,
    NodeLink,
)
from protos.edgefleet.fleet.v1 import link_pb2


class MemoryLinkPeer:
    """The control plane's end: `sent` holds every NodeMessage, `reply()` answers."""

    def __init__(self) -> None:
        self.sent: list[link_pb2.NodeMessage] = []
        self.hellos: list[link_pb2.Hello] = []
        self.up = True
        self.refuse = False
        self.metadata: dict[str, bytes] = {}
        self.artifacts: dict[str, bytes] = {}
        self.received = anyio.Event()
        self._down: MemoryObjectSendStream[link_pb2.ControlMessage | None] | None = None

    def attach(self, stream: MemoryObjectSendStream[link_pb2.ControlMessage | None]) -> None:
        self._down = stream

    async def reply(self, message: link_pb2.ControlMessage) -> None:
        if self._down is not None:
            await self._down.send(message)

    async def drop(self) -> None:
        """Cut the link: the node sees LinkUnavailableError and must reconnect."""
        if self._down is not None:
            await self._down.send(None)
            self._down = None

    def record(self, message: link_pb2.NodeMessage) -> None:
        self.sent.append(message)
        self.received.set()
        self.received = anyio.Event()


class MemoryNodeLink(NodeLink):
    def __init__(self, peer: MemoryLinkPeer) -> None:
        self.peer = peer
        self._receive: MemoryObjectReceiveStream[link_pb2.ControlMessage | None] | None = None

    async def connect(self, hello: link_pb2.Hello) -> None:
        if self.peer.refuse:
            raise LinkRefusedError("refused by the test peer")
        if not self.peer.up:
            raise LinkUnavailableError("the test peer is down")
        send, receive = anyio.create_memory_object_stream[link_pb2.ControlMessage | None](100)
        self._receive = receive
        self.peer.attach(send)
        self.peer.hellos.append(hello)

    async def send(self, message: link_pb2.NodeMessage) -> None:
        if self._receive is None or not self.peer.up:
            raise LinkUnavailableError("not connected")
        self.peer.record(message)

    async def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        if self._receive is None:
            raise LinkUnavailableError("not connected")
        async for message in self._receive:
            if message is None:
                self._receive = None
                raise LinkUnavailableError("the test peer dropped the link")
            yield message

    async def fetch_metadata(self, filename: str) -> bytes:
        if filename not in self.peer.metadata:
            raise LinkNotFoundError(f"no metadata {filename}")
        return self.peer.metadata[filename]

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        data = self.peer.artifacts[sha256]
        yield data[offset:]

    async def close(self) -> None:
        self._receive = None
