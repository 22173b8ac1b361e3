"""`GatewayClient`: paho's MQTT client as the device gateway uses it, with three costs
of paho's per-message path taken out (ADR 0041, fourth amendment):

- **reads**: paho reads a packet with three ``recv`` calls (its type byte, its length
  bytes one at a time, then its body) and one ``select`` a packet; here the socket is
  wrapped (`_BufferedSocket`, as paho wraps a websocket) so that one ``recv`` takes up to
  64 KiB and the packets in it are served from memory, and `loop_read` goes on through
  every whole packet already buffered (at most ``READ_BURST`` a call, so paho's keepalive
  and writes still come round). Each system call on paho's thread gives up the GIL, and
  on a busy node taking it back costs more than the call.
- **incoming PUBLISH**: paho builds a `Properties` object (dozens of ``hasattr`` and
  ``str.replace`` calls) and an `MQTTMessage` for each; with ``on_publish_raw`` set,
  a QoS 0/1 PUBLISH is decoded here to ``(topic, payload, mid, qos)`` and handed to it
  straight away (its properties are skipped: the gateway reads none, and paho resolves
  no topic alias either, none being asked for on CONNECT). A QoS 2 one, a topic that is
  not UTF-8 or a malformed packet goes paho's own way (`on_message`).
- **acks**: `ack_many` queues the PUBACKs of a whole batch as one write, where paho's
  `ack` queues one packet (and wakes paho's thread through its socket pair) a message.

Everything else (connect, subscribe, publish, reconnects, TLS) is paho's own. All three
lean on paho 2.x internals (``_create_socket``, ``_sock``, ``_in_packet``,
``_handle_publish``, ``_in_callback_mutex``, ``_packet_queue``; pyproject pins paho
below 3); tests/edge_node/devices/test_mqtt_client.py pins them against paho's own
decoding and ack bytes, and `ack_many` falls back to `ack` without ``_packet_queue``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

__all__ = ["READ_BURST", "GatewayClient", "RawPublishSink"]

# (topic, payload, mid, qos): what `GatewayClient.on_publish_raw` is given.
RawPublishSink = Callable[[str, bytes, int, int], None]

# Whole packets `loop_read` takes from the buffer in one call.
READ_BURST: Final = 256
_CHUNK: Final = 1 << 16
_U16: Final = struct.Struct("!H")
_PUBACK: Final = 0x40
# Remaining length 2: MQTT 3.1.1's PUBACK, and MQTT 5's for reason code 0 (success) with
# no properties, as paho's own `ack` sends it.
_PUBACK_PACKET: Final = struct.Struct("!BBH")


class _BufferedSocket:
    """A socket read in large chunks; what a caller did not take yet is `pending`."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._buf = b""
        self._pos = 0

    def recv(self, n: int) -> bytes:
        pos, buf = self._pos, self._buf
        if pos >= len(buf):
            data: bytes = self._sock.recv(max(n, _CHUNK))  # may raise: paho handles it
            if len(data) <= n:
                return data
            self._buf, self._pos = data, n
            return data[:n]
        end = pos + n
        self._pos = end
        if end >= len(buf):
            self._buf, self._pos = b"", 0
            return buf[pos:] if pos else buf
        return buf[pos:end]

    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def pending(self) -> int:
        """Bytes readable without waiting (paho's `_loop` skips its select wait then)."""
        inner = getattr(self._sock, "pending", None)
        return self.buffered() + (inner() if inner is not None else 0)

    def __getattr__(self, name: str) -> Any:  # send, fileno, close, setblocking ...
        return getattr(self._sock, name)


class GatewayClient(mqtt.Client):
    """`mqtt.Client` with buffered reads and batched PUBACKs (module docstring)."""

    # Set by the owner before connecting; None: paho's `on_message` for everything.
    on_publish_raw: RawPublishSink | None = None

    def _handle_publish(self) -> MQTTErrorCode:
        sink = self.on_publish_raw
        packet = self._in_packet
        header: int = packet["command"]
        qos = (header & 0x06) >> 1
        if sink is None or qos > 1 or self._protocol != mqtt.MQTTv5:
            return super()._handle_publish()
        data: bytearray = packet["packet"]
        try:
            (length,) = _U16.unpack_from(data, 0)
            end = 2 + length
            topic = data[2:end].decode("utf-8")
            mid = 0
            if qos:
                (mid,) = _U16.unpack_from(data, end)
                end += 2
            # The properties' length, a variable byte integer (MQTT 5, 1.5.5).
            skip, shift = 0, 0
            while True:
                byte = data[end]
                end += 1
                skip |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise ValueError("properties length over 4 bytes")
            end += skip
            if end > len(data) or not topic:
                raise ValueError("truncated")
        except (struct.error, IndexError, ValueError):  # UnicodeDecodeError too
            return super()._handle_publish()  # paho's own handling of the odd packet
        with self._in_callback_mutex:
            sink(topic, bytes(data[end:]), mid, qos)
        return mqtt.MQTT_ERR_SUCCESS

    def _create_socket(self) -> Any:
        return _BufferedSocket(super()._create_socket())

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        rc = super().loop_read(max_packets)
        for _ in range(READ_BURST):
            sock = getattr(self, "_sock", None)
            if rc != mqtt.MQTT_ERR_SUCCESS or not isinstance(sock, _BufferedSocket):
                break
            if not sock.buffered():
                break
            rc = super().loop_read(1)
        return rc

    def ack_many(self, mids: Iterable[int]) -> None:
        """PUBACK (QoS 1, success) each of `mids`, queued as one write."""
        mids = list(mids)
        if not mids:
            return
        queue = getattr(self, "_packet_queue", None)
        if queue is None:  # not the paho this was made for
            for mid in mids:
                self.ack(mid, 1)
            return
        pack = _PUBACK_PACKET.pack
        queue(_PUBACK, b"".join([pack(_PUBACK, 2, mid) for mid in mids]), 0, 0)
