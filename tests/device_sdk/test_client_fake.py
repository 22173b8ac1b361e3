"""`DeviceClient` against `device_sdk.testing.FakeBroker` (in process): what it sends,
how it applies the node's configuration, and how it behaves offline, on a late PUBACK
and on bad node messages. The same client over real Mosquitto: test_client_mosquitto.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.clock import ManualClock
from device_sdk.errors import ClientClosedError
from device_sdk.pacing import SkipPolicy, SourceConfig
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.testing import FakeBroker
from device_sdk.topics import device_topic
from device_sdk.transport import Link

DEVICE = "cam-gate-a"
FAST = BackoffPolicy(base_s=0.01, cap_s=0.05)
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 60


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def make_client(broker: FakeBroker) -> Iterator[Callable[..., DeviceClient]]:
    made: list[DeviceClient] = []

    def make(
        *,
        clock: ManualClock | None = None,
        on_config: Callable[[SourceConfig], None] | None = None,
        **overrides: Any,
    ) -> DeviceClient:
        config = ClientConfig(DEVICE, backoff=FAST, **overrides)
        client = DeviceClient(
            config, connector=broker.connector(), clock=clock, on_config=on_config
        )
        made.append(client)
        client.start()
        return client

    yield make
    for client in made:
        client.close()


def test_results_reach_the_node_with_ids_detections_and_provenance(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    client = make_client(firmware_version="fw-3.2")
    plate = Detection(
        "vehicle", 0.9, (0.1, 0.2, 0.5, 0.9), track_id=17, attributes={"plate_text": "AB123"}
    )
    ids = [
        client.publish_result(
            n, 1_767_225_600.0 + n / 10, [plate], model="plates", model_version="2.1"
        )
        for n in range(3)
    ]
    assert client.flush(5)
    results = broker.results(DEVICE)
    assert [r.frame_seq for r in results] == [0, 1, 2]
    first = results[0]
    assert first.detections[0].attributes["plate_text"] == "AB123"
    assert first.detections[0].track_id == 17
    assert (first.model, first.model_version) == ("plates", "2.1")
    assert first.captured_at.ToNanoseconds() == 1_767_225_600_000_000_000
    envelopes = [e for e in broker.unique(DEVICE) if e.HasField("frame_result")]
    assert [e.message_id for e in envelopes] == ids
    assert {(e.protocol_version, e.device_id, e.boot_id) for e in envelopes} == {
        (1, DEVICE, client.boot_id)
    }
    beat = broker.heartbeats(DEVICE)[0].heartbeat  # one at start
    assert (beat.firmware_version, beat.sdk_version) == ("fw-3.2", "0.1.0")
    assert beat.buffer.capacity_bytes == 256 * 1024


def test_detections_the_contract_cannot_carry_are_refused_at_the_call() -> None:
    for bad in [
        Detection("person", 1.5, (0.0, 0.0, 1.0, 1.0)),
        Detection("person", 0.5, (0.6, 0.0, 0.4, 1.0)),
        Detection("person", 0.5, (0.0, 0.0, 1.0, 1.2)),
        Detection("person", 0.5, (0.0, 0.0, 1.0, 1.0), track_id=0),
    ]:
        with pytest.raises(ValueError):
            bad.to_proto()


def test_the_node_config_is_applied_at_the_source(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    applied: list[int] = []
    client = make_client(on_config=lambda c: applied.append(c.version))
    assert client.publish_frame(1, 1.0, JPEG) is None  # frames are off until the node asks
    broker.send_config(
        DEVICE, version=2, target_fps=10, skip_policy=device_pb2.SKIP_POLICY_EVEN, send_frames=True
    )
    eventually(lambda: client.config.version == 2)
    assert client.config.skip_policy is SkipPolicy.EVEN
    assert applied == [2]
    kept = [n for n in range(90) if client.admit_frame(1_767_225_600.0 + n / 30)]
    assert len(kept) == 30 and kept[:3] == [0, 3, 6]
    assert client.publish_frame(3, 1_767_225_600.1, JPEG) is not None
    broker.send_config(DEVICE, version=1, send_frames=False)  # older: ignored
    broker.send_config(DEVICE, version=3, send_frames=False)
    eventually(lambda: client.config.version == 3)
    assert client.publish_frame(4, 1.0, JPEG) is None
    assert client.flush(5)
    assert [f.frame_seq for f in broker.frames(DEVICE)] == [3]
    client.publish_heartbeat()
    assert client.flush(5)
    beat = broker.heartbeats(DEVICE)[-1].heartbeat
    assert (beat.config_version, beat.frames_captured, beat.frames_skipped) == (3, 90, 60)


def test_a_retained_config_arrives_on_connect(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    broker.send_config(DEVICE, version=5, target_fps=2)
    client = make_client()
    eventually(lambda: client.config.version == 5)
    assert client.config.target_fps == 2


def test_offline_results_wait_and_arrive_once_the_broker_is_back(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    client = make_client()
    eventually(lambda: client.connected)
    broker.go_offline()
    eventually(lambda: not client.connected)
    for n in range(20):
        client.publish_result(n, 1.0 + n, [])
    assert not client.flush(0.1)
    stats = client.stats()
    assert stats.buffer.queued_messages >= 20 and stats.connect_failures >= 1
    broker.go_online()
    assert client.flush(5)
    assert [r.frame_seq for r in broker.results(DEVICE)] == list(range(20))
    assert client.stats().connects == 2


def test_a_late_puback_drops_the_connection_and_resends_with_the_same_ids(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    clock = ManualClock()
    client = make_client(clock=clock, ack_timeout_s=30.0, heartbeat_interval_s=3600.0)
    eventually(lambda: client.connected)
    assert client.flush(5)
    broker.hold_acks = True
    ids = [client.publish_result(n, clock.time(), []) for n in range(3)]
    eventually(lambda: len(broker.results(DEVICE)) == 3)
    clock.advance(31)
    eventually(lambda: broker.connects == 2 and len(broker.envelopes(DEVICE)) >= 1 + 2 * 3)
    broker.hold_acks = False
    broker.release_acks()
    assert client.flush(5)
    sent = [e.message_id for e in broker.envelopes(DEVICE) if e.HasField("frame_result")]
    assert sent == ids + ids  # the same three, resent: a node takes each id once
    assert client.stats().connects == 2


def test_heartbeats_carry_the_clock_estimate_from_the_nodes_time_sync(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    clock = ManualClock()
    client = make_client(clock=clock, heartbeat_interval_s=10.0)
    eventually(lambda: len(broker.heartbeats(DEVICE)) == 1)
    assert broker.answer_heartbeats(DEVICE, node_minus_device_us=-1_500) == 1
    eventually(lambda: client.stats().clock.samples == 1)
    clock.advance(10)
    eventually(lambda: len(broker.heartbeats(DEVICE)) == 2)
    beat = broker.heartbeats(DEVICE)[1].heartbeat
    assert (beat.clock.offset_us, beat.clock.error_us, beat.clock.samples) == (1_500, 0, 1)
    assert beat.uptime_ms == 10_000


def test_bad_node_messages_are_counted_never_a_crash(
    broker: FakeBroker, make_client: Callable[..., DeviceClient]
) -> None:
    client = make_client()
    eventually(lambda: client.connected)
    config = device_topic(DEVICE, "config")
    broker.publish(config, b"\xff\xff not protobuf")
    future = device_pb2.NodeEnvelope(protocol_version=2, config=device_pb2.DeviceConfig(version=9))
    broker.publish(config, future.SerializeToString())
    eventually(lambda: client.stats().bad_node_messages == 2)
    broker.send_config(DEVICE, version=1, target_fps=4)
    eventually(lambda: client.config.version == 1)
    assert client.connected


def test_a_file_ring_survives_a_reboot_with_the_broker_down(
    broker: FakeBroker, make_client: Callable[..., DeviceClient], tmp_path: Path
) -> None:
    broker.go_offline()
    first = make_client(ring_directory=tmp_path)
    ids = [first.publish_result(n, 1.0 + n, []) for n in range(5)]
    first.close()  # power off before the broker came back
    broker.go_online()
    second = make_client(ring_directory=tmp_path)
    assert second.flush(5)
    results = [e for e in broker.unique(DEVICE) if e.HasField("frame_result")]
    assert [e.message_id for e in results] == ids
    assert {e.boot_id for e in results} == {first.boot_id}  # as stamped when buffered
    assert second.boot_id != first.boot_id


def test_the_example_program_runs_against_the_fake_broker(broker: FakeBroker) -> None:
    from device_sdk.examples import camera

    sent = camera.run(
        ClientConfig("cam-example", backoff=FAST), frames=25, fps=25.0, connector=broker.connector()
    )
    assert sent == 25
    assert len(broker.results("cam-example")) == 25
    assert all(r.detections for r in broker.results("cam-example"))


def test_a_failure_inside_the_clients_thread_is_survived(broker: FakeBroker) -> None:
    """A link that raises something unexpected (a bug, a failing flash) costs a reconnect."""
    failures = iter([True])

    class Flaky:
        def connect(self, client_id: str, timeout_s: float) -> Link:
            link = broker.connector().connect(client_id, timeout_s)
            if next(failures, False):
                link.poll = lambda _t: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
            return link

    client = DeviceClient(ClientConfig(DEVICE, backoff=FAST), connector=Flaky())
    client.start()
    try:
        client.publish_result(1, 1.0, [])
        assert client.flush(5)
        assert [r.frame_seq for r in broker.results(DEVICE)] == [1]
        assert client.stats().connects == 2
    finally:
        client.close()
    with pytest.raises(ClientClosedError):
        client.publish_result(2, 2.0, [])
    client.close()  # twice is fine
