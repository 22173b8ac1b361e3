"""An MQTT node end to end: a real control plane on loopback (REST + the MQTT bridge), a
private Mosquitto with the password and ACL files `edgefleet mqtt acl` writes, and the
node agent with `transport: mqtt` — enrolling over HTTP(S), waiting for the broker to
learn its login, sending health, getting pinned by the doorbell, downloading TUF
metadata and the model over HTTP(S), self-testing, hot-swapping and reporting every
phase; a login the broker refuses; and a broker killed and restarted under load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from control_plane.link.mqtt_acl import render_acl_file, render_password_file, write_broker_files
from control_plane.link.mqtt_bridge import MqttBridgeConfig, control_plane_account
from control_plane.services import ServiceConfig
from edge_node.agent import EXIT_REFUSED, Agent, AgentContext
from edge_node.agent.transport import LoginGrace
from edge_node.clock import SystemClock
from edge_node.config import AgentConfig, MqttTransportConfig
from edge_node.enroll import MQTT_FILE
from edge_node.link.mqtt_link import MqttNodeLink
from edge_node.outbox import Outbox
from edge_node.runtime.config import RuntimeConfig, StreamConfig
from edge_node.updater.config import UpdaterConfig
from tests.control_plane.link.mqtt_helpers import CP_PASSWORD, bridge_config, write_acl
from tests.edge_node.agent.update_support import (
    FAST_UPLINK,
    QUICK_WATCH,
    FleetPlane,
    fleet_plane,
    frame,
    target_path,
    until,
)
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
DONE = "watchdog window passed"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class MqttPlane:
    fp: FleetPlane
    broker: Broker
    broker_files: Path

    def allow_enrolled_nodes(self) -> None:
        """`edgefleet mqtt acl` and a broker reload: what the operator does after an
        MQTT node enrolled."""
        write_acl(self.fp.services, self.broker_files)
        self.broker.reload()

    def node_config(self, data_dir: Path, **overrides: Any) -> AgentConfig:
        values: dict[str, Any] = {
            "data_dir": data_dir,
            "transport": "mqtt",
            "mqtt": MqttTransportConfig(
                host="127.0.0.1",
                port=self.broker.port,
                http_url=self.fp.running.url,
                login_grace_s=120.0,
                keepalive_s=5,
                connect_timeout_s=5.0,
            ),
            "bootstrap_token": self.fp.token(),
            "ca_file": self.fp.ca_file(),
            "health_interval_s": 0.2,
            "shutdown_deadline_s": 5.0,
            "uplink": FAST_UPLINK,
            "runtime": RuntimeConfig(streams=(StreamConfig("cam", target_fps=200),)),
            "updater": UpdaterConfig(watchdog=QUICK_WATCH, selftest_latency_budget_s=5.0),
        }
        values.update(overrides)
        return AgentConfig(**values)


@asynccontextmanager
async def mqtt_plane(tmp_path: Path, broker_factory: BrokerFactory) -> AsyncIterator[MqttPlane]:  # noqa: F811
    """A broker that knows only the control plane's login, and a control plane (REST,
    the MQTT bridge, a signed fleet) joined to it."""
    server_dir = tmp_path / "server"
    own = control_plane_account(server_dir, MqttBridgeConfig(password=CP_PASSWORD))
    files = write_broker_files(
        tmp_path / "broker-files",
        render_password_file([own]),
        render_acl_file(own.username, []),
    )
    broker = broker_factory(passwd=files.passwd, acl=files.acl)
    config = ServiceConfig(
        data_dir=server_dir,
        database_url=f"sqlite:///{tmp_path / 'edgefleet.db'}",
        artifacts_url=(server_dir / "artifacts").as_uri(),
        max_artifact_bytes=64 << 20,
        refresh_interval_s=3600,
        mqtt=bridge_config(broker),
    )
    async with fleet_plane(config, tmp_path / "ops") as fp:
        assert fp.services.delivery.attached >= 1  # the MQTT bridge is attached
        yield MqttPlane(fp, broker, tmp_path / "broker-files")


async def enrolled_node(data_dir: Path) -> str:
    await until(lambda: (data_dir / "identity.json").exists())
    return str(json.loads((data_dir / "identity.json").read_text())["node_id"])


async def feed(agent: Agent) -> None:
    while not agent.stopping:
        pipeline = agent.pipeline
        if pipeline is not None:
            pipeline.submit("cam", frame(0))
        await anyio.sleep(0.005)


async def test_an_mqtt_node_enrolls_reports_and_updates_over_https(
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    data_dir = tmp_path / "node"
    async with mqtt_plane(tmp_path, broker_factory) as mp:
        fp = mp.fp
        agent = Agent(mp.node_config(data_dir), SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            node_id = await enrolled_node(data_dir)
            # Enrolled over REST for MQTT: its broker login is on disk, owner-only.
            assert (data_dir / MQTT_FILE).stat().st_mode & 0o777 == 0o600
            login = json.loads((data_dir / MQTT_FILE).read_text())
            assert login["username"] == node_id
            assert (data_dir / "tuf-root.json").is_file()
            assert (data_dir / "director-key.json").is_file()
            node = fp.services.nodes.inventory.get_node(node_id)
            assert (node.transport, node.online) == ("mqtt", False)

            # The broker does not know the node yet: refused, and retried (login grace).
            await until(lambda: _forgiven(agent) >= 1)
            mp.allow_enrolled_nodes()
            await until(lambda: fp.services.nodes.inventory.get_node(node_id).online)
            await until(lambda: fp.services.records.count(node_id, "health") >= 2)
            uplink = agent.uplink
            assert uplink is not None
            await until(lambda: uplink.stats.records_acked >= 2)  # acks came back over MQTT
            group.start_soon(feed, agent)

            await fp.pin(node_id, "1.0.0")
            await _settled(fp, node_id, "1.0.0")
            await fp.pin(node_id, "1.1.0")
            await _settled(fp, node_id, "1.1.0")
            pipeline = agent.pipeline
            assert pipeline is not None
            expected = data_dir / "models" / "sha256" / fp.sha256["1.1.0"] / "model.onnx"
            assert pipeline.session.path == expected
            before = pipeline.stats()["cam"].processed
            await until(lambda: pipeline.stats()["cam"].processed > before + 20)
            reported = fp.reported(node_id)
            assert reported["active_target"] == target_path("1.1.0")
            assert reported["director_sequence"] == 2
            await agent.shutdown()

        # Every phase reached the control plane through the bridge, in order.
        statuses = fp.statuses.of(node_id)
        for sequence, version in ((1, "1.0.0"), (2, "1.1.0")):
            path = target_path(version)
            mine = [(s["phase"], s["detail"]) for s in statuses if s["target_path"] == path]
            steps = [m for i, m in enumerate(mine) if i == 0 or m != mine[i - 1]]
            assert [phase for phase, _ in steps] == [
                "downloading",
                "verifying",
                "self-testing",
                "active",
                "active",
            ], statuses
            assert {s["director_sequence"] for s in statuses if s["target_path"] == path} == {
                sequence
            }
        # The close published the Last Will: the node shows offline.
        await until(lambda: not fp.services.nodes.inventory.get_node(node_id).online)


async def test_a_broker_restart_loses_nothing_the_node_recorded(
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    data_dir = tmp_path / "node"
    appended: list[str] = []

    async def events(context: AgentContext, stop: anyio.Event) -> None:
        """Camera events into the outbox, every 20 ms, whatever the link does."""
        n = 0
        while not stop.is_set():
            payload = json.dumps({"n": n}).encode()
            record = await anyio.to_thread.run_sync(context.outbox.append, "event", payload)
            appended.append(record.id)
            n += 1
            with anyio.move_on_after(0.02):
                await stop.wait()

    async with mqtt_plane(tmp_path, broker_factory) as mp:
        fp = mp.fp
        agent = Agent(
            mp.node_config(data_dir),
            SystemClock(),
            components={"events": events},
        )
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            node_id = await enrolled_node(data_dir)
            mp.allow_enrolled_nodes()
            await until(lambda: fp.services.nodes.inventory.get_node(node_id).online)
            await until(lambda: fp.services.records.count(node_id, "event") >= 20)

            await anyio.to_thread.run_sync(mp.broker.wait_for_save)  # sessions on disk
            mp.broker.kill()  # SIGKILL: no clean shutdown
            stored_before = fp.services.records.count(node_id, "event")
            await until(lambda: len(appended) >= stored_before + 50)  # recorded while down
            assert agent.uplink is not None
            connects = agent.uplink.stats.connects
            mp.broker.start()  # same port, its persisted sessions

            await until(lambda: agent.uplink is not None and agent.uplink.stats.connects > connects)
            await until(lambda: fp.services.records.count(node_id, "event") > stored_before + 50)
            grace = agent.link
            assert isinstance(grace, LoginGrace) and isinstance(grace.inner, MqttNodeLink)
            assert grace.inner.stats.sessions_resumed >= 1  # the broker kept the session
            await agent.shutdown()

        # Every record the node made is stored once, or still in its outbox: none lost.
        stored = fp.services.records.record_ids(node_id)
        assert fp.services.records.count(node_id) == len(stored)  # no duplicates
        outbox = Outbox.open(
            data_dir / "outbox.db", node_id=node_id, budget_bytes=256 << 20, clock=SystemClock()
        )
        try:
            pending = {r.id for r in outbox.pending(100_000, 1 << 30)}
        finally:
            outbox.close()
        missing = [i for i in appended if i not in stored and i not in pending]
        assert missing == []
        assert len(stored & set(appended)) >= len(appended) - len(pending)


async def test_a_login_the_broker_refuses_stops_the_process_with_exit_3(
    tmp_path: Path,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    """`python -m edge_node run` with transport mqtt: it enrolls, but the broker was never
    told about it and the login grace is over: a clear error and exit code 3."""
    async with mqtt_plane(tmp_path, broker_factory) as mp:
        data_dir = tmp_path / "node"
        config_file = tmp_path / "node.yaml"
        config_file.write_text(
            json.dumps(  # JSON is YAML
                {
                    "data_dir": str(data_dir),
                    "fleet": "parks",
                    "transport": "mqtt",
                    "server_mqtt": f"127.0.0.1:{mp.broker.port}",
                    "server_http": mp.fp.running.url,
                    "mqtt_login_grace_s": 0,
                    "ca_file": str(mp.fp.ca_file()),
                    "health_interval_s": 0.2,
                }
            )
        )
        log_path = tmp_path / "agent.log"
        env = {**os.environ, "EDGEFLEET_NODE_BOOTSTRAP_TOKEN": mp.fp.token()}
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [sys.executable, "-m", "edge_node", "run", "--config", str(config_file)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                with anyio.fail_after(60):
                    code = await process.wait()
            finally:
                if process.returncode is None:
                    process.send_signal(signal.SIGKILL)
                    await process.wait()
        text = log_path.read_text()
        assert code == EXIT_REFUSED, text
        assert "the MQTT broker refuses node" in text
        assert "edgefleet mqtt acl" in text
        node_id = json.loads((data_dir / "identity.json").read_text())["node_id"]
        assert node_id in text


def _forgiven(agent: Agent) -> int:
    link = agent.link
    return link.refusals_forgiven if isinstance(link, LoginGrace) else 0


async def _settled(fp: FleetPlane, node_id: str, version: str) -> None:
    wanted = {"detail": DONE, "target_path": target_path(version)}

    def done() -> bool:
        update: dict[str, Any] = fp.reported(node_id).get("update") or {}
        return all(update.get(k) == v for k, v in wanted.items())

    await until(done, timeout=40)
