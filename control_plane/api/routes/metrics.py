"""Prometheus ``/metrics``: fleet-level series only (no per-node or per-record labels).

Labels are closed sets: node state (3), alert kind (6), record kind (2), transport (2),
refusal reason (a fixed vocabulary in the link and node code), TUF role (4); and the
fleet name on the metadata series (fleets are few, and named by operators). Each scrape reads the
database once, at most every ``SNAPSHOT_TTL_S`` seconds (cached), so many scrapers cost
little; the link counters are this process's own, read from memory. No token: the
series carry counts, never names or ids.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from control_plane.health.processor import HealthProcessor
from control_plane.health.queries import HealthQueries
from control_plane.nodes.broker_logins import BrokerLogins
from control_plane.nodes.model import RefusalCounter
from control_plane.registry.freshness import MetadataExpiry

router = APIRouter(tags=["metrics"])

SNAPSHOT_TTL_S = 5.0


class LinkCounts(NamedTuple):
    """What one transport of this process counted since it started."""

    refusals: Mapping[str, int]  # by reason
    records_acked: int


# Transport name ("grpc", "mqtt") -> its counts now; the server registers what it runs.
LinkSources = dict[str, Callable[[], LinkCounts]]

# The newest served version of each role of each active fleet (RegistryService).
MetadataSource = Callable[[], Sequence[MetadataExpiry]]


class FleetCollector(Collector):
    def __init__(
        self,
        queries: HealthQueries,
        processor: HealthProcessor,
        node_refusals: RefusalCounter,
        links: LinkSources | None = None,
        metadata: MetadataSource | None = None,
        broker_logins: BrokerLogins | None = None,
    ) -> None:
        self._queries = queries
        self._metadata = metadata
        self._broker_logins = broker_logins
        # This replica's processor, for its own failed passes (even when it does not run).
        self._processor = processor
        self._node_refusals = node_refusals
        self._links = links if links is not None else {}
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] | None = None
        self._taken = 0.0

    def _fleet(self) -> dict[str, Any]:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken > SNAPSHOT_TTL_S:
                self._snapshot = self._queries.fleet_snapshot()
                self._snapshot["metadata"] = list(self._metadata()) if self._metadata else []
                self._taken = time.monotonic()
            return self._snapshot

    def collect(self) -> Iterator[Metric]:
        fleet = self._fleet()
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
            value=self._processor.failed_passes,
        )
        expiry = GaugeMetricFamily(
            "edgefleet_tuf_metadata_expires_timestamp_seconds",
            "When the newest served metadata of each role expires (Unix time), by fleet; "
            "alert on (this - time()) for timestamp and snapshot",
            labels=["fleet", "role"],
        )
        for md in fleet["metadata"]:
            expiry.add_metric([md.fleet, md.role], md.expires_at.timestamp())
        yield expiry
        version = GaugeMetricFamily(
            "edgefleet_tuf_metadata_version",
            "Version of the newest served metadata of each role, by fleet",
            labels=["fleet", "role"],
        )
        for md in fleet["metadata"]:
            version.add_metric([md.fleet, md.role], md.version)
        yield version
        yield from self._link_metrics()
        logins = self._broker_logins
        if logins is not None and logins.accounts.manages_logins:
            yield GaugeMetricFamily(
                "edgefleet_mqtt_logins_missing",
                "Enrolled MQTT nodes the broker has no login for, at the last reconcile",
                value=logins.missing,
            )
            yield CounterMetricFamily(
                "edgefleet_mqtt_reconcile_failed_passes",
                "Reconciles of the broker's logins that failed on this replica (retried)",
                value=logins.failed_passes,
            )

    def _link_metrics(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "edgefleet_link_refusals",
            "Node messages and calls this replica's links refused, by transport and reason",
            labels=["transport", "reason"],
        )
        acked = CounterMetricFamily(
            "edgefleet_link_records_acked",
            "Records this replica's links stored and acknowledged, by transport",
            labels=["transport"],
        )
        for transport, read in sorted(self._links.items()):
            counts = read()
            for reason, count in sorted(counts.refusals.items()):
                refused.add_metric([transport, reason], count)
            acked.add_metric([transport], counts.records_acked)
        yield refused
        yield acked
        nodes = CounterMetricFamily(
            "edgefleet_node_refusals",
            "Enrollments and node authentications this replica refused, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(self._node_refusals.snapshot().items()):
            nodes.add_metric([reason], count)
        yield nodes


def fleet_registry(
    queries: HealthQueries,
    processor: HealthProcessor,
    node_refusals: RefusalCounter,
    links: LinkSources | None = None,
    metadata: MetadataSource | None = None,
    broker_logins: BrokerLogins | None = None,
) -> CollectorRegistry:
    """A registry of this app's own (not the process-global default)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        FleetCollector(queries, processor, node_refusals, links, metadata, broker_logins)
    )
    return registry


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
