"""Store-and-forward for a camera: what the SDK holds until the broker PUBACKs it.

The policy is a pure core (no I/O, no paho; `now` is passed in): a bound in bytes,
priorities, per-message TTL, oldest-first dropping of the lowest priority with counters by
reason, and removal only on PUBACK. Where the messages live besides memory is a small
port, `Journal`; `device_sdk.ring.FileRing` is the file adapter that survives a reboot.
Not a general queue: it orders by priority, then by admission, and nothing else (ADR 0037).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

__all__ = [
    "DROP_REASONS",
    "RECORD_OVERHEAD",
    "BufferStats",
    "Journal",
    "Message",
    "Priority",
    "Recovered",
    "SendBuffer",
]

# Why a message left the buffer without a PUBACK (the keys of BufferStats.dropped).
OVERFLOW, EXPIRED, TOO_LARGE = "overflow", "expired", "too_large"
CORRUPT, REFUSED = "corrupt", "refused"
DROP_REASONS = (OVERFLOW, EXPIRED, TOO_LARGE, CORRUPT, REFUSED)

# A message's size as buffered is its size as a file-ring record, so the bound in bytes
# is the same in memory and on flash: header (magic 2, kind 1, length 4, crc32 4) plus
# the PUT body's fixed part (priority 1, expires_at 8, id length 2, topic length 2).
_PUT_FIXED = struct.Struct(">BdHH")
RECORD_OVERHEAD = 11 + _PUT_FIXED.size


class Priority(IntEnum):
    """Lower value = more important: sent first, dropped last."""

    RESULT = 0
    HEARTBEAT = 1
    FRAME = 2


@dataclass(frozen=True, slots=True)
class Message:
    """One MQTT publish waiting for its PUBACK. `expires_at` is wall-clock seconds (a
    file ring outlives the monotonic clock of the boot that wrote it); inf = never."""

    message_id: str
    topic: str
    priority: Priority
    payload: bytes
    expires_at: float = float("inf")

    @property
    def size(self) -> int:
        return (
            RECORD_OVERHEAD
            + len(self.message_id.encode())
            + len(self.topic.encode())
            + len(self.payload)
        )


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a journal held when it was opened: its messages in the order they were
    written, and how many damaged stretches it skipped (a torn tail counts once)."""

    messages: list[Message]
    corrupt: int = 0


class Journal(Protocol):
    """Where buffered messages persist. `append` must be durable when it returns if the
    journal promises to survive a reboot; `remove` may be lazy (a remove lost in a crash
    resends the message with its id, which the node takes once)."""

    def recover(self) -> Recovered: ...

    def append(self, message: Message) -> None: ...

    def remove(self, message_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BufferStats:
    queued_messages: int  # pending + in flight
    queued_bytes: int
    in_flight: int
    capacity_bytes: int
    persistent: bool
    dropped: dict[str, int] = field(default_factory=dict)


class SendBuffer:
    """Bounded, prioritised, TTL'd messages that leave only on `ack` (a PUBACK).

    `put` admits a message, making room by dropping the oldest pending message of the
    lowest priority not above the newcomer's; if that cannot make room, the newcomer is
    the one dropped. `take` hands out the next messages to publish (most important
    first, oldest first within a priority) and marks them in flight; in-flight messages
    are never dropped or expired, only acked or, after a lost connection, `requeue`d in
    their original order. Not thread-safe: the client holds a lock around it.
    """

    def __init__(self, capacity_bytes: int, *, journal: Journal | None = None) -> None:
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = capacity_bytes
        self._journal = journal
        self._pending: dict[Priority, OrderedDict[str, tuple[int, Message]]] = {
            p: OrderedDict() for p in Priority
        }
        self._in_flight: dict[str, tuple[int, Message]] = {}
        self._used = 0
        self._next_order = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        if journal is not None:
            recovered = journal.recover()
            self._dropped[CORRUPT] += recovered.corrupt
            for message in recovered.messages:
                self._admit(message, persist=False)

    # -- the firmware's side -------------------------------------------------------

    def put(self, message: Message, now: float) -> bool:
        """Buffer `message`; False when it was dropped instead (counted by reason)."""
        if message.message_id in self._in_flight or any(
            message.message_id in q for q in self._pending.values()
        ):
            raise ValueError(f"message id {message.message_id!r} is already buffered")
        if message.expires_at <= now:
            self._dropped[EXPIRED] += 1
            return False
        return self._admit(message, persist=True)

    # -- the sender's side ---------------------------------------------------------

    def take(self, limit: int, now: float) -> list[Message]:
        """Up to `limit` messages to publish now, marked in flight (expired ones dropped)."""
        self.expire(now)
        taken: list[Message] = []
        for priority in Priority:
            queue = self._pending[priority]
            while queue and len(taken) < limit:
                message_id, entry = queue.popitem(last=False)
                self._in_flight[message_id] = entry
                taken.append(entry[1])
        return taken

    def ack(self, message_id: str) -> bool:
        """The broker has it: forget it. False for an id not in flight (a late PUBACK)."""
        entry = self._in_flight.pop(message_id, None)
        if entry is None:
            return False
        self._forget(entry[1])
        return True

    def refuse(self, message_id: str) -> bool:
        """The broker will never take it (an MQTT 5 PUBACK with a failure reason)."""
        entry = self._in_flight.pop(message_id, None)
        if entry is None:
            return False
        self._forget(entry[1])
        self._dropped[REFUSED] += 1
        return True

    def requeue(self) -> None:
        """The connection is gone: every in-flight message waits again, in its old place."""
        for order, message in self._in_flight.values():
            queue = self._pending[message.priority]
            queue[message.message_id] = (order, message)
        self._in_flight.clear()
        for priority, queue in self._pending.items():
            self._pending[priority] = OrderedDict(sorted(queue.items(), key=lambda kv: kv[1][0]))

    def expire(self, now: float) -> int:
        """Drop every pending message whose TTL ran out; how many."""
        expired = [m for q in self._pending.values() for _, m in q.values() if m.expires_at <= now]
        for message in expired:
            del self._pending[message.priority][message.message_id]
            self._forget(message)
        self._dropped[EXPIRED] += len(expired)
        return len(expired)

    # -- what a heartbeat reports --------------------------------------------------

    def __len__(self) -> int:
        return len(self._in_flight) + sum(len(q) for q in self._pending.values())

    def pending(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def stats(self) -> BufferStats:
        return BufferStats(
            queued_messages=len(self),
            queued_bytes=self._used,
            in_flight=len(self._in_flight),
            capacity_bytes=self.capacity_bytes,
            persistent=self._journal is not None,
            dropped=dict(self._dropped),
        )

    def message_ids(self) -> Iterable[str]:
        yield from self._in_flight
        for queue in self._pending.values():
            yield from queue

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- inside --------------------------------------------------------------------

    def _admit(self, message: Message, *, persist: bool) -> bool:
        size = message.size
        if size > self.capacity_bytes:
            self._dropped[TOO_LARGE] += 1
            return False
        if not self._make_room(size, message.priority):
            self._dropped[OVERFLOW] += 1
            return False
        if persist and self._journal is not None:
            self._journal.append(message)
        self._pending[message.priority][message.message_id] = (self._next_order, message)
        self._next_order += 1
        self._used += size
        return True

    def _make_room(self, size: int, priority: Priority) -> bool:
        """Drop the oldest pending messages of the lowest priorities not above `priority`
        until `size` fits; drop nothing if even all of them would not make room."""
        needed = self._used + size - self.capacity_bytes
        if needed <= 0:
            return True
        victims = [p for p in reversed(Priority) if p >= priority]
        evictable = sum(m.size for p in victims for _, m in self._pending[p].values())
        if evictable < needed:
            return False
        for victim in victims:
            queue = self._pending[victim]
            while queue and self._used + size > self.capacity_bytes:
                _, (_, message) = queue.popitem(last=False)
                self._forget(message)
                self._dropped[OVERFLOW] += 1
        return True

    def _forget(self, message: Message) -> None:
        self._used -= message.size
        if self._journal is not None:
            self._journal.remove(message.message_id)
