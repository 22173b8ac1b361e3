"""The control plane's MQTT 5 side: nodes' uplink in, acks and doorbells out.

`MqttBridge` is one paho client per replica. It holds a persistent session
(``clean_start=False`` plus a session expiry, a stable client id per replica) and reads
``status``/``health``/``events`` of every node through shared subscriptions
(``$share/edgefleet-cp/...``), so replicas split the nodes' messages between them.

Ack flow (QoS 1 both ways, manual PUBACK): a RecordBatch is stored with
`RecordIngest.store`; once that returned (committed) the bridge publishes an ``Ack`` on
the node's ``ack`` topic and only then PUBACKs the node's message to the broker. A
crash before the PUBACK makes the broker redeliver the message to this session when it
reconnects, and ingestion ignores what it already stored; a lost Ack makes the node
resend. Neither loses nor duplicates a record.

What a message means is the node inbox's (`node_inbox`, shared with gRPC and REST):
authorization and its cache, the protocol-version rule, Hello, heartbeat, update
status, Last Will and records. The bridge holds the paho session, its threads, acks
and PUBACKs; `mqtt_uplink.MqttUplink` checks each message's topic, size and payload
and hands it to the inbox.

Bad input is refused, counted by reason in `refusals`, logged, and PUBACKed anyway:
a malformed or oversized payload, a topic outside the tree, an unknown, revoked or
other-fleet node would be redelivered forever otherwise. A database outage is not
bad input: the message is retried with backoff and PUBACKed only once it is stored.
Which node may publish on which topic is the broker's ACL (`mqtt_acl`); MQTT does not
tell a subscriber who published.

Desired state: `publish_desired` rings a node's retained ``desired`` doorbell with its
signed assignment (`MqttDelivery` calls it after a pin); and every Hello is answered
with the node's current assignment on the same topic, not retained, so a node whose
broker lost the retained message still gets it, and an answer read before a newer pin
cannot overwrite that pin's retained doorbell.

Last Will: a node's will is a body-less NodeMessage on its ``status`` topic carrying the
MQTT user property ``edgefleet-presence: offline``; the bridge marks the node offline.

Status messages are handled off paho's network thread by `workers` threads, each owning
the nodes that hash to it, so one node's status messages keep their order (a will is not
overtaken by the Hello that follows it). A RecordBatch of a node checked within
`auth_cache_s` is parsed on paho's thread and handed to the group commit
(`RecordIngest.submit`) at once; one whose node must be looked up (a database call) goes
through the node's worker. Records carry their own ids and seqs, so batches need no
order among themselves. The Ack and the PUBACK go out when the group has committed,
from the writer's thread. The node and its fleet are looked up (by the
inbox) at most every `auth_cache_s` per node, not per message: a revocation stops a
node's messages within that time (and its login at the broker's next reload).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from sqlalchemy.exc import DBAPIError

from control_plane.errors import EdgefleetError, InvalidInputError, UnavailableError
from control_plane.link import wire
from control_plane.link.mqtt_acl import (
    CONTROL_PLANE_MQTT_USER,
    MqttAccount,
    load_or_create_password,
    mosquitto_password_hash,
)
from control_plane.link.mqtt_topics import (
    SHARE_GROUP,
    Leaf,
    node_topic,
    shared_filters,
)
from control_plane.link.mqtt_uplink import (
    OFFLINE,
    PRESENCE_PROPERTY,
    Counters,
    MqttRefusal,
    MqttUplink,
    PendingAck,
)
from control_plane.link.node_inbox import NodeInbox
from protos.edgefleet.fleet.v1 import director_pb2, link_pb2

__all__ = [
    "CONTROL_PLANE_PASSWORD_FILE",
    "OFFLINE",
    "PRESENCE_PROPERTY",
    "PULL_DESIRED",
    "Counters",
    "MqttBridge",
    "MqttBridgeConfig",
    "apply_tls",
    "control_plane_account",
    "control_plane_password",
]

log = logging.getLogger(__name__)

PULL_DESIRED: Final = "pull-desired"
# Relative to the data dir: the control plane's own broker password, made on first use.
CONTROL_PLANE_PASSWORD_FILE: Final = Path("mqtt") / "control-plane-password"


@dataclass(frozen=True, slots=True)
class MqttBridgeConfig:
    """Where the broker is and how the bridge behaves; every bound is explicit."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = CONTROL_PLANE_MQTT_USER
    # None: the password kept in <data dir>/mqtt/control-plane-password (made on first use).
    password: str | None = field(default=None, repr=False)
    # Stable per replica, so a restarted replica resumes its session. None: the account's
    # name and the host name. Nodes cannot take it: their logins are bound to their own ids.
    client_id: str | None = None
    # TLS to the broker: the broker's certificate and host name are checked against
    # `ca_file` (None: the system's CAs); `cert_file`/`key_file` add a client certificate.
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    share_group: str = SHARE_GROUP
    session_expiry_s: int = 24 * 3600
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0
    reconnect_min_s: int = 1
    reconnect_max_s: int = 30
    # Unacked deliveries the broker may have in flight to this replica (MQTT 5).
    receive_maximum: int = 128
    workers: int = 4
    max_message_bytes: int = 4 << 20
    # An Ack or command waiting in an offline node's session expires after this.
    downlink_expiry_s: int = 3600
    retry_initial_s: float = 0.2
    retry_cap_s: float = 5.0
    # A node found known, unrevoked and in its topic's fleet is not looked up again for
    # this long (0: every message): the node inbox's cache lifetime for this transport.
    # Revocation takes effect within it.
    auth_cache_s: float = 5.0

    def resolved_client_id(self) -> str:
        account = self.username or CONTROL_PLANE_MQTT_USER
        return self.client_id or f"{account}-{socket.gethostname()}"[:64]


def apply_tls(client: mqtt.Client, config: MqttBridgeConfig) -> None:
    """TLS on `client` when `config.tls`: certificate and host name checked, TLS 1.2+."""
    if not config.tls:
        if config.cert_file is not None or config.ca_file is not None:
            raise InvalidInputError("an MQTT CA or client certificate needs tls enabled")
        return
    if (config.cert_file is None) != (config.key_file is None):
        raise InvalidInputError("an MQTT client certificate needs both cert_file and key_file")
    context = ssl.create_default_context(
        cafile=str(config.ca_file) if config.ca_file is not None else None
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.cert_file is not None and config.key_file is not None:
        try:
            context.load_cert_chain(str(config.cert_file), str(config.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInputError(f"cannot load the MQTT client certificate: {exc}") from exc
    client.tls_set_context(context)


def control_plane_password(data_dir: Path, config: MqttBridgeConfig | None) -> str:
    """The control plane's broker password: configured, or kept in the data dir."""
    if config is not None and config.password:
        return config.password
    return load_or_create_password(data_dir / CONTROL_PLANE_PASSWORD_FILE)


def control_plane_account(data_dir: Path, config: MqttBridgeConfig | None) -> MqttAccount:
    """The control plane's own line for the broker's password file."""
    username = (config.username if config is not None else None) or CONTROL_PLANE_MQTT_USER
    password = control_plane_password(data_dir, config)
    return MqttAccount(username=username, password_hash=mosquitto_password_hash(password))


class _Inbound(NamedTuple):
    message: mqtt.MQTTMessage
    generation: int
    # 0 for a delivery from the broker; n for the n-th retry after the database failed.
    attempt: int = 0


class MqttBridge:
    """Start with `start()`, stop with `stop()` (idempotent). Thread-safe."""

    def __init__(self, inbox: NodeInbox, config: MqttBridgeConfig, *, data_dir: Path) -> None:
        """`data_dir` holds the control plane's broker password when `config` has none."""
        if config.workers < 1 or config.receive_maximum < 1:
            raise InvalidInputError("an MQTT bridge needs at least one worker and in-flight slot")
        self._inbox = inbox
        self._config = config
        self._data_dir = data_dir
        self.client_id = config.resolved_client_id()
        self.refusals = inbox.refusals
        self.counts = Counters()
        self._lock = threading.Lock()
        self._generation = 0
        self._sessions = 0
        self._connected = threading.Event()
        self._stopping = threading.Event()
        self._started = False
        self._client: mqtt.Client | None = None
        depth = max(4, 2 * config.receive_maximum)
        self._queues: list[queue.Queue[_Inbound | None]] = [
            queue.Queue(maxsize=depth) for _ in range(config.workers)
        ]
        self._workers: list[threading.Thread] = []
        self._expiry_properties: dict[int, Properties] = {}
        self._uplink = MqttUplink(
            inbox,
            self.counts,
            max_message_bytes=config.max_message_bytes,
            downlink_expiry_s=config.downlink_expiry_s,
            publish=self._publish,
        )

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect in the background (paho reconnects by itself); returns at once."""
        with self._lock:
            if self._started:
                return
            self._started = True
        config = self._config
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
        )
        apply_tls(client, config)
        if config.username:
            password = control_plane_password(self._data_dir, config)
            client.username_pw_set(config.username, password)
        client.reconnect_delay_set(config.reconnect_min_s, config.reconnect_max_s)
        client.connect_timeout = config.connect_timeout_s
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_socket_open = _no_delay
        self._client = client
        for index, inbox in enumerate(self._queues):
            worker = threading.Thread(
                target=self._work, args=(inbox,), name=f"mqtt-bridge-{index}", daemon=True
            )
            worker.start()
            self._workers.append(worker)
        properties = _properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = config.session_expiry_s
        properties.ReceiveMaximum = config.receive_maximum
        client.connect_async(
            config.host,
            config.port,
            keepalive=config.keepalive_s,
            clean_start=False,
            properties=properties,
        )
        client.loop_start()
        log.info(
            "MQTT bridge connecting to %s:%d%s as %s",
            config.host,
            config.port,
            " (TLS)" if config.tls else "",
            self.client_id,
            extra={"client_id": self.client_id},
        )

    def wait_connected(self, timeout: float) -> bool:
        """Whether the bridge holds a session with its subscriptions within `timeout`."""
        return self._connected.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the messages being handled, leave the rest unacked, disconnect.

        Unacked messages stay in this replica's session and come back when it
        reconnects (or expire with the session; the nodes resend them anyway).
        """
        with self._lock:
            if not self._started or self._stopping.is_set():
                return
            self._stopping.set()
        for inbox in self._queues:
            _drain(inbox)
            inbox.put(None)
        for worker in self._workers:
            worker.join(timeout)
        client = self._client
        if client is not None:
            # A normal DISCONNECT: the session, and its unacked messages, are kept.
            client.disconnect()
            client.loop_stop()
        self._connected.clear()
        log.info("MQTT bridge stopped", extra={"client_id": self.client_id})

    # ------------------------------------------------------------ downlink

    def publish_desired(
        self,
        fleet: str,
        node_id: str,
        assignment: director_pb2.SignedDirectorAssignment | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> None:
        """Ring a node's doorbell: a retained ControlMessage on its ``desired`` topic.

        With `assignment` the message carries it (`desired`); without, it is the command
        ``pull-desired``. Either way the node verifies and pulls signed state itself.
        Raises UnavailableError when the broker did not confirm within `timeout_s` (the
        message stays queued and goes out on reconnect; ringing again is harmless).
        """
        if assignment is not None:
            message = wire.desired(assignment)
        else:
            message = wire.control_message(command=link_pb2.Command(name=PULL_DESIRED))
        topic = node_topic(fleet, node_id, Leaf.DESIRED)
        self._publish_and_wait(topic, message.SerializeToString(), True, None, timeout_s)

    def publish_desired_many(
        self,
        fleet: str,
        assignments: Sequence[tuple[str, director_pb2.SignedDirectorAssignment]],
        *,
        timeout_s: float = 30.0,
    ) -> list[bool]:
        """`publish_desired` for many nodes of `fleet`: every doorbell is published first,
        then their PUBACKs are awaited under one deadline of `timeout_s`; whether each was
        confirmed, in order. An unconfirmed one stays queued in the client like a single
        one. Raises UnavailableError only when the bridge is not started.
        """
        infos = [
            self._publish(
                node_topic(fleet, node_id, Leaf.DESIRED),
                wire.desired(signed).SerializeToString(),
                retain=True,
                expiry_s=None,
            )
            for node_id, signed in assignments
        ]
        # Real time, not the injected clock: it bounds paho's own (real-time) waits below,
        # which a manual clock could neither shorten nor end.
        deadline = time.monotonic() + timeout_s
        confirmed: list[bool] = []
        for info in infos:
            try:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            except (RuntimeError, ValueError):
                confirmed.append(False)
                continue
            confirmed.append(info.is_published())
        return confirmed

    def clear_desired(self, fleet: str, node_id: str, *, timeout_s: float = 10.0) -> None:
        """Remove the retained doorbell (an empty retained message), e.g. after revocation."""
        topic = node_topic(fleet, node_id, Leaf.DESIRED)
        self._publish_and_wait(topic, b"", True, None, timeout_s)

    def publish_command(
        self, fleet: str, node_id: str, command: link_pb2.Command, *, timeout_s: float = 10.0
    ) -> None:
        """An operator command on the node's ``cmd`` topic (QoS 1, not retained)."""
        topic = node_topic(fleet, node_id, Leaf.CMD)
        payload = wire.control_message(command=command).SerializeToString()
        self._publish_and_wait(topic, payload, False, self._config.downlink_expiry_s, timeout_s)

    def _publish_and_wait(
        self, topic: str, payload: bytes, retain: bool, expiry_s: int | None, timeout_s: float
    ) -> None:
        info = self._publish(topic, payload, retain=retain, expiry_s=expiry_s)
        try:
            info.wait_for_publish(timeout_s)
        except (RuntimeError, ValueError) as exc:
            raise UnavailableError(f"MQTT publish to {topic} failed: {exc}") from exc
        if not info.is_published():
            raise UnavailableError(
                f"the broker did not confirm {topic} within {timeout_s:.0f}s; it stays queued"
            )

    def _publish(
        self, topic: str, payload: bytes, *, retain: bool, expiry_s: int | None
    ) -> mqtt.MQTTMessageInfo:
        client = self._client
        if client is None:
            raise UnavailableError("the MQTT bridge is not started")
        properties = None
        if expiry_s is not None:
            # One Properties per expiry, reused: paho packs it at every publish without
            # changing it, and building one costs ~30 µs (per Ack, at batch 1).
            properties = self._expiry_properties.get(expiry_s)
            if properties is None:
                properties = _properties(PacketTypes.PUBLISH)
                properties.MessageExpiryInterval = expiry_s
                self._expiry_properties[expiry_s] = properties
        # Not connected: paho keeps QoS 1 messages and sends them on reconnect.
        return client.publish(topic, payload, qos=1, retain=retain, properties=properties)

    # ------------------------------------------------- paho callbacks (network thread)

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            self.counts.add("connect-refused")
            log.error(
                "the MQTT broker refused the bridge: %s (does it know %s? with dynamic "
                "security it must be the plugin's admin; with the file export run "
                "`edgefleet mqtt acl` and reload the broker); retrying",
                reason_code,
                self._config.username,
            )
            return
        with self._lock:
            self._generation += 1
            self._sessions += 1
            first = self._sessions == 1
        self.counts.add("connects")
        if flags.session_present:
            self.counts.add("sessions-resumed")
            log.info("MQTT bridge connected; session resumed", extra={"client_id": self.client_id})
        elif first:
            log.info("MQTT bridge connected; new session", extra={"client_id": self.client_id})
        else:
            self.counts.add("sessions-lost")
            log.warning(
                "the broker had no session for %s (expired or broker state lost); "
                "messages queued meanwhile come back as node resends",
                self.client_id,
            )
        # Subscribe even into a resumed session: it is idempotent, and Mosquitto 2.0 does
        # not restore shared subscriptions from its persistence file after a restart, while
        # it does restore the session (session_present=1) - a "present" session can be deaf.
        options = SubscribeOptions(qos=1)
        client.subscribe([(f, options) for f in shared_filters(self._config.share_group)])

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        refused = [str(code) for code in reason_codes if code.is_failure]
        if refused:
            self.counts.add("subscribe-refused")
            log.error("the broker refused the bridge's subscriptions: %s", ", ".join(refused))
            return
        self._connected.set()

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._connected.clear()
        if not self._stopping.is_set():
            self.counts.add("disconnects")
            log.warning("MQTT bridge disconnected (%s); reconnecting", reason_code)

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            self.counts.add("publish-refused")
            log.error("the broker refused a bridge publish (mid %d): %s", mid, reason_code)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if self._stopping.is_set():
            return  # left unacked: it comes back to this session after a restart
        item = _Inbound(message, self._generation)
        if self._uplink.checked_recently(message.topic):
            # A batch of a node checked within auth_cache_s: parsing it and handing it to
            # the group commit cost less than a hand-off to a worker, and nothing here
            # waits (no database call; a full backlog is retried by the worker). Status
            # messages and nodes to look up still go to the node's worker.
            try:
                self._process(item)
            except Exception:  # never into paho's loop; _process already counted it
                log.exception("MQTT bridge failed on %s", message.topic)
            return
        shard = zlib.crc32(_node_segment(message.topic)) % len(self._queues)
        # Blocks paho's thread when the workers are behind: backpressure on the broker.
        self._queues[shard].put(item)

    # ---------------------------------------------------------------- workers

    def _work(self, inbox: queue.Queue[_Inbound | None]) -> None:
        while (item := inbox.get()) is not None:
            try:
                self._process(item)
            except Exception:  # a worker must not die; _process already counted it
                log.exception("MQTT bridge worker failed on %s", item.message.topic)

    def _process(self, item: _Inbound) -> None:
        message = item.message
        if item.attempt and self._stopping.wait(self._retry_delay(item.attempt)):
            return  # stopping: left unacked, the broker redelivers it
        try:
            stored = self._uplink.handle(message)
        except Exception as exc:  # classified in _settle; nothing escapes a worker
            self._settle(item, exc)
            return
        if stored is None:
            self._puback(message, item.generation)
            return
        future, ack = stored
        future.add_done_callback(lambda done: self._acknowledge(item, done, ack))

    def _acknowledge(self, item: _Inbound, future: Future[list[str]], ack: PendingAck) -> None:
        """The group commit holding the batch finished: Ack and PUBACK, on the writer's
        thread. Both only queue a packet for paho's network thread (nothing here waits),
        and a hand-off back to the node's worker cost more than they do: at one record
        per batch it was a fifth of the bridge's CPU per message (docs/benchmarks.md)."""
        error = future.exception()
        if isinstance(error, Exception):
            self._settle(item, error)
            return
        try:
            ids = future.result()
            self.counts.add("records", len(ids))
            if ids:
                self._publish(
                    node_topic(ack.fleet, ack.node_id, Leaf.ACK),
                    wire.ack(ids).SerializeToString(),
                    retain=False,
                    expiry_s=self._config.downlink_expiry_s,
                )
            self.counts.add("batches")
        except Exception:  # not acked: the node resends, ingestion ignores the duplicate
            self.refusals.add("internal")
            log.exception("MQTT bridge could not ack %s", item.message.topic)
        self._puback(item.message, item.generation)

    def _settle(self, item: _Inbound, exc: Exception) -> None:
        """A message that failed: refused (PUBACKed) or, on a database outage, retried."""
        message = item.message
        # The topic's node segment, as claimed (the refusal may be that it is not one).
        node_id = _claimed_node(message.topic)
        if isinstance(exc, MqttRefusal):
            self._inbox.refuse(exc.reason, exc.detail, node_id=node_id, where=message.topic[:200])
        elif isinstance(exc, UnavailableError | DBAPIError):
            # The database is down or busy: not the node's fault, so not acked yet.
            if self._stopping.is_set() or item.generation != self._generation:
                return  # the broker redelivers it
            self.counts.add("retries")
            log.warning(
                "storing %s failed (%s); retrying in %.1fs",
                message.topic,
                type(exc).__name__,
                self._retry_delay(item.attempt + 1),
            )
            self._requeue(item._replace(attempt=item.attempt + 1))
            return
        elif isinstance(exc, EdgefleetError):
            self._inbox.refuse_error(exc, node_id=node_id, where=message.topic[:200])
        else:
            self.refusals.add("internal")
            log.error(
                "MQTT bridge could not handle %s; dropping it",
                message.topic,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self._puback(message, item.generation)

    def _retry_delay(self, attempt: int) -> float:
        config = self._config
        return float(min(config.retry_initial_s * 2 ** max(attempt - 1, 0), config.retry_cap_s))

    def _requeue(self, item: _Inbound) -> None:
        """Back to the node's worker, which waits the retry delay first."""
        shard = zlib.crc32(_node_segment(item.message.topic)) % len(self._queues)
        inbox = self._queues[shard]
        # Often on the writer's thread: never block it on a full inbox (the worker may be
        # waiting for the writer); a short-lived thread waits instead.
        try:
            inbox.put_nowait(item)
        except queue.Full:
            threading.Thread(target=inbox.put, args=(item,), daemon=True).start()

    def _puback(self, message: mqtt.MQTTMessage, generation: int) -> None:
        client = self._client
        # After a reconnect the broker redelivers with the same packet id; acking the old
        # delivery could then ack a different message, so leave it to the redelivery.
        if client is None or generation != self._generation or message.qos == 0:
            return
        client.ack(message.mid, message.qos)


def _properties(packet_type: int) -> Properties:
    return Properties(packet_type)  # type: ignore[no-untyped-call]  # paho leaves it untyped


def _claimed_node(topic: str) -> str | None:
    parts = topic.split("/")
    return parts[3][:64] if len(parts) == 5 else None


def _node_segment(topic: str) -> bytes:
    parts = topic.split("/")
    return (parts[3] if len(parts) > 3 else topic).encode("utf-8", "replace")


def _drain(inbox: queue.Queue[_Inbound | None]) -> None:
    while True:
        try:
            inbox.get_nowait()
        except queue.Empty:
            return


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Acks and PUBACKs go out at once (paho leaves Nagle's algorithm on)."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
