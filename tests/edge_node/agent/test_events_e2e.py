"""Issue 14 §3 end to end: cameras publish, the node aggregates, the control plane stores.

Everything is real and a process of its own where it would be in the field: the shared
Mosquitto (127.0.0.1:1883, a topic root of its own per run), the control plane as
`edgefleet server` (REST + gRPC, SQLite), and the node as `python -m edge_node run` (what
`edgefleet node run` execs) with `devices:` (the gateway on the broker) and
`aggregation:` (a rules file) in its node.yaml. Two `device_sdk.DeviceClient` cameras:

- gate-a, whose clock runs an hour ahead: a person (its track 7) walks into the yard
  zone; later a car with plate "AB 123" drives through;
- gate-b, on time: a person (track 3) crosses the door line, its frames 7 and 8
  delivered out of order (within the allowed lateness: the crossing is still at frame
  7, the first on the new side, not at 8, the first that arrived there); an untracked
  person crosses too (never a crossing); the car "AB123" leaves here Δt after gate-a.

Every message gate-a sent is published again, byte for byte, by a raw MQTT client (a
resend: the same message ids). The control plane is stopped before the car drives
through: its transit waits in the node's outbox and is stored once the control plane is
back. `edgefleet events list --json` must then show exactly the three events, once
each, with their cameras' models and firmware and the frames behind them.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from control_plane.cli.client import ApiClient
from control_plane.cli.main import main as cli_main
from control_plane.cli.release import ReleaseClient
from control_plane.trust.keys import init_operator_keys
from device_sdk.backoff import BackoffPolicy
from device_sdk.client import ClientConfig, Detection, DeviceClient
from device_sdk.transport import MqttSettings
from tests.conftest import free_port, missing_service, wait_for_port
from tests.edge_node.agent.test_agent_devices import SkewedClock, clear_retained

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
BROKER_PORT = 1883
FLEET = "gates"
SKEW_S = 3600.0  # gate-a's clock minus the node's
STEP_S = 0.04  # between frames of one camera
TRANSIT_S = 1.5  # the car's time from gate-a to gate-b
LOG_TAIL = 3000
RULES = """\
version: 1
# Cameras bring their own track ids; the node's tracker would give the untracked person one.
tracker: {enabled: false}
time: {allowed_lateness: 300ms, idle_timeout: 1s}
cameras: [gate-a, gate-b]
rules:
  - {id: yard, type: zone_intrusion, camera: gate-a, classes: [person],
     zone: [[0.6, 0], [1, 0], [1, 1], [0.6, 1]]}
  - {id: door, type: line_crossing, camera: gate-b, classes: [person],
     line: [[0.5, 0], [0.5, 1]]}
  - {id: gates, type: correlation, entry: [gate-a], exit: [gate-b], within: 10m,
     classes: [car]}
"""


class World:
    """The control plane and node processes, their logs, and bounded waits on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "server"
        self.ports = {"http": free_port(), "grpc": free_port(), "enroll": free_port()}
        self.url = f"http://127.0.0.1:{self.ports['http']}"
        self.server: subprocess.Popen[bytes] | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.server_log = root / "server.log"
        self.node_log = root / "node.log"
        self.token = ""

    def logs(self) -> str:
        out = []
        for name, path, process in (
            ("node", self.node_log, self.node),
            ("control plane", self.server_log, self.server),
        ):
            text = path.read_text(errors="replace")[-LOG_TAIL:] if path.exists() else "(none)"
            code = None if process is None else process.poll()
            out.append(f"\n--- {name} (exit {code}) {path}:\n{text}")
        return "".join(out)

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.node is not None and self.node.poll() is not None:
                raise AssertionError(f"the node exited while waiting for {what}{self.logs()}")
            found = check()
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"waited {timeout_s:.0f} s for {what}{self.logs()}")

    def start_server(self) -> None:
        ports = self.ports
        with self.server_log.open("ab") as log:
            self.server = subprocess.Popen(
                [
                    *(sys.executable, "-m", "control_plane.cli.main", "server"),
                    *("--data-dir", str(self.data), "--http", f"127.0.0.1:{ports['http']}"),
                    *("--grpc", f"127.0.0.1:{ports['grpc']}"),
                    *("--grpc-enroll", f"127.0.0.1:{ports['enroll']}"),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = self.server

        def ready() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"the control plane exited at start{self.logs()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        self.wait("the control plane to be ready", ready, 20)
        self.token = (self.data / "admin-token").read_text().strip()

    def stop_server(self) -> None:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        self.server.wait(timeout=15)

    def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        response = httpx.get(f"{self.url}{path}", headers=headers, timeout=5)
        response.raise_for_status()
        return response.json()

    def events(self) -> list[dict[str, Any]]:
        return list(self.get(f"/v1/fleets/{FLEET}/events?limit=100")["events"])

    def records(self, kind: str) -> list[tuple[str, datetime, datetime, bytes]]:
        """The node records the control plane stored (read only, beside the server): id,
        when the node wrote it to its outbox, when it arrived, payload; oldest first."""
        uri = f"{(self.data / 'edgefleet.db').as_uri()}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            rows = db.execute(
                "SELECT record_id, created_at, received_at, payload FROM node_records"
                " WHERE kind = ? ORDER BY seq",
                (kind,),
            ).fetchall()
        return [(r[0], _utc(r[1]), _utc(r[2]), bytes(r[3])) for r in rows]

    def health(self) -> dict[str, Any] | None:
        """The node's newest health report at the control plane."""
        reports = self.records("health")
        return json.loads(reports[-1][3]) if reports else None


def _utc(stored: str) -> datetime:
    moment = datetime.fromisoformat(stored)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@contextmanager
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        for process in (w.node, w.server):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def node_yaml(w: World, root: str, client_id: str) -> Path:
    rules = w.root / "rules.yaml"
    rules.write_text(RULES)
    config = {
        "data_dir": str(w.root / "node"),
        "fleet": FLEET,
        "server_grpc": f"127.0.0.1:{w.ports['grpc']}",
        "enroll_grpc": f"127.0.0.1:{w.ports['enroll']}",
        "ca_file": str(w.data / "ca" / "ca.crt"),
        "health_interval_s": 1,
        "shutdown_deadline_s": 5,
        "updater": {"enabled": False},
        "aggregation": {"enabled": True, "rules_file": str(rules), "tick_s": 0.05},
        "devices": {
            "port": BROKER_PORT,
            "topic_root": root,
            "client_id": client_id,
            "session_expiry_s": 0,
            "cameras": {"gate-a": None, "gate-b": None},
        },
    }
    path = w.root / "node.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


class Recorder:
    """A raw MQTT client that keeps every results message it sees, to publish them again."""

    def __init__(self, topic: str) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_: self._subscribed.set()
        self._client.connect("127.0.0.1", BROKER_PORT)
        self._client.loop_start()
        self._client.subscribe(topic, qos=1)
        assert self._subscribed.wait(5), "the recorder's subscription was not acknowledged"

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, bytes(message.payload)))

    def taken(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.messages)

    def resend(self, messages: list[tuple[str, bytes]]) -> None:
        for topic, payload in messages:
            self._client.publish(topic, payload, qos=1).wait_for_publish(5)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def camera(device_id: str, root: str, firmware: str, clock: Any = None) -> DeviceClient:
    return DeviceClient(
        ClientConfig(
            device_id,
            mqtt=MqttSettings(port=BROKER_PORT),
            backoff=BackoffPolicy(base_s=0.05, cap_s=0.2),
            topic_root=root,
            firmware_version=firmware,
            heartbeat_interval_s=0.1,
        ),
        clock=clock,
    )


def offset_learned(cam: DeviceClient, offset_s: float) -> bool:
    estimate = cam.stats().clock
    return estimate.samples >= 2 and abs(estimate.offset_us / 1e6 - offset_s) < 0.05


def publish(
    cam: DeviceClient, frames: list[tuple[int, float, list[Detection]]], model: str
) -> None:
    for seq, captured, detections in frames:
        assert cam.publish_result(seq, captured, detections, model=model, model_version="1.4")
    assert cam.flush(5.0), "a camera did not get its results to the broker"


def iso(moment: str) -> float:
    return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()


def test_cameras_to_stored_events_once_each_across_a_control_plane_outage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not wait_for_port(BROKER_PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{BROKER_PORT}")
    root = f"t-{uuid.uuid4().hex[:10]}/edgefleet/dev"
    recorder = Recorder(f"{root}/gate-a/results")
    gate_a = camera("gate-a", root, "fw-2.3", SkewedClock())
    gate_b = camera("gate-b", root, "fw-9.1")
    try:
        with world(tmp_path) as w:
            # The control plane, a fleet, a bootstrap token; the node enrolls and connects.
            w.start_server()
            keys = init_operator_keys(
                tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None
            )
            with ApiClient(w.url, w.token) as api:
                ReleaseClient(api, keys).create_fleet(FLEET)
                token = api.json(
                    "POST", f"/v1/fleets/{FLEET}/node-tokens", json={"labels": {}, "ttl_s": 600}
                )
            env = {**os.environ, "EDGEFLEET_NODE_BOOTSTRAP_TOKEN": token["token"]}
            config = node_yaml(w, root, f"gw-{uuid.uuid4().hex[:10]}")
            with w.node_log.open("ab") as log:
                w.node = subprocess.Popen(
                    [sys.executable, "-m", "edge_node", "run", "--config", str(config)],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            identity = tmp_path / "node" / "identity.json"
            w.wait("the node to enroll", identity.exists, 20)
            node_id = str(json.loads(identity.read_text())["node_id"])
            w.wait("the node to be online", lambda: w.get(f"/v1/nodes/{node_id}")["online"], 15)

            # Both cameras learn their clock offset; a heartbeat tells the node gate-a's.
            gate_a.start()
            gate_b.start()
            w.wait("gate-a's clock estimate", lambda: offset_learned(gate_a, SKEW_S), 10)
            w.wait("gate-b's clock estimate", lambda: offset_learned(gate_b, 0.0), 10)
            for cam in (gate_a, gate_b):
                assert cam.publish_heartbeat() is not None and cam.flush(5.0)

            # gate-a: a person (track 7) walks into the zone; feet in it from frame 10 on.
            start_a = time.time() + SKEW_S
            walk = [
                (n, start_a + n * STEP_S, [Detection("person", 0.9, (x, 0.2, x + 0.1, 0.9), 7)])
                for n, x in ((n, 0.07 + n * 0.05) for n in range(16))
            ]
            # gate-b: a person (track 3) crosses x = 0.5: centre 0.2 + 0.05n, so frame 6 is in
            # the hysteresis band and frame 7 the first beyond it; frame 8 is sent before 7.
            # Beside them an untracked person walks the other way (never a crossing).
            start_b = time.time()
            cross = {
                n: (
                    n,
                    start_b + n * STEP_S,
                    [
                        Detection("person", 0.9, (0.15 + n * 0.05, 0.3, 0.25 + n * 0.05, 0.8), 3),
                        Detection("person", 0.8, (0.75 - n * 0.05, 0.3, 0.85 - n * 0.05, 0.8)),
                    ],
                )
                for n in range(12)
            }
            order = [0, 1, 2, 3, 4, 5, 6, 8, 7, 9, 10, 11]
            publish(gate_a, walk, "people-cam")
            publish(gate_b, [cross[n] for n in order], "door-cam")

            def stored(count: int) -> Callable[[], bool]:
                return lambda: len(w.events()) >= count

            w.wait("the intrusion and the crossing at the control plane", stored(2), 15)

            # gate-a resends everything it sent (the same messages, the same ids).
            w.wait("the recorder to see gate-a's walk", lambda: len(recorder.taken()) >= 16, 5)
            recorder.resend(recorder.taken())

            # The control plane goes down; the car drives from gate-a to gate-b meanwhile.
            w.stop_server()
            down = datetime.now(UTC)
            entered = time.time()
            car = Detection("car", 0.95, (0.3, 0.4, 0.6, 0.7), 21, {"plate_text": "AB 123"})
            publish(
                gate_a, [(100 + n, entered + SKEW_S + n * STEP_S, [car]) for n in range(3)], "lpr"
            )
            left = entered + TRANSIT_S
            while time.time() < left:  # the car's transit: event times are capture times
                time.sleep(0.05)
            car_b = Detection("car", 0.9, (0.4, 0.4, 0.7, 0.7), 5, {"plate_text": "AB123"})
            publish(gate_b, [(200 + n, left + n * STEP_S, [car_b]) for n in range(3)], "lpr")
            recorder.resend(recorder.taken()[-3:])  # and the car's frames at gate-a again

            # Back up (its start takes seconds: the node raises the transit meanwhile, into
            # its outbox): the transit arrives; nothing was lost, nothing is there twice.
            w.start_server()
            back = datetime.now(UTC)
            w.wait("the transit after the control plane came back", stored(3), 20)

            def settled() -> dict[str, Any] | None:
                report = w.health()
                if report is None or report["devices"]["rejected"]["duplicate"] < 19:
                    return None
                return report

            health = w.wait("a health report that counts the resent messages", settled, 10)
            capsys.readouterr()
            argv = ["--server", w.url, "--token", w.token, "events", "list", "--fleet", FLEET]
            assert cli_main([*argv, "--json"]) == 0
            events: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
            records = w.records("event")
            assert len(records) == 3
            assert w.node is not None
            w.node.send_signal(signal.SIGTERM)
            assert w.node.wait(timeout=20) == 0, w.logs()
    finally:
        gate_a.close(2.0)
        gate_b.close(2.0)
        recorder.close()
        for device in ("gate-a", "gate-b"):
            clear_retained(f"{root}/{device}/config")

    # The node's own account: every resent message refused as a duplicate, nothing too
    # late (frame 7 was reordered within the lateness), one event of each type.
    devices, aggregation = health["devices"], health["aggregation"]
    assert devices["rejected"] == {**devices["rejected"], "duplicate": 19}
    assert sum(devices["rejected"].values()) == 19, devices["rejected"]
    assert (aggregation["too_late"], aggregation["duplicates"]) == (0, 0)
    assert aggregation["events"] == {"zone.intrusion": 1, "line.crossed": 1, "transit.completed": 1}

    by_type = {e["type"]: e for e in events}
    assert sorted(e["type"] for e in events) == [
        "line.crossed",
        "transit.completed",
        "zone.intrusion",
    ], json.dumps(events, indent=1)
    assert len({e["event_id"] for e in events}) == 3
    assert {e["node"] for e in events} == {node_id}

    intrusion = by_type["zone.intrusion"]
    assert intrusion["rule_id"] == "yard"
    assert intrusion["entities"] == [
        {"kind": "track", "id": "gate-a/7", "class_name": "person", "camera": "gate-a"}
    ]
    assert intrusion["provenance"] == [
        {"origin": "device", "model": "people-cam", "model_version": "1.4", "firmware": "fw-2.3"}
    ]
    first = intrusion["evidence"][0]
    assert (first["camera"], first["frame_seq"]) == ("gate-a", 10)
    # At the node's time of frame 10: the camera's stamp less its hour.
    assert iso(intrusion["occurred_at"]) == pytest.approx(walk[10][1] - SKEW_S, abs=0.05)

    crossing = by_type["line.crossed"]
    assert crossing["rule_id"] == "door"
    assert [e["id"] for e in crossing["entities"]] == ["gate-b/3"]
    assert crossing["provenance"] == [
        {"origin": "device", "model": "door-cam", "model_version": "1.4", "firmware": "fw-9.1"}
    ]
    # The last frame before the line (5; 6 is in the hysteresis band), the first beyond it
    # and the one that confirmed it: 7 (sent after 8) first, so in event-time order.
    assert [e["frame_seq"] for e in crossing["evidence"]] == [5, 7, 8], crossing["evidence"]
    assert iso(crossing["occurred_at"]) == iso(crossing["evidence"][1]["captured_at"])
    # (gate-b's clock is the node's, give or take its offset estimate's error)
    assert iso(crossing["occurred_at"]) == pytest.approx(cross[7][1], abs=0.05)

    transit = by_type["transit.completed"]
    assert transit["rule_id"] == "gates"
    assert [(e["kind"], e["id"]) for e in transit["entities"]] == [("plate", "AB123")]
    assert {e["camera"] for e in transit["evidence"]} == {"gate-a", "gate-b"}
    assert [e["frame_seq"] for e in transit["evidence"]] == [100, 200]
    # Δt on one clock: gate-a's hour is taken off before the two are compared.
    assert transit["values"]["delta_s"] == pytest.approx(TRANSIT_S, abs=0.05)
    models = {(p["model"], p["firmware"]) for p in transit["provenance"]}
    assert models == {("lpr", "fw-2.3"), ("lpr", "fw-9.1")}
    # Written to the node's outbox while the control plane was down, sent once it was back.
    [(_, created, received, _)] = [r for r in records if r[0] == transit["record_id"]]
    assert down < created < back < received, (down, created, back, received)
