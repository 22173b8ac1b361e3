"""Reconnect delays: capped exponential backoff with full jitter (AWS's "full jitter":
uniform in [0, min(cap, base * 2**attempt)]), reset once a connection has held for a
while. Pure: the random source is injected; the caller does the waiting."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff", "BackoffPolicy"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    base_s: float = 1.0
    cap_s: float = 120.0
    # A connection that stays up this long resets the attempt count.
    reset_after_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError("backoff needs 0 < base_s <= cap_s")


class Backoff:
    """`next_delay()` after each failed or dropped connection; `connected(at)` when one
    succeeds and `disconnected(at)` when it ends (a long one resets the attempts)."""

    def __init__(
        self, policy: BackoffPolicy, *, uniform: Callable[[float, float], float] | None = None
    ) -> None:
        self.policy = policy
        self._uniform = uniform or random.uniform
        self.attempt = 0
        self._connected_at: float | None = None

    def ceiling(self) -> float:
        """The upper end of the next delay (the jitter draws below it)."""
        return min(self.policy.cap_s, self.policy.base_s * 2.0 ** min(self.attempt, 62))

    def next_delay(self) -> float:
        delay = self._uniform(0.0, self.ceiling())
        self.attempt += 1
        return delay

    def connected(self, at: float) -> None:
        self._connected_at = at

    def disconnected(self, at: float) -> None:
        if self._connected_at is not None and at - self._connected_at >= self.policy.reset_after_s:
            self.attempt = 0
        self._connected_at = None
