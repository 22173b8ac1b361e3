"""What one node publish means to the MQTT bridge: topic, size and payload checks, then
the node inbox.

Runs on the bridge's threads (paho's network thread for batches of a node checked
recently, else the node's worker); raises `MqttRefusal` for bad framing and lets the
inbox's errors through, which the bridge classifies (refuse and PUBACK, or retry). Not
here: the paho session, threads, acks and PUBACKs (`mqtt_bridge`), what a message means
(`node_inbox`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Final, NamedTuple, Protocol

import paho.mqtt.client as mqtt
from google.protobuf.message import DecodeError

from control_plane.link import wire
from control_plane.link.mqtt_topics import Leaf, NodeTopic, TopicError, node_topic, parse_topic
from control_plane.link.node_inbox import NodeClaim, NodeInbox
from control_plane.link.records import RECORD_KINDS, RESULTS_KIND
from control_plane.nodes.model import Node
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = ["OFFLINE", "PRESENCE_PROPERTY", "Counters", "MqttRefusal", "MqttUplink", "PendingAck"]

log = logging.getLogger("control_plane.link.mqtt_bridge")

PRESENCE_PROPERTY: Final = "edgefleet-presence"
OFFLINE: Final = "offline"
_RECORD_LEAVES: Final = (f"/{Leaf.HEALTH.value}", f"/{Leaf.EVENTS.value}")
# The record kinds each record leaf carries.
_LEAF_KINDS: Final = {Leaf.EVENTS: ("event",), Leaf.HEALTH: ("health", RESULTS_KIND)}


class Counters:
    """What the bridge did, by name (connects, messages, records, ...); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class MqttRefusal(Exception):
    """A message refused as bad input: count it, log it, PUBACK it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class PendingAck(NamedTuple):
    """Where the Ack of a submitted batch goes once its group has committed."""

    fleet: str
    node_id: str


class Publish(Protocol):
    """The bridge's QoS 1 publish (queued for paho's network thread; never waits)."""

    def __call__(
        self, topic: str, payload: bytes, *, retain: bool, expiry_s: int | None
    ) -> object: ...


class MqttUplink:
    """Checks one node message's framing and hands it to the inbox; thread-safe."""

    def __init__(
        self,
        inbox: NodeInbox,
        counts: Counters,
        *,
        max_message_bytes: int,
        downlink_expiry_s: int,
        publish: Publish,
    ) -> None:
        self._inbox = inbox
        self._counts = counts
        self._max_message_bytes = max_message_bytes
        self._downlink_expiry_s = downlink_expiry_s
        self._publish = publish

    def checked_recently(self, topic: str) -> bool:
        if not topic.endswith(_RECORD_LEAVES):
            return False
        parts = topic.split("/")
        if len(parts) != 5:
            return False  # the worker refuses it with the topic parser's reason
        return self._inbox.cached(NodeClaim(parts[3], parts[2])) is not None

    def handle(self, message: mqtt.MQTTMessage) -> tuple[Future[list[str]], PendingAck] | None:
        """Handle one message; a RecordBatch returns the future of its group commit."""
        self._counts.add("messages")
        limit = self._max_message_bytes
        if len(message.payload) > limit:
            raise MqttRefusal("oversized", f"{len(message.payload)} bytes is over {limit}")
        try:
            where = parse_topic(message.topic)
        except TopicError as exc:
            raise MqttRefusal("bad-topic", exc.message) from exc
        if where.leaf not in (Leaf.STATUS, Leaf.HEALTH, Leaf.EVENTS):
            raise MqttRefusal("wrong-leaf", f"nodes do not publish on {where.leaf.value}")
        try:
            body = link_pb2.NodeMessage.FromString(bytes(message.payload))
        except DecodeError as exc:
            raise MqttRefusal("malformed-message", f"not a NodeMessage: {exc}") from exc
        # Every MQTT message stands alone, so each carries the version it is written in.
        self._inbox.check_protocol(body.protocol_version)
        node = self._inbox.authorize(NodeClaim(where.node_id, where.fleet))
        kind = body.WhichOneof("body")
        if where.leaf is Leaf.STATUS:
            self._status(node, body, kind, message)
            return None
        return self._records(node, where, body, kind)

    def _status(
        self,
        node: Node,
        body: link_pb2.NodeMessage,
        kind: str | None,
        message: mqtt.MQTTMessage,
    ) -> None:
        if kind is None and _is_offline(message):
            self._inbox.offline(node.id)
            self._counts.add("offline")
            log.info("node went offline (Last Will)", extra={"node_id": node.id})
            return
        if kind == "records":
            raise MqttRefusal("wrong-leaf", "a status message cannot carry records")
        answer = self._inbox.handle(node.id, body)
        if kind in ("hello", "heartbeat"):
            self._counts.add(f"{kind}s")
        if answer.desired is not None:
            self._publish(
                node_topic(node.fleet, node.id, Leaf.DESIRED),
                wire.desired(answer.desired).SerializeToString(),
                retain=False,
                expiry_s=self._downlink_expiry_s,
            )
            self._counts.add("desired-sent")

    def _records(
        self, node: Node, where: NodeTopic, body: link_pb2.NodeMessage, kind: str | None
    ) -> tuple[Future[list[str]], PendingAck]:
        if kind is None:
            raise MqttRefusal("unknown-message", "a message with a body this bridge lacks")
        if kind != "records":
            raise MqttRefusal("wrong-leaf", f"{where.leaf.value} carries records, not {kind}")
        # A malformed batch raises (reason bad-batch): refused whole and not acked, as
        # over gRPC, so the node keeps it and the problem stays visible in its backlog.
        records = self._inbox.decode_records(body.records)
        # Sampled results travel on `health` (an ACL written before them lets them pass);
        # a kind this server does not know is the record validation's to refuse.
        allowed = _LEAF_KINDS[where.leaf]
        if any(r.kind in RECORD_KINDS and r.kind not in allowed for r in records):
            raise MqttRefusal(
                "wrong-leaf", f"{where.leaf.value} carries {' and '.join(allowed)} records only"
            )
        future = self._inbox.submit_records(node.id, records)
        return future, PendingAck(where.fleet, node.id)


def _is_offline(message: mqtt.MQTTMessage) -> bool:
    props = getattr(message, "properties", None)
    pairs = getattr(props, "UserProperty", None) or []
    return (PRESENCE_PROPERTY, OFFLINE) in [tuple(p) for p in pairs]
