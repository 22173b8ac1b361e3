"""`DeviceGateway` on the shared Mosquitto (127.0.0.1:1883), with real `DeviceClient`s on
the other side. Each test has a topic tree of its own (``t-<hex>/edgefleet/dev``, the
SDK's `topic_root`) and clears the retained configs it left; the broker-restart test has
a private broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.transport import MqttSettings
from edge_node.aggregation.model import Observation
from edge_node.devices.config import (
    CameraSettings,
    DeviceGatewayConfig,
    DeviceGatewayConfigError,
    IntakeLimits,
)
from edge_node.devices.gateway import DeviceGateway
from edge_node.devices.mqtt_client import GatewayClient
from tests.conftest import missing_service, wait_for_port
from tests.mqtt_support import BrokerFactory, broker_factory  # noqa: F401

PORT = 1883
FAST = BackoffPolicy(base_s=0.05, cap_s=0.2)
PERSON = Detection("person", 0.8, (0.1, 0.1, 0.3, 0.9), track_id=4)


def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


class Collected:
    """What the gateway handed on (called from its worker thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.observations: list[Observation] = []
        self.offsets: dict[str, float] = {}

    def observation(self, observation: Observation) -> None:
        with self.lock:
            self.observations.append(observation)

    def offset(self, device_id: str, offset_s: float) -> None:
        with self.lock:
            self.offsets[device_id] = offset_s

    def ids(self, source: str) -> list[str]:
        with self.lock:
            return [o.observation_id for o in self.observations if o.source == source]


class Site:
    """One test's topic tree: the gateway, its cameras (DeviceClients) and a raw client."""

    def __init__(self, cameras: dict[str, CameraSettings], **settings: Any) -> None:
        self.root = f"t-{uuid.uuid4().hex[:10]}/edgefleet/dev"
        self.config = DeviceGatewayConfig(
            cameras=cameras,
            port=PORT,
            topic_root=self.root,
            client_id=f"gw-{uuid.uuid4().hex[:10]}",
            session_expiry_s=0,
            **settings,
        )
        self.collected = Collected()
        self.gateways: list[DeviceGateway] = []
        self.clients: list[DeviceClient] = []
        self.raw = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.raw.connect("127.0.0.1", PORT)
        self.raw.loop_start()

    def gateway(self, config: DeviceGatewayConfig | None = None, **kw: Any) -> DeviceGateway:
        gateway = DeviceGateway(
            config or self.config,
            kw.pop("on_observation", self.collected.observation),
            on_clock_offset=self.collected.offset,
            **kw,
        )
        self.gateways.append(gateway)
        gateway.start()
        assert gateway.wait_ready(10)
        return gateway

    def camera(self, device_id: str, **settings: Any) -> DeviceClient:
        clock = settings.pop("clock", None)
        config = ClientConfig(
            device_id,
            mqtt=MqttSettings(port=PORT),
            backoff=FAST,
            topic_root=self.root,
            firmware_version="fw-1.0",
            **settings,
        )
        client = DeviceClient(config, clock=clock)
        self.clients.append(client)
        client.start()
        return client

    def publish(self, device_id: str, leaf: str, payload: bytes) -> None:
        self.raw.publish(f"{self.root}/{device_id}/{leaf}", payload, qos=1).wait_for_publish(5)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for gateway in self.gateways:
            gateway.stop(2.0)
        for device_id in self.config.cameras:  # clear the retained configs
            self.raw.publish(f"{self.root}/{device_id}/config", b"", qos=1, retain=True)
        self.raw.disconnect()
        self.raw.loop_stop()


@pytest.fixture
def site_factory() -> Iterator[Callable[..., Site]]:
    if not wait_for_port(PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{PORT}")
    made: list[Site] = []

    def make(cameras: dict[str, CameraSettings], **settings: Any) -> Site:
        made.append(Site(cameras, **settings))
        return made[-1]

    yield make
    for site in made:
        site.close()


class SkewedClock:
    """A camera whose wall clock is `skew_s` ahead of the node's."""

    def __init__(self, skew_s: float) -> None:
        self.skew_s = skew_s

    def time(self) -> float:
        return time.time() + self.skew_s

    def monotonic(self) -> float:
        return time.monotonic()


def test_results_arrive_once_each_and_the_camera_gets_its_config_and_clock(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory({"cam-a": CameraSettings(target_fps=12, skip_policy="even")})
    gateway = site.gateway()
    skew = 3600.0  # the camera's clock is an hour ahead: its results are impossible until
    camera = site.camera("cam-a", clock=SkewedClock(skew), heartbeat_interval_s=0.1)

    # The retained config reaches the camera; its version is the node's start in ms.
    eventually(lambda: camera.config.version > 0)
    assert camera.config.target_fps == 12 and camera.config.skip_policy.value == "even"
    assert abs(camera.config.version / 1000 - time.time()) < 60
    # The TimeSync answers make the camera's estimate converge on the skew (same machine:
    # a few ms of error), and its next heartbeats hand it to the node.
    eventually(lambda: camera.stats().clock.samples >= 3)
    estimate = camera.stats().clock
    assert estimate.offset_us / 1e6 == pytest.approx(skew, abs=0.05)
    assert estimate.error_us < 50_000
    eventually(lambda: "cam-a" in site.collected.offsets)
    assert site.collected.offsets["cam-a"] == pytest.approx(skew, abs=0.05)

    ids = [
        camera.publish_result(n, time.time() + skew, [PERSON], model="people", model_version="3")
        for n in range(20)
    ]
    assert camera.flush(10)
    eventually(lambda: len(site.collected.ids("cam-a")) == 20)
    assert site.collected.ids("cam-a") == ids  # once each, in the order sent
    first = site.collected.observations[0]
    assert (first.provenance.model, first.provenance.firmware) == ("people", "fw-1.0")
    assert first.detections[0].track_id == "4"
    health = gateway.health()
    assert health["accepted"]["results"] == 20
    assert health["rejected"]["timestamp_future"] == 0
    assert health["time_syncs"] >= 3 and health["connected"]


def test_a_resend_an_unknown_device_and_a_malformed_payload_are_counted(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory({"cam-a": CameraSettings(), "cam-b": CameraSettings()})
    gateway = site.gateway()
    camera = site.camera("cam-a")
    stranger = site.camera("cam-x")  # not on this node's allow-list
    sent = camera.publish_result(1, time.time(), [PERSON])
    stranger.publish_result(1, time.time(), [PERSON])
    assert camera.flush(10) and stranger.flush(10)
    eventually(lambda: site.collected.ids("cam-a") == [sent])

    # A QoS 1 resend (or a reboot's replay): the same envelope, the same message id.
    envelope = device_pb2.DeviceEnvelope(
        protocol_version=1, message_id=str(uuid.uuid4()), device_id="cam-b", boot_id="b"
    )
    envelope.sent_at.GetCurrentTime()
    envelope.frame_result.captured_at.GetCurrentTime()
    site.publish("cam-b", "results", envelope.SerializeToString())
    site.publish("cam-b", "results", envelope.SerializeToString())
    site.publish("cam-b", "results", b"\x08\x01\x12")  # truncated protobuf
    eventually(lambda: gateway.health()["rejected"]["malformed"] == 1)
    health = gateway.health()
    assert site.collected.ids("cam-b") == [envelope.message_id]
    assert health["rejected"]["duplicate"] == 1
    assert health["rejected"]["unknown_device"] >= 2  # cam-x's heartbeat and result
    assert health["unknown_devices"] == ["cam-x"]
    assert health["cameras"]["cam-b"]["rejected"] == {"duplicate": 1, "malformed": 1}
    assert site.collected.ids("cam-x") == []


def test_a_flooding_camera_is_limited_and_another_gets_through(
    site_factory: Callable[..., Site],
) -> None:
    limits = IntakeLimits(rate_per_s=20.0, burst=20)
    site = site_factory({"cam-flood": CameraSettings(), "cam-b": CameraSettings()}, limits=limits)
    gateway = site.gateway()
    flood = site.camera("cam-flood", max_inflight=100)
    steady = site.camera("cam-b")
    started = time.monotonic()
    for n in range(400):
        flood.publish_result(n, time.time(), [PERSON])
        if n % 40 == 0:
            steady.publish_result(n, time.time(), [PERSON])
    assert flood.flush(10) and steady.flush(10)
    eventually(lambda: gateway.health()["messages"] >= 400 + 10 + 2)  # results + heartbeats
    elapsed = time.monotonic() - started
    assert len(site.collected.ids("cam-b")) == 10
    taken = len(site.collected.ids("cam-flood"))
    # The burst, less the heartbeat that may have spent a token, then 20 a second.
    assert 19 <= taken <= 20 + 20 * elapsed
    assert gateway.health()["cameras"]["cam-flood"]["rejected"]["rate_limited"] >= 400 - taken
    assert gateway.health()["cameras"]["cam-b"]["rejected"] == {}


def test_stop_drains_within_its_deadline_and_the_session_redelivers_the_rest(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory({"cam-a": CameraSettings()})
    config = replace(site.config, session_expiry_s=10)
    release = threading.Event()

    def slow(observation: Observation) -> None:
        site.collected.observation(observation)
        release.wait(5)

    gateway = site.gateway(config, on_observation=slow)
    camera = site.camera("cam-a")
    ids = [camera.publish_result(n, time.time(), []) for n in range(5)]
    assert camera.flush(10)  # the broker has them all; the gateway is stuck on the first
    eventually(lambda: gateway.health()["queued"] >= 1)
    began = time.monotonic()
    assert gateway.stop(deadline_s=0.3) is False  # not drained: the callback still holds one
    assert time.monotonic() - began < 1.5
    release.set()

    # Same client id, persistent session: what was taken but not processed comes again.
    again = site.gateway(config)
    eventually(lambda: set(site.collected.ids("cam-a")) == set(ids))
    # The one inside the callback at stop was never acked either, so it may come twice
    # (the new gateway's id memory is fresh; the aggregation's duplicate check is the
    # second line, ADR 0038); nothing else does.
    assert len(site.collected.ids("cam-a")) in (5, 6)
    assert again.health()["accepted"]["results"] >= 4
    again.stop(2.0)
    # End the persistent session now rather than in 10 s.
    closer = replace(config, session_expiry_s=0)
    site.gateway(closer).stop(2.0)


def test_unusable_tls_files_are_a_config_error_at_start(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    config = DeviceGatewayConfig(tls=True, ca_file=ca, cameras={"cam-a": CameraSettings()})
    gateway = DeviceGateway(config, lambda _o: None)
    with pytest.raises(DeviceGatewayConfigError, match="TLS files"):
        gateway.start()
    assert gateway.stop(0.1)


def test_the_gateway_comes_back_after_its_broker_restarts(
    broker_factory: BrokerFactory,  # noqa: F811
) -> None:
    broker = broker_factory(persistence=False)
    collected = Collected()
    config = DeviceGatewayConfig(
        cameras={"cam-a": CameraSettings(target_fps=7)},
        port=broker.port,
        client_id="gw-restart",
        session_expiry_s=0,
    )
    gateway = DeviceGateway(config, collected.observation)
    camera = DeviceClient(ClientConfig("cam-a", mqtt=MqttSettings(port=broker.port), backoff=FAST))
    try:
        gateway.start()
        assert gateway.wait_ready(10)
        broker.stop()  # the retained config goes with it (no persistence)
        eventually(lambda: not gateway.health()["connected"])
        broker.start()
        assert gateway.wait_ready(10)  # reconnected (paho's own backoff) and subscribed
        camera.start()
        eventually(lambda: camera.config.target_fps == 7)  # the config was published again
        sent = camera.publish_result(1, time.time(), [PERSON])
        eventually(lambda: collected.ids("cam-a") == [sent])
        assert gateway.health()["connects"] == 2
    finally:
        camera.close()
        assert gateway.stop(2.0)


def test_a_callback_that_raises_is_counted_and_the_next_message_still_arrives(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory({"cam-a": CameraSettings()})
    calls: list[str] = []

    def flaky(observation: Observation) -> None:
        calls.append(observation.observation_id)
        if len(calls) == 1:
            raise RuntimeError("the aggregation choked")

    gateway = site.gateway(on_observation=flaky)
    camera = site.camera("cam-a")
    ids = [camera.publish_result(n, time.time(), [PERSON]) for n in range(2)]
    assert camera.flush(10)
    eventually(lambda: len(calls) == 2)
    assert calls == ids
    assert gateway.health()["callback_errors"] == 1


def test_a_burst_past_the_queue_into_a_slow_callback_loses_nothing(
    site_factory: Callable[..., Site],
) -> None:
    # 8 cameras publish 50 results each as fast as they can into a gateway whose queue
    # holds 20 and whose callback takes 3 ms. Mosquitto 2.0.11 sends past its in-flight
    # limit once acks flow, so the queue fills: the gateway must hold back, never drop.
    cameras = {f"cam-{n}": CameraSettings() for n in range(8)}
    limits = IntakeLimits(rate_per_s=10_000.0, burst=10_000)
    site = site_factory(cameras, limits=limits, max_queue=20)

    def slow(observation: Observation) -> None:
        time.sleep(0.003)
        site.collected.observation(observation)

    gateway = site.gateway(on_observation=slow)
    assert gateway.receive_maximum == 20  # min(receive_maximum 100, max_queue)
    clients = [site.camera(device_id) for device_id in cameras]
    sent: dict[str, list[str]] = {}

    def burst(device_id: str, camera: DeviceClient) -> None:
        sent[device_id] = [camera.publish_result(n, time.time(), [PERSON]) for n in range(50)]

    threads = [
        threading.Thread(target=burst, args=(d, c)) for d, c in zip(cameras, clients, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(camera.flush(10) for camera in clients)
    # Each camera has had all 50 PUBACKed by the broker, so each is the gateway's to take.
    eventually(lambda: len(site.collected.observations) >= 400)
    for device_id in cameras:  # every one exactly once, by message id
        assert sorted(site.collected.ids(device_id)) == sorted(sent[device_id])
    health = gateway.health()
    assert health["deferred"] == 0 and health["observations"] == 400


def test_a_message_that_finds_the_queue_full_too_long_is_left_unacked_for_the_session(
    site_factory: Callable[..., Site],
) -> None:
    # Queue of 1, keepalive 1 s: paho's thread waits at most 0.5 s for room. The callback
    # is stuck on the first result, the second is queued, the third waits and is deferred.
    # The gateway asks for a window of 10: a broker that keeps a window of 1 would never
    # send the third, this stands in for one that sends past it (Mosquitto 2.0.11).
    site = site_factory({"cam-a": CameraSettings()})
    config = replace(site.config, session_expiry_s=10, max_queue=1, keepalive_s=1)
    release = threading.Event()

    def stuck(observation: Observation) -> None:
        site.collected.observation(observation)
        release.wait(5)

    class WideWindow(DeviceGateway):
        @property
        def receive_maximum(self) -> int:
            return 10

    gateway = WideWindow(config, stuck, on_clock_offset=site.collected.offset)
    site.gateways.append(gateway)
    gateway.start()
    assert gateway.wait_ready(10)
    camera = site.camera("cam-a")
    ids = [camera.publish_result(n, time.time(), []) for n in range(3)]
    assert camera.flush(10)
    eventually(lambda: gateway.health()["deferred"] >= 1)
    release.set()
    eventually(lambda: gateway.health()["queued"] == 0)
    health = gateway.health()
    assert health["queue_full"] >= 1
    taken = site.collected.ids("cam-a")
    assert len(taken) == len(set(taken)) and set(taken) < set(ids)  # one (or more) held
    gateway.stop(2.0)

    # The deferred one was never acked: the next session has it, nothing else is lost.
    again = site.gateway(replace(config, max_queue=10))
    eventually(lambda: set(site.collected.ids("cam-a")) == set(ids))
    again.stop(2.0)
    site.gateway(replace(config, session_expiry_s=0)).stop(2.0)  # end the session now


def result_envelope(device_id: str) -> tuple[str, bytes]:
    envelope = device_pb2.DeviceEnvelope(
        protocol_version=1, message_id=str(uuid.uuid4()), device_id=device_id, boot_id="b"
    )
    envelope.sent_at.GetCurrentTime()
    envelope.frame_result.captured_at.GetCurrentTime()
    return envelope.message_id, envelope.SerializeToString()


class AckLog(DeviceGateway):
    """A gateway whose paho client notes every mid it acks (one by one or a batch's)."""

    acks: list[int]

    def _new_client(self) -> GatewayClient:
        client = super()._new_client()
        self.acks = []
        ack, ack_many = client.ack, client.ack_many

        def noted(mid: int, qos: int) -> Any:
            self.acks.append(mid)
            return ack(mid, qos)

        def noted_many(mids: Iterable[int]) -> None:
            mids = list(mids)
            self.acks.extend(mids)
            ack_many(mids)

        client.ack = noted  # type: ignore[method-assign]
        client.ack_many = noted_many  # type: ignore[method-assign]
        return client


def test_a_batch_is_acked_only_once_its_observations_were_handed_on(
    site_factory: Callable[..., Site],
) -> None:
    # The first batch's hand-off is held while 30 more results arrive: they are queued,
    # so the worker takes them as one batch (or a few); at each hand-off exactly the
    # observations of the batches before it have been acked, none of its own.
    site = site_factory({"cam-a": CameraSettings()})
    release = threading.Event()
    batches: list[tuple[int, list[str]]] = []  # (acks seen at the hand-off, its ids)

    def sink(observations: Any) -> None:
        batches.append((len(gateway.acks), [o.observation_id for o in observations]))
        release.wait(5)

    gateway = AckLog(site.config, on_observations=sink, on_clock_offset=site.collected.offset)
    site.gateways.append(gateway)
    gateway.start()
    assert gateway.wait_ready(10)
    first, payload = result_envelope("cam-a")
    site.publish("cam-a", "results", payload)
    eventually(lambda: len(batches) == 1)
    sent = [first]
    for _ in range(30):
        message_id, payload = result_envelope("cam-a")
        site.publish("cam-a", "results", payload)
        sent.append(message_id)
    eventually(lambda: gateway.health()["queued"] == 31)  # 1 in hand, 30 queued
    assert gateway.acks == []  # nothing acked while its batch is still being handed on
    release.set()
    eventually(lambda: len(gateway.acks) == 31)
    assert [i for _, ids in batches for i in ids] == sent  # each once, in order
    assert max(len(ids) for _, ids in batches) > 1  # batched, not one by one
    handed = 0
    for acked, ids in batches:
        assert acked == handed
        handed += len(ids)


class Crash(BaseException):
    """Stands in for the worker dying mid-batch (not an Exception: nothing catches it)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_that_dies_mid_batch_acks_none_of_it_and_the_session_delivers_it_again(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory({"cam-a": CameraSettings()})
    config = replace(site.config, session_expiry_s=10)
    hold = threading.Event()
    crashed: list[str] = []

    def dies(observations: Any) -> None:
        if not hold.is_set():  # the first hand-off: wait for the rest to queue up
            hold.set()
            site.collected.observation(observations[0])
            time.sleep(0.3)
            return
        crashed.extend(o.observation_id for o in observations)
        raise Crash

    gateway = AckLog(config, on_observations=dies, on_clock_offset=site.collected.offset)
    site.gateways.append(gateway)
    gateway.start()
    assert gateway.wait_ready(10)
    sent = []
    for n in range(20):
        message_id, payload = result_envelope("cam-a")
        site.publish("cam-a", "results", payload)
        sent.append(message_id)
        if n == 0:  # the rest queue up while the first batch is handed on
            eventually(hold.is_set)
    worker = gateway._worker
    assert worker is not None
    worker.join(10)
    assert not worker.is_alive() and crashed  # it died inside its second batch
    assert len(gateway.acks) == 1  # the first result only
    assert gateway.health()["queued"] == 20 - 1 - len(crashed)  # the crashed batch: out
    gateway.stop(1.0)

    # Same client id, persistent session: every result not acked comes again.
    again = site.gateway(config)
    eventually(lambda: set(site.collected.ids("cam-a")) == set(sent))
    assert set(crashed) <= set(site.collected.ids("cam-a")[1:])
    assert again.health()["deferred"] == 0
    again.stop(2.0)
    site.gateway(replace(config, session_expiry_s=0)).stop(2.0)  # end the session now
