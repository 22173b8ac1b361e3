"""Camera logins on the node's local broker: `edgefleet-node devices broker-files` writes
Mosquitto's passwd and acl from node.yaml's ``devices:``, and a PRIVATE Mosquitto started
here with those files (``allow_anonymous false``, ``use_username_as_clientid true``)
refuses each attack: anonymous or wrong-password logins, a camera publishing as another,
reading another camera's config, writing the node's topics, taking the gateway's session,
and a camera removed from the allow-list after regeneration and SIGHUP. Each attack has a
positive control on the same broker (the camera's own topic works)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from device_sdk import topics as sdk_topics
from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import MqttSettings
from edge_node.__main__ import main as node_main
from edge_node.aggregation.model import Observation
from edge_node.config import device_settings
from edge_node.devices.gateway import DeviceGateway
from edge_node.devices.mosquitto_logins import (
    CAMERA_READS,
    CAMERA_WRITES,
    DeviceLoginError,
    mosquitto_password_hash,
    render_acl,
    render_passwd,
)
from tests.mqtt_support import Broker, BrokerFactory, broker_factory, try_connect  # noqa: F401

ROOT = "edgefleet/dev"
GATEWAY = "gateway-n1"
NOT_AUTHORIZED = 135


def test_the_leaves_are_the_sdks() -> None:
    assert ROOT == sdk_topics.ROOT
    assert set(CAMERA_WRITES) == {sdk_topics.RESULTS, sdk_topics.HEARTBEAT, sdk_topics.FRAME}
    assert set(CAMERA_READS) == {sdk_topics.CONFIG, sdk_topics.TIME}


def test_a_device_id_that_cannot_be_a_login_is_refused_by_name() -> None:
    for bad in ("cam a", "cam:a", "%u", "-cam", ".."):
        with pytest.raises(DeviceLoginError, match="cannot be a broker login"):
            render_acl(GATEWAY, [bad], root=ROOT)
    with pytest.raises(DeviceLoginError, match="gateway's login"):
        render_acl(GATEWAY, [GATEWAY], root=ROOT)
    with pytest.raises(DeviceLoginError, match="twice"):
        render_passwd([("a", mosquitto_password_hash("x")), ("a", mosquitto_password_hash("y"))])


class Site:
    """node.yaml, the generated files and the private broker that loads them."""

    def __init__(self, root: Path, factory: BrokerFactory) -> None:
        self.root = root
        self.out = root / "broker"
        self.credentials = root / "node" / "device-logins"
        self.node_yaml = root / "node.yaml"
        self.write_files(["cam-a", "cam-b"])
        self.broker: Broker = factory(
            passwd=self.out / "passwd",
            acl=self.out / "acl",
            persistence=False,
            extra=["use_username_as_clientid true"],
        )

    def write_files(self, cameras: list[str]) -> None:
        self.node_yaml.write_text(
            yaml.safe_dump(
                {
                    "data_dir": str(self.root / "node"),
                    "devices": {
                        "username": GATEWAY,
                        "client_id": GATEWAY,
                        "password_file": str(self.root / "node" / "gateway.password"),
                        "cameras": {c: {"target_fps": 5} for c in cameras},
                    },
                }
            )
        )
        args = ["devices", "broker-files", "--config", str(self.node_yaml), "--out", str(self.out)]
        assert node_main(args) == 0

    def password(self, device_id: str) -> str:
        return (self.credentials / f"{device_id}.password").read_text().strip()

    def gateway_password(self) -> str:
        return (self.root / "node" / "gateway.password").read_text().strip()

    def client(self, user: str | None, password: str | None, client_id: str = "") -> Probe:
        return Probe(self.broker.port, user, password, client_id or f"probe-{time.monotonic_ns()}")

    def camera(self, device_id: str, **kw: Any) -> Probe:
        return self.client(device_id, self.password(device_id), **kw)

    def gateway(self) -> Probe:
        return self.client(GATEWAY, self.gateway_password(), client_id=GATEWAY)


class Probe:
    """A raw MQTT 5 client: its CONNACK, what it received, each PUBACK's reason."""

    def __init__(self, port: int, user: str | None, password: str | None, client_id: str):
        self.lock = threading.Lock()
        self.connack: int | None = None
        self.disconnected = threading.Event()
        self.received: list[tuple[str, bytes]] = []
        self.pubacks: dict[int, int] = {}
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        if user is not None:
            self.client.username_pw_set(user, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = lambda *_: self.disconnected.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        wait(lambda: self.connack is not None)

    def _on_connect(self, _c: object, _u: object, _f: object, reason: Any, _p: object) -> None:
        self.connack = reason.value

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.received.append((message.topic, bytes(message.payload)))

    def _on_publish(self, _c: object, _u: object, mid: int, reason: Any, _p: object) -> None:
        with self.lock:
            self.pubacks[mid] = reason.value

    def subscribe(self, *filters: str) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *_: done.set()
        self.client.subscribe([(f, 1) for f in filters])
        assert done.wait(10)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Publish at QoS 1 and wait for the PUBACK; its reason code (0 = taken)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        wait(lambda: info.mid in self.pubacks)
        with self.lock:
            return self.pubacks[info.mid]

    def got(self, payload: bytes) -> list[str]:
        with self.lock:
            return [t for t, p in self.received if p == payload]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def site(tmp_path: Path, broker_factory: BrokerFactory) -> Site:  # noqa: F811
    return Site(tmp_path, broker_factory)


def test_files_are_private_and_passwords_kept_across_runs(site: Site) -> None:
    assert (site.out / "passwd").stat().st_mode & 0o777 == 0o600
    assert (site.credentials / "cam-a.password").stat().st_mode & 0o777 == 0o600
    assert site.credentials.stat().st_mode & 0o777 == 0o700
    before = site.password("cam-a")
    site.write_files(["cam-a", "cam-b"])
    assert site.password("cam-a") == before
    assert before not in (site.out / "passwd").read_text()  # only its hash
    # A passwd the broker's group may read stays so when written again.
    (site.out / "passwd").chmod(0o640)
    site.write_files(["cam-a", "cam-b"])
    assert (site.out / "passwd").stat().st_mode & 0o777 == 0o640


def test_anonymous_and_wrong_passwords_are_refused(site: Site) -> None:
    assert site.client(None, None).connack == NOT_AUTHORIZED
    assert try_connect(site.broker.port, "cam-a", site.password("cam-b")) == NOT_AUTHORIZED
    assert try_connect(site.broker.port, "cam-x", "guess") == NOT_AUTHORIZED
    # Positive control: each generated login works (the $7$ hash is Mosquitto's own).
    assert try_connect(site.broker.port, "cam-a", site.password("cam-a")) == 0
    assert try_connect(site.broker.port, GATEWAY, site.gateway_password()) == 0


def test_a_camera_cannot_publish_as_another(site: Site) -> None:
    gateway = site.gateway()
    gateway.subscribe(f"{ROOT}/+/results", f"{ROOT}/+/heartbeat", f"{ROOT}/+/frame")
    cam_a = site.camera("cam-a")
    for leaf in CAMERA_WRITES:
        assert cam_a.publish(f"{ROOT}/cam-b/{leaf}", b"forged") == NOT_AUTHORIZED
    assert cam_a.publish(f"{ROOT}/cam-a/results", b"own") == 0
    wait(lambda: gateway.got(b"own") == [f"{ROOT}/cam-a/results"])
    assert gateway.got(b"forged") == []
    gateway.close()
    cam_a.close()


def test_a_camera_cannot_read_another_cameras_config_nor_write_node_topics(
    site: Site,
) -> None:
    gateway = site.gateway()
    cam_a = site.camera("cam-a")
    cam_b = site.camera("cam-b")
    cam_a.subscribe(f"{ROOT}/+/config", f"{ROOT}/cam-b/time", f"{ROOT}/cam-a/config", "#")
    cam_b.subscribe(f"{ROOT}/cam-b/config")
    assert gateway.publish(f"{ROOT}/cam-b/config", b"config-b", retain=True) == 0
    assert gateway.publish(f"{ROOT}/cam-b/time", b"time-b") == 0
    assert gateway.publish(f"{ROOT}/cam-a/config", b"config-a", retain=True) == 0
    wait(lambda: bool(cam_a.got(b"config-a")) and bool(cam_b.got(b"config-b")))
    assert cam_a.got(b"config-b") == [] and cam_a.got(b"time-b") == []
    # A retained config is not handed over on a later subscription either (a second
    # cam-a connection: the broker closes the first, the client id is the username).
    late = site.camera("cam-a")
    assert cam_a.disconnected.wait(10)
    late.subscribe(f"{ROOT}/cam-b/config", f"{ROOT}/cam-a/config")
    wait(lambda: bool(late.got(b"config-a")))
    assert late.got(b"config-b") == []
    # The node's own leaves, and anything outside the device tree, are the gateway's or
    # nobody's: a camera may not set its own config, another's, or a node topic.
    for topic in (
        f"{ROOT}/cam-a/config",
        f"{ROOT}/cam-b/config",
        f"{ROOT}/cam-b/time",
        "edgefleet/v1/gates/n1/status",
        f"{ROOT}/cam-a/other",
    ):
        assert late.publish(topic, b"forged") == NOT_AUTHORIZED, topic
    for probe in (gateway, cam_a, cam_b, late):
        probe.close()


def test_a_camera_cannot_take_the_gateways_session(site: Site) -> None:
    gateway = site.gateway()
    intruder = site.camera("cam-a", client_id=GATEWAY)  # the broker makes it "cam-a"
    assert intruder.connack == 0
    time.sleep(0.3)
    assert not gateway.disconnected.is_set()
    # Positive control: a second connection of the same login does take over (cam-a's
    # own reboot replaces its half-open connection).
    again = site.camera("cam-a", client_id="anything")
    wait(intruder.disconnected.is_set)
    for probe in (gateway, intruder, again):
        probe.close()


def test_a_removed_camera_is_refused_after_regeneration_and_a_reload(site: Site) -> None:
    gateway = site.gateway()
    gateway.subscribe(f"{ROOT}/+/results")
    old_password = site.password("cam-b")
    connected = site.camera("cam-b")
    assert connected.publish(f"{ROOT}/cam-b/results", b"before") == 0
    wait(lambda: bool(gateway.got(b"before")))

    site.write_files(["cam-a"])
    assert not (site.credentials / "cam-b.password").exists()
    site.broker.reload()
    # Mosquitto 2.0 re-checks connected clients at a reload: cam-b is dropped at once.
    assert connected.disconnected.wait(10)
    assert try_connect(site.broker.port, "cam-b", old_password) == NOT_AUTHORIZED
    assert try_connect(site.broker.port, "cam-a", site.password("cam-a")) == 0
    gateway.close()
    connected.close()


def test_the_real_gateway_and_an_sdk_camera_work_with_the_logins(site: Site) -> None:
    """The generated files fit the real pair: the gateway subscribes and publishes the
    camera's config; the SDK camera (its credentials options) gets it and its result
    reaches the gateway."""
    raw = yaml.safe_load(site.node_yaml.read_text())["devices"]
    raw["port"] = site.broker.port
    config = device_settings(raw)
    assert config is not None
    observations: list[Observation] = []
    gateway = DeviceGateway(config, observations.append)
    password = site.password("cam-a")
    settings = MqttSettings(port=site.broker.port, username="cam-a", password=password)
    camera = DeviceClient(
        ClientConfig("cam-a", mqtt=settings, backoff=BackoffPolicy(base_s=0.05, cap_s=0.2))
    )
    try:
        gateway.start()
        assert gateway.wait_ready(10)
        camera.start()
        wait(lambda: camera.config.target_fps == 5)
        camera.publish_result(1, time.time(), [Detection("person", 0.9, (0.1, 0.1, 0.2, 0.2))])
        wait(lambda: len(observations) == 1)
        assert observations[0].source == "cam-a"
        assert gateway.health()["rejected"]["device_mismatch"] == 0
    finally:
        camera.close()
        gateway.stop(2)


def test_the_command_names_what_is_missing(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path), "devices": {"cameras": {}}}))
    args = ["devices", "broker-files", "--config", str(config), "--out", str(tmp_path / "o")]
    assert node_main(args) == 2
    assert "devices.password_file" in capsys.readouterr().err
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path),
                "devices": {"password_file": str(tmp_path / "gw.password"), "cameras": {}},
            }
        )
    )
    assert node_main(args) == 2
    assert "needs a username" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert os.path.exists(tmp_path / "gw.password")
