"""The agent's results task: the sampler's picks into the outbox as ``results`` records.

Each record's payload is one ``edgefleet.agent.results/1`` document
(``protos.bundle.results.result_to_wire``) as compact JSON. Results are best effort: a
record the outbox will not take (its results share is full and nothing older can go, the
budget is taken by events and health, the disk is full) is counted here and by the outbox
(``dropped_results``), never retried and never a reason to stop. Not here: which results
are picked (``edge_node.results.sampling``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread

from edge_node.errors import ClosedError, OutboxFullError, PayloadTooLargeError
from edge_node.outbox import Outbox
from edge_node.results.sampling import ResultSampler
from protos.bundle.results import InferenceResult, result_to_wire

__all__ = ["FeedStats", "ResultsFeed", "encode_result"]

log = logging.getLogger(__name__)


def encode_result(result: InferenceResult) -> bytes:
    """The record payload: the wire document as compact JSON (ValueError if it is not JSON)."""
    return json.dumps(result_to_wire(result), separators=(",", ":"), allow_nan=False).encode()


@dataclass
class FeedStats:
    stored: int = 0
    # Not taken by the outbox (full, over its results share, too large): dropped.
    dropped: int = 0
    # Could not be encoded (a value JSON cannot carry): a bug upstream, logged.
    unencodable: int = 0


class ResultsFeed:
    def __init__(
        self, sampler: ResultSampler, outbox: Outbox, monotonic: Callable[[], float]
    ) -> None:
        self._sampler = sampler
        self._outbox = outbox
        self._monotonic = monotonic
        self.stats = FeedStats()

    def drain_once(self) -> int:
        """Take the sample due now and append it to the outbox; blocking (a worker thread).

        Returns the records stored. Raises only `ClosedError` (the outbox closed: stopping).
        """
        stored = 0
        for result in self._sampler.take(self._monotonic()):
            try:
                payload = encode_result(result)
            except (TypeError, ValueError) as exc:
                self.stats.unencodable += 1
                log.warning("a result of stream %s cannot be encoded: %s", result.stream, exc)
                continue
            try:
                self._outbox.append("results", payload)
            except (OutboxFullError, PayloadTooLargeError) as exc:
                self.stats.dropped += 1
                log.debug("result sample not stored: %s", exc.message)
                continue
            stored += 1
        self.stats.stored += stored
        return stored

    async def run(self, stop: anyio.Event) -> None:
        """`drain_once` every `drain_interval_s` until `stop` (the agent's supervised task)."""
        interval = self._sampler.config.drain_interval_s
        while not stop.is_set():
            try:
                await anyio.to_thread.run_sync(self.drain_once)
            except ClosedError:
                return  # stopping: the outbox closed under the feed
            with anyio.move_on_after(interval):
                await stop.wait()
