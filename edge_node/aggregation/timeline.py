"""Event time for the aggregation: clock offsets, watermarks, lateness and duplicates.

The :class:`Aligner` takes observations in arrival order and releases them in event-time
order, each with its time on the node's clock (``captured_at`` minus the camera's clock
offset). Each source's watermark is its newest event time minus ``allowed_lateness_s``;
the aligner's watermark is the lowest of the sources that are not idle (a source silent
for ``idle_timeout_s`` of node time stops holding it back, the Flink/Beam lesson), is never
ahead of the node's clock minus the lateness, never goes back, and moves on with the
node's clock when every source is idle. An observation is
released once the watermark passes it, so everything that arrives within the lateness
bound is applied in the same order whatever order it came in: the rules downstream see one
history. One that arrives behind the watermark is too late: counted, not applied.
Duplicates (same source and observation id) are dropped while the id is remembered
(``dedup_horizon_s`` of event time, at most ``max_ids``). Every bound is counted when hit.

Not here: what the rules do with the released observations (``edge_node.aggregation.engine``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from edge_node.aggregation.model import Observation

__all__ = ["Aligner", "AlignerConfig", "AlignerStats", "Released", "SourceStats"]

Released = tuple[float, Observation]
_NEG_INF: Final = -math.inf


@dataclass(frozen=True, slots=True)
class AlignerConfig:
    # How far behind its own newest frame a source's frame may arrive and still be applied
    # in order (the watermark's delay). DESIGN: a ±50 ms alignment window by default.
    allowed_lateness_s: float = 0.05
    # A source that sent nothing for this long (node clock) no longer holds the watermark.
    idle_timeout_s: float = 2.0
    # An event time further ahead of the node's clock than this is impossible: refused.
    max_future_s: float = 5.0
    # Observations waiting for the watermark; past this the oldest is released early.
    max_buffered: int = 20_000
    # Ids remembered against duplicates, for this long behind the watermark (event time).
    dedup_horizon_s: float = 120.0
    max_ids: int = 200_000
    # None: any source; otherwise the node's allow-list of cameras.
    known_sources: frozenset[str] | None = None
    max_sources: int = 1_000


@dataclass(slots=True)
class SourceStats:
    accepted: int = 0
    duplicates: int = 0
    # Arrived behind this source's own watermark but before the aligner released that
    # time: applied in order (reordered within the bound).
    late_applied: int = 0
    # Arrived behind the aligner's watermark: not applied.
    too_late: int = 0
    future: int = 0


@dataclass(slots=True)
class AlignerStats:
    unknown_source: int = 0
    invalid_time: int = 0
    # The buffer was full and its oldest observation went out before the watermark.
    released_early: int = 0
    # Ids forgotten because max_ids was reached (a duplicate of one would be applied).
    ids_evicted: int = 0
    # Sources refused because max_sources were known already.
    sources_refused: int = 0
    per_source: dict[str, SourceStats] = field(default_factory=dict)

    def total(self, name: str) -> int:
        return sum(int(getattr(s, name)) for s in self.per_source.values())


@dataclass(slots=True)
class _Source:
    offset_s: float = 0.0
    newest: float = _NEG_INF  # newest event time seen (node clock)
    last_arrival: float = _NEG_INF  # node clock


class Aligner:
    """Arrival order in, event-time order out. Not thread-safe: one owner calls it."""

    def __init__(self, config: AlignerConfig | None = None) -> None:
        self.config = config or AlignerConfig()
        self.stats = AlignerStats()
        self._sources: dict[str, _Source] = {}
        self._heap: list[tuple[float, str, int, str, Observation]] = []
        self._seen: dict[tuple[str, str], float] = {}
        self._seen_heap: list[tuple[float, str, str]] = []
        self._watermark = _NEG_INF

    @property
    def watermark(self) -> float:
        """Everything before this event time has been released (or refused as too late)."""
        return self._watermark

    @property
    def buffered(self) -> int:
        return len(self._heap)

    @property
    def remembered_ids(self) -> int:
        return len(self._seen)

    def set_clock_offset(self, source: str, offset_s: float) -> None:
        """The camera's clock minus the node's (a heartbeat's estimate), for later frames."""
        state = self._source(source)
        if state is not None and math.isfinite(offset_s):
            state.offset_s = offset_s

    def clock_offsets(self) -> Mapping[str, float]:
        return {name: s.offset_s for name, s in self._sources.items()}

    def offer(self, observation: Observation, now: float) -> list[Released]:
        """Take one observation that arrived at `now` (node clock); return what is released."""
        source = observation.source
        state = self._source(source)
        if state is None:
            return self.advance(now)
        stats = self.stats.per_source[source]
        captured = observation.captured_at
        if not math.isfinite(captured):
            self.stats.invalid_time += 1
            return self.advance(now)
        at = captured - state.offset_s
        if at > now + self.config.max_future_s:
            stats.future += 1
            return self.advance(now)
        key = (source, observation.observation_id)
        if key in self._seen:
            stats.duplicates += 1
            return self.advance(now)
        state.last_arrival = now
        if at < self._watermark:
            stats.too_late += 1
            self._remember(key, at)
            return self.advance(now)
        if at < state.newest - self.config.allowed_lateness_s:
            stats.late_applied += 1
        stats.accepted += 1
        if at > state.newest:
            state.newest = at
        self._remember(key, at)
        heapq.heappush(self._heap, (at, source, observation.frame_seq, key[1], observation))
        return self.advance(now)

    def advance(self, now: float) -> list[Released]:
        """Move the watermark for `now` (idle sources) and release what it passed."""
        watermark = self._compute_watermark(now)
        if watermark > self._watermark:
            self._watermark = watermark
        heap = self._heap
        out: list[Released] = []
        while heap and heap[0][0] < self._watermark:
            item = heapq.heappop(heap)
            out.append((item[0], item[4]))
        while len(heap) > self.config.max_buffered:
            item = heapq.heappop(heap)
            self.stats.released_early += 1
            self._watermark = max(self._watermark, math.nextafter(item[0], math.inf))
            out.append((item[0], item[4]))
        self._forget(self._watermark - self.config.dedup_horizon_s)
        return out

    def flush(self) -> list[Released]:
        """Release everything (shutdown, or a test's end of input); the watermark follows."""
        out = [(item[0], item[4]) for item in sorted(self._heap)]
        self._heap.clear()
        if out:
            self._watermark = max(self._watermark, math.nextafter(out[-1][0], math.inf))
        return out

    # --------------------------------------------------------------------- internals

    def _source(self, source: str) -> _Source | None:
        state = self._sources.get(source)
        if state is not None:
            return state
        known = self.config.known_sources
        if known is not None and source not in known:
            self.stats.unknown_source += 1
            return None
        if len(self._sources) >= self.config.max_sources:
            self.stats.sources_refused += 1
            return None
        state = self._sources[source] = _Source()
        self.stats.per_source[source] = SourceStats()
        return state

    def _compute_watermark(self, now: float) -> float:
        lateness = self.config.allowed_lateness_s
        idle_before = now - self.config.idle_timeout_s
        lowest = math.inf
        for state in self._sources.values():
            if state.last_arrival > idle_before and state.newest - lateness < lowest:
                lowest = state.newest - lateness
        if lowest == math.inf:
            # Every source idle (or none yet): event time follows the node's clock.
            return now - lateness if self._sources else _NEG_INF
        # Never ahead of the node's own clock: a camera whose clock runs fast (within
        # max_future_s) must not make every other camera's frames too late.
        return min(lowest, now - lateness)

    def _remember(self, key: tuple[str, str], at: float) -> None:
        self._seen[key] = at
        heapq.heappush(self._seen_heap, (at, key[0], key[1]))
        while len(self._seen) > self.config.max_ids:
            _, source, oid = heapq.heappop(self._seen_heap)
            if self._seen.pop((source, oid), None) is not None:
                self.stats.ids_evicted += 1

    def _forget(self, before: float) -> None:
        seen_heap = self._seen_heap
        while seen_heap and seen_heap[0][0] < before:
            _, source, oid = heapq.heappop(seen_heap)
            self._seen.pop((source, oid), None)
