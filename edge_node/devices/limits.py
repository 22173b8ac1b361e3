"""Two bounds of the device intake, pure and clocked by the caller: a token bucket per
camera (a flooding camera is limited, the others are not), and the memory of recent
message ids (a redelivery is dropped, never a second observation).

Times are monotonic seconds passed in (``now``). Not here: what is counted where.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["RecentIds", "TokenBucket"]


class TokenBucket:
    """``burst`` tokens, refilled at ``rate_per_s``; `take(now)` spends one if there is one."""

    __slots__ = ("_last", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate_per_s > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._last = now

    def take(self, now: float) -> bool:
        if now > self._last:  # a clock that stands still (or goes back) refills nothing
            self._tokens = min(
                float(self.burst), self._tokens + (now - self._last) * self.rate_per_s
            )
            self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class RecentIds:
    """The ids seen in the last ``horizon_s``, at most ``max_ids`` (the oldest go first;
    ``evicted_early`` counts those that left before their horizon, so a redelivery of one
    of them would pass: the aggregation's own duplicate check is the second line)."""

    def __init__(self, max_ids: int, horizon_s: float) -> None:
        if max_ids < 1 or horizon_s <= 0:
            raise ValueError("RecentIds needs max_ids >= 1 and horizon_s > 0")
        self.max_ids = max_ids
        self.horizon_s = horizon_s
        self.evicted_early = 0
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()  # key -> first seen

    def __len__(self) -> int:
        return len(self._seen)

    def seen_before(self, key: tuple[str, str], now: float) -> bool:
        """True if `key` was seen within the horizon; otherwise remembers it and says False."""
        self._expire(now)
        if key in self._seen:
            return True
        self._seen[key] = now
        if len(self._seen) > self.max_ids:
            self._seen.popitem(last=False)
            self.evicted_early += 1
        return False

    def forget(self, key: tuple[str, str]) -> None:
        """Drop `key` if remembered (a message taken back unprocessed)."""
        self._seen.pop(key, None)

    def _expire(self, now: float) -> None:
        seen = self._seen
        cutoff = now - self.horizon_s
        while seen:
            key, first = next(iter(seen.items()))
            if first > cutoff:
                return
            del seen[key]
