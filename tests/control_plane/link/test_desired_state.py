"""Desired state reaches the node: a pin through the live REST API goes out at once over
gRPC and MQTT, and every Hello is answered with the node's current assignment; the node
accepts it with the director key it got at enrollment (both database backends).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from control_plane.cli.main import main as cli_main
from edge_node.enroll import enroll_over_grpc, parse_director_key
from edge_node.link.base import NodeLink
from edge_node.link.grpc_link import GrpcNodeLink
from edge_node.link.mqtt_link import MqttLinkConfig, MqttNodeLink
from edge_node.updater.director import AssignmentReplayError
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.link.desired_support import (
    FLEET,
    RunningPlane,
    node_accepts,
    publish_fleet,
    running_plane,
    tuf_view,
)
from tests.control_plane.link.grpc_support import (
    ADMIN,
    batch,
    hello,
    node_settings,
    until,
    wire_record,
)
from tests.control_plane.link.mqtt_helpers import bridge_config
from tests.mqtt_support import BrokerFactory, broker_factory  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DET_100 = "models/det/1.0.0/model.onnx"
DET_110 = "models/det/1.1.0/model.onnx"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def next_message(link: NodeLink, timeout: float = 15.0) -> link_pb2.ControlMessage:
    with anyio.fail_after(timeout):
        async for message in link.incoming():
            return message
    raise AssertionError("the link ended without a message")  # pragma: no cover


async def pin_over_rest(running: RunningPlane, node_id: str, version: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {running.admin_token}"}
    async with httpx.AsyncClient(base_url=running.url, headers=headers) as http:
        response = await http.post(
            f"/v1/nodes/{node_id}/pin", json={"model": "det", "version": version}
        )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_grpc_node_gets_a_pin_at_once_and_its_assignment_at_every_hello(
    service_config: Any, tmp_path: Path
) -> None:
    async with running_plane(service_config) as running:
        services = running.services
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
        # The node's trust anchors, both from its authenticated enrollment.
        director_key = files.director_key()
        assert director_key.keyid == services.director.director_public_key()["keyid"]
        view = await anyio.to_thread.run_sync(
            tuf_view, running.url, files.tuf_root_path.read_bytes(), tmp_path / "tuf"
        )

        def accepts(message: link_pb2.ControlMessage, last_sequence: int = 0) -> Any:
            return node_accepts(
                message,
                director_key=director_key,
                node_id=files.node_id,
                view=view,
                last_sequence=last_sequence,
            )

        link = GrpcNodeLink(node_settings(running.node_target), files.credentials)
        await link.connect(hello())
        # Nothing assigned yet: the first thing down the stream is the ack of a batch.
        await link.send(batch([wire_record(1)]))
        assert (await next_message(link)).WhichOneof("body") == "ack"

        # `edgefleet nodes pin` through the live REST API: the node has it at once.
        argv = ["--server", running.url, "--token", running.admin_token, "--output", "json"]
        argv += ["nodes", "pin", files.node_id, "--model", "det", "--version", "1.1.0"]
        assert await anyio.to_thread.run_sync(cli_main, argv) == 0
        first = accepts(await next_message(link))
        assert (first.sequence, first.target_path, first.release_counter) == (1, DET_110, 2)
        await link.close()

        # Pinned while the node was away: its next Hello is answered with it.
        await pin_over_rest(running, files.node_id, "1.0.0")
        await link.connect(hello(director_sequence=1))
        second = accepts(await next_message(link), last_sequence=1)
        assert (second.sequence, second.target_path) == (2, DET_100)

        # Up to date already: sent anyway, and the node recognises the one it holds.
        await link.connect(hello(director_sequence=2))
        with pytest.raises(AssignmentReplayError) as replayed:
            accepts(await next_message(link), last_sequence=2)
        assert replayed.value.reason == "replayed"
        await link.close()


async def enroll_for_mqtt(running: RunningPlane) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {running.admin_token}"}
    async with httpx.AsyncClient(base_url=running.url, headers=headers) as http:
        created = await http.post(f"/v1/fleets/{FLEET}/node-tokens", json={})
        token = created.json()["token"]
        response = await http.post(
            "/v1/enroll",
            json={"token": token, "csr_pem": make_csr().decode(), "transport": "mqtt"},
            headers={"Authorization": ""},
        )
    assert response.status_code == 201, response.text
    enrolled: dict[str, Any] = response.json()
    return enrolled


def mqtt_link(enrolled: dict[str, Any], port: int) -> MqttNodeLink:
    return MqttNodeLink(
        MqttLinkConfig(
            fleet=FLEET,
            node_id=enrolled["node_id"],
            username=enrolled["mqtt_username"],
            password=enrolled["mqtt_password"],
            port=port,
            connect_timeout_s=5.0,
            keepalive_s=5,
        )
    )


async def test_mqtt_nodes_get_a_pin_by_the_retained_doorbell_and_at_hello(
    service_config: Any,
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    broker = broker_factory(persistence=False)
    config = dataclasses.replace(service_config, mqtt=bridge_config(broker))
    async with running_plane(config, grpc=False) as running:
        services = running.services
        assert services.delivery.attached == 1  # the MQTT bridge, while the API runs
        await anyio.to_thread.run_sync(
            publish_fleet, running.url, running.admin_token, tmp_path / "ops"
        )
        online, offline = await enroll_for_mqtt(running), await enroll_for_mqtt(running)
        async with httpx.AsyncClient(base_url=running.url) as http:
            published_key = (await http.get("/v1/director/key")).json()
            root = (await http.get(f"/v1/fleets/{FLEET}/tuf/metadata/1.root.json")).content
        assert online["director_public_key"] == published_key
        director_key = parse_director_key(json.dumps(online["director_public_key"]).encode())
        view = await anyio.to_thread.run_sync(tuf_view, running.url, root, tmp_path / "tuf")

        # A connected node: the pin rings its doorbell, and the node accepts what it holds.
        link = mqtt_link(online, broker.port)
        await link.connect(hello())
        await until(lambda: services.nodes.inventory.get_node(online["node_id"]).online, timeout=15)
        await pin_over_rest(running, online["node_id"], "1.1.0")
        message = await next_message(link)
        first = node_accepts(
            message, director_key=director_key, node_id=online["node_id"], view=view
        )
        assert (first.sequence, first.target_path) == (1, DET_110)

        # Back into its session, where the retained message is not sent again: the
        # bridge answers the Hello with the current assignment.
        await link.close()
        await link.connect(hello(director_sequence=1))
        assert link.stats.sessions_resumed == 1
        again = await next_message(link)
        assert again.desired.assignment == message.desired.assignment
        await link.close()

        # A node that has never connected is pinned: only the broker will hold it.
        await pin_over_rest(running, offline["node_id"], "1.0.0")

    # The control plane is gone; the node connects and finds the retained doorbell.
    late = mqtt_link(offline, broker.port)
    try:
        await late.connect(hello())
        got = node_accepts(
            await next_message(late),
            director_key=director_key,
            node_id=offline["node_id"],
            view=view,
        )
        assert (got.sequence, got.target_path) == (1, DET_100)
    finally:
        await late.close()
