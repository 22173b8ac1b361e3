"""Which served frames a shadow candidate also runs on, and the CPU share it may take.

What it is for: the shadow stage (ADR 0031) runs a candidate beside the served model on
``sample_per_mille`` of the frames, never above ``max_cpu_percent`` of one core.
:class:`FrameSampler` picks the frames evenly (an accumulator, not a coin: 50 per mille is
every 20th frame, so the sample is steady and testable). :class:`CpuBudget` is a token
bucket in CPU seconds: wall time credits it at the cap's rate, each sample's measured CPU
time is spent from it, and a sample may start only while the credit is positive; the
credit is bounded, so an idle stretch does not bank a burst. Over any span the candidate
uses at most the cap times the span, plus the bound, plus one sample.

What it is not for: measuring (the runner reads its thread's CPU time) or threads. Pure:
numbers in, decisions out; not thread-safe (the runner holds its lock).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_CREDIT_S", "CpuBudget", "FrameSampler"]

MAX_CREDIT_S: Final = 1.0
"""The credit never exceeds this much wall time's worth of the cap."""


class FrameSampler:
    """``pick()`` is true for ``per_mille`` of the calls, evenly spread (the first call
    is picked)."""

    def __init__(self, per_mille: int) -> None:
        if not 1 <= per_mille <= 1000:
            raise ValueError(f"per_mille must be 1-1000, got {per_mille}")
        self._per_mille = per_mille
        self._acc = 1000 - per_mille

    def pick(self) -> bool:
        self._acc += self._per_mille
        if self._acc >= 1000:
            self._acc -= 1000
            return True
        return False


class CpuBudget:
    """At most ``percent`` of one core, measured in CPU seconds against wall seconds."""

    def __init__(self, percent: int, now: float, *, max_credit_s: float = MAX_CREDIT_S) -> None:
        if not 1 <= percent <= 100:
            raise ValueError(f"percent must be 1-100, got {percent}")
        self._share = percent / 100.0
        self._cap = self._share * max_credit_s
        self._credit = self._cap
        self._last = now
        self._started = now
        self._spent = 0.0

    def allows(self, now: float) -> bool:
        """Whether a sample may start at ``now`` (wall seconds, monotonic)."""
        self._refill(now)
        return self._credit > 0.0

    def spend(self, cpu_s: float, now: float) -> None:
        """A sample took ``cpu_s`` CPU seconds; it finished at ``now``."""
        self._refill(now)
        cost = max(0.0, cpu_s)
        self._credit -= cost
        self._spent += cost

    def cpu_percent(self, now: float) -> float | None:
        """The CPU used since the start, percent of one core (None before any time)."""
        elapsed = now - self._started
        if elapsed <= 0:
            return None
        return 100.0 * self._spent / elapsed

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._credit = min(self._cap, self._credit + elapsed * self._share)
