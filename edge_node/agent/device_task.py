"""The agent's device task: starts the node's `DeviceGateway` (node.yaml ``devices:``),
hands what the cameras send to the aggregation, and stops the gateway within the agent's
drain deadline.

The gateway's callbacks run on its worker thread; both go straight into the aggregation
task's bounded hand-off (``AggregationTask.offer_observations``, a batch at a time, and
``set_clock_offset``: a lock held for an append), so the gateway's worker never waits on
the rules and the engine is only ever touched by the aggregation's own worker. Cameras'
results are durable (ADR 0041): when the hand-off is full the gateway's worker waits for
the aggregation to drain it (backpressure: the gateway's queue fills, then paho stops
reading, then TCP holds the broker back), and one the aggregation still refuses (no room
within its wait, or stopping) is reported to the gateway as not processed, so it stays
unacked and the broker delivers it again. Without an aggregation (no rules file, or one
that failed) the gateway runs all the same: it checks, rate-limits, dedupes, answers
heartbeats and sends each camera its config, and the observations it accepts are counted
(``observations_not_aggregated``), acked and dropped (the rules are off until a restart;
leaving them unacked would only fill the broker's window). Reconnects are the gateway's
own (paho's); a gateway that cannot start (its TLS files unusable) fails the agent like
any task.

Not here: the gateway (``edge_node.devices.gateway``), the rules.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import anyio.to_thread

from edge_node.agent.aggregation_task import AggregationTask
from edge_node.aggregation.model import Observation
from edge_node.clock import TaskClock
from edge_node.devices.config import DeviceGatewayConfig
from edge_node.devices.gateway import DeviceGateway

__all__ = ["MAX_CAMERAS_REPORTED", "DeviceTask"]

log = logging.getLogger(__name__)

MAX_CAMERAS_REPORTED: Final = 64
# The gateway's counters that the health section carries as they are.
_COUNTERS: Final = (
    "connects",
    "connect_failures",
    "disconnects",
    "messages",
    "queued",
    "max_queue",
    "queue_full",
    "deferred",
    "observations",
    "time_syncs",
    "configs_published",
    "publish_failures",
    "callback_errors",
    "internal_errors",
    "remembered_ids",
    "ids_evicted_early",
)


class DeviceTask:
    """`run(stop)` as an agent task; `health()` at any time. `stopped` is set once the
    gateway has stopped (the aggregation waits for it before its last flush)."""

    def __init__(
        self,
        config: DeviceGatewayConfig,
        aggregation: AggregationTask | None,
        clock: TaskClock,
        *,
        stop_deadline_s: float,
    ) -> None:
        self.config = config
        self._aggregation = aggregation
        self._stop_deadline_s = stop_deadline_s
        self._lock = threading.Lock()
        self.not_aggregated = 0
        self.stopped = anyio.Event()
        self.gateway = DeviceGateway(
            config,
            on_observations=self._observations,
            on_clock_offset=self._clock_offset,
            time_fn=lambda: clock.now().timestamp(),
            monotonic_fn=clock.monotonic,
        )

    # ------------------------------------------------------------ the gateway's worker

    def _observations(self, observations: Sequence[Observation]) -> int:
        """The batch form (what the gateway calls): how many were processed, a prefix;
        the rest the gateway leaves unacked."""
        aggregation = self._aggregation
        taken = 0
        if aggregation is not None:
            taken = aggregation.offer_observations(observations)
            if taken == len(observations) or aggregation.state != "failed":
                return taken
        with self._lock:
            self.not_aggregated += len(observations) - taken
        return len(observations)

    def _clock_offset(self, device_id: str, offset_s: float) -> None:
        aggregation = self._aggregation
        if aggregation is not None:
            aggregation.set_clock_offset(device_id, offset_s)

    @property
    def aggregating(self) -> bool:
        aggregation = self._aggregation
        return aggregation is not None and aggregation.accepting

    # ------------------------------------------------------------ the agent's task

    async def run(self, stop: anyio.Event) -> None:
        """Start the gateway (it connects and reconnects in the background), wait for
        `stop`, then stop it within the deadline: what it still holds stays unacked for
        the broker's session to deliver again."""
        try:
            await anyio.to_thread.run_sync(self.gateway.start)
            log.info(
                "device gateway on %s:%d for %d cameras under %s (%s)",
                self.config.host,
                self.config.port,
                len(self.config.cameras),
                self.config.topic_root,
                "aggregating" if self._aggregation is not None else "counting only: no rules",
            )
            await stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                drained = await anyio.to_thread.run_sync(self.gateway.stop, self._stop_deadline_s)
                self.stopped.set()
            log.info("device gateway stopped (%s)", "drained" if drained else "not drained")

    # ------------------------------------------------------------ health

    def health(self) -> dict[str, Any]:
        """The health report's ``devices`` section (health.proto ``Devices``)."""
        raw = self.gateway.health()
        with self._lock:
            not_aggregated = self.not_aggregated
        cameras = raw.get("cameras", {})
        shown = sorted(cameras)[:MAX_CAMERAS_REPORTED]
        return {
            "broker": f"{self.config.host}:{self.config.port}",
            "connected": bool(raw.get("connected")),
            "last_error": raw.get("last_error"),
            "mode": "aggregating" if self.aggregating else "counting",
            **{name: int(raw.get(name, 0)) for name in _COUNTERS},
            "accepted": _counts(raw.get("accepted", {})),
            "rejected": _counts(raw.get("rejected", {})),
            "unknown_devices": [str(d) for d in raw.get("unknown_devices", [])],
            "observations_not_aggregated": not_aggregated,
            "cameras": {device_id: _camera(cameras[device_id]) for device_id in shown},
            "cameras_omitted": len(cameras) - len(shown),
        }


def _counts(raw: dict[str, Any]) -> dict[str, int]:
    return {str(k)[:64]: int(v) for k, v in raw.items()}


def _camera(raw: dict[str, Any]) -> dict[str, Any]:
    last_seen = raw.get("last_seen")
    return {
        "accepted": _counts(raw.get("accepted", {})),
        "rejected": _counts(raw.get("rejected", {})),
        "clock_offset_s": raw.get("clock_offset_s"),
        "clock_error_s": raw.get("clock_error_s"),
        "firmware": str(raw.get("firmware", "")),
        "boot_id": str(raw.get("boot_id", "")),
        "config_version": int(raw.get("config_version", 0)),
        "reported_config_version": int(raw.get("reported_config_version", 0)),
        "last_seen": None
        if last_seen is None
        else datetime.fromtimestamp(last_seen, UTC).isoformat(),
    }
