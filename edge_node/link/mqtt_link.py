"""`MqttNodeLink`: the node's MQTT 5 transport behind the `NodeLink` port.

What it is for: carrying `NodeMessage` / `ControlMessage` between one node and the
control plane through a broker, with the node's own credentials from enrollment
(username = node id). What it is not: a way to download models. MQTT carries no TUF
metadata or artifacts; an MQTT node fetches them over HTTPS from the control plane's
TUF repository, and `fetch_metadata` / `fetch_artifact` raise `LinkUnsupportedError`.

Wire (docs/protocol.md, "MQTT"): topics ``edgefleet/v1/<fleet>/<node>/<leaf>``.

- Up, QoS 1: Hello, Heartbeat and UpdateStatus on ``status``; a RecordBatch on ``events``
  or ``health`` by record kind (a mixed batch is split in two messages); sampled results
  travel on ``health`` too, so a broker ACL written before them lets them through.
- Down, QoS 1: ``ack`` (Acks), ``cmd`` (Commands) and the retained ``desired`` doorbell,
  each a serialized ControlMessage; `incoming()` yields them as they are. A doorbell
  carries either the signed assignment (`desired`) or the command ``pull-desired``; the
  node verifies and pulls signed state either way, so a stale or replayed retained
  message changes nothing. The control plane also answers every Hello with the current
  assignment on ``desired`` (not retained), so the same assignment may arrive twice.
- TLS (`tls`, `ca_file`): paho's TLS with the server's certificate and host name checked.
- Session: client id = node id, ``clean_start=False`` and a session expiry, so acks
  published while the node is away wait for it. Subscriptions use retain handling 1:
  the retained doorbell comes again only with a new subscription (a lost session).
- Last Will, on ``status``: a NodeMessage without a body plus the MQTT user property
  ``edgefleet-presence: offline``. `close()` disconnects with reason 0x04, so the
  broker publishes the will then too: the control plane sees the node go offline.

Threads: paho runs its network loop in its own thread; every callback is handed to the
asyncio loop that called `connect()` (``loop.call_soon_threadsafe``), where all state
lives. Incoming messages wait in a bounded queue; when it is full a message is dropped
and counted (acks are safe to lose, the uplink resends; the doorbell rings again).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.to_thread
import paho.mqtt.client as mqtt
from google.protobuf.message import DecodeError
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_node.errors import InvalidInputError, PayloadTooLargeError
from edge_node.link.base import (
    PROTOCOL_VERSION,
    LinkError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    NodeLink,
)
from protos.edgefleet.fleet.v1 import link_pb2

__all__ = [
    "OFFLINE",
    "PRESENCE_PROPERTY",
    "ROOT",
    "LinkUnsupportedError",
    "MqttLinkConfig",
    "MqttLinkStats",
    "MqttNodeLink",
    "node_topic",
    "offline_will",
]

log = logging.getLogger(__name__)

# A deliberate copy of control_plane.link.mqtt_topics' names (the packages never import
# each other); tests/edge_node/test_mqtt_link.py checks that both agree.
ROOT: Final = "edgefleet/v1"
PRESENCE_PROPERTY: Final = "edgefleet-presence"
OFFLINE: Final = "offline"
_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_UPLINK_BY_KIND: Final = {
    link_pb2.RECORD_KIND_EVENT: "events",
    link_pb2.RECORD_KIND_HEALTH: "health",
    link_pb2.RECORD_KIND_RESULTS: "health",
}
_DOWNLINK: Final = ("desired", "ack", "cmd")
# CONNACK / SUBACK / PUBACK reasons that say "not you": retrying cannot help.
_REFUSALS: Final = frozenset({0x85, 0x86, 0x87, 0x8A, 0x8C})


class LinkUnsupportedError(LinkRequestError):
    """This transport cannot do that (MQTT carries no artifacts: use HTTPS to the
    control plane's TUF repository); the link itself is fine."""

    title = "not supported by this link"


def _properties(packet_type: int) -> Properties:
    return Properties(packet_type)  # type: ignore[no-untyped-call]  # paho leaves it untyped


def node_topic(fleet: str, node_id: str, leaf: str) -> str:
    return f"{ROOT}/{fleet}/{node_id}/{leaf}"


def offline_will() -> tuple[bytes, Properties]:
    """The Last Will's payload and properties (see the module docstring)."""
    properties = _properties(PacketTypes.WILLMESSAGE)
    properties.UserProperty = (PRESENCE_PROPERTY, OFFLINE)
    payload = link_pb2.NodeMessage(protocol_version=PROTOCOL_VERSION).SerializeToString()
    return payload, properties


@dataclass(frozen=True, slots=True)
class MqttLinkConfig:
    fleet: str
    node_id: str
    username: str
    password: str = field(repr=False)
    host: str = "127.0.0.1"
    port: int = 1883
    session_expiry_s: int = 7 * 24 * 3600
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    # 0: the broker publishes the will as soon as the connection is lost.
    will_delay_s: int = 0
    max_incoming: int = 1000
    max_message_bytes: int = 4 << 20
    # TLS to the broker (the password travels in CONNECT): verified against `ca_file`
    # (a PEM bundle) or, without it, the system's CAs; the host name is checked.
    tls: bool = False
    ca_file: str | None = None

    def __post_init__(self) -> None:
        for what, value in (("fleet", self.fleet), ("node id", self.node_id)):
            if _SEGMENT.fullmatch(value) is None:
                raise InvalidInputError(f"{what} {value[:80]!r} is not a topic segment")
        if self.max_incoming < 1 or self.max_message_bytes < 1024:
            raise InvalidInputError("max_incoming and max_message_bytes must be positive")
        if self.ca_file is not None and not self.tls:
            raise InvalidInputError("ca_file is for TLS to the broker: set tls as well")


@dataclass
class MqttLinkStats:
    connects: int = 0
    sessions_resumed: int = 0
    sessions_lost: int = 0
    messages_in: int = 0
    malformed_in: int = 0
    dropped_in: int = 0
    publish_refused: int = 0


class _Connection:
    """One paho client and the asyncio-side state of its connection."""

    def __init__(self, client: mqtt.Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.connack: asyncio.Future[tuple[ReasonCode, bool, Properties | None]] = (
            loop.create_future()
        )
        self.replies: dict[int, asyncio.Future[list[ReasonCode]]] = {}
        self.inbox: collections.deque[link_pb2.ControlMessage] = collections.deque()
        self.wakeup = asyncio.Event()
        self.failure: LinkError | None = None
        self.max_packet: int | None = None

    def post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` on the asyncio loop (called from paho's thread)."""
        # RuntimeError: the loop is closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)

    def fail(self, error: LinkError) -> None:
        if self.failure is None:
            self.failure = error
        futures: list[asyncio.Future[Any]] = [self.connack, *self.replies.values()]
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # marks it retrieved: nobody may be waiting for it
        self.replies.clear()
        self.wakeup.set()


class MqttNodeLink(NodeLink):
    def __init__(self, config: MqttLinkConfig) -> None:
        self._config = config
        self._conn: _Connection | None = None
        self._ever_connected = False
        self.stats = MqttLinkStats()
        self._downlink = {node_topic(config.fleet, config.node_id, leaf) for leaf in _DOWNLINK}

    def topic(self, leaf: str) -> str:
        return node_topic(self._config.fleet, self._config.node_id, leaf)

    # ------------------------------------------------------------------ connect

    async def connect(self, hello: link_pb2.Hello) -> None:
        await self._drop_connection(with_will=False)
        config = self._config
        conn = _Connection(self._new_client(), asyncio.get_running_loop())
        self._conn = conn
        try:
            await self._open(conn)
            with anyio.fail_after(config.connect_timeout_s):
                reason, session_present, properties = await conn.connack
            if reason.is_failure:
                error_type = LinkRefusedError if reason.value in _REFUSALS else LinkUnavailableError
                raise error_type(f"the broker refused the connection: {reason}", reason=str(reason))
            self._note_session(session_present)
            conn.max_packet = getattr(properties, "MaximumPacketSize", None)
            with anyio.fail_after(config.connect_timeout_s):
                await self._subscribe(conn)
                hello_message = link_pb2.NodeMessage(protocol_version=PROTOCOL_VERSION, hello=hello)
                await self._publish_confirmed(conn, self.topic("status"), hello_message)
        except TimeoutError:
            await self._drop_connection(with_will=False)
            raise LinkUnavailableError(
                f"no answer from the MQTT broker within {config.connect_timeout_s:.0f}s"
            ) from None
        except BaseException:
            await self._drop_connection(with_will=False)
            raise
        self.stats.connects += 1
        log.info("MQTT link up", extra={"node_id": config.node_id, "host": config.host})

    def _new_client(self) -> mqtt.Client:
        config = self._config
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=config.node_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,  # the uplink reconnects, with its own backoff
        )
        client.username_pw_set(config.username, config.password)
        client.connect_timeout = config.connect_timeout_s
        if config.tls:
            try:
                client.tls_set(ca_certs=config.ca_file, cert_reqs=ssl.CERT_REQUIRED)
            except (OSError, ValueError) as exc:  # unreadable or not PEM
                raise InvalidInputError(
                    f"cannot use {config.ca_file} for TLS to the broker: {exc}"
                ) from exc
        payload, properties = offline_will()
        if config.will_delay_s > 0:
            properties.WillDelayInterval = config.will_delay_s
        client.will_set(self.topic("status"), payload, qos=1, retain=False, properties=properties)
        client.on_socket_open = _no_delay
        return client

    async def _open(self, conn: _Connection) -> None:
        config = self._config
        client = conn.client
        client.on_connect = lambda _c, _u, flags, reason, props: conn.post(
            self._on_connack, conn, reason, flags.session_present, props
        )
        client.on_disconnect = lambda _c, _u, _f, reason, _p: conn.post(
            self._on_disconnect, conn, reason
        )
        client.on_subscribe = lambda _c, _u, mid, reasons, _p: conn.post(
            self._on_reply, conn, mid, list(reasons)
        )
        client.on_publish = lambda _c, _u, mid, reason, _p: conn.post(
            self._on_reply, conn, mid, [reason]
        )
        client.on_message = lambda _c, _u, message: conn.post(
            self._on_message, conn, message.topic, bytes(message.payload)
        )
        properties = _properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = config.session_expiry_s
        try:
            await anyio.to_thread.run_sync(
                lambda: client.connect(
                    config.host,
                    config.port,
                    keepalive=config.keepalive_s,
                    clean_start=False,
                    properties=properties,
                )
            )
        except OSError as exc:  # refused, unreachable, DNS, timeout
            raise LinkUnavailableError(
                f"cannot reach the MQTT broker at {config.host}:{config.port}: {exc}"
            ) from exc
        client.loop_start()

    def _note_session(self, session_present: bool) -> None:
        if session_present:
            self.stats.sessions_resumed += 1
        elif self._ever_connected:
            self.stats.sessions_lost += 1
            log.warning(
                "the broker had no session for this node (expired or broker state lost); "
                "unacked records are resent from the outbox"
            )
        self._ever_connected = True

    async def _subscribe(self, conn: _Connection) -> None:
        # Retain handling 1: the retained doorbell only with a new subscription.
        options = SubscribeOptions(qos=1, retainHandling=1)
        result, mid = conn.client.subscribe([(self.topic(leaf), options) for leaf in _DOWNLINK])
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise LinkUnavailableError(f"subscribing failed: {mqtt.error_string(result)}")
        reasons = await self._reply(conn, mid)
        refused = [str(r) for r in reasons if r.is_failure]
        if refused:
            raise LinkRefusedError(
                f"the broker refused the node's subscriptions: {', '.join(refused)}"
            )

    async def _publish_confirmed(
        self, conn: _Connection, topic: str, message: link_pb2.NodeMessage
    ) -> None:
        mid = self._publish(conn, topic, message.SerializeToString())
        (reason,) = await self._reply(conn, mid)
        if reason.is_failure:
            error_type = LinkRefusedError if reason.value in _REFUSALS else LinkUnavailableError
            raise error_type(f"the broker refused a publish on {topic}: {reason}")

    def _reply(self, conn: _Connection, mid: int) -> asyncio.Future[list[ReasonCode]]:
        # Registered before the loop runs again, so the callback always finds it.
        future: asyncio.Future[list[ReasonCode]] = conn.loop.create_future()
        if conn.failure is not None:
            future.set_exception(conn.failure)
        else:
            conn.replies[mid] = future
        return future

    # ------------------------------------------------- callbacks (on the asyncio loop)

    def _on_connack(
        self,
        conn: _Connection,
        reason: ReasonCode,
        session_present: bool,
        properties: Properties | None,
    ) -> None:
        if not conn.connack.done():
            conn.connack.set_result((reason, session_present, properties))

    def _on_disconnect(self, conn: _Connection, reason: ReasonCode) -> None:
        if conn.failure is None:
            log.info("MQTT link down: %s", reason)
        conn.fail(LinkUnavailableError(f"the MQTT connection was lost: {reason}"))

    def _on_reply(self, conn: _Connection, mid: int, reasons: list[ReasonCode]) -> None:
        future = conn.replies.pop(mid, None)
        if future is not None:
            if not future.done():
                future.set_result(reasons)
            return
        # A record batch or heartbeat: nobody waits, but a refusal must not go unnoticed.
        for reason in reasons:
            if reason.is_failure:
                self.stats.publish_refused += 1
                log.error("the broker refused a publish: %s", reason)
                if reason.value in _REFUSALS:
                    conn.fail(
                        LinkRefusedError(
                            f"the broker refused the node's publish: {reason} (revoked, or "
                            "the broker's ACL lacks this node: run `edgefleet mqtt acl`)"
                        )
                    )

    def _on_message(self, conn: _Connection, topic: str, payload: bytes) -> None:
        if conn.failure is not None or conn is not self._conn:
            return
        if topic not in self._downlink:
            log.warning("ignoring a message on an unexpected topic %s", topic[:200])
            return
        if not payload:
            return  # a cleared retained doorbell
        try:
            message = link_pb2.ControlMessage.FromString(payload)
        except DecodeError:
            self.stats.malformed_in += 1
            log.warning("ignoring a malformed ControlMessage on %s", topic)
            return
        if message.protocol_version < PROTOCOL_VERSION:  # newer ones only add fields
            self.stats.malformed_in += 1
            log.warning("ignoring protocol version %d on %s", message.protocol_version, topic)
            return
        if len(conn.inbox) >= self._config.max_incoming:
            self.stats.dropped_in += 1
            log.warning("incoming queue full (%d); dropping a message", len(conn.inbox))
            return
        self.stats.messages_in += 1
        conn.inbox.append(message)
        conn.wakeup.set()

    # --------------------------------------------------------------------- port

    async def send(self, message: link_pb2.NodeMessage) -> None:
        conn = self._live()
        for topic, payload in self._split(message):
            self._publish(conn, topic, payload)

    def _split(self, message: link_pb2.NodeMessage) -> list[tuple[str, bytes]]:
        if message.WhichOneof("body") != "records":
            return [(self.topic("status"), message.SerializeToString())]
        groups: dict[str, list[link_pb2.Record]] = {}
        for record in message.records.records:
            leaf = _UPLINK_BY_KIND.get(record.kind)
            if leaf is None:
                raise InvalidInputError(f"record {record.id} has no known kind", kind=record.kind)
            groups.setdefault(leaf, []).append(record)
        return [
            (
                self.topic(leaf),
                link_pb2.NodeMessage(
                    protocol_version=message.protocol_version or PROTOCOL_VERSION,
                    records=link_pb2.RecordBatch(records=records),
                ).SerializeToString(),
            )
            for leaf, records in groups.items()
        ]

    def _publish(self, conn: _Connection, topic: str, payload: bytes) -> int:
        limit = min(
            self._config.max_message_bytes, conn.max_packet or self._config.max_message_bytes
        )
        if len(payload) > limit:
            raise PayloadTooLargeError(
                f"a message of {len(payload)} bytes is over the {limit}-byte limit",
                size=len(payload),
                limit=limit,
            )
        info = conn.client.publish(topic, payload, qos=1)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise LinkUnavailableError(f"publishing failed: {mqtt.error_string(info.rc)}")
        return info.mid

    async def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        conn = self._conn
        if conn is None:
            raise LinkUnavailableError("not connected")
        while True:
            while conn.inbox:
                yield conn.inbox.popleft()
            if conn.failure is not None:
                raise conn.failure
            conn.wakeup.clear()
            await conn.wakeup.wait()

    async def fetch_metadata(self, filename: str) -> bytes:
        raise LinkUnsupportedError(
            "MQTT carries no TUF metadata: fetch it over HTTPS from the control plane's "
            "TUF repository",
            filename=filename,
        )

    def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        raise LinkUnsupportedError(
            "MQTT carries no artifacts: fetch targets over HTTPS from the control plane's "
            "TUF repository",
            target_path=target_path,
        )

    async def close(self) -> None:
        """Disconnect with the will (reason 0x04), so the node shows offline; idempotent."""
        await self._drop_connection(with_will=True)

    # ----------------------------------------------------------------- helpers

    def _live(self) -> _Connection:
        conn = self._conn
        if conn is None:
            raise LinkUnavailableError("not connected")
        if conn.failure is not None:
            raise conn.failure
        return conn

    async def _drop_connection(self, *, with_will: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.fail(LinkUnavailableError("the link was closed"))
        client = conn.client
        reason = (
            ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
            if with_will
            else None
        )

        def shut() -> None:
            client.disconnect(reasoncode=reason)  # a no-op when the socket is gone
            client.loop_stop()

        with anyio.CancelScope(shield=True):  # also runs when connect() was cancelled
            await anyio.to_thread.run_sync(shut)


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Send small packets (a batch of one, a PUBACK) at once, not after a delayed ACK.

    paho leaves Nagle's algorithm on; with it a stop-and-wait exchange waits tens of
    milliseconds per round trip. A socket that is not TCP (a test double) is left alone.
    """
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
