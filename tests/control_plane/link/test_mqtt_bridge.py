"""The MQTT bridge against a private Mosquitto and a real database (SQLite and PostgreSQL).

The node side is the real `MqttNodeLink` where a well-behaved node is meant, and a raw
paho client where a test needs to misbehave (garbage, other nodes' topics).
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import paho.mqtt.client as mqtt
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from paho.mqtt.enums import CallbackAPIVersion
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from control_plane.clock import ManualClock
from control_plane.link.ingest import RecordIngest
from control_plane.link.mqtt_bridge import MqttBridge
from control_plane.link.mqtt_topics import Leaf, node_topic
from control_plane.services import Services
from edge_node.link.base import LinkRefusedError, LinkUnavailableError, node_message
from edge_node.link.mqtt_link import MqttNodeLink
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.link.mqtt_helpers import (
    ADMIN,
    CP_PASSWORD,
    MqttNode,
    bridge_config,
    create_fleet,
    enroll_mqtt_node,
    start_bridge,
    write_acl,
)
from tests.mqtt_support import Broker, BrokerFactory, broker_factory  # noqa: F401

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fleet(services: Services) -> str:
    return create_fleet(services, "gates")


@pytest.fixture
def node(services: Services, fleet: str) -> MqttNode:
    return enroll_mqtt_node(services, fleet)


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> Broker:  # noqa: F811
    """Anonymous: tests here may publish anywhere; the ACL has its own tests."""
    return broker_factory(persistence=False)


@pytest.fixture
def bridge(services: Services, broker: Broker) -> Iterator[MqttBridge]:
    started = start_bridge(services, bridge_config(broker))
    yield started
    started.stop()


@pytest.fixture
async def link(node: MqttNode, broker: Broker) -> AsyncIterator[MqttNodeLink]:
    connected = MqttNodeLink(node.link_config(broker))
    yield connected
    await connected.close()


def wire_record(kind: int, seq: int, payload: bytes = b"{}") -> link_pb2.Record:
    created = Timestamp()
    created.FromDatetime(datetime(2026, 12, 1, tzinfo=UTC))
    return link_pb2.Record(
        id=str(uuid.uuid4()),
        seq=seq,
        kind=kind,
        created_at=created,
        content_type="application/json",
        payload=payload,
    )


def batch(records: Sequence[link_pb2.Record]) -> link_pb2.NodeMessage:
    return node_message(records=link_pb2.RecordBatch(records=records))


async def eventually(condition: Callable[[], object], timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def acked_ids(link: MqttNodeLink, expected: set[str], timeout: float = 15.0) -> set[str]:
    seen: set[str] = set()
    with anyio.fail_after(timeout):
        async for message in link.incoming():
            if message.WhichOneof("body") == "ack":
                seen.update(message.ack.record_ids)
            if expected <= seen:
                return seen
    raise AssertionError("incoming() ended")


class RawClient:
    """A paho client that publishes whatever a test wants, and waits for PUBACKs."""

    def __init__(self, broker: Broker, username: str = "raw", password: str = "x") -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"raw-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.username_pw_set(username, password)
        self.reasons: dict[int, int] = {}
        self.client.on_publish = lambda _c, _u, mid, reason, _p: self.reasons.__setitem__(
            mid, reason.value
        )
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes) -> int:
        """The PUBACK reason code (0 = accepted; 135 = not authorized)."""
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(10)
        return self.reasons[info.mid]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def raw(broker: Broker) -> Iterator[RawClient]:
    client = RawClient(broker)
    yield client
    client.close()


# ----------------------------------------------------------------------------- tests


async def test_hello_marks_online_and_records_are_stored_once_and_acked(
    services: Services, bridge: MqttBridge, link: MqttNodeLink, node: MqttNode
) -> None:
    await link.connect(link_pb2.Hello(agent_version="1.2.3", active_target="models/a/1/m.onnx"))
    await eventually(
        lambda: services.nodes.inventory.get_node(node.node_id).agent_version == "1.2.3"
    )
    shown = services.nodes.inventory.get_node(node.node_id)
    assert shown.online and shown.transport == "mqtt"
    assert shown.reported_state["active_target"] == "models/a/1/m.onnx"

    # A mixed batch goes out as two messages, one per leaf; each gets its own Ack.
    records = [wire_record(link_pb2.RECORD_KIND_EVENT if i % 3 else 2, i) for i in range(1, 10)]
    ids = {r.id for r in records}
    await link.send(batch(records))
    assert await acked_ids(link, ids) == ids
    assert services.records.record_ids(node.node_id) == ids
    assert services.records.count(node.node_id, "health") == 3

    # A resend (lost ack, reconnect) is acked again and stored once.
    await link.send(batch(records))
    assert await acked_ids(link, ids) == ids
    assert services.records.count(node.node_id) == 9
    assert bridge.refusals.snapshot() == {}


async def test_results_travel_on_the_health_leaf_and_only_there(
    services: Services, bridge: MqttBridge, raw: RawClient, link: MqttNodeLink, node: MqttNode
) -> None:
    from tests.control_plane.link.test_results_store import document

    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    sample = wire_record(link_pb2.RECORD_KIND_RESULTS, 1, json.dumps(document("gate", 9)).encode())
    health = wire_record(link_pb2.RECORD_KIND_HEALTH, 2)
    await link.send(batch([sample, health]))  # one message: both on `health`
    assert await acked_ids(link, {sample.id, health.id}) == {sample.id, health.id}
    (shown,) = services.nodes.results.recent(node.node_id)
    assert (shown.record_id, shown.stream, shown.document["frame_id"]) == (sample.id, "gate", 9)
    assert services.records.count(node.node_id, "health") == 1

    elsewhere = wire_record(link_pb2.RECORD_KIND_RESULTS, 3, json.dumps(document()).encode())
    events = node_topic(node.fleet, node.node_id, Leaf.EVENTS)
    assert raw.publish(events, batch([elsewhere]).SerializeToString()) in {0, 16}
    await eventually(lambda: bridge.refusals.snapshot() == {"wrong-leaf": 1})
    assert len(services.nodes.results.recent(node.node_id)) == 1


async def test_an_event_reaches_the_event_store_once_however_often_it_is_sent(
    services: Services, bridge: MqttBridge, link: MqttNodeLink, node: MqttNode
) -> None:
    from control_plane.events.query import EventQuery
    from edge_node.aggregation.wire import encode_event
    from tests.control_plane.events.support import event

    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    sent = event(1)
    record = wire_record(link_pb2.RECORD_KIND_EVENT, 1, encode_event(sent))
    record.content_type = "application/x-protobuf"
    garbage = wire_record(link_pb2.RECORD_KIND_EVENT, 2, b"\xff\xff")
    garbage.content_type = "application/x-protobuf"
    replayed = wire_record(link_pb2.RECORD_KIND_EVENT, 3, encode_event(sent))  # new record
    replayed.content_type = "application/x-protobuf"
    ids = {record.id, garbage.id, replayed.id}
    await link.send(batch([record, garbage, replayed]))
    assert await acked_ids(link, ids) == ids
    await link.send(batch([record]))  # a resend after a lost ack
    assert await acked_ids(link, {record.id}) == {record.id}

    (stored,) = services.events.page(EventQuery(node.fleet)).events
    assert (stored.event_id, stored.node_id, stored.record_id) == (
        sent.event_id,
        node.node_id,
        record.id,
    )
    assert services.records.count(node.node_id, "event") == 3  # raw history, as sent
    assert bridge.refusals.snapshot() == {"bad-event": 1}  # counted; the rest unaffected


async def test_heartbeat_and_update_status_reach_the_inventory(
    services: Services, bridge: MqttBridge, link: MqttNodeLink, node: MqttNode
) -> None:
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    await link.send(
        node_message(
            update_status=link_pb2.UpdateStatus(
                target_path="models/a/2/model.onnx", phase="verifying", director_sequence=4
            )
        )
    )
    await eventually(
        lambda: "update" in services.nodes.inventory.get_node(node.node_id).reported_state
    )
    update = services.nodes.inventory.get_node(node.node_id).reported_state["update"]
    assert update["phase"] == "verifying" and update["director_sequence"] == 4
    await eventually(lambda: bridge.counts["heartbeats"] == 1)


async def test_bad_input_is_refused_counted_acked_and_the_bridge_keeps_working(
    services: Services,
    small_bridge: MqttBridge,
    raw: RawClient,
    link: MqttNodeLink,
    node: MqttNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="control_plane.link.node_inbox")
    events = node_topic(node.fleet, node.node_id, Leaf.EVENTS)
    good = wire_record(link_pb2.RECORD_KIND_EVENT, 1)
    sent = {
        "malformed-message": raw.publish(events, b"\xff\x00 not protobuf"),
        "oversized": raw.publish(events, b"x" * 5000),
        "protocol-version": raw.publish(
            events, link_pb2.NodeMessage(protocol_version=0).SerializeToString()
        ),
        "unknown-message": raw.publish(
            events, link_pb2.NodeMessage(protocol_version=1).SerializeToString()
        ),
        "wrong-leaf": raw.publish(
            events, node_message(heartbeat=link_pb2.Heartbeat()).SerializeToString()
        ),
        "bad-batch": raw.publish(
            events,
            batch(
                [link_pb2.Record(id="not-a-uuid", seq=1, kind=1, created_at=good.created_at)]
            ).SerializeToString(),
        ),
        "bad-topic": raw.publish(
            f"edgefleet/v1/{node.fleet}/bad!id/events", batch([good]).SerializeToString()
        ),
    }
    assert set(sent.values()) <= {0, 16}  # accepted by the broker ("no subscribers" is 16)
    expected = {reason: 1 for reason in sent if reason != "bad-topic"}
    # `bad!id` matches the shared filter's `+`; it is refused by the topic parser.
    expected["bad-topic"] = 1
    await eventually(lambda: small_bridge.refusals.snapshot() == expected)
    # Each refusal's log line names the node its topic claims (none for a bad topic).
    logged = {getattr(r, "reason", None): getattr(r, "node_id", None) for r in caplog.records}
    assert logged["bad-batch"] == logged["wrong-leaf"] == node.node_id
    assert logged["oversized"] == node.node_id

    # Poison was PUBACKed: nothing is redelivered, and good traffic still flows.
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    await link.send(batch([good]))
    assert await acked_ids(link, {good.id}) == {good.id}
    assert services.records.record_ids(node.node_id) == {good.id}
    assert small_bridge.refusals.snapshot() == expected


@pytest.fixture
def small_bridge(services: Services, broker: Broker) -> Iterator[MqttBridge]:
    started = start_bridge(services, bridge_config(broker, max_message_bytes=4096))
    yield started
    started.stop()


async def test_unknown_revoked_and_other_fleet_nodes_are_refused(
    services: Services, bridge: MqttBridge, raw: RawClient, node: MqttNode
) -> None:
    create_fleet(services, "yards")
    other = enroll_mqtt_node(services, "yards")
    services.nodes.inventory.revoke(ADMIN, other.node_id)
    record = wire_record(link_pb2.RECORD_KIND_EVENT, 1)
    payload = batch([record]).SerializeToString()

    raw.publish(node_topic("gates", "n-000000000000", Leaf.EVENTS), payload)
    raw.publish(node_topic("yards", other.node_id, Leaf.EVENTS), payload)
    raw.publish(node_topic("yards", node.node_id, Leaf.EVENTS), payload)  # wrong fleet
    raw.publish(node_topic("gates", node.node_id, Leaf.EVENTS), payload)  # the real one

    await eventually(lambda: services.records.record_ids(node.node_id) == {record.id})
    await eventually(
        lambda: (
            bridge.refusals.snapshot() == {"node-unknown": 1, "node-revoked": 1, "wrong-fleet": 1}
        )
    )
    assert services.records.count(other.node_id) == 0


async def test_a_revocation_stops_a_nodes_messages_once_its_cached_check_expires(
    services: Services, broker: Broker, raw: RawClient, node: MqttNode
) -> None:
    # The bridge looks a node up at most every auth_cache_s, not for every message; the
    # cache reads its own clock, moved by hand here.
    clock = ManualClock(datetime.now(UTC))
    bridge = start_bridge(services, bridge_config(broker, auth_cache_s=5.0), clock=clock)
    try:
        first = wire_record(link_pb2.RECORD_KIND_EVENT, 1)
        topic = node_topic("gates", node.node_id, Leaf.EVENTS)
        raw.publish(topic, batch([first]).SerializeToString())
        await eventually(lambda: services.records.record_ids(node.node_id) == {first.id})
        services.nodes.inventory.revoke(ADMIN, node.node_id)
        # Within auth_cache_s of the check the node's batches still go through.
        clock.advance(timedelta(seconds=4))
        cached = wire_record(link_pb2.RECORD_KIND_EVENT, 2)
        raw.publish(topic, batch([cached]).SerializeToString())
        await eventually(lambda: services.records.record_ids(node.node_id) == {first.id, cached.id})
        clock.advance(timedelta(seconds=2))
        late = wire_record(link_pb2.RECORD_KIND_EVENT, 3)
        raw.publish(topic, batch([late]).SerializeToString())
        await eventually(lambda: bridge.refusals.snapshot() == {"node-revoked": 1})
        assert services.records.record_ids(node.node_id) == {first.id, cached.id}
    finally:
        bridge.stop()


async def test_last_will_marks_the_node_offline(
    services: Services, bridge: MqttBridge, link: MqttNodeLink, node: MqttNode
) -> None:
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    await eventually(lambda: services.nodes.inventory.get_node(node.node_id).online)

    # The connection dies without a DISCONNECT (power cut, SIGKILL): the broker sends the will.
    conn = link._conn
    assert conn is not None
    sock = conn.client.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)
    await eventually(lambda: not services.nodes.inventory.get_node(node.node_id).online)
    assert bridge.counts["offline"] == 1

    # Back online with a Hello; a clean close() sends the will too (reason 0x04).
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    await eventually(lambda: services.nodes.inventory.get_node(node.node_id).online)
    await link.close()
    await eventually(lambda: not services.nodes.inventory.get_node(node.node_id).online)


async def test_two_replicas_split_the_load_and_store_each_record_once(
    services: Services, broker: Broker, fleet: str
) -> None:
    nodes = [enroll_mqtt_node(services, fleet) for _ in range(4)]
    replicas = [
        start_bridge(services, bridge_config(broker, client_id=f"cp-replica-{i}")) for i in (1, 2)
    ]
    links = [MqttNodeLink(n.link_config(broker)) for n in nodes]
    sent: dict[str, set[str]] = {n.node_id: set() for n in nodes}
    try:
        for link in links:
            await link.connect(link_pb2.Hello(agent_version="1.0.0"))
        for round_ in range(10):
            for n, link in zip(nodes, links, strict=True):
                records = [wire_record(1, round_ * 10 + i + 1) for i in range(5)]
                sent[n.node_id].update(r.id for r in records)
                await link.send(batch(records))
        for n in nodes:
            await eventually(lambda n=n: services.records.record_ids(n.node_id) == sent[n.node_id])
        # Counted once the Ack is out, a moment after the commit the loop above saw.
        await eventually(lambda: sum(r.counts["batches"] for r in replicas) == 40)
        batches = [r.counts["batches"] for r in replicas]
        assert all(b > 0 for b in batches), batches
    finally:
        for link in links:
            await link.close()
        for replica in replicas:
            replica.stop()


class FlakyIngest(RecordIngest):
    """Its first `failures` transactions fail as a database outage does."""

    def __init__(self, real: RecordIngest, failures: int) -> None:
        super().__init__(real._sessions, real._clock, real.limits)
        self.failures = failures
        self._sessions = self._flaky_sessions  # type: ignore[assignment]
        self._real_sessions = real._sessions

    def _flaky_sessions(self) -> Session:
        if self.failures > 0:
            self.failures -= 1
            raise OperationalError("INSERT", {}, ConnectionRefusedError("database down (test)"))
        return self._real_sessions()


async def test_a_database_outage_delays_the_ack_until_the_commit(
    services: Services, broker: Broker, link: MqttNodeLink, node: MqttNode
) -> None:
    services.records = FlakyIngest(services.records, failures=3)
    bridge = start_bridge(services, bridge_config(broker))
    try:
        await link.connect(link_pb2.Hello(agent_version="1.0.0"))
        record = wire_record(1, 1)
        await link.send(batch([record]))
        assert await acked_ids(link, {record.id}) == {record.id}
        assert services.records.record_ids(node.node_id) == {record.id}
        assert bridge.counts["retries"] == 3
        assert bridge.refusals.snapshot() == {}
    finally:
        bridge.stop()


def test_the_bridge_sends_small_packets_at_once(bridge: MqttBridge) -> None:
    assert bridge._client is not None
    sock = bridge._client.socket()
    assert sock is not None
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


async def test_the_doorbell_is_retained_for_nodes_that_connect_later(
    services: Services, bridge: MqttBridge, link: MqttNodeLink, node: MqttNode
) -> None:
    bridge.publish_desired(node.fleet, node.node_id)
    await link.connect(link_pb2.Hello(agent_version="1.0.0"))
    with anyio.fail_after(10):
        async for message in link.incoming():
            assert message.WhichOneof("body") == "command"
            assert message.command.name == "pull-desired"
            break
    bridge.publish_command(node.fleet, node.node_id, link_pb2.Command(name="resync"))
    with anyio.fail_after(10):
        async for message in link.incoming():
            assert message.command.name == "resync"
            break


# ------------------------------------------------------------- with the real ACL


async def test_a_node_cannot_publish_on_another_nodes_topics(
    services: Services,
    fleet: str,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    a, b = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
    passwd, acl = write_acl(services, tmp_path / "mosquitto")
    secured = broker_factory(passwd=passwd, acl=acl, persistence=False)
    bridge = start_bridge(services, bridge_config(secured))
    as_a = RawClient(secured, a.node_id, a.password)
    try:
        record = wire_record(1, 1)
        payload = batch([record]).SerializeToString()
        for leaf in (Leaf.EVENTS, Leaf.HEALTH, Leaf.STATUS):
            assert as_a.publish(node_topic(fleet, b.node_id, leaf), payload) == 135
        assert as_a.publish(node_topic("yards", a.node_id, Leaf.EVENTS), payload) == 135
        assert as_a.publish(node_topic(fleet, a.node_id, Leaf.ACK), payload) == 135
        assert as_a.publish(node_topic(fleet, a.node_id, Leaf.EVENTS), payload) == 0
        await anyio.sleep(0)
        with anyio.fail_after(15):
            while services.records.count(a.node_id) != 1:
                await anyio.sleep(0.02)
        assert services.records.count(b.node_id) == 0
        assert bridge.refusals.snapshot() == {}

        # B, through its own link, never sees what is meant for A.
        link_b = MqttNodeLink(b.link_config(secured))
        await link_b.connect(link_pb2.Hello(agent_version="1.0.0"))
        bridge.publish_command(fleet, a.node_id, link_pb2.Command(name="for-a-only"))
        bridge.publish_command(fleet, b.node_id, link_pb2.Command(name="for-b"))
        with anyio.fail_after(10):
            async for message in link_b.incoming():
                assert message.command.name == "for-b"
                break
        await link_b.close()

        # A wrong password is refused at CONNECT: the link gives up instead of spinning.
        bad = MqttNodeLink(a.link_config(secured, password="wrong"))
        with pytest.raises(LinkRefusedError):
            await bad.connect(link_pb2.Hello())
    finally:
        as_a.close()
        bridge.stop()


async def test_a_revoked_node_is_cut_off_at_the_next_broker_reload(
    services: Services,
    fleet: str,
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    keep, gone = enroll_mqtt_node(services, fleet), enroll_mqtt_node(services, fleet)
    passwd, acl = write_acl(services, tmp_path / "mosquitto")
    secured = broker_factory(passwd=passwd, acl=acl, persistence=False)
    staying, leaving = (
        MqttNodeLink(keep.link_config(secured)),
        MqttNodeLink(gone.link_config(secured)),
    )
    await staying.connect(link_pb2.Hello())
    await leaving.connect(link_pb2.Hello())

    services.nodes.inventory.revoke(ADMIN, gone.node_id)
    write_acl(services, tmp_path / "mosquitto")
    assert gone.node_id not in passwd.read_text() + acl.read_text()
    assert keep.node_id in passwd.read_text()
    assert CP_PASSWORD not in passwd.read_text()
    secured.reload()  # SIGHUP

    # Mosquitto drops the revoked login at the reload and refuses it from then on.
    with pytest.raises(LinkUnavailableError), anyio.fail_after(10):
        async for _ in leaving.incoming():
            pass
    with pytest.raises(LinkRefusedError):
        await leaving.connect(link_pb2.Hello())
    await staying.send(node_message(heartbeat=link_pb2.Heartbeat()))  # still connected
    await staying.close()
