"""`DeviceClient` over real Mosquitto: MQTT 5 and 3.1.1 on the shared broker (a topic
tree of its own per test), and, on a private broker, the offline buffer across a broker
restart and a device reboot over the same file ring (nothing lost, one id per frame)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import Literal

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion

from control_plane.link.mqtt_acl import mosquitto_password_hash
from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.topics import device_topic
from device_sdk.transport import MqttSettings
from tests.conftest import missing_service, wait_for_port
from tests.edge_node.test_mqtt_link_tls import TlsBroker, write_pki
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

SHARED_PORT = 1883
FAST = BackoffPolicy(base_s=0.05, cap_s=0.2)
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 100


def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class NodeSide:
    """The edge node's end, as a raw paho client: takes everything under the device and
    publishes its config. `persistent` keeps a 3.1.1 session across a broker restart."""

    def __init__(self, port: int, device_id: str, *, persistent: bool = False) -> None:
        self.device_id = device_id
        self.received: list[device_pb2.DeviceEnvelope] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"node-{device_id}",
            protocol=mqtt.MQTTv311,
            clean_session=not persistent,
        )
        self.client.reconnect_delay_set(0.05, 0.2)
        self.client.on_connect = lambda c, *_: c.subscribe(f"edgefleet/dev/{device_id}/+", qos=1)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._subscribed.wait(10)

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        if message.topic.endswith(("/config", "/time")):
            return
        with self._lock:
            self.received.append(device_pb2.DeviceEnvelope.FromString(message.payload))

    def results(self) -> dict[int, set[str]]:
        """frame_seq -> the message ids it arrived under."""
        out: dict[int, set[str]] = {}
        with self._lock:
            for envelope in self.received:
                if envelope.HasField("frame_result"):
                    out.setdefault(envelope.frame_result.frame_seq, set()).add(envelope.message_id)
        return out

    def of_kind(self, kind: str) -> list[device_pb2.DeviceEnvelope]:
        with self._lock:
            return [e for e in self.received if e.HasField(kind)]

    def send_config(self, config: device_pb2.DeviceConfig | None) -> None:
        """Retained, as a node does; None clears the retained message."""
        payload = (
            device_pb2.NodeEnvelope(
                protocol_version=1, message_id="c", config=config
            ).SerializeToString()
            if config is not None
            else b""
        )
        topic = device_topic(self.device_id, "config")
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def shared_broker() -> int:
    if not wait_for_port(SHARED_PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{SHARED_PORT}")
    return SHARED_PORT


@pytest.fixture
def clients() -> Iterator[list[DeviceClient]]:
    made: list[DeviceClient] = []
    yield made
    for client in made:
        client.close()


def device_client(clients: list[DeviceClient], config: ClientConfig) -> DeviceClient:
    client = DeviceClient(config)
    clients.append(client)
    client.start()
    return client


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_results_config_and_frames_over_mqtt(
    protocol: Literal["5", "3.1.1"], shared_broker: int, clients: list[DeviceClient]
) -> None:
    device = f"t-{protocol.replace('.', '')}-{uuid.uuid4().hex[:10]}"
    node = NodeSide(shared_broker, device)
    try:
        settings = MqttSettings(port=shared_broker, protocol=protocol)
        client = device_client(clients, ClientConfig(device, mqtt=settings, backoff=FAST))
        person = Detection("person", 0.8, (0.1, 0.1, 0.3, 0.9), track_id=4, attributes={"z": "3"})
        ids = {client.publish_result(n, time.time(), [person]) for n in range(10)}
        assert client.flush(10)
        eventually(lambda: len(node.results()) == 10)
        assert {i for seen in node.results().values() for i in seen} == ids
        assert node.of_kind("frame_result")[0].frame_result.detections[0].attributes["z"] == "3"
        assert node.of_kind("heartbeat")  # sent on start

        node.send_config(device_pb2.DeviceConfig(version=1, target_fps=5, send_frames=True))
        eventually(lambda: client.config.version == 1)
        assert client.config.target_fps == 5
        assert client.publish_frame(10, time.time(), JPEG)
        assert client.flush(10)
        eventually(lambda: len(node.of_kind("frame")) == 1)
        assert node.of_kind("frame")[0].frame.jpeg == JPEG
        assert client.stats().connects == 1
    finally:
        node.send_config(None)
        node.close()


def test_the_buffer_outlives_a_broker_restart(
    broker_factory: BrokerFactory,  # noqa: F811
    clients: list[DeviceClient],
) -> None:
    broker = broker_factory()
    device = f"t-restart-{uuid.uuid4().hex[:8]}"
    node = NodeSide(broker.port, device, persistent=True)
    try:
        settings = MqttSettings(port=broker.port, protocol="3.1.1")
        client = device_client(clients, ClientConfig(device, mqtt=settings, backoff=FAST))
        for n in range(5):
            client.publish_result(n, time.time(), [])
        assert client.flush(10)
        broker.wait_for_save()  # the node's session (its subscription) is on disk
        for n in range(5, 205):  # a burst: the broker goes down with some of it in flight
            client.publish_result(n, time.time(), [])
        broker.stop()
        eventually(lambda: not client.connected)
        for n in range(205, 230):
            client.publish_result(n, time.time(), [])
        assert client.stats().buffer.queued_messages >= 25
        broker.start()
        assert client.flush(15)
        eventually(lambda: len(node.results()) == 230)
        assert all(len(seen) == 1 for seen in node.results().values())
        assert client.stats().connects >= 2
        assert f"as {client.client_id} (p2," in broker.log_text()  # p2: MQTT 3.1.1
    finally:
        node.close()


def test_a_device_reboot_over_its_file_ring_loses_and_duplicates_nothing(
    broker_factory: BrokerFactory,  # noqa: F811
    clients: list[DeviceClient],
    tmp_path: Path,
) -> None:
    broker = broker_factory()
    device = f"t-reboot-{uuid.uuid4().hex[:8]}"
    node = NodeSide(broker.port, device, persistent=True)
    config = ClientConfig(
        device, mqtt=MqttSettings(port=broker.port), backoff=FAST, ring_directory=tmp_path / "ring"
    )
    try:
        before = device_client(clients, config)
        for n in range(5):
            before.publish_result(n, time.time(), [])
        assert before.flush(10)
        broker.wait_for_save()
        broker.kill()
        eventually(lambda: not before.connected)
        unsent = {before.publish_result(n, time.time(), []) for n in range(5, 20)}
        before.close()  # the camera loses power with 15 results on flash
        broker.start()
        after = device_client(clients, config)
        assert after.boot_id != before.boot_id
        assert after.flush(15)
        eventually(lambda: len(node.results()) == 20)
        by_frame = node.results()
        assert sorted(by_frame) == list(range(20))
        assert all(len(seen) == 1 for seen in by_frame.values())  # one id per frame
        assert {i for n in range(5, 20) for i in by_frame[n]} == unsent
        assert after.stats().buffer.queued_messages == 0
        assert f"as {after.client_id} (p5," in broker.log_text()  # p5: MQTT 5
    finally:
        node.close()


def test_tls_and_credentials(tmp_path: Path, clients: list[DeviceClient]) -> None:
    """A broker's TLS listener with a password file: the right CA and password connect;
    a wrong password is refused and retried (counted, said why); an unverifiable broker
    is never connected to."""
    ca, cert, key = write_pki(tmp_path / "pki", x509.IPAddress(IPv4Address("127.0.0.1")))
    passwd = tmp_path / "passwd"
    passwd.write_text(f"cam-tls:{mosquitto_password_hash('s3cret', iterations=1000)}\n")
    broker = TlsBroker(tmp_path / "broker", cert, key)
    broker.passwd = passwd
    broker.start()
    try:

        def tls_client(device: str, **settings: object) -> DeviceClient:
            mqtt_settings = MqttSettings(port=broker.port, username="cam-tls", **settings)  # type: ignore[arg-type]
            return device_client(clients, ClientConfig(device, mqtt=mqtt_settings, backoff=FAST))

        wrong_password = tls_client("cam-bad-pw", password="nope", ca_file=ca)
        no_ca = tls_client("cam-no-ca", password="s3cret", tls=True)  # system CAs
        good = tls_client("cam-tls", password="s3cret", ca_file=ca)
        assert good.publish_result(1, time.time(), [])
        assert good.flush(10)
        eventually(lambda: wrong_password.stats().connect_failures >= 2)
        assert "refused" in (wrong_password.stats().last_error or "")
        eventually(lambda: no_ca.stats().connect_failures >= 1)
        assert "certificate verify failed" in (no_ca.stats().last_error or "")
        assert wrong_password.stats().connects == no_ca.stats().connects == 0
    finally:
        broker.kill()
