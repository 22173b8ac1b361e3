"""`MqttNodeLink` against a private Mosquitto, with a raw paho client playing the control plane.

What every link must do is in tests/edge_node/link_contract; here what is MQTT's own.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from control_plane.link import mqtt_bridge, mqtt_topics
from control_plane.link.mqtt_acl import mosquitto_password_hash
from edge_node.link.base import LinkRefusedError, LinkUnavailableError, node_message
from edge_node.link.mqtt_link import (
    OFFLINE,
    PRESENCE_PROPERTY,
    ROOT,
    LinkUnsupportedError,
    MqttLinkConfig,
    MqttNodeLink,
    node_topic,
)
from protos.edgefleet.fleet.v1 import link_pb2
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

pytestmark = pytest.mark.anyio

FLEET, NODE = "gates", "n-0123456789ab"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Peer:
    """The control plane's end: sees everything under the node, publishes downlink."""

    def __init__(self, broker: Broker) -> None:
        self.received: list[mqtt.MQTTMessage] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"peer-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_connect = lambda c, *_: c.subscribe(f"{ROOT}/{FLEET}/{NODE}/#", qos=1)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert self._subscribed.wait(10)

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append(message)

    def on(self, leaf: str) -> list[mqtt.MQTTMessage]:
        with self._lock:
            return [m for m in self.received if m.topic == node_topic(FLEET, NODE, leaf)]

    def publish(self, leaf: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(
            node_topic(FLEET, NODE, leaf), payload, qos=1, retain=retain
        ).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> Broker:  # noqa: F811
    return broker_factory(persistence=True)


@pytest.fixture
def peer(broker: Broker) -> Iterator[Peer]:
    started = Peer(broker)
    yield started
    started.close()


def config(broker: Broker, **overrides: object) -> MqttLinkConfig:
    values: dict[str, object] = {
        "fleet": FLEET,
        "node_id": NODE,
        "username": NODE,
        "password": "secret",
        "port": broker.port,
        "connect_timeout_s": 5.0,
    }
    return MqttLinkConfig(**(values | overrides))  # type: ignore[arg-type]


@pytest.fixture
async def link(broker: Broker) -> AsyncIterator[MqttNodeLink]:
    made = MqttNodeLink(config(broker))
    yield made
    await made.close()


async def eventually(condition: Callable[[], object], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def next_message(link: MqttNodeLink, timeout: float = 10.0) -> link_pb2.ControlMessage:
    with anyio.fail_after(timeout):
        async for message in link.incoming():
            return message
    raise AssertionError("incoming() ended")


def record(kind: int) -> link_pb2.Record:
    return link_pb2.Record(id=str(uuid.uuid4()), seq=1, kind=kind)


def ack(*ids: str) -> bytes:
    return link_pb2.ControlMessage(
        protocol_version=1, ack=link_pb2.Ack(record_ids=list(ids))
    ).SerializeToString()


# ----------------------------------------------------------------------------- tests


def test_the_node_side_names_agree_with_the_control_plane() -> None:
    """edge_node keeps its own copy of the topic tree and the will; they must not drift."""
    assert ROOT == mqtt_topics.ROOT
    assert (PRESENCE_PROPERTY, OFFLINE) == (mqtt_bridge.PRESENCE_PROPERTY, mqtt_bridge.OFFLINE)
    for leaf in mqtt_topics.Leaf:
        assert node_topic(FLEET, NODE, leaf.value) == mqtt_topics.node_topic(FLEET, NODE, leaf)


async def test_hello_on_connect_and_records_split_by_kind(peer: Peer, link: MqttNodeLink) -> None:
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    await eventually(lambda: peer.on("status"))
    hello = link_pb2.NodeMessage.FromString(peer.on("status")[0].payload)
    assert hello.protocol_version == 1 and hello.hello.agent_version == "1.0.0"

    events = [record(link_pb2.RECORD_KIND_EVENT) for _ in range(3)]
    health = [record(link_pb2.RECORD_KIND_HEALTH) for _ in range(2)]
    await link.send(
        node_message(records=link_pb2.RecordBatch(records=[*events, health[0], *health[1:]]))
    )
    await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    await eventually(
        lambda: peer.on("events") and peer.on("health") and len(peer.on("status")) == 2
    )

    def ids(leaf: str) -> list[str]:
        message = link_pb2.NodeMessage.FromString(peer.on(leaf)[0].payload)
        return [r.id for r in message.records.records]

    assert ids("events") == [r.id for r in events]
    assert ids("health") == [r.id for r in health]
    assert all(m.qos == 1 for m in peer.received)


async def test_small_packets_are_not_held_back_by_nagle(link: MqttNodeLink) -> None:
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    assert link._conn is not None
    sock = link._conn.client.socket()
    assert sock is not None
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_incoming_yields_downlink_messages_and_skips_garbage(
    peer: Peer, link: MqttNodeLink
) -> None:
    await link.connect(link_pb2.Hello())
    peer.publish("ack", b"\xff\x00garbage")
    peer.publish("ack", ack("a", "b"))
    peer.publish(
        "cmd",
        link_pb2.ControlMessage(
            protocol_version=1, command=link_pb2.Command(name="resync")
        ).SerializeToString(),
    )
    first = await next_message(link)
    assert list(first.ack.record_ids) == ["a", "b"]
    assert (await next_message(link)).command.name == "resync"
    assert link.stats.malformed_in == 1


async def test_the_retained_doorbell_arrives_on_subscribe(
    peer: Peer, broker: Broker, link: MqttNodeLink
) -> None:
    doorbell = link_pb2.ControlMessage(
        protocol_version=1, command=link_pb2.Command(name="pull-desired")
    ).SerializeToString()
    peer.publish("desired", doorbell, retain=True)
    await link.connect(link_pb2.Hello())
    assert (await next_message(link)).command.name == "pull-desired"


async def test_acks_sent_while_the_node_was_away_wait_in_its_session(
    peer: Peer, link: MqttNodeLink
) -> None:
    await link.connect(link_pb2.Hello())
    await link.close()
    peer.publish("ack", ack("while-away"))
    await link.connect(link_pb2.Hello())
    assert list((await next_message(link)).ack.record_ids) == ["while-away"]
    assert link.stats.sessions_resumed == 1


async def test_close_publishes_the_offline_will(peer: Peer, link: MqttNodeLink) -> None:
    await link.connect(link_pb2.Hello())
    await link.close()
    await link.close()  # idempotent
    await eventually(lambda: len(peer.on("status")) == 2)
    will = peer.on("status")[1]
    assert link_pb2.NodeMessage.FromString(will.payload).WhichOneof("body") is None
    assert (PRESENCE_PROPERTY, OFFLINE) in will.properties.UserProperty


async def test_a_dead_broker_ends_the_link_and_a_restarted_one_takes_it_back(
    broker: Broker, link: MqttNodeLink
) -> None:
    await link.connect(link_pb2.Hello())
    broker.kill()
    with pytest.raises(LinkUnavailableError):
        await next_message(link)
    with pytest.raises(LinkUnavailableError):
        await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    with pytest.raises(LinkUnavailableError):
        await link.connect(link_pb2.Hello())
    broker.start()
    await link.connect(link_pb2.Hello())
    await link.send(node_message(heartbeat=link_pb2.Heartbeat()))


async def test_bad_credentials_are_a_refusal(
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"{NODE}:{mosquitto_password_hash('right')}\n")
    acl = tmp_path / "acl"
    acl.write_text(
        f"user {NODE}\n"
        + "".join(
            f"topic write {node_topic(FLEET, NODE, leaf)}\n"
            for leaf in ("status", "events", "health")
        )
        + "".join(
            f"topic read {node_topic(FLEET, NODE, leaf)}\n" for leaf in ("desired", "ack", "cmd")
        )
    )
    secured = broker_factory(passwd=passwd, acl=acl, persistence=False)
    with pytest.raises(LinkRefusedError):
        await MqttNodeLink(config(secured, password="wrong")).connect(link_pb2.Hello())
    good = MqttNodeLink(config(secured, password="right"))
    await good.connect(link_pb2.Hello())
    await good.close()
    # The same node under another fleet's topics: the ACL refuses its Hello.
    other = MqttNodeLink(config(secured, password="right", fleet="yards"))
    with pytest.raises(LinkRefusedError):
        await other.connect(link_pb2.Hello())


async def test_models_come_over_https_not_mqtt(link: MqttNodeLink) -> None:
    with pytest.raises(LinkUnsupportedError, match="HTTPS"):
        await link.fetch_metadata("timestamp.json")
    with pytest.raises(LinkUnsupportedError, match="HTTPS"):
        link.fetch_artifact("models/a/1/model.onnx", "0" * 64)


def test_config_refuses_wildcards_in_names() -> None:
    from edge_node.errors import InvalidInputError

    for fleet, node in (("ga+tes", NODE), (FLEET, "n/1"), (FLEET, "#"), ("", NODE)):
        with pytest.raises(InvalidInputError):
            MqttLinkConfig(fleet=fleet, node_id=node, username=node, password="x")
