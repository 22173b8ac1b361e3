"""One control plane per `NodeLink` adapter, behind one interface, for the link contract suite.

A kit plays the control plane's part of a test: it hands out links (a well-behaved
node's, a refused node's, one to nowhere), says what the control plane saw, pushes a
command down and takes the control plane away and back. Not here: the assertions.
"""

from __future__ import annotations

import abc
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from edge_node.link.base import NodeLink
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from protos.edgefleet.fleet.v1 import link_pb2
from tests.conftest import let_grpc_settle

if TYPE_CHECKING:
    from control_plane.services import Services
    from tests.control_plane.link.grpc_support import GrpcPlane

CONTROL_WAIT_S = 15.0


async def until(condition: Callable[[], object], timeout: float = CONTROL_WAIT_S) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


def control_plane_services(work: Path, clock: Any = None) -> Services:
    """A real control plane's services on SQLite in `work`."""
    from control_plane.services import ServiceConfig, build_services

    data = work / "server"
    config = ServiceConfig(
        data_dir=data,
        database_url=f"sqlite:///{work / 'cp.db'}",
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
    )
    return build_services(config) if clock is None else build_services(config, clock=clock)


def stored_by(services: Services, node_id: str) -> int:
    """Records in node_records plus sampled results in node_results (their own table)."""
    return services.records.count(node_id) + len(services.nodes.results.recent(node_id, limit=1000))


class SilentListener:
    """A loopback port that takes TCP connections (the kernel's backlog does) and never
    answers: no TLS handshake, no CONNACK."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self.port: int = self._socket.getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._socket.close()


class LinkKit(abc.ABC):
    """The control plane side of the contract, for one adapter."""

    name: str
    # Whether the kit's control plane holds a TUF repository for the node's fleet, so a
    # missing file is "not found" (the gRPC kit's fleet has no trust root: a refusal; MQTT
    # carries no downloads at all). Not found with a repository: test_grpc_downloads.py.
    has_repository: bool = True

    @abc.abstractmethod
    def link(self) -> NodeLink:
        """A new link of the one enrolled, well-behaved node."""

    @abc.abstractmethod
    def refused_link(self) -> NodeLink:
        """A link the control plane answers "no" (revoked node, wrong credentials)."""

    @abc.abstractmethod
    def unreachable_link(self) -> NodeLink:
        """A link to a control plane (or broker) nobody listens for."""

    @abc.abstractmethod
    def silent_link(self, connect_timeout_s: float) -> NodeLink:
        """A link to something that takes the connection and never answers."""

    @abc.abstractmethod
    async def hello_seen(self, agent_version: str) -> bool:
        """Whether the control plane recorded a Hello of the node with this version."""

    @abc.abstractmethod
    async def stored(self) -> int:
        """How many distinct records the control plane stored for the node."""

    @abc.abstractmethod
    async def send_command(self, name: str) -> None:
        """Send the node a Command through the control plane's own downlink."""

    @abc.abstractmethod
    async def go_down(self) -> None:
        """The control plane (or the broker) goes away; the node's link breaks."""

    @abc.abstractmethod
    async def come_back(self) -> None:
        """It is back, at the same address."""

    async def close(self) -> None:  # noqa: B027  (most kits need nothing)
        """Stop what the kit started."""


# ----------------------------------------------------------------------------- memory


class MemoryKit(LinkKit):
    name = "memory"

    def __init__(self) -> None:
        self.peer = MemoryLinkPeer(ack_records=True)
        self._refusing = MemoryLinkPeer()
        self._refusing.refuse = True
        self._nowhere = MemoryLinkPeer()
        self._nowhere.up = False
        self.peer.metadata["1.root.json"] = b"{}"

    def link(self) -> NodeLink:
        return MemoryNodeLink(self.peer)

    def refused_link(self) -> NodeLink:
        return MemoryNodeLink(self._refusing)

    def unreachable_link(self) -> NodeLink:
        return MemoryNodeLink(self._nowhere)

    def silent_link(self, connect_timeout_s: float) -> NodeLink:
        silent = MemoryLinkPeer()
        silent.silent = True
        return MemoryNodeLink(silent, connect_timeout_s=connect_timeout_s)

    async def hello_seen(self, agent_version: str) -> bool:
        return any(h.agent_version == agent_version for h in self.peer.hellos)

    async def stored(self) -> int:
        return len(self.peer.stored)

    async def send_command(self, name: str) -> None:
        await self.peer.reply(
            link_pb2.ControlMessage(protocol_version=1, command=link_pb2.Command(name=name))
        )

    async def go_down(self) -> None:
        self.peer.up = False
        await self.peer.drop()

    async def come_back(self) -> None:
        self.peer.up = True


# ----------------------------------------------------------------------------- gRPC


class GrpcKit(LinkKit):
    """A real control plane's services (SQLite) and its gRPC link server on loopback."""

    name = "grpc"
    has_repository = False

    def __init__(self, work: Path) -> None:
        from control_plane.clock import ManualClock
        from control_plane.link.grpc_server import GrpcLinkConfig
        from tests.conftest import free_port
        from tests.control_plane.link.grpc_support import ensure_fleet

        # Real "now": TLS checks certificate validity against the wall clock.
        self.services = control_plane_services(work, clock=ManualClock(datetime.now(UTC)))
        ensure_fleet(self.services)
        self._config = GrpcLinkConfig(
            node_address=f"127.0.0.1:{free_port()}",
            enroll_address=f"127.0.0.1:{free_port()}",
            auth_recheck_s=0.0,
        )
        self._work = work
        self.silent = SilentListener()
        self._server: Any = None
        self.files: Any = None
        self._revoked: Any = None

    async def start(self) -> GrpcKit:
        from tests.control_plane.link.grpc_support import ADMIN

        await self.come_back()
        self.files = await self._plane().enroll(self._work / "node")
        self._revoked = await self._plane().enroll(self._work / "revoked")
        self.services.nodes.inventory.revoke(ADMIN, self._revoked.node_id)
        return self

    def _plane(self) -> GrpcPlane:
        from tests.control_plane.link.grpc_support import GrpcPlane

        return GrpcPlane(self.services, self._server)

    def link(self) -> NodeLink:
        return self._plane().link(self.files)

    def refused_link(self) -> NodeLink:
        return self._plane().link(self._revoked)

    def unreachable_link(self) -> NodeLink:
        from edge_node.link.grpc_link import GrpcNodeLink
        from tests.conftest import free_port
        from tests.control_plane.link.grpc_support import node_settings

        return GrpcNodeLink(node_settings(f"127.0.0.1:{free_port()}"), self.files.credentials)

    def silent_link(self, connect_timeout_s: float) -> NodeLink:
        from edge_node.link.grpc_link import GrpcNodeLink
        from tests.control_plane.link.grpc_support import node_settings

        settings = node_settings(self.silent.target, connect_timeout_s=connect_timeout_s)
        return GrpcNodeLink(settings, self.files.credentials)

    async def hello_seen(self, agent_version: str) -> bool:
        node = await anyio.to_thread.run_sync(
            self.services.nodes.inventory.get_node, self.files.node_id
        )
        return bool(node.online and node.agent_version == agent_version)

    async def stored(self) -> int:
        return await anyio.to_thread.run_sync(stored_by, self.services, self.files.node_id)

    async def send_command(self, name: str) -> None:
        message = link_pb2.ControlMessage(protocol_version=1, command=link_pb2.Command(name=name))
        assert self._server.hub.send(self.files.node_id, message), "the node is not connected"

    async def go_down(self) -> None:
        server, self._server = self._server, None
        await server.stop(0)

    async def come_back(self) -> None:
        from control_plane.services import grpc_link_server

        # A stopped server does not start again: a restart is a new one on the same ports.
        self._server = grpc_link_server(self.services, self._config)
        await self._server.start()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
        await let_grpc_settle()
        self.services.close()
        self.silent.close()


# ----------------------------------------------------------------------------- MQTT


class MqttKit(LinkKit):
    """A real control plane's services (SQLite), a private Mosquitto with the password
    and ACL files the control plane renders, and the control plane's MQTT bridge."""

    name = "mqtt"
    has_repository = False

    def __init__(self, work: Path, broker_factory: Any) -> None:
        from tests.control_plane.link.mqtt_helpers import create_fleet, enroll_mqtt_node

        self.services = control_plane_services(work)
        self.fleet = create_fleet(self.services, "gates")
        self.node = enroll_mqtt_node(self.services, self.fleet)
        self._work = work
        self.silent = SilentListener()
        self._broker_factory = broker_factory
        self.broker: Any = None
        self.bridge: Any = None

    def start(self) -> MqttKit:
        from tests.control_plane.link.mqtt_helpers import bridge_config, start_bridge, write_acl

        passwd, acl = write_acl(self.services, self._work / "mosquitto")
        self.broker = self._broker_factory(passwd=passwd, acl=acl, persistence=True)
        self.bridge = start_bridge(self.services, bridge_config(self.broker))
        return self

    def link(self) -> NodeLink:
        from edge_node.link.mqtt_link import MqttNodeLink

        return MqttNodeLink(self.node.link_config(self.broker))

    def refused_link(self) -> NodeLink:
        from edge_node.link.mqtt_link import MqttNodeLink

        return MqttNodeLink(self.node.link_config(self.broker, password="wrong"))

    def unreachable_link(self) -> NodeLink:
        from edge_node.link.mqtt_link import MqttNodeLink
        from tests.conftest import free_port

        return MqttNodeLink(self.node.link_config(self.broker, port=free_port()))

    def silent_link(self, connect_timeout_s: float) -> NodeLink:
        from edge_node.link.mqtt_link import MqttNodeLink

        config = self.node.link_config(
            self.broker, port=self.silent.port, connect_timeout_s=connect_timeout_s
        )
        return MqttNodeLink(config)

    async def hello_seen(self, agent_version: str) -> bool:
        node = await anyio.to_thread.run_sync(
            self.services.nodes.inventory.get_node, self.node.node_id
        )
        return bool(node.online and node.agent_version == agent_version)

    async def stored(self) -> int:
        return await anyio.to_thread.run_sync(stored_by, self.services, self.node.node_id)

    async def send_command(self, name: str) -> None:
        await anyio.to_thread.run_sync(
            lambda: self.bridge.publish_command(
                self.fleet, self.node.node_id, link_pb2.Command(name=name)
            )
        )

    async def go_down(self) -> None:
        self.broker.kill()
        # So that `come_back` waits for the bridge's reconnection, not a stale flag.
        await until(lambda: not self.bridge.connected)

    async def come_back(self) -> None:
        self.broker.start()
        # The bridge reconnects by itself; acks need it subscribed again.
        assert await anyio.to_thread.run_sync(self.bridge.wait_connected, 15)

    async def close(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.services.close()
        self.silent.close()
