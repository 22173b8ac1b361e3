"""End to end over a real Mosquitto (with the generated password file and ACL): a node
process appending events and draining its outbox through the Uplink and MqttNodeLink,
and the control plane's bridge storing them. Mid-stream we SIGKILL the broker, the node
or the control plane and restart it; afterwards the stored ids must be exactly the
appended ids. The database's primary key (node, record id) makes a duplicate row
impossible, so "no duplicates" is checked as stored count == appended count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.link.mqtt_bridge import MqttBridge
from control_plane.services import Services
from tests.control_plane.link.mqtt_helpers import (
    CP_PASSWORD,
    MqttNode,
    bridge_config,
    create_fleet,
    enroll_mqtt_node,
    start_bridge,
    wait_until,
    write_acl,
)
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


class Child:
    """A python -m child whose stdout lines are collected by a reader thread."""

    def __init__(self, module: str, args: list[str], password: str, log: Path) -> None:
        self.log = log
        env = {**os.environ, "EDGEFLEET_TEST_MQTT_PASSWORD": password, "PYTHONPATH": str(ROOT)}
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                env=env,
                text=True,
            )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.strip())
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def words(self, first: str) -> list[str]:
        with self._changed:
            return [line.split()[1] for line in self.lines if line.split()[:1] == [first]]

    def wait_for(self, first: str, count: int = 1, timeout: float = 20.0) -> None:
        def enough() -> bool:
            seen = sum(1 for line in self.lines if line.split()[:1] == [first])
            return seen >= count or self.proc.poll() is not None

        with self._changed:
            self._changed.wait_for(enough, timeout)
            seen = sum(1 for line in self.lines if line.split()[:1] == [first])
        if seen < count:
            raise AssertionError(
                f"waited for {count} x {first!r}, saw {seen}; exit code {self.proc.poll()}\n"
                + self.log.read_text(errors="replace")[-4000:]
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=10)


def start_node(
    tmp_path: Path, broker: Broker, node: MqttNode, *, count: int, name: str = "node"
) -> Child:
    return Child(
        "tests.edge_node.mqtt_node_process",
        [
            "--outbox",
            str(tmp_path / "outbox.db"),
            "--port",
            str(broker.port),
            "--fleet",
            node.fleet,
            "--node",
            node.node_id,
            "--count",
            str(count),
            "--rate",
            "50",
            "--ack-timeout",
            "2",
        ],
        node.password,
        tmp_path / f"{name}.log",
    )


def start_bridge_process(services: Services, broker: Broker, tmp_path: Path) -> Child:
    child = Child(
        "tests.control_plane.link.mqtt_bridge_process",
        [
            "--data-dir",
            str(services.config.data_dir),
            "--database-url",
            services.config.database_url,
            "--port",
            str(broker.port),
            "--client-id",
            "cp-e2e-replica",
        ],
        CP_PASSWORD,
        tmp_path / "bridge.log",
    )
    child.wait_for("connected", timeout=30)
    return child


@pytest.fixture
def node(services: Services) -> MqttNode:
    return enroll_mqtt_node(services, create_fleet(services, "gates"))


@pytest.fixture
def broker(
    services: Services,
    node: MqttNode,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> Broker:
    passwd, acl = write_acl(services, tmp_path / "mosquitto")
    return broker_factory(passwd=passwd, acl=acl, persistence=True)


@pytest.fixture
def bridge(services: Services, broker: Broker) -> Iterator[MqttBridge]:
    started = start_bridge(services, bridge_config(broker, client_id="cp-e2e-in-process"))
    yield started
    started.stop()


def assert_stored_exactly(services: Services, node: MqttNode, expected: set[str]) -> None:
    wait_until(
        lambda: services.records.record_ids(node.node_id) == expected,
        timeout=25,
        what=f"{len(expected)} records stored",
    )
    assert services.records.count(node.node_id) == len(expected)


def test_broker_sigkill_and_restart_mid_stream(
    services: Services, node: MqttNode, broker: Broker, bridge: MqttBridge, tmp_path: Path
) -> None:
    child = start_node(tmp_path, broker, node, count=300)
    try:
        child.wait_for("appended", 40)
        broker.wait_for_save()  # the sessions are on disk now, and more traffic is in flight
        broker.kill()
        killed_at = len(child.words("appended"))
        child.wait_for("appended", killed_at + 30)  # the node keeps appending meanwhile
        broker.start()
        child.wait_for("done", timeout=20)
        appended = set(child.words("appended"))
        assert len(appended) == 300
        assert_stored_exactly(services, node, appended)
        # The bridge came back to its persisted session (subscriptions and all).
        assert bridge.counts["connects"] == 2
        assert bridge.counts["sessions-lost"] == 0
    finally:
        child.terminate()


def test_node_sigkill_and_restart_mid_stream(
    services: Services, node: MqttNode, broker: Broker, bridge: MqttBridge, tmp_path: Path
) -> None:
    first = start_node(tmp_path, broker, node, count=10_000, name="node-1")
    try:
        first.wait_for("appended", 60)
    finally:
        first.kill()
    # The broker publishes the killed node's Last Will: the control plane marks it offline.
    wait_until(lambda: bridge.counts["offline"] >= 1, what="the Last Will")
    wait_until(lambda: not services.nodes.inventory.get_node(node.node_id).online, what="offline")

    second = start_node(tmp_path, broker, node, count=50, name="node-2")
    try:
        second.wait_for("done", timeout=20)
        expected = (
            set(first.words("appended"))
            | set(second.words("pending"))
            | set(second.words("appended"))
        )
        assert len(expected) >= 110
        assert_stored_exactly(services, node, expected)
        assert services.nodes.inventory.get_node(node.node_id).online
    finally:
        second.terminate()


def test_control_plane_sigkill_and_restart_mid_stream(
    services: Services, node: MqttNode, broker: Broker, tmp_path: Path
) -> None:
    replica = start_bridge_process(services, broker, tmp_path)
    child = start_node(tmp_path, broker, node, count=150)
    try:
        child.wait_for("appended", 40)
        replica.kill()
        child.wait_for("appended", 70)  # stored nowhere meanwhile: it waits in the outbox
        replica = start_bridge_process(services, broker, tmp_path)
        child.wait_for("done", timeout=20)
        appended = set(child.words("appended"))
        assert len(appended) == 150
        assert_stored_exactly(services, node, appended)
    finally:
        child.terminate()
        replica.terminate()
