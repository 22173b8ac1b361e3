"""Cameras' results are durable from the broker to the rules (ADR 0041): the agent's
`DeviceTask` on the shared Mosquitto (127.0.0.1:1883, a topic tree of its own per test)
into a real `AggregationTask` whose hand-off is small and whose worker is slow. A full
hand-off holds the gateway back instead of dropping; one the aggregation still refuses
stays unacked and comes again on the broker's next session."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import MqttSettings
from edge_node.agent.aggregation_task import AggregationTask, AggregationTaskConfig
from edge_node.agent.device_task import DeviceTask
from edge_node.aggregation.model import Observation
from edge_node.clock import SystemClock
from edge_node.devices.config import CameraSettings, DeviceGatewayConfig, IntakeLimits
from edge_node.outbox import Outbox
from tests.conftest import missing_service, wait_for_port

PORT = 1883
FAST = BackoffPolicy(base_s=0.05, cap_s=0.2)
PERSON = Detection("person", 0.8, (0.1, 0.1, 0.3, 0.9), track_id=4)
CAMERAS = ("cam-0", "cam-1", "cam-2", "cam-3")
RULES = f"""\
version: 1
cameras: [{", ".join(CAMERAS)}]
rules:
  - {{id: yard, type: zone_intrusion, camera: cam-0, classes: [person],
     zone: [[0.6, 0], [1, 0], [1, 1], [0.6, 1]]}}
"""


def eventually(condition: Callable[[], bool], timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class Node:
    """The aggregation (its engine's `offer` and `offer_many` recorded) and the devices' config."""

    def __init__(self, tmp_path: Path, outbox: Outbox, **aggregation: object) -> None:
        rules = tmp_path / "rules.yaml"
        rules.write_text(RULES)
        settings = AggregationTaskConfig(enabled=True, rules_file=rules, **aggregation)  # type: ignore[arg-type]
        self.clock = SystemClock()
        self.aggregation = AggregationTask(settings, outbox, self.clock, observation_wait_s=5.0)
        assert self.aggregation.start()
        engine = self.aggregation.aggregator
        assert engine is not None
        self.lock = threading.Lock()
        self.reached: list[tuple[str, str]] = []  # (camera, message id), in the engine
        offer = engine.offer

        def recorded(observation: Observation, now: float) -> list[object]:
            with self.lock:
                self.reached.append((observation.source, observation.observation_id))
            return offer(observation, now)  # type: ignore[return-value]

        offer_many = engine.offer_many

        def recorded_many(observations: list[Observation], now: float) -> list[object]:
            with self.lock:
                self.reached += [(o.source, o.observation_id) for o in observations]
            return offer_many(observations, now)  # type: ignore[return-value]

        engine.offer = recorded  # type: ignore[method-assign]
        engine.offer_many = recorded_many  # type: ignore[method-assign]
        self.root = f"t-{uuid.uuid4().hex[:10]}/edgefleet/dev"
        self.devices = DeviceGatewayConfig(
            cameras={device_id: CameraSettings() for device_id in CAMERAS},
            port=PORT,
            topic_root=self.root,
            client_id=f"gw-{uuid.uuid4().hex[:10]}",
            session_expiry_s=10,
            max_queue=10,
            limits=IntakeLimits(rate_per_s=10_000.0, burst=10_000),
        )
        self.tasks: list[DeviceTask] = []
        self.cameras: list[DeviceClient] = []
        self._draining = threading.Event()
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._drain, daemon=True)
        self._worker.start()

    def device_task(self, **changes: object) -> DeviceTask:
        task = DeviceTask(
            replace(self.devices, **changes),  # type: ignore[arg-type]
            self.aggregation,
            self.clock,
            stop_deadline_s=2.0,
        )
        self.tasks.append(task)
        task.gateway.start()
        assert task.gateway.wait_ready(10)
        return task

    def camera(self, device_id: str) -> DeviceClient:
        config = ClientConfig(
            device_id, mqtt=MqttSettings(port=PORT), backoff=FAST, topic_root=self.root
        )
        client = DeviceClient(config)
        self.cameras.append(client)
        client.start()
        return client

    def drain(self, on: bool) -> None:
        (self._draining.set if on else self._draining.clear)()

    def _drain(self) -> None:  # the aggregation's worker, slow: every 20 ms
        while not self._stop.wait(0.02):
            if self._draining.is_set():
                self.aggregation.drain_once()

    def ids(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.reached)

    def close(self) -> None:
        for client in self.cameras:
            client.close()
        for task in self.tasks:
            task.gateway.stop(2.0)
        self._stop.set()
        self._worker.join(5)
        # End the persistent session and clear the retained configs.
        closer = DeviceTask(
            replace(self.devices, session_expiry_s=0), None, self.clock, stop_deadline_s=1.0
        )
        closer.gateway.start()
        closer.gateway.wait_ready(10)
        closer.gateway.stop(1.0)
        raw = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        raw.connect("127.0.0.1", PORT)
        raw.loop_start()
        for device_id in CAMERAS:
            raw.publish(
                f"{self.root}/{device_id}/config", b"", qos=1, retain=True
            ).wait_for_publish(5)
        raw.disconnect()
        raw.loop_stop()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    if not wait_for_port(PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{PORT}")
    made: list[Node] = []
    with Outbox.open(
        tmp_path / "outbox.db", node_id="node-1", budget_bytes=1 << 24, clock=SystemClock()
    ) as outbox:

        def make(**aggregation: object) -> Node:
            made.append(Node(tmp_path, outbox, **aggregation))
            return made[-1]

        yield make
        for node in made:
            node.close()


def test_a_burst_into_a_small_slow_aggregation_reaches_it_all_exactly_once(
    node_factory: Callable[..., Node],
) -> None:
    # 4 cameras x 40 results as fast as they can; the hand-off holds 5 and the worker
    # takes it every 20 ms (250 a second at most), the gateway's queue holds 10.
    node = node_factory(queue_size=5)
    node.drain(True)
    task = node.device_task()
    clients = [node.camera(device_id) for device_id in CAMERAS]
    sent: set[tuple[str, str]] = set()
    for n in range(40):
        for device_id, camera in zip(CAMERAS, clients, strict=True):
            sent.add((device_id, camera.publish_result(n, time.time(), [PERSON])))
    assert all(camera.flush(10) for camera in clients)
    eventually(lambda: len(node.ids()) >= len(sent))
    reached = node.ids()
    assert len(reached) == len(sent) == 160 and set(reached) == sent  # each exactly once
    health = node.aggregation.health()
    assert health["queue_overflow"] == 0 and health["observations_refused"] == 0
    assert health["observations_waited"] >= 1  # the hand-off was full: held back
    devices = task.health()
    assert devices["deferred"] == 0 and devices["observations_not_aggregated"] == 0


def test_results_the_aggregation_refuses_stay_unacked_and_come_again_next_session(
    node_factory: Callable[..., Node],
) -> None:
    # The worker is held: the hand-off (1) fills, the next results wait 50 ms each and are
    # refused, so the gateway leaves them unacked. The next session has them all again.
    node = node_factory(queue_size=1)
    node.aggregation.observation_wait_s = 0.05
    task = node.device_task()
    camera = node.camera("cam-1")
    sent = {("cam-1", camera.publish_result(n, time.time(), [PERSON])) for n in range(4)}
    assert camera.flush(10)
    eventually(lambda: task.health()["deferred"] >= 3)
    assert node.aggregation.health()["observations_refused"] == 3
    assert task.health()["observations_not_aggregated"] == 0
    task.gateway.stop(2.0)
    node.aggregation.observation_wait_s = 5.0
    node.drain(True)
    again = node.device_task()  # same client id: the broker's session redelivers
    eventually(lambda: set(node.ids()) == sent)
    assert len(node.ids()) == 4  # the taken one was acked: not sent again
    assert again.health()["deferred"] == 0
