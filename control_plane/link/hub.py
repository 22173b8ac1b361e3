"""Which nodes hold a link to this replica, and a bounded downlink queue to each.

The gRPC `Sync` handler attaches a session when a node's Hello is accepted and detaches
it when the stream ends; whatever decides what a node should do (rollouts, operator
commands) calls `LinkHub.send(node_id, ControlMessage)`, or `LinkHub.send_many` for a
whole wave of nodes (one hop into the event loop for the lot). It holds no state worth
keeping: a node that is not connected here gets its desired state when it next says Hello.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from collections.abc import Sequence
from typing import Final

from control_plane.errors import ConflictError, EdgefleetError, UnavailableError
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = ["DownlinkSession", "LinkHub", "Mailbox"]

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING: Final = 64
_THREADSAFE_TIMEOUT_S: Final = 5.0
# `send_many` hands the loop back after this many nodes, so the streams write meanwhile
# and other connections are served; and waits for the loop this much longer per node.
SEND_MANY_SLICE: Final = 256
_THREADSAFE_PER_NODE_S: Final = 0.001


class Mailbox:
    """A bounded FIFO of one stream's ControlMessages, on the event loop.

    The subset of `asyncio.Queue` the link uses, plus `wait()`, which the stream's end
    also wakes: the downlink waits on one future per idle spell, not on a task per
    message raced against the end (that race was a fifth of the server's time per Ack).
    """

    def __init__(self, maxsize: int) -> None:
        self._items: collections.deque[link_pb2.ControlMessage] = collections.deque()
        self._maxsize = maxsize
        self._waiter: asyncio.Future[None] | None = None
        self._room: collections.deque[asyncio.Future[None]] = collections.deque()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return len(self._items) >= self._maxsize

    def put_nowait(self, message: link_pb2.ControlMessage) -> None:
        """Raises `asyncio.QueueFull` when `maxsize` messages wait already."""
        if self.full():
            raise asyncio.QueueFull
        self._items.append(message)
        self.wake()

    async def put(self, message: link_pb2.ControlMessage) -> None:
        """Waits for room (the stream's reader is cancelled when the stream ends)."""
        while self.full():
            room = asyncio.get_running_loop().create_future()
            self._room.append(room)
            try:
                await room
            finally:
                if room in self._room:
                    self._room.remove(room)
        self.put_nowait(message)

    def get_nowait(self) -> link_pb2.ControlMessage:
        if not self._items:
            raise asyncio.QueueEmpty
        message = self._items.popleft()
        while self._room:
            room = self._room.popleft()
            if not room.done():
                room.set_result(None)
                break
        return message

    async def wait(self) -> None:
        """Until a message is put or `wake()` is called (returns at once if not empty)."""
        if self._items:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class DownlinkSession:
    """One node's open stream: a bounded mailbox of messages and how the stream ended.

    `ended` resolves to None when the node closed its side, or to the error the stream
    must end with (revoked, superseded by a newer stream, server shutting down).
    """

    def __init__(self, node_id: str, max_pending: int) -> None:
        self.node_id = node_id
        self.queue = Mailbox(max_pending)
        self.ended: asyncio.Future[EdgefleetError | None] = (
            asyncio.get_running_loop().create_future()
        )

    def end(self, error: EdgefleetError | None = None) -> None:
        """End the stream (first call wins)."""
        if not self.ended.done():
            self.ended.set_result(error)
            self.queue.wake()


class LinkHub:
    """Per-node downlinks of the connected nodes. `send` may be called from any thread;
    everything else runs on the event loop that serves the links.
    """

    def __init__(self, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self._max_pending = max_pending
        self._sessions: dict[str, DownlinkSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.dropped = 0  # messages refused because a node's queue was full

    # ------------------------------------------------------------- loop side

    def attach(self, node_id: str) -> DownlinkSession:
        """A new stream for `node_id`; an older one of the same node is ended (superseded).

        A node has one Sync stream: the newer one wins, because the older one is most
        likely a connection the node already gave up on.
        """
        self._loop = asyncio.get_running_loop()
        session = DownlinkSession(node_id, self._max_pending)
        with self._lock:
            previous = self._sessions.get(node_id)
            self._sessions[node_id] = session
        if previous is not None:
            previous.end(
                ConflictError(
                    f"a newer Sync stream of node {node_id!r} replaced this one",
                    reason="superseded",
                )
            )
        return session

    def detach(self, session: DownlinkSession) -> bool:
        """Forget `session`; True if it was still the node's current one."""
        with self._lock:
            if self._sessions.get(session.node_id) is not session:
                return False
            del self._sessions[session.node_id]
            return True

    def close_all(self) -> int:
        """End every stream (the server is stopping); returns how many were open."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.end(UnavailableError("the control plane is shutting down", reason="shutdown"))
        return len(sessions)

    # ----------------------------------------------------------- any thread

    def send(self, node_id: str, message: link_pb2.ControlMessage) -> bool:
        """Queue `message` for `node_id`; False if the node is not connected here or its
        queue is full (counted in `dropped`). Delivery is not confirmed: the node
        reports what it did through its own messages.
        """
        loop = self._loop
        if loop is None:
            return False
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return self._offer(node_id, message)
        if loop.is_closed():
            return False

        async def offer() -> bool:
            return self._offer(node_id, message)

        future = asyncio.run_coroutine_threadsafe(offer(), loop)
        try:
            return future.result(timeout=_THREADSAFE_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            future.cancel()
            return False

    def send_many(self, items: Sequence[tuple[str, link_pb2.ControlMessage]]) -> list[bool]:
        """`send` for many nodes at once; whether each item was queued, in order.

        From another thread it is one `run_coroutine_threadsafe` hop into the loop for
        the whole list (not a round trip per node), and the loop is handed back every
        `SEND_MANY_SLICE` nodes so that the streams start writing while the rest is
        queued. On the loop itself it queues everything at once, without yielding. If
        the loop does not get through the list in time, what it had not reached counts
        as not queued (an item queued in the last moment may be reported as not queued;
        never the other way round).
        """
        results = [False] * len(items)
        loop = self._loop
        if loop is None or not items:
            return results
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            for index, (node_id, message) in enumerate(items):
                results[index] = self._offer(node_id, message)
            return results
        if loop.is_closed():
            return results

        async def offer_all() -> None:
            for index, (node_id, message) in enumerate(items):
                results[index] = self._offer(node_id, message)
                if index % SEND_MANY_SLICE == SEND_MANY_SLICE - 1:
                    await asyncio.sleep(0)

        future = asyncio.run_coroutine_threadsafe(offer_all(), loop)
        try:
            future.result(timeout=_THREADSAFE_TIMEOUT_S + _THREADSAFE_PER_NODE_S * len(items))
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            future.cancel()
            log.warning(
                "the event loop did not take %d downlink messages in time; %d were queued",
                len(items),
                sum(results),
            )
        return list(results)

    def connected(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def is_connected(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._sessions

    def _offer(self, node_id: str, message: link_pb2.ControlMessage) -> bool:
        with self._lock:
            session = self._sessions.get(node_id)
        if session is None or session.ended.done():
            return False
        try:
            session.queue.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "downlink queue of node %s is full; message dropped",
                node_id,
                extra={"node_id": node_id, "reason": "downlink-full"},
            )
            return False
        return True
