"""A monotonic seconds counter, injected, for the runtime's durations and rate limits.

``edge_node.clock.Clock`` gives wall-clock datetimes: right for stamping when a frame was
captured, wrong for measuring how long it queued or for spacing frames, because NTP may step
the wall clock (a node offline for days is corrected by minutes at once). Durations use this.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["ManualTicker", "SystemTicker", "Ticker"]


class Ticker(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...


class SystemTicker:
    monotonic = staticmethod(time.perf_counter)
    """``time.perf_counter`` itself, not a method around it: the pipeline reads it five
    times a frame."""


class ManualTicker:
    """A ticker tests move by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic ticker cannot go backwards")
        self._now += seconds
