"""The SDK's one seam for I/O: a `Connector` makes a `Link` (one MQTT connection), and
the client drives it from its own thread by `poll`. `PahoConnector` is the real adapter
(MQTT 5 or 3.1.1, QoS 1, TLS, credentials); `device_sdk.testing` has an in-process one.
Adapters frame and ack; what to send, when, and what to retry is the client's."""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from device_sdk.errors import BrokerRefusedError, BrokerUnavailableError, InvalidMessageError

__all__ = [
    "Acked",
    "Connector",
    "Link",
    "LinkEvent",
    "Lost",
    "MqttSettings",
    "PahoConnector",
    "Received",
]


@dataclass(frozen=True, slots=True)
class Acked:
    """PUBACK for `packet_id`; `refused` when an MQTT 5 broker acked with a failure
    reason (e.g. not authorized): it will never take that message."""

    packet_id: int
    refused: bool = False


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Lost:
    reason: str


LinkEvent = Acked | Received | Lost


class Link(Protocol):
    def publish(self, topic: str, payload: bytes) -> int:
        """Send at QoS 1; the packet id its `Acked` will carry. Raises
        BrokerUnavailableError when the connection is gone."""
        ...

    def subscribe(self, topics: Sequence[str]) -> None: ...

    def poll(self, timeout_s: float) -> list[LinkEvent]:
        """Do the link's I/O for up to `timeout_s`; what happened since the last poll."""
        ...

    def close(self) -> None: ...


class Connector(Protocol):
    def connect(self, client_id: str, timeout_s: float) -> Link:
        """A connected link (CONNACK accepted) within `timeout_s`, or BrokerError."""
        ...


@dataclass(frozen=True, slots=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    # "3.1.1" for brokers and cameras that speak nothing newer.
    protocol: Literal["5", "3.1.1"] = "5"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # TLS: set tls (the system's CAs) or ca_file; cert_file + key_file for a client cert.
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    keepalive_s: int = 30

    def __post_init__(self) -> None:
        if self.protocol not in ("5", "3.1.1"):
            raise InvalidMessageError(f"MQTT protocol {self.protocol!r}: use '5' or '3.1.1'")
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidMessageError("a client certificate needs both cert_file and key_file")
        if self.password is not None and self.username is None:
            raise InvalidMessageError("a password needs a username")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None


class PahoConnector:
    """Connects a fresh paho client per connection (paho's own queue and reconnect are
    never used: the SDK's buffer is the only queue). Clean sessions: what was in flight
    is resent from the buffer with its message id."""

    def __init__(self, settings: MqttSettings) -> None:
        self.settings = settings

    def connect(self, client_id: str, timeout_s: float) -> Link:
        s = self.settings
        v5 = s.protocol == "5"
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            clean_session=None if v5 else True,
            reconnect_on_failure=False,
        )
        client.connect_timeout = timeout_s
        client.max_inflight_messages_set(0)  # 0: no limit in paho; the SDK keeps its window
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        if s.uses_tls:
            client.tls_set(
                ca_certs=str(s.ca_file) if s.ca_file else None,
                certfile=str(s.cert_file) if s.cert_file else None,
                keyfile=str(s.key_file) if s.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        link = _PahoLink(client)
        try:
            if v5:
                client.connect(s.host, s.port, s.keepalive_s, clean_start=True)
            else:
                client.connect(s.host, s.port, s.keepalive_s)
        except (OSError, ValueError) as exc:
            raise BrokerUnavailableError(f"cannot reach {s.host}:{s.port}: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while link.connack is None:
            if time.monotonic() > deadline:
                link.close()
                raise BrokerUnavailableError(f"no CONNACK from {s.host}:{s.port} in {timeout_s}s")
            if client.loop(0.05) != mqtt.MQTT_ERR_SUCCESS and link.connack is None:
                link.close()
                raise BrokerUnavailableError(f"{s.host}:{s.port} closed the connection")
        if link.connack.is_failure:
            link.close()
            raise BrokerRefusedError(str(link.connack))
        return link


class _PahoLink:
    def __init__(self, client: mqtt.Client) -> None:
        self.client = client
        self.connack: Any = None  # paho's ReasonCode once CONNACK arrived
        self._events: list[LinkEvent] = []
        self._lost = False
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect

    def _on_connect(self, _c: object, _u: object, _f: object, reason: Any, _p: object) -> None:
        self.connack = reason

    def _on_publish(self, _c: object, _u: object, mid: int, reason: Any, _p: object) -> None:
        self._events.append(Acked(mid, refused=bool(reason.is_failure)))

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        self._events.append(Received(message.topic, bytes(message.payload)))

    def _on_disconnect(self, _c: object, _u: object, _f: object, reason: Any, _p: object) -> None:
        self._lose(f"disconnected: {reason}")

    def _lose(self, reason: str) -> None:
        if not self._lost:
            self._lost = True
            self._events.append(Lost(reason))

    def publish(self, topic: str, payload: bytes) -> int:
        if self._lost:
            raise BrokerUnavailableError("the connection is gone")
        info = self.client.publish(topic, payload, qos=1)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self._lose(f"publish failed: {mqtt.error_string(info.rc)}")
            raise BrokerUnavailableError(f"publish failed: {mqtt.error_string(info.rc)}")
        return int(info.mid)

    def subscribe(self, topics: Sequence[str]) -> None:
        rc, _ = self.client.subscribe([(t, 1) for t in topics])
        if rc != mqtt.MQTT_ERR_SUCCESS:
            self._lose(f"subscribe failed: {mqtt.error_string(rc)}")

    def poll(self, timeout_s: float) -> list[LinkEvent]:
        if not self._lost:
            rc = self.client.loop(timeout_s)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                self._lose(f"connection lost: {mqtt.error_string(rc)}")
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        self._lost = True
        if self.client.is_connected():
            self.client.disconnect()
            self.client.loop_write()  # sends DISCONNECT
        self.client._sock_close()  # paho's only way to drop a socket that never connected
