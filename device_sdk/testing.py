"""An in-process broker for firmware developers' tests: no network, no Mosquitto.

    broker = FakeBroker()
    client = DeviceClient(ClientConfig("cam-1"), connector=broker.connector())
    client.start()
    ... client.publish_result(...) ...
    assert client.flush(5)
    assert [r.frame_seq for r in broker.results("cam-1")] == [...]

It records every publish, acks it at once (or holds the acks, `hold_acks`), can go
offline and come back, and plays the node's side: `send_config`, `answer_heartbeats`.
It is a `device_sdk.transport.Connector`, the same seam the real client uses. Not a
broker: exact topics only, one process, QoS 1 semantics as the SDK sees them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from device_sdk.errors import BrokerRefusedError, BrokerUnavailableError
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.topics import CONFIG, ROOT, TIME, device_topic
from device_sdk.transport import Acked, Link, LinkEvent, Lost, Received

__all__ = ["FakeBroker", "Published"]


@dataclass(frozen=True, slots=True)
class Published:
    topic: str
    payload: bytes
    client_id: str

    def envelope(self) -> device_pb2.DeviceEnvelope:
        return device_pb2.DeviceEnvelope.FromString(self.payload)


class FakeBroker:
    def __init__(self, *, root: str = ROOT) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._links: list[_FakeLink] = []
        self._retained: dict[str, bytes] = {}
        self._held: list[tuple[_FakeLink, int]] = []
        self.published: list[Published] = []
        self.online = True
        self.hold_acks = False
        self.refuse_connections: str | None = None  # a CONNACK reason, e.g. "Not authorized"
        self.connects = 0
        self._answered: set[str] = set()

    # -- the seam the client uses --------------------------------------------------

    def connector(self) -> _FakeConnector:
        return _FakeConnector(self)

    # -- what a test does to the broker --------------------------------------------

    def go_offline(self) -> None:
        """Drop every connection and refuse new ones until `go_online()`."""
        with self._lock:
            self.online = False
            links, self._links = self._links, []
            self._held.clear()  # acks that never came: the client resends
        for link in links:
            link.lose("broker went away")

    def go_online(self) -> None:
        with self._lock:
            self.online = True

    def release_acks(self) -> int:
        """Send the PUBACKs held while `hold_acks` was set; how many."""
        with self._lock:
            held, self._held = self._held, []
        for link, packet_id in held:
            link.push(Acked(packet_id))
        return len(held)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """As the node would: to every link subscribed to `topic`."""
        with self._lock:
            if retain:
                self._retained[topic] = payload
            links = [link for link in self._links if topic in link.subscriptions]
        for link in links:
            link.push(Received(topic, payload))

    def send_config(
        self,
        device_id: str,
        *,
        version: int,
        target_fps: float = 0.0,
        skip_policy: device_pb2.SkipPolicy.ValueType = device_pb2.SKIP_POLICY_UNSPECIFIED,
        send_frames: bool = False,
    ) -> None:
        """Publish a retained DeviceConfig, as the node does."""
        envelope = device_pb2.NodeEnvelope(
            protocol_version=1,
            message_id=f"config-{device_id}-{version}",
            config=device_pb2.DeviceConfig(
                version=version,
                target_fps=target_fps,
                skip_policy=skip_policy,
                send_frames=send_frames,
            ),
        )
        topic = device_topic(device_id, CONFIG, root=self.root)
        self.publish(topic, envelope.SerializeToString(), retain=True)

    def answer_heartbeats(self, device_id: str, *, node_minus_device_us: int) -> int:
        """Answer every heartbeat of `device_id` not answered yet with a TimeSync, as a
        node whose clock is `node_minus_device_us` ahead of the camera's would (zero
        network delay); how many were answered."""
        answered = 0
        for beat in self.heartbeats(device_id):
            if beat.message_id in self._answered:
                continue
            self._answered.add(beat.message_id)
            node_us = beat.sent_at.ToMicroseconds() + node_minus_device_us
            stamp = Timestamp()
            stamp.FromMicroseconds(node_us)
            envelope = device_pb2.NodeEnvelope(
                protocol_version=1,
                message_id=f"time-{beat.message_id}",
                sent_at=stamp,
                time_sync=device_pb2.TimeSync(
                    heartbeat_id=beat.message_id,
                    device_sent_at=beat.sent_at,
                    node_received_at=stamp,
                ),
            )
            topic = device_topic(device_id, TIME, root=self.root)
            self.publish(topic, envelope.SerializeToString())
            answered += 1
        return answered

    # -- what a test reads ---------------------------------------------------------

    def envelopes(self, device_id: str | None = None) -> list[device_pb2.DeviceEnvelope]:
        """Every DeviceEnvelope received, in arrival order (redeliveries included)."""
        with self._lock:
            published = list(self.published)
        parsed = [p.envelope() for p in published if p.topic.startswith(self.root + "/")]
        return [e for e in parsed if device_id is None or e.device_id == device_id]

    def unique(self, device_id: str | None = None) -> list[device_pb2.DeviceEnvelope]:
        """`envelopes()` with each message id once (what a node acts on)."""
        seen: set[str] = set()
        out = []
        for envelope in self.envelopes(device_id):
            if envelope.message_id not in seen:
                seen.add(envelope.message_id)
                out.append(envelope)
        return out

    def results(self, device_id: str) -> list[device_pb2.FrameResult]:
        return [e.frame_result for e in self.unique(device_id) if e.HasField("frame_result")]

    def heartbeats(self, device_id: str) -> list[device_pb2.DeviceEnvelope]:
        return [e for e in self.unique(device_id) if e.HasField("heartbeat")]

    def frames(self, device_id: str) -> list[device_pb2.Frame]:
        return [e.frame for e in self.unique(device_id) if e.HasField("frame")]

    # -- inside --------------------------------------------------------------------

    def _connect(self, client_id: str) -> _FakeLink:
        with self._lock:
            if not self.online:
                raise BrokerUnavailableError("fake broker is offline")
            if self.refuse_connections is not None:
                raise BrokerRefusedError(self.refuse_connections)
            link = _FakeLink(self, client_id)
            self._links.append(link)
            self.connects += 1
            return link

    def _received(self, link: _FakeLink, topic: str, payload: bytes, packet_id: int) -> None:
        with self._lock:
            self.published.append(Published(topic, payload, link.client_id))
            if self.hold_acks:
                self._held.append((link, packet_id))
                return
        link.push(Acked(packet_id))

    def _subscribed(self, link: _FakeLink, topics: Sequence[str]) -> None:
        with self._lock:
            link.subscriptions.update(topics)
            retained = [(t, p) for t, p in self._retained.items() if t in topics]
        for topic, payload in retained:
            link.push(Received(topic, payload))

    def _closed(self, link: _FakeLink) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)


class _FakeConnector:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker

    def connect(self, client_id: str, timeout_s: float) -> Link:
        return self.broker._connect(client_id)


class _FakeLink:
    def __init__(self, broker: FakeBroker, client_id: str) -> None:
        self.broker = broker
        self.client_id = client_id
        self.subscriptions: set[str] = set()
        self._events: list[LinkEvent] = []
        self._ready = threading.Condition()
        self._lost = False
        self._next_id = 0

    def push(self, event: LinkEvent) -> None:
        with self._ready:
            if self._lost and not isinstance(event, Lost):
                return
            self._events.append(event)
            self._ready.notify_all()

    def lose(self, reason: str) -> None:
        self.push(Lost(reason))
        with self._ready:
            self._lost = True

    def publish(self, topic: str, payload: bytes) -> int:
        with self._ready:
            if self._lost:
                raise BrokerUnavailableError("the connection is gone")
            self._next_id = self._next_id % 65535 + 1
            packet_id = self._next_id
        self.broker._received(self, topic, payload, packet_id)
        return packet_id

    def subscribe(self, topics: Sequence[str]) -> None:
        self.broker._subscribed(self, topics)

    def poll(self, timeout_s: float) -> list[LinkEvent]:
        with self._ready:
            self._ready.wait_for(lambda: bool(self._events), timeout=timeout_s)
            events, self._events = self._events, []
            return events

    def close(self) -> None:
        with self._ready:
            self._lost = True
        self.broker._closed(self)
