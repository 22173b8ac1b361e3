"""`MqttBridge.publish_desired_many` and `MqttDelivery.deliver_many` against a private
Mosquitto: every doorbell is published before any PUBACK is awaited, the PUBACKs share one
deadline, and what the broker did not confirm stays queued and goes out on reconnect."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from control_plane.errors import UnavailableError
from control_plane.link.desired import MqttDelivery
from control_plane.services import Services, mqtt_bridge
from protos.edgefleet.fleet.v1 import director_pb2, link_pb2
from tests.control_plane.link.mqtt_helpers import bridge_config, start_bridge, wait_until
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

FLEET = "gates"


def assignments(count: int) -> list[tuple[str, director_pb2.SignedDirectorAssignment]]:
    return [
        (
            f"n-{index:012x}",
            director_pb2.SignedDirectorAssignment(
                assignment=f"assignment {index}".encode(), keyid="k", signature=b"s"
            ),
        )
        for index in range(count)
    ]


class RetainedReader:
    """A fresh subscriber to every node's ``desired`` topic: what the broker retains."""

    def __init__(self, broker: Broker) -> None:
        self.got: dict[str, link_pb2.ControlMessage] = {}
        self._lock = threading.Lock()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"reader-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_connect = lambda client, *_: client.subscribe(
            f"edgefleet/v1/{FLEET}/+/desired", qos=1
        )
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        node_id = message.topic.split("/")[3]
        with self._lock:
            self.got[node_id] = link_pb2.ControlMessage.FromString(message.payload)

    def count(self) -> int:
        with self._lock:
            return len(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def reader_factory() -> Iterator[list[RetainedReader]]:
    readers: list[RetainedReader] = []
    yield readers
    for reader in readers:
        reader.close()


def test_every_doorbell_is_published_and_retained(
    services: Services,
    broker_factory: BrokerFactory,  # noqa: F811
    reader_factory: list[RetainedReader],
) -> None:
    broker = broker_factory(persistence=False)
    bridge = start_bridge(services, bridge_config(broker))
    try:
        items = assignments(300)
        assert bridge.publish_desired_many(FLEET, items, timeout_s=10) == [True] * 300

        reader = RetainedReader(broker)  # subscribes after: only retained messages reach it
        reader_factory.append(reader)
        wait_until(lambda: reader.count() == 300, what="300 retained doorbells")
        for node_id, signed in items:
            message = reader.got[node_id]
            assert message.WhichOneof("body") == "desired"
            assert message.desired.assignment == signed

        # Through the delivery port, as the director calls it after a chunk commits.
        delivered = MqttDelivery(bridge).deliver_many(FLEET, items[:3])
        assert delivered == {node_id: ("mqtt",) for node_id, _ in items[:3]}
    finally:
        bridge.stop()


def test_unconfirmed_doorbells_are_reported_in_time_and_go_out_on_reconnect(
    services: Services,
    broker_factory: BrokerFactory,  # noqa: F811
    reader_factory: list[RetainedReader],
) -> None:
    broker = broker_factory(persistence=True)
    bridge = start_bridge(services, bridge_config(broker))
    try:
        broker.kill()
        wait_until(lambda: not bridge.connected, what="the bridge to notice")
        items = assignments(50)
        started = time.monotonic()
        confirmed = bridge.publish_desired_many(FLEET, items, timeout_s=0.5)
        assert confirmed == [False] * 50
        assert time.monotonic() - started < 3.0  # one deadline, not one per message
        assert MqttDelivery(bridge, confirm_s=0.2).deliver_many(FLEET, items[:2]) == {}

        broker.start()
        assert bridge.wait_connected(20)
        reader = RetainedReader(broker)
        reader_factory.append(reader)
        wait_until(lambda: reader.count() == 50, what="the queued doorbells after reconnect")
        assert reader.got[items[7][0]].desired.assignment == items[7][1]
    finally:
        bridge.stop()


def test_a_bridge_that_was_never_started_is_unavailable(
    services: Services,
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    bridge = mqtt_bridge(services, bridge_config(broker_factory(persistence=False)))
    with pytest.raises(UnavailableError):
        bridge.publish_desired_many(FLEET, assignments(2), timeout_s=0.1)
    assert MqttDelivery(bridge).deliver_many(FLEET, assignments(2)) == {}
