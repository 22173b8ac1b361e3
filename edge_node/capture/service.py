"""`CaptureService`: one task per stream with a source, feeding frames into the runtime.

What it is for: at each stream's rate, grab a snapshot and submit it to whatever pipeline
is serving now (looked up per frame, so a hot swap, which keeps the pipeline and changes
its session, goes unnoticed here). A failed grab is counted by reason and retried after a
capped backoff; nothing in capture is fatal to the agent. ``run(stop)`` returns promptly
once ``stop`` is set: a grab in progress is cancelled.

What it is not for: parsing sources (``edge_node.capture.config``) or the fetching itself
(``edge_node.capture.sources``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Final, Protocol

import anyio

from edge_node.capture.config import DirectorySourceConfig, HttpSourceConfig, StreamSource
from edge_node.capture.schedule import CaptureCounters, CaptureStats, FramePacer, retry_delay
from edge_node.capture.sources import (
    CaptureError,
    DirectorySource,
    HttpSnapshotSource,
    SnapshotSource,
)
from edge_node.clock import Clock

__all__ = ["CaptureService", "FrameSink", "SourceFactory"]

_log = logging.getLogger(__name__)

_NO_SINK_POLL_S: Final = 0.2
_LOG_EVERY: Final = 100
_DIRECTORY_BACKOFF_CAP_S: Final = 30.0  # also for a source that cannot be set up


class FrameSink(Protocol):
    def submit(
        self, stream: str, frame: object, *, captured_at: datetime | None = None
    ) -> object: ...


SourceFactory = Callable[[StreamSource, CaptureCounters], SnapshotSource]


class CaptureService:
    """Runs the capture loops; ``sink()`` gives the pipeline to feed, or None (no model yet:
    nothing is fetched)."""

    def __init__(
        self,
        sources: Sequence[StreamSource],
        sink: Callable[[], FrameSink | None],
        clock: Clock,
        *,
        source_factory: SourceFactory | None = None,
    ) -> None:
        self._sources = tuple(sources)
        self._sink = sink
        self._clock = clock
        self._factory = source_factory or self._default_source
        self._counters = {s.stream: CaptureCounters(s.stream) for s in self._sources}

    def stats(self) -> Mapping[str, CaptureStats]:
        return {name: c.snapshot() for name, c in self._counters.items()}

    async def run(self, stop: anyio.Event) -> None:
        if not self._sources:
            return
        async with anyio.create_task_group() as group:
            for source in self._sources:
                group.start_soon(self._run_stream, source)
            await stop.wait()
            group.cancel_scope.cancel()

    def _default_source(self, spec: StreamSource, counters: CaptureCounters) -> SnapshotSource:
        if isinstance(spec.source, HttpSourceConfig):
            return HttpSnapshotSource(spec.source, self._clock)
        assert isinstance(spec.source, DirectorySourceConfig)
        return DirectorySource(spec.source, counters)

    async def _run_stream(self, spec: StreamSource) -> None:
        counters = self._counters[spec.stream]
        failures = 0
        while True:
            try:
                source = self._factory(spec, counters)
                break
            except Exception:  # e.g. an unreadable CA bundle: counted and retried, not fatal
                failures = counters.count_failure("setup_error")
                delay = retry_delay(failures, 1.0, _DIRECTORY_BACKOFF_CAP_S)
                _log.exception("stream %s: cannot set up its source", spec.stream)
                await anyio.sleep(delay)
        try:
            await self._loop(spec, source, counters)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                await source.aclose()

    async def _loop(
        self, spec: StreamSource, source: SnapshotSource, counters: CaptureCounters
    ) -> None:
        pacer = FramePacer(spec.fps)
        if isinstance(spec.source, HttpSourceConfig):
            initial_s, cap_s = spec.source.backoff_initial_s, spec.source.backoff_max_s
        else:
            initial_s = pacer.interval
            cap_s = max(initial_s, _DIRECTORY_BACKOFF_CAP_S)
        _log.info("capturing stream %s at %.2f fps", spec.stream, spec.fps)
        while True:
            sink = self._sink()
            if sink is None:
                await anyio.sleep(_NO_SINK_POLL_S)
                continue
            due = pacer.next_due(time.monotonic())
            await anyio.sleep(max(0.0, due - time.monotonic()))
            try:
                snapshot = await source.grab()
                if snapshot is None:
                    continue
                counters.count_captured()
                sink.submit(spec.stream, snapshot.data, captured_at=snapshot.captured_at)
            except Exception as exc:  # capture is never fatal: count, back off, retry
                reason = exc.reason if isinstance(exc, CaptureError) else "internal_error"
                failures = counters.count_failure(reason)
                delay = retry_delay(failures, initial_s, cap_s)
                if failures == 1 or failures % _LOG_EVERY == 0:
                    _log.warning(
                        "stream %s: capture failed (%s, %d in a row): %s; retrying in %.1fs",
                        spec.stream,
                        reason,
                        failures,
                        exc,
                        delay,
                        exc_info=not isinstance(exc, CaptureError),
                    )
                await anyio.sleep(delay)
