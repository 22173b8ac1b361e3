"""The shipped MQTT swarm against a private Mosquitto; a raw paho client is the control plane."""

from __future__ import annotations

import threading
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_node.link.mqtt_link import OFFLINE, PRESENCE_PROPERTY, node_topic
from edge_node.testing.mqtt_swarm import MqttSwarm, SwarmConfig, SwarmNode
from protos.edgefleet.fleet.v1 import link_pb2
from tests.conftest import free_port
from tests.mqtt_support import BrokerFactory, broker_factory  # noqa: F401

FLEET = "gates"


class ControlPlane:
    """Subscribes to every node's status, publishes retained doorbells."""

    def __init__(self, port: int) -> None:
        self.status: list[mqtt.MQTTMessage] = []
        self._lock = threading.Lock()
        subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"cp-{uuid.uuid4().hex[:6]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_connect = lambda c, *_: c.subscribe(f"edgefleet/v1/{FLEET}/+/status", qos=1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert subscribed.wait(10)

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.status.append(message)

    def hellos(self) -> dict[str, str]:
        with self._lock:
            found = {}
            for m in self.status:
                body = link_pb2.NodeMessage.FromString(bytes(m.payload))
                if body.WhichOneof("body") == "hello":
                    found[m.topic.split("/")[3]] = body.hello.agent_version
            return found

    def ring(self, node_id: str, payload: bytes) -> None:
        topic = node_topic(FLEET, node_id, "desired")
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_every_node_says_hello_and_hears_its_doorbell(
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    broker = broker_factory(persistence=False)
    plane = ControlPlane(broker.port)
    nodes = [SwarmNode(f"n-{i:012x}", "x") for i in range(5)]
    swarm = MqttSwarm(
        SwarmConfig(fleet=FLEET, port=broker.port, agent_version="swarm-1", connect_concurrency=2),
        nodes,
    )
    settled: list[tuple[int, bool]] = []
    desired: dict[int, bytes] = {}
    deadline = time.monotonic() + 20

    def keep_running() -> bool:
        if len(settled) == len(nodes) and not desired and len(plane.hellos()) == len(nodes):
            for node in nodes:
                plane.ring(node.node_id, node.node_id.encode())
        return len(desired) < len(nodes) and time.monotonic() < deadline

    try:
        swarm.run(
            keep_running=keep_running,
            on_settled=lambda index, ok, why: settled.append((index, ok)),
            on_desired=lambda index, payload, at: desired.update({index: payload}),
        )
    finally:
        plane.close()
    assert sorted(settled) == [(i, True) for i in range(len(nodes))]
    assert plane.hellos() == {node.node_id: "swarm-1" for node in nodes}
    assert desired == {i: node.node_id.encode() for i, node in enumerate(nodes)}
    # A normal DISCONNECT at the end: no Last Will, the control plane keeps the sessions.
    assert not any(
        (PRESENCE_PROPERTY, OFFLINE) in getattr(m.properties, "UserProperty", [])
        for m in plane.status
    )


def test_a_node_nobody_answers_is_settled_as_failed() -> None:
    swarm = MqttSwarm(SwarmConfig(fleet=FLEET, port=free_port()), [SwarmNode("n-1", "x")])
    settled: list[tuple[int, bool, str]] = []
    deadline = time.monotonic() + 10
    swarm.run(
        keep_running=lambda: not settled and time.monotonic() < deadline,
        on_settled=lambda index, ok, why: settled.append((index, ok, why)),
        on_desired=lambda *_: None,
    )
    assert len(settled) == 1 and settled[0][:2] == (0, False) and "connect" in settled[0][2]
