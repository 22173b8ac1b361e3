"""`GatewayClient`: paho's client with buffered reads, a lean PUBLISH path and batched
PUBACKs. Pinned against paho's own behaviour: the same bytes on the wire for acks, the
same (topic, payload, mid, qos) as paho's `MQTTMessage` for what it decodes, paho's own
path for what it leaves alone. The gateway on a real broker: test_gateway_mosquitto."""

from __future__ import annotations

import contextlib
import shutil
import socket
import struct
import threading
import time
import uuid
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from edge_node.devices.config import CameraSettings, DeviceGatewayConfig, IntakeLimits
from edge_node.devices.gateway import DeviceGateway
from edge_node.devices.mqtt_client import READ_BURST, GatewayClient, _BufferedSocket
from tests.edge_node.test_mqtt_link_tls import TlsBroker, write_pki


def client(cls: type[mqtt.Client] = GatewayClient) -> Any:
    return cls(CallbackAPIVersion.VERSION2, client_id="t", protocol=mqtt.MQTTv5, manual_ack=True)


def queued_bytes(c: mqtt.Client) -> bytes:
    """What the client has queued for the socket (not connected: nothing was sent)."""
    return b"".join(bytes(p["packet"]) for p in c._out_packet)


def test_ack_many_queues_the_bytes_paho_acks_one_by_one_would_in_one_write() -> None:
    mids = [1, 2, 300, 65535, 7]
    paho, ours = client(mqtt.Client), client()
    for mid in mids:
        paho.ack(mid, 1)
    ours.ack_many(iter(mids))
    assert queued_bytes(ours) == queued_bytes(paho)
    assert queued_bytes(ours) == b"".join(struct.pack("!BBH", 0x40, 2, m) for m in mids)
    assert len(ours._out_packet) == 1 and len(paho._out_packet) == len(mids)
    ours.ack_many([])
    assert len(ours._out_packet) == 1  # nothing queued for an empty batch


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_packet(topic: bytes, payload: bytes, mid: int, qos: int, props: bytes = b"") -> bytes:
    """A PUBLISH's bytes after its fixed header (what paho's `_packet_handle` is given)."""
    body = struct.pack("!H", len(topic)) + topic
    if qos:
        body += struct.pack("!H", mid)
    return body + varint(len(props)) + props + payload


def feed(c: Any, header: int, packet: bytes) -> None:
    c._in_packet = {
        "command": header,
        "have_remaining": 1,
        "remaining_count": [],
        "remaining_mult": 1,
        "remaining_length": len(packet),
        "packet": bytearray(packet),
        "to_process": 0,
        "pos": 0,
    }
    c._handle_publish()


def properties_bytes() -> bytes:
    """Properties a camera might send, without their length (paho's `pack` leads with
    it): over 127 bytes, so that length takes two bytes."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/x-protobuf"
    props.UserProperty = [("k" * 200, "v" * 100)]
    packed: bytes = props.pack()  # type: ignore[no-untyped-call]
    return packed[2:] if packed[0] & 0x80 else packed[1:]


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("with_properties", [False, True])
@pytest.mark.parametrize("payload", [b"", b"\x00\x01" * 300])
def test_a_publish_is_decoded_as_paho_decodes_it(
    qos: int, with_properties: bool, payload: bytes
) -> None:
    props = properties_bytes() if with_properties else b""
    assert len(props) > 127 or not with_properties
    packet = publish_packet("edgefleet/dev/cam-é/results".encode(), payload, 513, qos, props)
    header = 0x30 | (qos << 1)
    seen: list[tuple[str, bytes, int, int]] = []
    ours = client()
    ours.on_publish_raw = lambda *args: seen.append(args)
    ours.on_message = lambda *_: pytest.fail("paho's path taken")
    feed(ours, header, packet)
    messages: list[mqtt.MQTTMessage] = []
    paho = client(mqtt.Client)
    paho.on_message = lambda _c, _u, m: messages.append(m)
    feed(paho, header, packet)
    (m,) = messages
    assert seen == [(m.topic, m.payload, m.mid, m.qos)]
    assert isinstance(seen[0][1], bytes)
    assert queued_bytes(ours) == b""  # manual acks: nothing acked by decoding


@pytest.mark.parametrize(
    ("header", "packet"),
    [
        (0x34, publish_packet(b"a/b", b"x", 9, 2)),  # QoS 2: paho's exchange
        (0x32, publish_packet(b"a/\xff", b"x", 9, 1)),  # not UTF-8
        (0x32, struct.pack("!H", 40) + b"a/b"),  # truncated topic
        (0x32, publish_packet(b"a/b", b"", 9, 1)[:-1] + b"\x05"),  # properties past the end
    ],
)
def test_what_it_does_not_decode_goes_paho_s_own_way(header: int, packet: bytes) -> None:
    ours = client()
    ours.on_publish_raw = lambda *_: pytest.fail("decoded")
    taken: list[Any] = []
    ours.on_message = lambda _c, _u, m: taken.append(m)
    with contextlib.suppress(Exception):  # paho's own refusal of a malformed packet
        feed(ours, header, packet)
    paho = client(mqtt.Client)
    expected: list[Any] = []
    paho.on_message = lambda _c, _u, m: expected.append(m)
    with contextlib.suppress(Exception):
        feed(paho, header, packet)
    assert len(taken) == len(expected)


def test_without_a_raw_sink_every_publish_goes_to_on_message() -> None:
    ours = client()
    taken: list[mqtt.MQTTMessage] = []
    ours.on_message = lambda _c, _u, m: taken.append(m)
    feed(ours, 0x32, publish_packet(b"a/b", b"x", 9, 1))
    assert [(m.topic, m.payload, m.mid) for m in taken] == [("a/b", b"x", 9)]


def test_the_buffered_socket_serves_small_reads_from_one_large_recv() -> None:
    left, right = socket.socketpair()
    try:
        right.setblocking(False)
        sock = _BufferedSocket(right)
        with pytest.raises(BlockingIOError):
            sock.recv(1)  # nothing there: the socket's own error, as paho expects
        left.sendall(b"abcdefgh")
        assert sock.recv(1) == b"a"
        assert sock.buffered() == 7 and sock.pending() == 7
        assert sock.recv(3) == b"bcd"
        assert sock.recv(10) == b"efgh"  # no more than is buffered, no wait
        assert sock.buffered() == 0
        with pytest.raises(BlockingIOError):
            sock.recv(1)
        left.sendall(b"xyz")
        assert sock.recv(3) == b"xyz"  # a read of all there is is not buffered
        assert sock.fileno() == right.fileno()  # the rest is the socket's
        left.close()
        assert sock.recv(5) == b""  # closed: paho's connection lost
    finally:
        left.close()
        right.close()


def test_loop_read_takes_every_whole_buffered_packet_in_one_call() -> None:
    left, right = socket.socketpair()
    try:
        right.setblocking(False)
        c = client()
        seen: list[int] = []
        c.on_publish_raw = lambda _t, _p, mid, _q: seen.append(mid)
        c._sock = _BufferedSocket(right)
        n = READ_BURST + 40
        wire = b""
        for mid in range(1, n + 1):
            body = publish_packet(b"a/b", b"p" * 200, mid, 1)
            wire += bytes([0x32]) + varint(len(body)) + body
        left.sendall(wire[:-50])  # the last packet not whole yet
        assert c.loop_read() == mqtt.MQTT_ERR_SUCCESS
        assert seen == list(range(1, READ_BURST + 2))  # the first, then up to READ_BURST
        assert c.loop_read() == mqtt.MQTT_ERR_SUCCESS
        assert seen == list(range(1, n))  # the rest of the whole ones; the last waits
        left.sendall(wire[-50:])
        assert c.loop_read() == mqtt.MQTT_ERR_SUCCESS
        assert seen == list(range(1, n + 1))
    finally:
        left.close()
        right.close()


def test_the_gateway_over_tls_takes_a_burst_once_and_acks_it(tmp_path: Path) -> None:
    # TLS under the buffered socket: the SSL socket's own pending bytes count, its
    # want-read is paho's. 400 results published at once (many a TLS record), each taken
    # once and acked: a second session with the same client id gets none of them again.
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed")
    ca, cert, key = write_pki(tmp_path / "pki", x509.IPAddress(IPv4Address("127.0.0.1")))
    broker = TlsBroker(tmp_path / "broker", cert, key)
    broker.start()
    try:
        config = DeviceGatewayConfig(
            cameras={"cam-a": CameraSettings()},
            port=broker.port,
            tls=True,
            ca_file=ca,
            client_id="tls-gateway",
            session_expiry_s=30,
            limits=IntakeLimits(rate_per_s=10_000, burst=10_000),
        )
        seen: list[str] = []
        lock = threading.Lock()

        def sink(observations: Any) -> None:
            with lock:
                seen.extend(o.observation_id for o in observations)

        gateway = DeviceGateway(config, on_observations=sink)
        gateway.start()
        assert gateway.wait_ready(10)
        camera = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="cam-a", protocol=mqtt.MQTTv5)
        camera.tls_set(ca_certs=str(ca))
        camera.connect("127.0.0.1", broker.port)
        camera.loop_start()
        try:
            sent = []
            infos = []
            for _ in range(400):
                envelope = device_pb2.DeviceEnvelope(
                    protocol_version=1, message_id=str(uuid.uuid4()), device_id="cam-a"
                )
                envelope.sent_at.GetCurrentTime()
                envelope.frame_result.captured_at.GetCurrentTime()
                sent.append(envelope.message_id)
                infos.append(
                    camera.publish(
                        "edgefleet/dev/cam-a/results", envelope.SerializeToString(), qos=1
                    )
                )
            for info in infos:
                info.wait_for_publish(10)
            deadline = time.monotonic() + 15
            while len(seen) < 400 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sorted(seen) == sorted(sent)
            health = gateway.health()
            assert (health["deferred"], health["internal_errors"]) == (0, 0)
            assert gateway.stop(5.0)
            again = DeviceGateway(config, on_observations=sink)  # the same session
            again.start()
            try:
                assert again.wait_ready(10)
                time.sleep(1.0)
                assert again.health()["messages"] == 0  # everything was acked
            finally:
                again.stop(2.0)
            assert len(seen) == 400
        finally:
            camera.disconnect()
            camera.loop_stop()
            gateway.stop(2.0)
    finally:
        broker.kill()
