"""`edgefleet server`: build the services from settings; serve the REST API and, when
configured, the gRPC node link, in one asyncio loop that stops both on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Final

import uvicorn
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from control_plane.api.app import create_app
from control_plane.api.routes.metrics import LinkCounts
from control_plane.errors import UnavailableError
from control_plane.link.grpc_server import GrpcLinkConfig
from control_plane.logs import configure_logging
from control_plane.services import ServiceConfig, Services, build_services, grpc_link_server
from control_plane.settings import ServerSettings

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Freeze what start-up built; collect the youngest generation less often.

    Call once the server is up. Under ingestion load CPython's collector took 5-8 % of
    the control plane's core with its defaults (docs/benchmarks.md, CPython 3.11): a
    batch of 100 records allocates about a thousand objects, so the youngest generation
    (700) was collected about once per batch, and the oldest, every few seconds,
    walked the whole heap that start-up left (modules, ORM metadata, protobuf
    descriptors, the app): a pause for every stream. Frozen (`gc.freeze`), that heap is
    never scanned again; with 10,000 allocations between young collections a collection
    comes every ten batches or so, and cyclic garbage made later still goes. Start-up
    objects that become cyclic garbage afterwards stay (a bounded, one-time cost).
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def service_config(settings: ServerSettings) -> ServiceConfig:
    return ServiceConfig(
        data_dir=settings.data_dir.resolve(),
        database_url=settings.resolved_database_url,
        artifacts_url=settings.resolved_artifacts,
        max_json_bytes=settings.max_json_bytes,
        max_artifact_bytes=settings.max_artifact_bytes,
        snapshot_ttl=settings.snapshot_ttl,
        timestamp_ttl=settings.timestamp_ttl,
        refresh_interval_s=settings.refresh_interval_s,
        ready_margin_fraction=settings.ready_margin_fraction,
        mqtt=settings.mqtt_bridge_config(),
        broker_accounts=settings.mqtt_accounts,
        broker_reconcile_interval_s=settings.mqtt_reconcile_interval_s,
        health=settings.health_config(),
        health_processor=settings.health_processor,
        results_per_node=settings.results_per_node,
        events=settings.events_config(),
        rollouts=settings.rollout_config(),
        rollout_controller=settings.rollout_controller,
        webhooks=settings.webhook_config(),
        keys_dir=None if settings.keys_dir is None else settings.keys_dir.resolve(),
        init_keys=settings.init_keys,
        director_signer_uri=settings.director_signer_uri,
        director_public_key=settings.director_public_key,
        online_signer_uris=settings.online_signer_uris,
    )


HTTP_SHUTDOWN_S: Final = 10.0
GRPC_GRACE_S: Final = 5.0
STOP_DEADLINE_S: Final = 15.0
GIL_SWITCH_INTERVAL_S: Final = 0.001
GC_YOUNG_THRESHOLD: Final = 10_000
"""Allocations between two collections of CPython's youngest generation (default 700)."""


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: `serve()` owns the signals and stops
    the REST API and the gRPC link together.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ControlPlane:
    """The REST API (uvicorn) and the gRPC node link in the running event loop.

    `start()` fails fast if either cannot listen; `stop()` stops both at once, within
    `STOP_DEADLINE_S`, and is safe to call twice. Tests run it to restart a control
    plane on the same ports and data.
    """

    def __init__(
        self,
        services: Services,
        *,
        host: str,
        port: int,
        grpc: GrpcLinkConfig | None = None,
        log_level: str = "info",
        run_background: bool = True,
    ) -> None:
        self.services = services
        self.link = grpc_link_server(services, grpc) if grpc is not None else None
        app = create_app(services, run_background=run_background)
        if self.link is not None:
            link = self.link
            app.state.link_counts["grpc"] = lambda: LinkCounts(
                link.refusals.snapshot(), link.stats.records_acked
            )
        self._http = _Uvicorn(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level.lower(),
                # Our formatter on the root logger, not uvicorn's; the request-id
                # middleware writes the access lines (with the request id).
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=int(HTTP_SHUTDOWN_S),
                lifespan="on",
            )
        )
        self._address = (host, port)
        self._http_task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        # Bound here, not by uvicorn (which logs and exits): a port in use is one error.
        host, port = self._address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn does
        try:
            listener = socket.create_server(self._address, family=family)
        except OSError as exc:
            raise UnavailableError(
                f"cannot listen on {host}:{port} for the REST API: {exc.strerror or exc}",
                address=f"{host}:{port}",
            ) from exc
        if self.link is not None:
            try:
                await self.link.start()
            except BaseException:
                listener.close()
                raise
        self._http_task = asyncio.create_task(self._http.serve([listener]), name="uvicorn")
        try:
            async with asyncio.timeout(timeout_s):
                while not self._http.started:
                    if self._http_task.done():
                        self._http_task.result()  # raises what stopped it
                        raise RuntimeError("the REST API stopped while starting")
                    await asyncio.sleep(0.01)  # uvicorn offers no event to await
            # uvicorn says where it runs only when it binds itself.
            bound = f"{host}:{listener.getsockname()[1]}"
            log.info("REST API on http://%s", bound, extra={"address": bound})
        except BaseException:
            await self.stop()
            raise

    async def wait(self) -> None:
        """Until the REST API stops by itself (it exits on a fatal startup error)."""
        if self._http_task is not None:
            await asyncio.shield(self._http_task)

    async def stop(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        self._http.should_exit = True
        stops: list[asyncio.Future[None]] = []
        if self.link is not None:
            stops.append(asyncio.ensure_future(self.link.stop(GRPC_GRACE_S)))
        if self._http_task is not None:
            stops.append(self._http_task)
        if not stops:
            return
        done, pending = await asyncio.wait(stops, timeout=STOP_DEADLINE_S)
        if pending:
            log.warning("the control plane did not stop within %.0fs; forcing", STOP_DEADLINE_S)
            self._http.force_exit = True
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("stopping failed", exc_info=task.exception())


def serve(settings: ServerSettings) -> None:
    configure_logging(settings.log_format, settings.log_level)
    # The event loop, gRPC's threads, the record writer and the MQTT bridge hand the GIL
    # to each other around every database and socket call. With CPython's default 5 ms
    # switch interval a thread back from PostgreSQL can wait that long for a busy loop to
    # let go, several times per group commit; 1 ms keeps acks prompt (docs/benchmarks.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        services: Services = build_services(service_config(settings))
    except DBAPIError as exc:  # unreachable, refused, bad credentials: not our bug
        url = make_url(settings.resolved_database_url).render_as_string(hide_password=True)
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise UnavailableError(f"cannot use the database {url}: {reason}", url=url) from exc
    except OSError as exc:  # a data dir or store path that cannot be made or written
        raise UnavailableError(f"cannot start: {exc}", path=exc.filename) from exc
    if services.admin_token_file.exists():
        log.info("admin token file: %s", services.admin_token_file)
    try:
        asyncio.run(_serve(settings, services))
    finally:
        services.close()


async def _serve(settings: ServerSettings, services: Services) -> None:
    plane = ControlPlane(
        services,
        host=settings.host,
        port=settings.port,
        grpc=settings.grpc_link_config(),
        log_level=settings.log_level,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await plane.start()
        tune_gc()
        stopped = asyncio.ensure_future(stop.wait())
        running = asyncio.ensure_future(plane.wait())
        await asyncio.wait((stopped, running), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        log.info("stopping the control plane")
        await plane.stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
