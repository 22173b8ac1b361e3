"""``Telemetry``: what the agent records into and asks a health report of, once per window.

What it is for: the one object the rest of the node touches. The pipeline's result path
calls ``record_frame`` (or ``record_result``) from its worker threads: that is an append to
a deque (thread-safe in CPython, no lock), about a tenth of a microsecond. The agent's
health loop calls ``report(now, …)`` from a worker thread once per interval: it folds the
pending frames into the latency sketches (under a lock the recorders never wait on, except
when ``pending_frames_limit`` frames piled up because no report came, when the recording
thread folds them itself and it is counted), samples the system, and returns the
``edgefleet.agent.health/2`` document (``report``) or its encoding (``report_payload``,
checked and encoded once: the agent's path). No lock is held across I/O.

What it is not for: sending (the agent appends ``report_payload``'s bytes to its outbox) or
reaching into the pipeline, the outbox or the uplink: their numbers are passed in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Protocol

from edge_node.clock import Clock
from edge_node.runtime.timing import SystemTicker, Ticker
from edge_node.telemetry.config import TelemetryConfig
from edge_node.telemetry.latency import LatencyBook
from edge_node.telemetry.memory import RssTrend
from edge_node.telemetry.probe import SystemSample
from edge_node.telemetry.report import (
    HEALTH_SCHEMA,
    CaptureCounts,
    ErrorNote,
    OutboxCounts,
    StreamCounts,
    StreamTotals,
    UplinkCounts,
    cpu_section,
    errors_section,
    fit_checked,
    latency_section,
    memory_section,
    outbox_section,
    stream_section,
    thermal_section,
    uplink_section,
)
from edge_node.telemetry.thermal import ThermalReading, throttling
from protos.health_schema import check_report

__all__ = ["ErrorLogHandler", "FrameTiming", "Probe", "Telemetry"]

_MAX_SOURCE_CHARS: Final = 64
_MAX_MESSAGE_CHARS: Final = 512


class Probe(Protocol):
    """Where system samples come from (``SystemProbe``; tests pass a fake)."""

    def sample(self) -> SystemSample: ...


class FrameTiming(Protocol):
    """A frame's model version and timings (``protos.bundle.results.InferenceResult``,
    what the pipeline hands ``on_result``, fits)."""

    @property
    def model_label(self) -> str: ...
    @property
    def queue_s(self) -> float: ...
    @property
    def preprocess_s(self) -> float: ...
    @property
    def inference_s(self) -> float: ...
    @property
    def decode_s(self) -> float: ...


class Telemetry:
    """Latency, drift, memory and system health of one node; see the module docstring.

    ``clock`` stamps windows and errors (wall time); ``ticker`` measures windows and
    warm-ups (monotonic), and should be the probe's ticker too (RSS trend times come from
    the samples).
    """

    def __init__(
        self,
        config: TelemetryConfig,
        *,
        clock: Clock,
        probe: Probe,
        ticker: Ticker | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._probe = probe
        self._ticker = ticker or SystemTicker()
        self._pending: deque[tuple[str, float, float]] = deque()
        self._pending_limit = config.pending_frames_limit
        self._fold_lock = threading.Lock()
        self._book = LatencyBook(config)
        self._inline_folds = 0
        self._report_lock = threading.Lock()
        self._trend = RssTrend(config)
        self._started_s = self._ticker.monotonic()
        self._window_started_s = self._started_s
        self._window_started_at = clock.now()
        self._seq = 0
        self._stream_totals: dict[str, StreamTotals] = {}
        self._report_sample: SystemSample | None = None
        self._thermal: ThermalReading | None = None
        self._error_lock = threading.Lock()
        self._errors = 0
        self._last_error: ErrorNote | None = None

    # -- recording (any thread) ----------------------------------------------------------

    def record_frame(self, model: str, queue_s: float, compute_s: float) -> None:
        """One served frame: the model version's label (``name@version``), seconds queued,
        seconds of compute (preprocess + inference + decode). O(1); never waits unless
        the pending bound is hit."""
        pending = self._pending
        pending.append((model, queue_s, compute_s))
        if len(pending) >= self._pending_limit:
            self._fold(inline=True)

    def record_result(self, result: FrameTiming) -> None:
        """``record_frame`` for an ``InferenceResult``, keyed by its ``model_label``, so
        every version has its own latency and drift baseline."""
        self.record_frame(
            result.model_label,
            result.queue_s,
            result.preprocess_s + result.inference_s + result.decode_s,
        )

    def record_error(self, source: str, message: str, *, at: datetime | None = None) -> None:
        """An error worth an operator's eye: counted in the window; the last one is shown."""
        note = ErrorNote(
            at=at if at is not None else self._clock.now(),
            source=str(source)[:_MAX_SOURCE_CHARS],
            message=str(message)[:_MAX_MESSAGE_CHARS],
        )
        with self._error_lock:
            self._errors += 1
            self._last_error = note

    @property
    def pending_frames(self) -> int:
        return len(self._pending)

    def _fold(self, *, inline: bool = False) -> int:
        with self._fold_lock:
            pending = self._pending
            count = len(pending)
            if inline:
                if count < self._pending_limit:
                    return 0  # another thread folded meanwhile
                self._inline_folds += 1
            pop = pending.popleft
            return self._book.add_frames((pop() for _ in range(count)), self._ticker.monotonic())

    # -- drift baselines across restarts ---------------------------------------------------

    def export_baselines(self) -> dict[str, Any]:
        """Ready drift baselines (JSON-ready); persist them so a restart keeps drift."""
        with self._fold_lock:
            return self._book.export_baselines()

    def import_baselines(self, data: Mapping[str, Any]) -> None:
        """Restore ``export_baselines``' data; ``InvalidInputError`` when malformed."""
        with self._fold_lock:
            self._book.import_baselines(data, self._ticker.monotonic())

    # -- sampling and reporting (the health loop's thread) ---------------------------------

    def sample(self) -> SystemSample:
        """Sample the system and feed the RSS trend (call between reports for a finer
        trend; ``report`` samples too). Blocking I/O: call it from a worker thread."""
        sample = self._probe.sample()
        with self._report_lock:
            self._trend.add(sample.monotonic_s, sample.rss_bytes)
        return sample

    def report(
        self,
        now: datetime,
        *,
        node_id: str,
        agent_version: str,
        active_model: str | None = None,
        model_runtime: Mapping[str, Any] | None = None,
        streams: Mapping[str, StreamCounts] | None = None,
        capture: Mapping[str, CaptureCounts] | None = None,
        queue_depth_frames: int | None = None,
        outbox: OutboxCounts | None = None,
        uplink: UplinkCounts | None = None,
        shadow: Mapping[str, Any] | None = None,
        aggregation: Mapping[str, Any] | None = None,
        devices: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Close the window and return its ``edgefleet.agent.health/2`` document.

        ``shadow`` is its ``shadow`` section as the updater's shadow stage builds it,
        ``aggregation`` its ``aggregation`` section as the aggregation task builds it,
        ``devices`` its ``devices`` section as the agent's device task builds it.

        Its encoding (``encode_report``) fits ``max_report_bytes``. Blocking I/O (the
        probe): call it from a worker thread, one at a time.
        """
        report, _ = self._report(
            now,
            node_id=node_id,
            agent_version=agent_version,
            active_model=active_model,
            model_runtime=model_runtime,
            streams=streams,
            capture=capture,
            queue_depth_frames=queue_depth_frames,
            outbox=outbox,
            uplink=uplink,
            shadow=shadow,
            aggregation=aggregation,
            devices=devices,
        )
        return report

    def report_payload(
        self,
        now: datetime,
        *,
        node_id: str,
        agent_version: str,
        active_model: str | None = None,
        model_runtime: Mapping[str, Any] | None = None,
        streams: Mapping[str, StreamCounts] | None = None,
        capture: Mapping[str, CaptureCounts] | None = None,
        queue_depth_frames: int | None = None,
        outbox: OutboxCounts | None = None,
        uplink: UplinkCounts | None = None,
        shadow: Mapping[str, Any] | None = None,
        aggregation: Mapping[str, Any] | None = None,
        devices: Mapping[str, Any] | None = None,
    ) -> bytes:
        """``report``, encoded as the outbox stores it (``encode_report``'s bytes): the
        agent's path, which checks and encodes the document once. Same rules as ``report``.
        """
        _, data = self._report(
            now,
            node_id=node_id,
            agent_version=agent_version,
            active_model=active_model,
            model_runtime=model_runtime,
            streams=streams,
            capture=capture,
            queue_depth_frames=queue_depth_frames,
            outbox=outbox,
            uplink=uplink,
            shadow=shadow,
            aggregation=aggregation,
            devices=devices,
        )
        return data

    def _report(
        self,
        now: datetime,
        *,
        node_id: str,
        agent_version: str,
        active_model: str | None,
        model_runtime: Mapping[str, Any] | None,
        streams: Mapping[str, StreamCounts] | None,
        capture: Mapping[str, CaptureCounts] | None,
        queue_depth_frames: int | None,
        outbox: OutboxCounts | None,
        uplink: UplinkCounts | None,
        shadow: Mapping[str, Any] | None = None,
        aggregation: Mapping[str, Any] | None = None,
        devices: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        cpu_started = time.thread_time()
        self._fold()
        with self._fold_lock:
            latency = self._book.close_window()
            inline_folds, self._inline_folds = self._inline_folds, 0
        sample = self.sample()
        end_s = self._ticker.monotonic()
        with self._error_lock:
            errors, self._errors = self._errors, 0
            last_error = self._last_error
        with self._report_lock:
            window_s = end_s - self._window_started_s
            self._seq += 1
            previous = self._report_sample
            streams_part, self._stream_totals = stream_section(
                streams or {}, self._stream_totals, self.config.max_streams, capture
            )
            previous_thermal, self._thermal = self._thermal, sample.thermal
            report: dict[str, Any] = {
                "schema": HEALTH_SCHEMA,
                "node_id": node_id,
                "agent_version": agent_version,
                "seq": self._seq,
                "window_start": self._window_started_at.isoformat(),
                "window_end": now.isoformat(),
                "window_s": round(window_s, 3),
                "uptime_s": round(end_s - self._started_s, 3),
                "system_uptime_s": None
                if sample.boot_time_s is None
                else round(max(0.0, now.timestamp() - sample.boot_time_s), 1),
                "model_active": active_model,
                "model_runtime": None if model_runtime is None else dict(model_runtime),
                "shadow": None if shadow is None else dict(shadow),
                "aggregation": None if aggregation is None else dict(aggregation),
                "devices": None if devices is None else dict(devices),
                **latency_section(latency, window_s),
                **streams_part,
                "queue_depth_frames": queue_depth_frames,
                "memory": memory_section(
                    rss_bytes=sample.rss_bytes,
                    budget_bytes=self.config.memory_budget_bytes,
                    min_headroom_ratio=self.config.min_headroom_ratio,
                    system_total_bytes=sample.system_memory_total_bytes,
                    system_available_bytes=sample.system_memory_available_bytes,
                    trend=self._trend.reading,
                ),
                "cpu": cpu_section(
                    process_cpu_s=sample.process_cpu_s,
                    previous_cpu_s=None if previous is None else previous.process_cpu_s,
                    elapsed_s=0.0
                    if previous is None
                    else sample.monotonic_s - previous.monotonic_s,
                    system_percent=sample.system_cpu_percent,
                    cores=sample.cpu_cores,
                    threads=sample.threads,
                ),
                "disk": {
                    "data_dir_free_bytes": sample.disk_free_bytes,
                    "data_dir_total_bytes": sample.disk_total_bytes,
                },
                "thermal": thermal_section(
                    sample.thermal, previous_thermal, throttling(previous_thermal, sample.thermal)
                ),
                "outbox": outbox_section(outbox),
                "uplink": uplink_section(uplink),
                "errors": errors_section(errors, last_error),
            }
            self._report_sample = sample
            self._window_started_s = end_s
            self._window_started_at = now
            telemetry: dict[str, Any] = {
                "report_cpu_ms": 0.0,
                "inline_folds": inline_folds,
                "sketches_dropped": False,
            }
            report["telemetry"] = telemetry
            # The schema check is the costliest step, so it is inside the CPU time; the
            # placeholder has the final value's type, so the check holds for both. Only
            # the encoding (it must include the figure) is left out.
            check_report(report)
            telemetry["report_cpu_ms"] = round((time.thread_time() - cpu_started) * 1000.0, 3)
            data = fit_checked(report, self.config.max_report_bytes)
        return report, data


class ErrorLogHandler(logging.Handler):
    """A logging handler that records every record at ``level`` or above as the node's
    last error (``source`` is the logger's name). Attach it to the ``edge_node`` logger."""

    def __init__(self, telemetry: Telemetry, level: int = logging.ERROR) -> None:
        super().__init__(level)
        self._telemetry = telemetry

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._telemetry.record_error(record.name, record.getMessage())
        except Exception:  # a handler must never raise into the code that logged
            self.handleError(record)
