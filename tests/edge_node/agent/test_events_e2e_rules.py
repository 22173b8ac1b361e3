"""Issue 14 §3, more rules end to end through one real node: dwell, an overdue transit,
frames too late to apply and frames out of order within the allowed lateness.

The same world as `test_events_e2e` (the shared Mosquitto under a topic root of its own,
`edgefleet server`, `python -m edge_node run` with `devices:` and a rules file), its
fixtures reused, a short rules file of its own, and several cases through one node so the
whole takes seconds:

- dwell: gate-a sees a person (track 7) in the yard for 1.5 s with ``min_time: 1s``, its
  frames 5 and 6 sent swapped (within the 300 ms lateness: applied, counted
  ``late_applied``): one ``zone.loitering`` event, at frame 10 (1 s after the visit began);
- overdue: a car with plate "XY 9" at gate-a, never at gate-b, ``within: 1s``: one
  ``transit.overdue`` once later frames move the watermark past entry + 1 s;
- too late: the car at gate-b, stamped 0.3 s after its entry (it would complete the
  transit) but sent after gate-b's frames up to entry + 1 s, beyond the lateness: taken by
  the gateway (inside its limits), counted ``too_late`` by the aggregation, visible in the
  node's health at the control plane, not applied (the journey stays overdue).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from control_plane.cli.client import ApiClient
from control_plane.cli.release import ReleaseClient
from control_plane.trust.keys import init_operator_keys
from device_sdk.client import Detection
from tests.conftest import missing_service, wait_for_port
from tests.edge_node.agent.test_agent_devices import clear_retained
from tests.edge_node.agent.test_events_e2e import (
    BROKER_PORT,
    FLEET,
    REPO,
    camera,
    iso,
    node_yaml,
    offset_learned,
    publish,
    world,
)

pytestmark = [pytest.mark.slow]

STEP_S = 0.1
RULES = """\
version: 1
tracker: {enabled: false}
time: {allowed_lateness: 300ms, idle_timeout: 1s}
cameras: [gate-a, gate-b]
rules:
  - {id: loiter, type: dwell, camera: gate-a, classes: [person], min_time: 1s,
     zone: [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}
  - {id: gates, type: correlation, entry: [gate-a], exit: [gate-b], within: 1s,
     classes: [car]}
"""


def test_dwell_overdue_too_late_and_reordered_frames_through_one_node(tmp_path: Path) -> None:
    if not wait_for_port(BROKER_PORT, timeout=2):
        missing_service(f"Mosquitto on 127.0.0.1:{BROKER_PORT}")
    root = f"t-{uuid.uuid4().hex[:10]}/edgefleet/dev"
    gate_a = camera("gate-a", root, "fw-2.3")
    gate_b = camera("gate-b", root, "fw-9.1")
    try:
        with world(tmp_path) as w:
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
            (w.root / "rules.yaml").write_text(RULES)  # this test's rules, same file
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
            gate_a.start()
            gate_b.start()
            for cam in (gate_a, gate_b):
                w.wait("the cameras' clock estimates", partial(offset_learned, cam, 0.0), 10)
                assert cam.publish_heartbeat() is not None and cam.flush(5.0)

            # Dwell (with 5 and 6 swapped) and the car at gate-a in one stream of frames.
            start = time.time()
            person = Detection("person", 0.9, (0.1, 0.2, 0.2, 0.9), 7)
            dwell = {n: (n, start + n * STEP_S, [person]) for n in range(16)}
            order = [0, 1, 2, 3, 4, 6, 5, *range(7, 16)]
            publish(gate_a, [dwell[n] for n in order], "people-cam")
            car = Detection("car", 0.95, (0.6, 0.4, 0.9, 0.7), 21, {"plate_text": "XY 9"})
            entered = time.time()
            publish(gate_a, [(100 + n, entered + n * STEP_S, [car]) for n in range(3)], "lpr")
            # gate-b: frames with nothing in them up to entry + 1 s; then the car, stamped
            # entry + 0.3 s (it would close the journey: a transit) but 0.7 s behind gate-b's
            # newest, beyond the 300 ms lateness: too late, counted, not applied.
            while time.time() < entered + 1.0:
                time.sleep(0.02)
            publish(gate_b, [(300 + n, entered + 0.8 + n * 0.1, []) for n in range(3)], "lpr")
            late = Detection("car", 0.9, (0.4, 0.4, 0.7, 0.7), 5, {"plate_text": "XY9"})
            publish(gate_b, [(299, entered + 0.3, [late])], "lpr")
            # Later frames on both move the watermark past the car's entry + 1 s.
            while time.time() < entered + 1.5:
                time.sleep(0.05)
            for cam, seq in ((gate_a, 400), (gate_b, 500)):
                publish(cam, [(seq + n, time.time() + n * STEP_S, []) for n in range(3)], "lpr")

            w.wait("the dwell and the overdue transit", lambda: len(w.events()) >= 2, 15)

            def settled() -> dict[str, Any] | None:
                report = w.health()
                if report is None or report["aggregation"]["too_late"] < 1:
                    return None
                if sum(report["aggregation"]["events"].values()) < 2:
                    return None
                return report

            health = w.wait("a health report with the late frame and the events", settled, 10)
            time.sleep(0.5)  # anything raised twice would be stored by now
            events = w.events()
            assert w.node is not None
            w.node.send_signal(signal.SIGTERM)
            assert w.node.wait(timeout=20) == 0, w.logs()
    finally:
        gate_a.close(2.0)
        gate_b.close(2.0)
        for device in ("gate-a", "gate-b"):
            clear_retained(f"{root}/{device}/config")

    devices, aggregation = health["devices"], health["aggregation"]
    assert sum(devices["rejected"].values()) == 0, devices["rejected"]  # all taken
    assert aggregation["too_late"] == 1, aggregation
    assert aggregation["late_applied"] >= 1, aggregation  # frame 5, after 6
    assert aggregation["events"] == {"zone.loitering": 1, "transit.overdue": 1}, aggregation
    assert sorted(e["type"] for e in events) == ["transit.overdue", "zone.loitering"], events

    by_type = {e["type"]: e for e in events}
    loiter = by_type["zone.loitering"]
    assert loiter["rule_id"] == "loiter"
    assert [e["id"] for e in loiter["entities"]] == ["gate-a/7"]
    assert loiter["values"]["dwell_s"] == pytest.approx(1.0, abs=0.05)
    assert iso(loiter["occurred_at"]) == pytest.approx(dwell[10][1], abs=0.05)

    overdue = by_type["transit.overdue"]
    assert overdue["rule_id"] == "gates"
    assert [(e["kind"], e["id"]) for e in overdue["entities"]] == [("plate", "XY9")]
    assert {e["camera"] for e in overdue["evidence"]} == {"gate-a"}  # never seen leaving
    assert iso(overdue["occurred_at"]) == pytest.approx(entered + 1.0, abs=0.05)
