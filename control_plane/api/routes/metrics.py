"""Prometheus ``/metrics``: fleet-level series only (no per-node or per-record labels).

Labels are closed sets: node state (3), alert kind (6), record kind (2). Each scrape reads
the database once, at most every ``SNAPSHOT_TTL_S`` seconds (cached), so many scrapers
cost little. No token: the series carry counts, never names or ids.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control_plane.services import Services

router = APIRouter(tags=["metrics"])

SNAPSHOT_TTL_S = 5.0


class FleetCollector(Collector):
    def __init__(self, services: Services) -> None:
        self._services = services
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] | None = None
        self._taken = 0.0

    def _fleet(self) -> dict[str, Any]:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken > SNAPSHOT_TTL_S:
                self._snapshot = self._services.health.fleet_snapshot()
                self._taken = time.monotonic()
            return self._snapshot

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet()
        health = self._services.health
        nodes = GaugeMetricFamily("edgefleet_nodes", "Enrolled nodes by state", labels=["state"])
        for state, count in fleet["nodes"].items():
            nodes.add_metric([state], count)
        yield nodes
        alerts = GaugeMetricFamily(
            "edgefleet_alerts_open", "Open health alerts by kind", labels=["kind"]
        )
        for kind, count in fleet["alerts"].items():
            alerts.add_metric([kind], count)
        yield alerts
        records = CounterMetricFamily(
            "edgefleet_node_records_stored",
            "Records from node outboxes stored (acknowledged) by kind",
            labels=["kind"],
        )
        for kind, count in fleet["records"].items():
            records.add_metric([kind], count)
        yield records
        yield CounterMetricFamily(
            "edgefleet_health_reports_processed",
            "Health reports turned into points and roll-ups (all replicas)",
            value=fleet["processed"],
        )
        yield CounterMetricFamily(
            "edgefleet_health_reports_malformed",
            "Health reports skipped as unreadable (all replicas)",
            value=fleet["malformed"],
        )
        yield GaugeMetricFamily(
            "edgefleet_health_processing_lag_seconds",
            "Age of the oldest stored health report not processed yet (0: caught up)",
            value=fleet["lag_s"],
        )
        yield CounterMetricFamily(
            "edgefleet_health_processor_failed_passes",
            "Passes of this replica's health processor that failed (retried)",
            value=health.failed_passes,
        )


def fleet_registry(services: Services) -> CollectorRegistry:
    """A registry of this app's own (not the process-global default)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(services))
    return registry


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
