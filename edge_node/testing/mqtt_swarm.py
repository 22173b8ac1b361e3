"""Thousands of simulated MQTT nodes in one thread: paho clients on one selector loop, each
on the wire as `MqttNodeLink` is (same client id, session, Last Will, subscriptions, Hello).

For fan-out benchmarks and large demo fleets, where `MqttNodeLink`'s one network thread
per node is too dear. Not a link: it sends only the Hello and hands each ``desired``
message up as bytes; a node that must send records uses `edge_node.testing.simulator`.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_node.link.base import PROTOCOL_VERSION
from edge_node.link.mqtt_link import node_topic, offline_will
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = ["MqttSwarm", "SwarmConfig", "SwarmNode"]

_DOWNLINK: Final = ("desired", "ack", "cmd")
# How often the clients' keepalive and the settle deadlines are looked at.
_MISC_EVERY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class SwarmNode:
    node_id: str
    password: str


@dataclass(frozen=True, slots=True)
class SwarmConfig:
    fleet: str
    port: int
    host: str = "127.0.0.1"
    agent_version: str = "sim-0.1.0"
    # Nodes between CONNECT and their Hello's PUBACK at once (the broker's backlog).
    connect_concurrency: int = 64
    # A node that has not had its CONNACK, SUBACK and Hello PUBACK by then has failed.
    settle_timeout_s: float = 120.0
    keepalive_s: int = 60
    session_expiry_s: int = 7 * 24 * 3600
    select_timeout_s: float = 0.05


class MqttSwarm:
    """Connects every node (`connect_concurrency` at a time) and runs their network loop.

    Per node: client id = user name = node id, its own password, MQTT 5, clean_start
    False with a session expiry, the offline Last Will; subscribe to ``desired``, ``ack``
    and ``cmd`` (QoS 1, retain handling 1); publish the Hello on ``status`` (QoS 1).
    """

    def __init__(
        self,
        config: SwarmConfig,
        nodes: Sequence[SwarmNode],
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.nodes = list(nodes)
        self._timer = timer
        self._selector = selectors.DefaultSelector()
        self._pending: set[int] = set()  # nodes between CONNECT and the Hello's PUBACK
        self._hello_mids: dict[int, int] = {}
        self._on_settled: Callable[[int, bool, str], None] = lambda *_: None
        self._on_desired: Callable[[int, bytes, float], None] = lambda *_: None
        self._hello = link_pb2.NodeMessage(
            protocol_version=PROTOCOL_VERSION,
            hello=link_pb2.Hello(agent_version=config.agent_version),
        ).SerializeToString()
        self._clients = [self._client(index, node) for index, node in enumerate(self.nodes)]

    def run(
        self,
        *,
        keep_running: Callable[[], bool],
        on_settled: Callable[[int, bool, str], None],
        on_desired: Callable[[int, bytes, float], None],
    ) -> None:
        """Until `keep_running()` is false: `on_settled(index, ok, why)` once per node when
        its Hello was confirmed or it failed; `on_desired(index, payload, at)` for every
        non-empty ``desired`` message. Ends with a normal DISCONNECT for every node (no
        Will: the sessions stay)."""
        self._on_settled, self._on_desired = on_settled, on_desired
        config = self.config
        connect_props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        connect_props.SessionExpiryInterval = config.session_expiry_s
        next_node = 0
        started: dict[int, float] = {}
        last_misc = self._timer()
        while keep_running():
            while (
                next_node < len(self._clients) and len(self._pending) < config.connect_concurrency
            ):
                index = next_node
                next_node += 1
                self._pending.add(index)
                started[index] = self._timer()
                try:
                    self._clients[index].connect(
                        config.host,
                        config.port,
                        keepalive=config.keepalive_s,
                        clean_start=False,
                        properties=connect_props,
                    )
                except OSError as exc:
                    self._done(index, False, f"connect: {exc}")
            for key, events in self._selector.select(timeout=config.select_timeout_s):
                client = key.data
                if events & selectors.EVENT_READ:
                    client.loop_read()
                if events & selectors.EVENT_WRITE:
                    client.loop_write()
            now = self._timer()
            if now - last_misc > _MISC_EVERY_S:
                last_misc = now
                for client in self._clients:
                    client.loop_misc()
                late = [i for i in self._pending if now - started[i] > config.settle_timeout_s]
                for index in late:
                    self._done(
                        index,
                        False,
                        f"no CONNACK/SUBACK/PUBACK within {config.settle_timeout_s:g} s",
                    )
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.disconnect()  # normal DISCONNECT: no Will, the session stays
                client.loop_write()

    # ----------------------------------------------------------------- per client

    def _client(self, index: int, node: SwarmNode) -> mqtt.Client:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=node.node_id,
            protocol=mqtt.MQTTv5,
            userdata=index,
            reconnect_on_failure=False,
        )
        client.username_pw_set(node.node_id, node.password)
        will_payload, will_props = offline_will()
        client.will_set(
            node_topic(self.config.fleet, node.node_id, "status"),
            will_payload,
            qos=1,
            properties=will_props,
        )
        client.on_connect = self._connected
        client.on_subscribe = self._subscribed
        client.on_publish = self._published
        client.on_message = self._message
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._register_write
        client.on_socket_unregister_write = self._unregister_write
        return client

    def _done(self, index: int, ok: bool, why: str = "") -> None:
        if index not in self._pending:
            return
        self._pending.discard(index)
        self._on_settled(index, ok, why)

    def _connected(self, client: Any, index: int, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self._done(index, False, f"CONNACK {reason}")
            return
        node_id = self.nodes[index].node_id
        options = SubscribeOptions(qos=1, retainHandling=1)
        client.subscribe(
            [(node_topic(self.config.fleet, node_id, leaf), options) for leaf in _DOWNLINK]
        )

    def _subscribed(self, client: Any, index: int, mid: int, reasons: Any, props: Any) -> None:
        if any(r.is_failure for r in reasons):
            self._done(index, False, f"SUBACK {reasons}")
            return
        topic = node_topic(self.config.fleet, self.nodes[index].node_id, "status")
        self._hello_mids[index] = client.publish(topic, self._hello, qos=1).mid

    def _published(self, client: Any, index: int, mid: int, reason: Any, props: Any) -> None:
        if self._hello_mids.get(index) == mid:
            self._done(index, not reason.is_failure, f"PUBACK {reason}")

    def _message(self, client: Any, index: int, message: Any) -> None:
        if message.topic.endswith("/desired") and message.payload:
            self._on_desired(index, bytes(message.payload), self._timer())

    def _socket_open(self, client: Any, index: int, sock: Any) -> None:
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _socket_close(self, client: Any, index: int, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _register_write(self, client: Any, index: int, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)

    def _unregister_write(self, client: Any, index: int, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(sock, selectors.EVENT_READ, client)
