"""The agent's device gateway end to end on the node, on the shared Mosquitto
(127.0.0.1:1883, a topic tree of its own per test): a real `DeviceClient` whose clock is
an hour ahead sends a person walking into a zone; the agent's gateway takes its
heartbeats' clock estimate and its results, the aggregation raises one intrusion at the
node's time of the frame, named by the camera's model and firmware, and the health
report carries the gateway's section. Without a rules file the gateway still runs and
counts.

The agent enrolls with a real control plane but its link points at a closed port, so
what the node stored stays in its outbox to be read back after shutdown.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import MqttSettings
from edge_node.agent import Agent
from edge_node.agent.aggregation_task import AggregationTaskConfig
from edge_node.aggregation.model import Provenance
from edge_node.aggregation.wire import decode_event
from edge_node.clock import SystemClock
from edge_node.config import AgentConfig
from edge_node.devices.config import CameraSettings, DeviceGatewayConfig
from edge_node.updater.config import UpdaterConfig
from tests.conftest import missing_service, wait_for_port
from tests.control_plane.link.grpc_support import node_settings
from tests.edge_node.agent.support import agent_config, control_plane
from tests.edge_node.agent.test_agent_aggregation import closed_port, next_reports, stored

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PORT = 1883
SKEW_S = 3600.0  # the camera's clock runs an hour ahead of the node's
RULES = """\
version: 1
cameras: [cam-a]
rules:
  - {id: yard, type: zone_intrusion, camera: cam-a, classes: [person],
     zone: [[0.6, 0], [1, 0], [1, 1], [0.6, 1]]}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def broker() -> None:
    if not wait_for_port(PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{PORT}")


class SkewedClock:
    def time(self) -> float:
        return time.time() + SKEW_S

    def monotonic(self) -> float:
        return time.monotonic()


@asynccontextmanager
async def agent_with_devices(
    tmp_path: Path, rules_text: str | None
) -> AsyncIterator[tuple[Agent, DeviceClient]]:
    """An enrolled agent whose gateway knows camera "cam-a" (and the rules file
    `rules_text`, if any), and that camera, started; both stopped when the block ends."""
    root = f"t-{uuid.uuid4().hex[:10]}/edgefleet/dev"
    devices = DeviceGatewayConfig(
        cameras={"cam-a": CameraSettings()},
        port=PORT,
        topic_root=root,
        client_id=f"gw-{uuid.uuid4().hex[:10]}",
        session_expiry_s=0,
    )
    aggregation = AggregationTaskConfig()
    if rules_text is not None:
        rules = tmp_path / "rules.yaml"
        rules.write_text(rules_text)
        aggregation = AggregationTaskConfig(enabled=True, rules_file=rules, tick_s=0.02)
    camera = DeviceClient(
        ClientConfig(
            "cam-a",
            mqtt=MqttSettings(port=PORT),
            backoff=BackoffPolicy(base_s=0.05, cap_s=0.2),
            topic_root=root,
            firmware_version="fw-2.3",
            heartbeat_interval_s=0.1,
        ),
        clock=SkewedClock(),
    )
    async with control_plane(tmp_path) as plane:
        config: AgentConfig = replace(
            agent_config(plane, tmp_path / "node"),
            link=node_settings(closed_port(), connect_timeout_s=1.0),
            updater=UpdaterConfig(enabled=False),
            aggregation=aggregation,
            devices=devices,
        )
        agent = Agent(config, SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            assert agent.devices is not None
            assert await anyio.to_thread.run_sync(agent.devices.gateway.wait_ready, 10.0)
            camera.start()
            try:
                yield agent, camera
            finally:
                await anyio.to_thread.run_sync(camera.close, 2.0)
                await agent.shutdown(5.0)
    clear_retained(f"{root}/cam-a/config")  # the config the gateway left for the camera


def clear_retained(topic: str) -> None:
    raw = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    raw.connect("127.0.0.1", PORT)
    raw.loop_start()
    raw.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
    raw.disconnect()
    raw.loop_stop()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.01)


def offset_known(agent: Agent) -> Callable[[], bool]:
    def known() -> bool:
        assert agent.devices is not None
        offset = agent.devices.health()["cameras"]["cam-a"]["clock_offset_s"]
        return offset is not None and abs(offset - SKEW_S) < 0.05

    return known


async def walk_into_the_zone(camera: DeviceClient) -> list[float]:
    """A person (track 7) walking from x 0.1 to 0.9, a frame every 30 ms stamped by the
    camera's own clock; returns the capture times sent (the camera's clock)."""
    sent: list[float] = []
    for n in range(16):
        left = 0.07 + n * 0.05
        captured = camera_clock()
        person = Detection("person", 0.9, (left, 0.2, left + 0.1, 0.9), track_id=7)
        assert camera.publish_result(n, captured, [person], model="people-cam", model_version="1.4")
        sent.append(captured)
        await anyio.sleep(0.03)
    assert await anyio.to_thread.run_sync(camera.flush, 5.0)
    return sent


def camera_clock() -> float:
    return SkewedClock().time()


def worker_alive(agent: Agent) -> bool:
    assert agent.devices is not None
    worker = agent.devices.gateway._worker
    assert worker is not None
    return worker.is_alive()


async def test_a_camera_an_hour_off_raises_one_intrusion_at_the_nodes_time(
    tmp_path: Path, broker: None
) -> None:
    async with agent_with_devices(tmp_path, RULES) as (agent, camera):
        aggregation, devices = agent.aggregation, agent.devices
        assert aggregation is not None and devices is not None
        await until(offset_known(agent))
        sent = await walk_into_the_zone(camera)
        await until(lambda: aggregation.stats.events_stored >= 1)
        await next_reports(agent, 2)
        assert worker_alive(agent)
    # Shut down cleanly: the gateway's worker is gone, it is disconnected, nothing left.
    assert agent._failure is None
    assert not worker_alive(agent)
    final = devices.health()
    assert (final["connected"], final["queued"]) == (False, 0)
    assert aggregation.state == "stopped"

    [record] = stored(agent, "event")
    event = decode_event(record.payload)
    assert (event.type, event.rule_id, record.id) == ("zone.intrusion", "yard", event.event_id)
    assert event.provenance == (Provenance("device", "people-cam", "1.4", "fw-2.3"),)
    # The first frame whose feet (bottom-centre, x 0.62) are in the zone: frame 10.
    entered = event.evidence[0]
    assert (entered.camera, entered.frame_seq) == ("cam-a", 10)
    # On the node's clock: the camera's stamp less its offset, not an hour ahead.
    assert event.at == pytest.approx(sent[10] - SKEW_S, abs=0.05)
    assert abs(event.at - time.time()) < 60

    reports = [json.loads(r.payload) for r in stored(agent, "health")]
    section: dict[str, Any] = reports[-1]["devices"]
    assert section["broker"] == f"127.0.0.1:{PORT}" and section["connected"]
    assert section["mode"] == "aggregating"
    assert section["accepted"]["results"] == 16 and section["observations"] == 16
    assert section["observations_not_aggregated"] == 0
    assert section["rejected"]["timestamp_future"] == 0
    cam = section["cameras"]["cam-a"]
    assert cam["firmware"] == "fw-2.3" and cam["clock_offset_s"] == pytest.approx(SKEW_S, abs=0.05)
    assert cam["last_seen"] is not None
    assert reports[-1]["aggregation"]["device_observations"] == 16
    assert reports[-1]["aggregation"]["clock_offsets"] >= 1
    assert reports[-1]["aggregation"]["events"] == {"zone.intrusion": 1}


async def test_without_a_rules_file_the_gateway_runs_and_counts(
    tmp_path: Path, broker: None
) -> None:
    async with agent_with_devices(tmp_path, None) as (agent, camera):
        devices = agent.devices
        assert devices is not None and agent.aggregation is None
        await until(offset_known(agent))
        await walk_into_the_zone(camera)
        await until(lambda: devices.health()["observations"] == 16)
        await next_reports(agent, 2)
    assert stored(agent, "event") == []
    reports = [json.loads(r.payload) for r in stored(agent, "health")]
    section = reports[-1]["devices"]
    assert section["mode"] == "counting"
    assert (section["observations"], section["observations_not_aggregated"]) == (16, 16)
    assert section["accepted"]["heartbeats"] >= 1 and section["time_syncs"] >= 1
    assert reports[-1]["aggregation"] is None
    assert not worker_alive(agent)
