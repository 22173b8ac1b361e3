"""The uplink: drains the outbox through a `NodeLink` and deletes what the control plane acked.

Stop-and-wait per batch: one `RecordBatch` in flight, resent when the link drops or no
ack arrives within `ack_timeout_s`. Resends are safe (the control plane stores each
record id once) and the outbox keeps everything until it is acked, so neither a broker
crash, a control-plane restart nor a node restart loses or duplicates a record.
Batches are large (hundreds of records), so one round trip per batch costs little.

With nothing in flight and nothing pending the uplink waits for the outbox to store
something (`Outbox.on_append`, from the appending thread onto the uplink's event loop),
at most ``idle_poll_s``, so a new event goes out as soon as it is committed rather than
at the next poll.

Sampled inference results (kind ``results``) are best effort and go last: a batch holds
them only when no event or health report is waiting, so results never delay those, and
a control plane that does not know the kind (older than the node) holds up only results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.to_thread
from google.protobuf.timestamp_pb2 import Timestamp

from edge_node.clock import Clock
from edge_node.errors import StorageError
from edge_node.link.base import (
    Backoff,
    LinkRefusedError,
    LinkUnavailableError,
    NodeLink,
    node_message,
)
from edge_node.outbox import Kind, Outbox, Record
from protos.edgefleet.fleet.v1 import link_pb2

log = logging.getLogger(__name__)

_KINDS = {
    "event": link_pb2.RECORD_KIND_EVENT,
    "health": link_pb2.RECORD_KIND_HEALTH,
    "results": link_pb2.RECORD_KIND_RESULTS,
}
# Events are `edgefleet.fleet.v1.Event` messages (events.proto); the rest is JSON.
_CONTENT_TYPES: Final[dict[Kind, str]] = {"event": "application/x-protobuf"}
# Sent before anything else; results only when none of these waits.
_FIRST: Final[tuple[Kind, ...]] = ("event", "health")
_LAST: Final[tuple[Kind, ...]] = ("results",)

ControlHandler = Callable[[link_pb2.ControlMessage], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class UplinkConfig:
    batch_records: int = 500
    batch_bytes: int = 1 << 20
    idle_poll_s: float = 0.2
    heartbeat_s: float = 10.0
    ack_timeout_s: float = 30.0
    content_type: str = "application/json"
    backoff: Backoff = field(default_factory=Backoff)


@dataclass
class UplinkStats:
    connects: int = 0
    disconnects: int = 0
    batches_sent: int = 0
    records_sent: int = 0
    records_acked: int = 0
    ack_timeouts: int = 0


def to_wire(record: Record, content_type: str) -> link_pb2.Record:
    """The wire record; ``content_type`` is for the kinds without their own (JSON ones)."""
    created = Timestamp()
    created.FromDatetime(record.created_at)
    return link_pb2.Record(
        id=record.id,
        seq=record.seq,
        kind=_KINDS[record.kind],
        created_at=created,
        content_type=_CONTENT_TYPES.get(record.kind, content_type),
        payload=record.payload,
    )


class Uplink:
    def __init__(
        self,
        outbox: Outbox,
        link: NodeLink,
        *,
        clock: Clock,
        config: UplinkConfig | None = None,
        on_control: ControlHandler | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`on_connect` runs after every (re)connect, before the first batch is sent
        (the updater sends its last status again: a Hello resets it upstream)."""
        self._outbox = outbox
        self._link = link
        self._clock = clock
        self._config = config or UplinkConfig()
        self._on_control = on_control
        self._on_connect = on_connect
        self.stats = UplinkStats()
        self._acked = anyio.Event()
        self._in_flight: set[str] = set()
        # Set (on the loop) when the outbox stored something since it was made.
        self._appended = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, hello: Callable[[], link_pb2.Hello], stop: anyio.Event) -> None:
        """Connect, drain, reconnect with backoff, until `stop` is set.

        `LinkRefusedError` (revoked, unknown node) propagates: retrying cannot help.
        """
        self._loop = asyncio.get_running_loop()
        remove = self._outbox.on_append(self._on_append)
        try:
            await self._run(hello, stop)
        finally:
            remove()
            self._loop = None

    def _on_append(self) -> None:
        """The outbox stored something (any thread): wake the sender on its loop."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to wake
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._appended.set()

    async def _run(self, hello: Callable[[], link_pb2.Hello], stop: anyio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            try:
                await self._link.connect(hello())
                self.stats.connects += 1
                attempt = 0
                if self._on_connect is not None:
                    await self._on_connect()
                await self._session(stop)
            except LinkUnavailableError as exc:
                self.stats.disconnects += 1
                delay = self._config.backoff.delay(attempt)
                attempt += 1
                log.info("link unavailable (%s); retrying in %.1fs", exc.message, delay)
                with anyio.move_on_after(delay):
                    await stop.wait()
            finally:
                self._in_flight.clear()

    async def _session(self, stop: anyio.Event) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._receive)
                tasks.start_soon(self._heartbeat)
                tasks.start_soon(self._cancel_on, stop, tasks.cancel_scope)
                await self._send_batches(stop)
                tasks.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            raise _link_error_in(group) from group

    @staticmethod
    async def _cancel_on(stop: anyio.Event, scope: anyio.CancelScope) -> None:
        await stop.wait()
        scope.cancel()

    async def _send_batches(self, stop: anyio.Event) -> None:
        config = self._config
        while not stop.is_set():
            # A fresh event before reading: what is stored after the read sets it.
            self._appended = anyio.Event()
            batch = await anyio.to_thread.run_sync(self._next_batch)
            if not batch:
                # Stop cancels the session (`_cancel_on`); the poll is the fallback.
                with anyio.move_on_after(config.idle_poll_s):
                    await self._appended.wait()
                continue
            ids = [r.id for r in batch]
            self._in_flight = set(ids)
            self._acked = anyio.Event()
            try:
                await anyio.to_thread.run_sync(self._outbox.mark_attempt, ids)
            except StorageError as exc:  # bookkeeping only: a full disk must not stop us
                log.warning("outbox attempt not recorded: %s", exc.message)
            message = node_message(
                records=link_pb2.RecordBatch(
                    records=[to_wire(r, config.content_type) for r in batch]
                )
            )
            await self._link.send(message)
            self.stats.batches_sent += 1
            self.stats.records_sent += len(batch)
            with anyio.move_on_after(config.ack_timeout_s) as waited:
                await self._acked.wait()
            if waited.cancelled_caught:
                self.stats.ack_timeouts += 1
                log.warning(
                    "no ack for %d records within %.0fs; resending", len(ids), config.ack_timeout_s
                )

    def _next_batch(self) -> list[Record]:
        config = self._config
        batch = self._outbox.pending(config.batch_records, config.batch_bytes, _FIRST)
        if batch:
            return batch
        return self._outbox.pending(config.batch_records, config.batch_bytes, _LAST)

    async def _receive(self) -> None:
        async for message in self._link.incoming():
            kind = message.WhichOneof("body")
            if kind == "ack":
                ids = list(message.ack.record_ids)
                try:
                    deleted = await anyio.to_thread.run_sync(self._outbox.ack, ids)
                except StorageError as exc:
                    # A full disk: the records stay and go again after the ack timeout (the
                    # control plane stores each once); the uplink, and the node, go on.
                    log.warning("acked records not deleted yet: %s", exc.message)
                    continue
                self.stats.records_acked += deleted
                self._in_flight.difference_update(ids)
                if not self._in_flight:
                    self._acked.set()
            elif self._on_control is not None:
                await self._on_control(message)
        raise LinkUnavailableError("the control plane closed the link")

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(self._config.heartbeat_s)
            sent = Timestamp()
            sent.FromDatetime(self._clock.now())
            await self._link.send(node_message(heartbeat=link_pb2.Heartbeat(sent_at=sent)))


def _link_error_in(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error that decides what happens next: a refusal wins over an outage."""
    refused = group.subgroup(LinkRefusedError)
    if refused is not None:
        return _first(refused)
    unavailable = group.subgroup(LinkUnavailableError)
    if unavailable is not None and group.split(LinkUnavailableError)[1] is None:
        return _first(unavailable)
    return group


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf
