"""The FastAPI application factory; the lifespan runs the freshness, renewal, liveness,
health, event retention and rollout duties.

`create_app(services)` takes a built `Services` container (see control_plane.services);
it reads no settings and opens nothing by itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread
from fastapi import FastAPI

from control_plane.api import openapi, problems
from control_plane.api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from control_plane.api.routes import (
    access,
    artifacts,
    director,
    events,
    fleet_health,
    fleets,
    health,
    metrics,
    models,
    mqtt,
    nodes,
    rollouts,
    tuf,
)
from control_plane.director.service import DirectorService
from control_plane.events.store import EventStore
from control_plane.health.processor import HealthProcessor
from control_plane.nodes.presence import NodePresence
from control_plane.registry.service import RegistryService
from control_plane.rollouts.service import RolloutService
from control_plane.services import Services, bridge_running

log = logging.getLogger(__name__)

TARGETS_BODY_LIMIT = 16 << 20
# A rotation carries a root and the whole re-signed targets metadata in one JSON body.
ROTATION_BODY_LIMIT = TARGETS_BODY_LIMIT + (1 << 20)
# How often silent nodes are marked offline; small against the heartbeat timeout (90 s).
LIVENESS_INTERVAL_S = 5.0


async def _freshness_loop(registry: RegistryService, interval_s: float) -> None:
    """Re-sign snapshot and timestamp before they lapse, even when nothing changed."""
    while True:
        try:
            refreshed = await anyio.to_thread.run_sync(registry.refresh_expiring)
            if refreshed:
                log.info("re-signed snapshot/timestamp of fleets %s", ", ".join(refreshed))
        except Exception:
            log.exception("freshness refresh failed; retrying next interval")
        await anyio.sleep(interval_s)


async def _renewal_loop(director: DirectorService, interval_s: float) -> None:
    """Renew director assignments before they lapse (ADR 0032), at least six times per
    renewal window (a third of their lifetime), so a missed pass is caught up in time."""
    interval = min(interval_s, director.ttl.total_seconds() / 18)

    def renew_and_move() -> None:
        try:
            director.renew_expiring()
        finally:
            # Nodes still assigned a revoked version (a move a crash interrupted): ADR 0035.
            director.move_all_off_revoked()

    await _every(interval, renew_and_move, "renewing director assignments")


async def _every(interval_s: float, work: Callable[[], object], what: str) -> None:
    """`work()` in a worker thread every `interval_s`; a failure is logged, never fatal."""
    while True:
        try:
            await anyio.to_thread.run_sync(work)
        except Exception:
            log.exception("%s failed; retrying next interval", what)
        await anyio.sleep(interval_s)


async def _health_loop(processor: HealthProcessor) -> None:
    """Turn stored health reports into series and alerts (control_plane.health.processor).

    A pass drains up to a bounded number of batches; the loop sleeps only when it found
    nothing left, so a backlog after a restart drains without waiting on the interval.
    """
    config = processor.config
    while True:
        busy = False
        try:
            done = await anyio.to_thread.run_sync(processor.process_pending)
            busy = done >= config.batch_size
        except Exception:
            processor.failed_passes += 1
            log.exception("processing health reports failed; retrying next interval")
        await anyio.sleep(0 if busy else config.interval_s)


async def _rollout_loop(controller: RolloutService) -> None:
    """Step the rollouts (control_plane.rollouts.service): every replica may run it, the
    leases make one step each rollout at a time."""
    await _every(controller.config.interval_s, controller.tick, "the rollout controller's tick")


async def _event_retention_loop(events: EventStore) -> None:
    """Delete events past their retention (control_plane.events.store)."""
    interval = events.config.prune_interval_s
    await _every(interval, events.apply_retention, "pruning events past their retention")


async def _liveness_loop(presence: NodePresence) -> None:
    """Mark nodes offline whose heartbeats stopped (a link can die without closing)."""
    await _every(LIVENESS_INTERVAL_S, presence.mark_offline_stale, "marking silent nodes offline")


def create_app(services: Services, *, run_background: bool = True) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks, bridge_running(services) as bridge:
            app.state.mqtt_bridge = bridge  # None unless the server runs with --mqtt
            if bridge is not None:
                app.state.link_counts["mqtt"] = lambda: metrics.LinkCounts(
                    bridge.refusals.snapshot(), bridge.counts["records"]
                )
            if run_background:
                config = services.config
                tasks.start_soon(_freshness_loop, services.registry, config.refresh_interval_s)
                tasks.start_soon(_renewal_loop, services.director, config.renewal_interval_s)
                tasks.start_soon(_liveness_loop, services.nodes.presence)
                tasks.start_soon(_event_retention_loop, services.events)
                if config.health_processor:
                    tasks.start_soon(_health_loop, services.health.processor)
                if config.rollout_controller:
                    tasks.start_soon(_rollout_loop, services.rollouts)
                if services.nodes.broker_logins.accounts.manages_logins:
                    tasks.start_soon(
                        _every,
                        config.broker_reconcile_interval_s,
                        services.nodes.broker_logins.reconcile,
                        "reconciling the broker's node logins",
                    )
            yield
            tasks.cancel_scope.cancel()

    app = FastAPI(
        title="edgefleet control plane",
        version="0.1.0",
        description="Signed ONNX model registry and fleet rollouts.",
        lifespan=lifespan,
    )
    app.state.services = services
    # The REST transport's node inbox (the enrollment route); no cache: one call per node.
    app.state.rest_inbox = services.node_inbox("rest", auth_cache_s=0.0)
    problems.install(app)
    openapi.install(app)
    for router in (
        health,
        fleets,
        artifacts,
        models,
        tuf,
        access,
        nodes,
        director,
        rollouts,
        mqtt,
        fleet_health,
        events,
        metrics,
    ):
        app.include_router(router.router)
    # Transports register their counters here as they start (the MQTT bridge below, the
    # gRPC link in `control_plane.server`).
    app.state.link_counts = {}
    app.state.metrics_registry = metrics.fleet_registry(
        services.health.queries,
        services.health.processor,
        services.nodes.refusals,
        app.state.link_counts,
        services.registry.metadata_expiries,
        services.nodes.broker_logins,
    )
    app.add_middleware(
        BodyLimitMiddleware,
        default_limit=services.config.max_json_bytes,
        large=[
            ("PUT", r"/v1/artifacts/[^/]+", services.config.max_artifact_bytes),
            ("POST", r"/v1/fleets/[^/]+/targets", TARGETS_BODY_LIMIT),
            ("POST", r"/v1/fleets/[^/]+/root", ROTATION_BODY_LIMIT),
        ],
    )
    app.add_middleware(RequestIdMiddleware)
    return app
