"""Injected time for the edge node, so ids, backoff and windows are tested without sleeping.

A deliberate copy of ``control_plane.clock`` (the two packages must not import each
other), plus `TaskClock` for the node's long-running tasks. Not here: what waits on it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

import anyio
import anyio.lowlevel

__all__ = ["Clock", "ManualClock", "SystemClock", "TaskClock"]


class Clock(Protocol):
    def now(self) -> datetime:
        """Timezone-aware UTC now."""
        ...


class TaskClock(Clock, Protocol):
    """A clock an async task also measures intervals and waits with (deadlines,
    backoff, watch windows): what a task takes instead of `anyio.current_time()` and
    `anyio.sleep()`."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start; never goes back (deadlines are on this)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on this clock (at once for `<= 0`)."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock tests move by hand (backwards too, to test what survives that).

    `sleep()` waits until `advance()` has moved the clock past its end, so a test says
    exactly when a deadline passes. With `sleeps_advance=True` a sleep instead moves the
    clock itself and returns at once: for code whose sleeps are only backoff, whose
    tests want the time to pass without anyone advancing it.

    `monotonic()` counts forward moves only, as the system's monotonic clock keeps going
    when the wall clock is set back.
    """

    def __init__(self, start: datetime | None = None, *, sleeps_advance: bool = False) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0
        self._sleeps_advance = sleeps_advance
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._elapsed

    @property
    def sleepers(self) -> int:
        """Sleeps in progress (a test can wait until the task under test sleeps)."""
        return len(self._sleepers)

    def advance(self, delta: timedelta) -> None:
        """Move the clock; sleeps whose end it passes return."""
        self._now += delta
        self._elapsed += max(0.0, delta.total_seconds())
        for end, woken in self._sleepers:
            if end <= self._elapsed:
                woken.set()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        if self._sleeps_advance:
            self.advance(timedelta(seconds=seconds))
            await anyio.lowlevel.checkpoint()
            return
        entry = (self._elapsed + seconds, anyio.Event())
        self._sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            self._sleepers.remove(entry)
