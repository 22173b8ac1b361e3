"""A bulk pin through the live REST API reaches a gRPC node and an MQTT node of the fleet at
once (one delivery call per chunk: `LinkHub.send_many`, `MqttBridge.publish_desired_many`),
and each node accepts its own assignment (both database backends)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from control_plane.cli.main import main as cli_main
from edge_node.enroll import enroll_over_grpc
from edge_node.link.grpc_link import GrpcNodeLink
from tests.control_plane.link.desired_support import (
    FLEET,
    node_accepts,
    publish_fleet,
    running_plane,
    tuf_view,
)
from tests.control_plane.link.grpc_support import ADMIN, hello, node_settings, until
from tests.control_plane.link.mqtt_helpers import bridge_config
from tests.control_plane.link.test_desired_state import (
    DET_100,
    DET_110,
    enroll_for_mqtt,
    mqtt_link,
    next_message,
)
from tests.mqtt_support import BrokerFactory, broker_factory  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_bulk_pin_reaches_grpc_and_mqtt_nodes_at_once(
    service_config: Any,
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    broker = broker_factory(persistence=False)
    config = dataclasses.replace(service_config, mqtt=bridge_config(broker))
    async with running_plane(config) as running:
        services = running.services
        assert services.delivery.attached == 2  # the hub and the MQTT bridge
        await anyio.to_thread.run_sync(
            publish_fleet, running.url, running.admin_token, tmp_path / "ops"
        )
        token, _ = services.nodes.tokens.create_bootstrap_token(
            ADMIN, FLEET, {}, timedelta(hours=1)
        )
        files = await enroll_over_grpc(
            running.enroll_target,
            services.ca.ca_pem,
            token,
            "0.1.0",
            tmp_path / "node",
            server_name="localhost",
        )
        enrolled = await enroll_for_mqtt(running)
        view = await anyio.to_thread.run_sync(
            tuf_view, running.url, files.tuf_root_path.read_bytes(), tmp_path / "tuf"
        )
        director_key = files.director_key()

        grpc_node = GrpcNodeLink(node_settings(running.node_target), files.credentials)
        mqtt_node = mqtt_link(enrolled, broker.port)
        try:
            await grpc_node.connect(hello())
            await mqtt_node.connect(hello())
            assert running.plane.link is not None
            hub = running.plane.link.hub
            await until(lambda: hub.is_connected(files.node_id), timeout=15)
            await until(
                lambda: services.nodes.inventory.get_node(enrolled["node_id"]).online, timeout=15
            )

            # The whole fleet over REST: both nodes have it without saying Hello again.
            headers = {"Authorization": f"Bearer {running.admin_token}"}
            async with httpx.AsyncClient(base_url=running.url, headers=headers) as http:
                response = await http.post(
                    f"/v1/fleets/{FLEET}/pin",
                    json={"model": "det", "version": "1.1.0", "labels": {}},
                )
            assert response.status_code == 201, response.text
            body = response.json()
            assert (body["pinned"], body["delivered"], body["skipped"]) == (2, 2, [])

            for node_id, link in ((files.node_id, grpc_node), (enrolled["node_id"], mqtt_node)):
                got = node_accepts(
                    await next_message(link), director_key=director_key, node_id=node_id, view=view
                )
                assert (got.sequence, got.target_path) == (1, DET_110)

            # `edgefleet nodes pin --fleet` by ids: the next change, sequence 2 for each.
            argv = ["--server", running.url, "--token", running.admin_token, "-o", "json"]
            argv += ["nodes", "pin", files.node_id, enrolled["node_id"], "--fleet", FLEET]
            argv += ["--model", "det", "--version", "1.0.0"]
            assert await anyio.to_thread.run_sync(cli_main, argv) == 0
            for node_id, link in ((files.node_id, grpc_node), (enrolled["node_id"], mqtt_node)):
                got = node_accepts(
                    await next_message(link),
                    director_key=director_key,
                    node_id=node_id,
                    view=view,
                    last_sequence=1,
                )
                assert (got.sequence, got.target_path) == (2, DET_100)
        finally:
            await grpc_node.close()
            await mqtt_node.close()
