"""Time for the SDK, injected: wall-clock seconds (stamps, TTLs) and a monotonic clock
(pacing, timeouts, uptime). Tests pass a `ManualClock`; nothing here sleeps."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the Unix epoch, on the camera's wall clock."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps back (its origin is arbitrary)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (both readings by the same step)."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._wall = start
        self._mono = 0.0

    def time(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds
