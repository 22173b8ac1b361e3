"""RFC 9562 UUIDv7 ids for outbox records: time-ordered, unique, monotonic per generator.

Python 3.11 has no ``uuid.uuid7``. Not a general UUID library: it only makes and reads v7.

Layout (RFC 9562 §5.7) and the counter we keep in it (§6.2, method 1)::

    48 bits unix_ts_ms | 4 bits ver=0111 | 12 bits rand_a | 2 bits var=10 | 62 bits rand_b
                                         \\____ 42-bit counter ____________/ 32 random bits

In a new millisecond the counter is seeded at random with its top bit clear (so at least
2**41 ids fit in one millisecond); within the same millisecond it is incremented. If the
clock steps back, the generator stays on the last millisecond it used and keeps counting,
so ids from one generator are strictly increasing whatever the wall clock does. Should the
counter ever overflow, the timestamp is advanced by one millisecond (the RFC's remedy).
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from edge_node.clock import Clock

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_COUNTER_BITS = 42
_COUNTER_SEED_BITS = _COUNTER_BITS - 1  # top bit clear: headroom before overflow
_TAIL_BITS = 32
_MAX_MS = (1 << 48) - 1


def unix_ms(moment: datetime) -> int:
    """Whole milliseconds since the Unix epoch (exact integer arithmetic, no float)."""
    return (moment - _EPOCH) // _MS


def uuid7_unix_ms(value: uuid.UUID) -> int:
    """The millisecond timestamp a UUIDv7 carries."""
    return value.int >> 80


class UUIDv7Generator:
    """Makes UUIDv7s from an injected clock; thread-safe; strictly increasing per instance."""

    def __init__(self, clock: Clock, randbits: Callable[[int], int] = secrets.randbits) -> None:
        self._clock = clock
        self._randbits = randbits
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def new(self) -> uuid.UUID:
        ms = unix_ms(self._clock.now())
        if not 0 <= ms <= _MAX_MS:
            raise ValueError(f"clock reads {ms} ms since the epoch, outside UUIDv7's range")
        with self._lock:
            if ms > self._last_ms:
                self._last_ms = ms
                self._counter = self._randbits(_COUNTER_SEED_BITS)
            else:
                # Same millisecond, or the clock stepped back: keep counting on the last one.
                self._counter += 1
                if self._counter >> _COUNTER_BITS:
                    self._last_ms += 1
                    self._counter = self._randbits(_COUNTER_SEED_BITS)
            ts, counter = self._last_ms, self._counter
        tail = self._randbits(_TAIL_BITS)
        value = (
            (ts << 80)
            | (0x7 << 76)
            | ((counter >> 30) << 64)
            | (0b10 << 62)
            | ((counter & ((1 << 30) - 1)) << 32)
            | tail
        )
        return uuid.UUID(int=value)
