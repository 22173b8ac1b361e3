"""Nothing lost, nothing duplicated: a node's outbox drains over gRPC while the control
plane (REST API and gRPC link, one event loop) is stopped and started again on the same
ports, data directory and database.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
import pytest

from control_plane.link.grpc_server import GrpcLinkConfig
from control_plane.server import ControlPlane
from control_plane.services import ServiceConfig, Services, build_services
from edge_node.clock import SystemClock
from edge_node.enroll import EnrollmentFiles, enroll_over_grpc
from edge_node.link.base import Backoff, LinkRefusedError
from edge_node.link.grpc_link import GrpcNodeLink
from edge_node.link.uplink import Uplink, UplinkConfig
from edge_node.outbox import Outbox
from protos.edgefleet.fleet.v1 import link_pb2
from tests.conftest import free_port
from tests.control_plane.link.grpc_support import ADMIN, FLEET, ensure_fleet, node_settings, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

UPLINK = UplinkConfig(
    batch_records=25,
    idle_poll_s=0.02,
    heartbeat_s=1.0,
    ack_timeout_s=3.0,
    backoff=Backoff(initial_s=0.05, cap_s=0.5),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Plane:
    """Starts and stops a whole control plane on fixed ports, as an operator's restart."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.http_port = free_port()
        self.grpc = GrpcLinkConfig(
            node_address=f"127.0.0.1:{free_port()}",
            enroll_address=f"127.0.0.1:{free_port()}",
            stop_grace_s=2.0,
        )
        self.services: Services | None = None
        self.running: ControlPlane | None = None

    async def start(self) -> Services:
        services = await anyio.to_thread.run_sync(build_services, self.config)
        plane = ControlPlane(
            services,
            host="127.0.0.1",
            port=self.http_port,
            grpc=self.grpc,
            log_level="warning",
            run_background=False,
        )
        await plane.start()
        self.services, self.running = services, plane
        return services

    async def stop(self) -> None:
        assert self.running is not None and self.services is not None
        await self.running.stop()
        self.services.close()
        self.running = self.services = None


async def test_a_restart_mid_stream_neither_loses_nor_duplicates_records(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    plane = Plane(service_config)
    services = await plane.start()
    ensure_fleet(services, FLEET)
    token, _ = services.nodes.tokens.create_bootstrap_token(ADMIN, FLEET, {}, timedelta(hours=1))
    files = await enroll_over_grpc(
        plane.grpc.enroll_address or "",
        services.ca.ca_pem,
        token,
        "0.1.0",
        tmp_path / "node",
        server_name="localhost",
    )
    node_id = files.node_id
    outbox = Outbox.open(
        tmp_path / "node" / "outbox.db", node_id=node_id, budget_bytes=64 << 20, clock=SystemClock()
    )
    link = GrpcNodeLink(
        node_settings(plane.grpc.node_address, connect_timeout_s=2.0), files.credentials
    )
    uplink = Uplink(outbox, link, clock=SystemClock(), config=UPLINK)
    appended: list[str] = []

    async def append(count: int) -> None:
        for i in range(count):
            record = await anyio.to_thread.run_sync(
                outbox.append, "event", b'{"n": %d}' % len(appended)
            )
            appended.append(record.id)
            if i % 10 == 9:
                await anyio.sleep(0)  # let the uplink interleave

    def stored() -> int:
        return services.records.count(node_id)

    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(uplink.run, lambda: link_pb2.Hello(agent_version="0.1.0"), stop)
            await append(150)
            await until(lambda: stored() >= 40)  # mid-stream: some stored, more pending
            pending_at_stop = outbox.stats().pending_events
            await plane.stop()

            await append(100)  # the control plane is down: the outbox keeps them
            await until(lambda: uplink.stats.disconnects >= 1)

            services = await plane.start()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.http_port}") as http:
                assert (await http.get("/healthz")).status_code == 200
            await append(50)
            await until(lambda: outbox.stats().pending_events == 0, timeout=20)
            stop.set()
    finally:
        await link.close()
        outbox.close()
        if plane.running is not None:
            await plane.stop()

    assert pending_at_stop > 0
    assert uplink.stats.connects >= 2
    restarted = build_services(service_config)
    try:
        ids = restarted.records.record_ids(node_id)
        count = restarted.records.count(node_id)
    finally:
        restarted.close()
    assert ids == set(appended)
    assert count == len(ids) == 300


async def test_metrics_count_what_the_grpc_link_acked_and_refused(
    service_config: ServiceConfig, tmp_path: Path
) -> None:
    plane = Plane(service_config)
    services = await plane.start()
    try:
        ensure_fleet(services, FLEET)
        token, _ = services.nodes.tokens.create_bootstrap_token(
            ADMIN, FLEET, {}, timedelta(hours=1)
        )

        async def enroll(directory: str) -> EnrollmentFiles:
            return await enroll_over_grpc(
                plane.grpc.enroll_address or "",
                services.ca.ca_pem,
                token,
                "0.1.0",
                tmp_path / directory,
                server_name="localhost",
            )

        files = await enroll("node")
        with pytest.raises(LinkRefusedError):
            await enroll("again")  # the token is used: refused, counted
        outbox = Outbox.open(
            tmp_path / "node" / "outbox.db",
            node_id=files.node_id,
            budget_bytes=1 << 20,
            clock=SystemClock(),
        )
        link = GrpcNodeLink(
            node_settings(plane.grpc.node_address, connect_timeout_s=2.0), files.credentials
        )
        uplink = Uplink(outbox, link, clock=SystemClock(), config=UPLINK)
        stop = anyio.Event()
        try:
            for n in range(7):
                outbox.append("event", b'{"n": %d}' % n)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(uplink.run, lambda: link_pb2.Hello(agent_version="0.1.0"), stop)
                await until(lambda: outbox.stats().pending_events == 0)
                stop.set()
        finally:
            await link.close()
            outbox.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{plane.http_port}") as http:
            text = (await http.get("/metrics")).text
    finally:
        await plane.stop()
    for line in (
        'edgefleet_link_records_acked_total{transport="grpc"} 7.0',
        'edgefleet_link_refusals_total{reason="token-used",transport="grpc"} 1.0',
        'edgefleet_node_refusals_total{reason="token-used"} 1.0',
    ):
        assert line in text, text
    assert files.node_id not in text  # counts only, never ids
