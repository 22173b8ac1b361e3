"""Which inference results go to the control plane: a bounded sample, per stream and node-wide.

Pure: takes results and monotonic seconds and returns the results to send; no clock, no
I/O. The agent calls :meth:`ResultSampler.offer` for every ``InferenceResult`` from the
pipeline's worker threads, and its results task calls :meth:`ResultSampler.take` every
second or so (``edge_node.results.feed``). Not here: encoding and storing (the feed).

The rule
    * Per stream, at most one result per ``interval_s``: the most recent result *with
      detections* offered since the stream's last sample, else the most recent result.
      So a stream that saw something in the interval shows it, and a quiet one still
      shows what its model makes of the scene.
    * Node-wide, at most ``max_per_minute`` results: a token bucket holding up to
      10 seconds' worth (at least one). A due stream that finds no token waits for a
      later take, keeping its newest candidates; the streams that waited longest go first.
    * At most ``max_streams`` streams are tracked; results of others are counted
      (``untracked``) and ignored. A stream offered nothing for ``10 * interval_s`` (at
      least a minute) is forgotten, so renamed streams do not fill the table.

Threads: ``offer`` is O(1) and takes the sampler's lock for a few assignments only; ``take``
holds it while it walks the (bounded) stream table, never while encoding or storing, so
the inference threads never wait on I/O.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Final

from edge_node.errors import InvalidInputError
from protos.bundle.results import InferenceResult

__all__ = [
    "MAX_INTERVAL_S",
    "MAX_PER_MINUTE",
    "MAX_STREAMS",
    "MIN_INTERVAL_S",
    "ResultSampler",
    "ResultsConfig",
    "SamplerStats",
]

MIN_INTERVAL_S: Final = 1.0
MAX_INTERVAL_S: Final = 86_400.0
MAX_PER_MINUTE: Final = 600
MAX_STREAMS: Final = 1024
_BUCKET_S: Final = 10.0  # the token bucket holds this many seconds' worth
_MIN_FORGET_S: Final = 60.0
# Tokens accrue in float steps (0.1 + 0.1 + ... falls short of 1.0): a token this close
# to whole counts as whole, so the rate is what the setting says.
_TOKEN_SLACK: Final = 1e-9


@dataclass(frozen=True, slots=True)
class ResultsConfig:
    """The ``results:`` section of node.yaml (checked again here for direct callers).

    ``max_pending`` and ``outbox_share`` bound what waits in the outbox (its own rule for
    results); ``drain_interval_s`` is how often the feed takes a sample.
    """

    enabled: bool = True
    interval_s: float = 10.0
    max_per_minute: int = 30
    max_streams: int = 64
    drain_interval_s: float = 1.0
    max_pending: int = 500
    outbox_share: float = 0.1

    def __post_init__(self) -> None:
        _check("results.interval_s", self.interval_s, MIN_INTERVAL_S, MAX_INTERVAL_S)
        _check("results.max_per_minute", self.max_per_minute, 1, MAX_PER_MINUTE, integer=True)
        _check("results.max_streams", self.max_streams, 1, MAX_STREAMS, integer=True)
        _check("results.drain_interval_s", self.drain_interval_s, 0.05, 60.0)
        _check("results.max_pending", self.max_pending, 1, 100_000, integer=True)
        _check("results.outbox_share", self.outbox_share, 0.001, 1.0)


def _check(name: str, value: float, low: float, high: float, *, integer: bool = False) -> None:
    wrong_type = isinstance(value, bool) or not isinstance(value, int if integer else int | float)
    if wrong_type or not math.isfinite(value) or not low <= value <= high:
        raise InvalidInputError(
            f"{name} must be {'an integer' if integer else 'a number'} in [{low:g}, {high:g}], "
            f"got {value!r}",
            field=name,
        )


@dataclass(frozen=True, slots=True)
class SamplerStats:
    offered: int
    taken: int
    untracked: int
    # Due samples that waited for a token (the node-wide rate), summed over takes.
    rate_limited: int
    streams: int


class _Slot:
    __slots__ = ("last_taken_s", "latest", "seen_s", "with_detections")

    def __init__(self) -> None:
        self.latest: InferenceResult | None = None
        self.with_detections: InferenceResult | None = None
        self.last_taken_s: float | None = None
        self.seen_s: float | None = None  # the last take that found an offer


class ResultSampler:
    def __init__(self, config: ResultsConfig | None = None) -> None:
        self._config = config or ResultsConfig()
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._capacity = max(1.0, self._config.max_per_minute * _BUCKET_S / 60.0)
        self._tokens = self._capacity
        self._refilled_s: float | None = None
        self._forget_s = max(_MIN_FORGET_S, 10 * self._config.interval_s)
        self._offered = 0
        self._taken = 0
        self._untracked = 0
        self._rate_limited = 0

    @property
    def config(self) -> ResultsConfig:
        return self._config

    def offer(self, result: InferenceResult) -> None:
        """Consider one result (any thread; O(1), never waits on I/O)."""
        with self._lock:
            slot = self._slots.get(result.stream)
            if slot is None:
                if len(self._slots) >= self._config.max_streams:
                    self._untracked += 1
                    return
                slot = self._slots[result.stream] = _Slot()
            slot.latest = result
            if result.decoded.detections:
                slot.with_detections = result
            self._offered += 1

    def take(self, now_s: float) -> list[InferenceResult]:
        """The results to send now (``now_s``: monotonic seconds), oldest-waiting first."""
        config = self._config
        with self._lock:
            self._refill(now_s)
            due: list[tuple[float, _Slot]] = []
            for name, slot in list(self._slots.items()):
                if slot.latest is None:
                    if slot.seen_s is not None and now_s - slot.seen_s >= self._forget_s:
                        del self._slots[name]
                    continue
                last = slot.last_taken_s
                if last is None or now_s - last >= config.interval_s:
                    due.append((-math.inf if last is None else last, slot))
                slot.seen_s = now_s
            due.sort(key=lambda item: item[0])
            taken: list[InferenceResult] = []
            for _, slot in due:
                if self._tokens < 1.0 - _TOKEN_SLACK:
                    self._rate_limited += len(due) - len(taken)
                    break
                self._tokens = max(0.0, self._tokens - 1.0)
                chosen = slot.with_detections or slot.latest
                assert chosen is not None  # due slots have an offer
                slot.latest = slot.with_detections = None
                slot.last_taken_s = now_s
                taken.append(chosen)
            self._taken += len(taken)
            return taken

    def _refill(self, now_s: float) -> None:
        if self._refilled_s is not None and now_s > self._refilled_s:
            rate = self._config.max_per_minute / 60.0
            self._tokens = min(self._capacity, self._tokens + (now_s - self._refilled_s) * rate)
        if self._refilled_s is None or now_s > self._refilled_s:
            self._refilled_s = now_s

    def stats(self) -> SamplerStats:
        with self._lock:
            return SamplerStats(
                offered=self._offered,
                taken=self._taken,
                untracked=self._untracked,
                rate_limited=self._rate_limited,
                streams=len(self._slots),
            )
