"""Shared set-up for the MQTT tests: fleets, MQTT-enrolled nodes, broker files, bridges."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.clock import Clock
from control_plane.link.mqtt_acl import render_acl_file, render_password_file, write_broker_files
from control_plane.link.mqtt_bridge import (
    MqttBridge,
    MqttBridgeConfig,
    control_plane_account,
)
from control_plane.services import Services, mqtt_bridge
from control_plane.storage import FleetRow, session_factory
from edge_node.link.mqtt_link import MqttLinkConfig
from tests.control_plane.identity.helpers import make_csr
from tests.mqtt_support import Broker

ADMIN = RequestContext(Principal(token_id="admin", name="root", role=Role.ADMIN), "req-admin")
CP_PASSWORD = "control-plane-test-password"


@dataclass(frozen=True)
class MqttNode:
    node_id: str
    fleet: str
    password: str

    def link_config(self, broker: Broker, **overrides: object) -> MqttLinkConfig:
        values: dict[str, object] = {
            "fleet": self.fleet,
            "node_id": self.node_id,
            "username": self.node_id,
            "password": self.password,
            "port": broker.port,
            "connect_timeout_s": 5.0,
            "keepalive_s": 5,
        }
        return MqttLinkConfig(**(values | overrides))  # type: ignore[arg-type]


def create_fleet(services: Services, name: str) -> str:
    with session_factory(services.engine)() as session:
        session.add(FleetRow(name=name, state="active", created_at=datetime.now(UTC)))
        session.commit()
    return name


def enroll_mqtt_node(services: Services, fleet: str) -> MqttNode:
    token, _ = services.nodes.tokens.create_bootstrap_token(ADMIN, fleet, {}, timedelta(hours=1))
    enrolled = services.nodes.enrollment.enroll(
        token, make_csr(), agent_version="0.1.0", transport="mqtt"
    )
    assert enrolled.mqtt_username == enrolled.node_id
    assert enrolled.mqtt_password
    return MqttNode(enrolled.node_id, fleet, enrolled.mqtt_password)


def bridge_config(broker: Broker, **overrides: object) -> MqttBridgeConfig:
    values: dict[str, object] = {
        "port": broker.port,
        "password": CP_PASSWORD,
        "client_id": "cp-test-1",
        "workers": 2,
        "reconnect_min_s": 1,
        "reconnect_max_s": 1,
        "retry_initial_s": 0.05,
        "retry_cap_s": 0.2,
        "keepalive_s": 5,
    }
    return MqttBridgeConfig(**(values | overrides))  # type: ignore[arg-type]


def write_acl(services: Services, directory: Path) -> tuple[Path, Path]:
    """The broker's passwd and acl, rendered exactly as `edgefleet mqtt acl` does."""
    nodes = services.nodes.inventory.mqtt_accounts(ADMIN)
    own = control_plane_account(services.config.data_dir, MqttBridgeConfig(password=CP_PASSWORD))
    files = write_broker_files(
        directory, render_password_file([own, *nodes]), render_acl_file(own.username, nodes)
    )
    return files.passwd, files.acl


def start_bridge(
    services: Services, config: MqttBridgeConfig, *, clock: Clock | None = None
) -> MqttBridge:
    bridge = mqtt_bridge(services, config, clock=clock)
    bridge.start()
    assert bridge.wait_connected(15), "the bridge did not connect"
    return bridge


def wait_until(condition: Callable[[], object], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)
