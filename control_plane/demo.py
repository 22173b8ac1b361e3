"""`make demo`: the whole loop on embedded defaults, driven through the real CLI.

Starts `edgefleet server` as a process (SQLite, local artifact store, the gRPC node
link), creates offline keys and a fleet, pushes a generated ONNX model with its runtime
spec (preprocessing, output decoder, labels: signed with the version) and verifies it
with an unmodified TUF client that knows only the fleet's first root. Then an edge node
runs as its own process (`edgefleet node run`) with a camera drop directory: it enrolls
with a bootstrap token, is pinned to 1.0.0 and then, with every node of the fleet, to
1.1.0, whose input size and normalisation differ and are signed with it (each time:
signed assignment, download, self-test, hot swap while frames flow), and reports health
that `edgefleet nodes list` shows. Then 1.2.0, a box detector (the `yolo` decoder), goes
out as a canary rollout (`edgefleet rollout create`): the controller assigns it, the node
becomes healthy on it, a one-minute bake, and the gates (on the node's own numbers before
the update) pass it. Last, events: the node's node.yaml names a rules file (a zone, a
count per class per interval), so 1.2.0's detections become events in the node's outbox
and the control plane's event store, which `edgefleet events list` shows.
Everything lives under `.demo/` and is made fresh on each run; nothing is left running.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
from tuf.ngclient import Updater

from control_plane.registry.sample_models import (
    TINY_DETECTOR_LABELS,
    tiny_box_detector,
    tiny_detector,
)

DEMO_DIR = Path(".demo")
FLEET = "demo-parks"
STARTUP_TIMEOUT_S = 30.0
NODE_TIMEOUT_S = 90.0
# A rollout: the node's update and health reports, a one-minute bake (the shortest), and
# the gates' next evaluation after it (once a minute).
ROLLOUT_TIMEOUT_S = 240.0
ROLLOUT_ENDED = ("done", "paused", "aborted", "rolled-back")
# Health points on 1.1.0 before the rollout starts: the demo's gates need 5 pairs.
BASELINE_POINTS = 8
# A demo's minute of data: the gates' minimums lowered to it, memory not judged (a slope
# needs a quarter of an hour of points). 1.2.0 is a box detector with a heavier decoder
# than the classifier it replaces (about twice its sub-millisecond P99), so its latency
# is allowed four times its baseline; the other thresholds are the defaults.
DEMO_GATES = """\
min_samples: {baseline_pairs: 5, baseline_pairs_per_node: 5, frames: 100, node_hours: 0.01}
rss_slope: {enabled: false}
latency_vs_baseline: {max_increase: 3.0}
"""
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def _cli(env: dict[str, str], *args: str) -> None:
    shown = " ".join(["edgefleet", *args])
    print(f"$ {shown}", flush=True)
    subprocess.run([sys.executable, "-m", "control_plane.cli.main", *args], env=env, check=True)


def _wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited early with status {server.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the server did not become ready within {STARTUP_TIMEOUT_S:.0f}s")


CLASSIFICATION = """\
  decoder: classification
  top_k: 2
"""
# 1.2.0 finds boxes: its results go through the node's rules (RULES) and become events.
BOXES = """\
  decoder: yolo         # [1, 4 + classes, N] candidate boxes, cx cy w h in input pixels
  box_format: cxcywh
  objectness: false
  score_threshold: 0.5
"""
# The node's rules file: a person's feet in the right half of the frame (where the demo's
# box detector puts them) is an intrusion; the detections per class every 5 s, a count.
RULES = """\
version: 1
cameras: [gate-north]
rules:
  - {id: north-yard, type: zone_intrusion, camera: gate-north, classes: [person],
     zone: [[0.5, 0], [1, 0], [1, 1], [0.5, 1]]}
  - {id: north-counts, type: count, cameras: [gate-north], interval: 5s}
"""
EVENTS_TIMEOUT_S = 30.0


def _runtime_file(work: Path, name: str, mean: str, std: str, output: str = CLASSIFICATION) -> Path:
    """An operator's runtime.yaml for the demo's detector, and its labels file."""
    labels = work / "labels.txt"
    labels.write_text("".join(f"{label}\n" for label in TINY_DETECTOR_LABELS))
    path = work / name
    path.write_text(
        f"""# How {name.removesuffix(".yaml")} is run: signed into the version's TUF custom field.
preprocess:
  layout: NCHW          # size: the model's own (its input is fixed)
  mean: {mean}
  std: {std}
output:
{output}labels_file: labels.txt  # one per line, class 0 first; relative to this file
"""
    )
    print(f"{path}:\n{path.read_text()}")
    return path


def main() -> int:
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)
    data, keys, work = DEMO_DIR / "server", DEMO_DIR / "keys", DEMO_DIR / "work"
    work.mkdir(parents=True)
    port, grpc_port, enroll_port = _free_port(), _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"

    _step(f"starting the control plane on {url} (SQLite + local artifact store in {data})")
    log = (DEMO_DIR / "server.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "control_plane.cli.main",
            "server",
            "--data-dir",
            str(data),
            "--http",
            f"127.0.0.1:{port}",
            "--grpc",
            f"127.0.0.1:{grpc_port}",
            "--grpc-enroll",
            f"127.0.0.1:{enroll_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # The rollout controller steps every second (default 10 s): a demo's pace.
        env={**os.environ, "EDGEFLEET_ROLLOUT_INTERVAL_S": "1"},
    )
    try:
        _wait_ready(url, server)
        token = (data / "admin-token").read_text().strip()
        env = {
            **os.environ,
            "EDGEFLEET_SERVER": url,
            "EDGEFLEET_TOKEN": token,
            "EDGEFLEET_KEYS": str(keys),
            "EDGEFLEET_FLEET": FLEET,
            # Tables as wide as a terminal, also when `make` gives the CLI none.
            "COLUMNS": os.environ.get("COLUMNS", "150"),
        }
        print(f"first admin token written once to {data / 'admin-token'} (mode 0600)")

        _step("offline keys: 3 root keys (any 2 sign root) and a release key")
        _cli(env, "keys", "init", "--out", str(keys))

        _step("a fleet whose root you sign; the server keeps only snapshot/timestamp keys")
        _cli(env, "fleet", "create", FLEET)

        _step("a generated ONNX model and how to run it: checked, signed here, uploaded")
        model = tiny_detector(work / "detector.onnx")
        runtime = _runtime_file(
            work, "runtime-1.0.0.yaml", "[0.485, 0.456, 0.406]", "[0.229, 0.224, 0.225]"
        )
        _cli(
            env,
            "model",
            "push",
            str(model),
            "--name",
            "detector",
            "--version",
            "1.0.0",
            "--runtime",
            str(runtime),
        )

        _step("an unmodified TUF client, given only the fleet's first root, verifies it")
        root = httpx.get(f"{url}/v1/fleets/{FLEET}/tuf/metadata/1.root.json", timeout=10)
        root.raise_for_status()
        (work / "tuf").mkdir()
        updater = Updater(
            metadata_dir=str(work / "tuf"),
            metadata_base_url=f"{url}/v1/fleets/{FLEET}/tuf/metadata/",
            target_base_url=f"{url}/v1/fleets/{FLEET}/tuf/targets/",
            target_dir=str(work),
            bootstrap=root.content,
        )
        updater.refresh()
        info = updater.get_targetinfo("models/detector/1.0.0/model.onnx")
        if info is None:
            raise SystemExit("the TUF client did not find the pushed model")
        path = Path(updater.download_target(info, filepath=str(work / "verified.onnx")))
        same = path.read_bytes() == model.read_bytes()
        print(
            f"verified {info.path}: {info.length} bytes, sha256 {info.hashes['sha256'][:16]}…,"
            f" release counter {info.custom['release_counter']}, identical: {same}"
        )
        if not same:
            return 1

        _int8_release(env, work, model, runtime)

        if not _run_node(env, url, data, work, model, grpc_port, enroll_port):
            return 1

        _step("the audit log: who did what")
        _cli(env, "audit", "list", "--limit", "10")
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    _step("what to try next")
    print(f"""  .venv/bin/edgefleet server --data-dir {data}            # start it again, same state
  export EDGEFLEET_SERVER=http://127.0.0.1:8080 EDGEFLEET_TOKEN=$(cat {data}/admin-token)
  export EDGEFLEET_KEYS={keys} EDGEFLEET_FLEET={FLEET}
  .venv/bin/edgefleet model show detector --version 1.0.0 -o json
  .venv/bin/edgefleet model push other.onnx --name detector --version 1.2.0 --runtime runtime.yaml
  .venv/bin/edgefleet model revoke detector 1.0.0
  .venv/bin/edgefleet token create --role viewer --name dashboard
  .venv/bin/edgefleet node run --config {DEMO_DIR}/work/node.yaml   # the node again
  .venv/bin/edgefleet nodes show <node id>; edgefleet alerts list
  .venv/bin/edgefleet rollout list; edgefleet rollout watch 1
  See docs/operator-guide.md for every command.""")
    return 0


def _int8_release(env: dict[str, str], work: Path, model: Path, runtime: Path) -> None:
    """An INT8 build of 1.0.0: quantized on camera-like images through 1.0.0's own
    preprocessing, then pushed only with a passing comparison against the FP32 model."""
    _step("an INT8 build of 1.0.0: quantized, compared with FP32, signed with its release check")
    calibration, held_out = work / "calibration", work / "held-out"
    _scenes(calibration, seed=1)
    _scenes(held_out, seed=2)
    int8 = work / "detector-int8.onnx"
    quantize = ("model", "quantize", str(model), "--calibration", str(calibration))
    _cli(env, *quantize, "--out", str(int8), "--runtime", str(runtime))
    push = ("model", "push", str(int8), "--name", "detector", "--version", "1.0.1-int8")
    _cli(env, *push, "--runtime", str(runtime), "--baseline", str(model), "--data", str(held_out))


def _scenes(directory: Path, seed: int, count: int = 24) -> None:
    """Small PNG frames from dark to bright with texture: a calibration or held-out set."""
    import numpy as np
    from PIL import Image

    directory.mkdir()
    rng = np.random.default_rng(seed)
    for index in range(count):
        level = 20 + 215 * index / (count - 1)  # night to glare
        pixels = level + rng.normal(0.0, 12 + 30 * rng.random(), (64, 64, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(directory / f"{index}.png")


def _run_node(
    env: dict[str, str],
    url: str,
    data: Path,
    work: Path,
    model: Path,
    grpc_port: int,
    enroll_port: int,
) -> bool:
    """An edge node process through enrollment, two updates and health reports."""
    headers = {"Authorization": f"Bearer {env['EDGEFLEET_TOKEN']}"}
    _step("an edge node: a bootstrap token, a node.yaml, `edgefleet node run`")
    print(f"$ edgefleet node token create --fleet {FLEET} --labels site=north")
    created = httpx.post(
        f"{url}/v1/fleets/{FLEET}/node-tokens",
        json={"labels": {"site": "north"}, "ttl_s": 3600},
        headers=headers,
        timeout=10,
    )
    created.raise_for_status()
    camera = work / "camera"
    camera.mkdir()
    node_dir = DEMO_DIR / "node"
    rules = work / "rules.yaml"
    rules.write_text(RULES)
    config = work / "node.yaml"
    config.write_text(
        f"""data_dir: {node_dir.resolve()}
fleet: {FLEET}
server_grpc: 127.0.0.1:{grpc_port}
enroll_grpc: 127.0.0.1:{enroll_port}
ca_file: {(data / "ca" / "ca.crt").resolve()}
health_interval_s: 2
runtime:
  streams:
    - name: gate-north
      target_fps: 5
      source:
        url: file://{camera.resolve()}
        settle_s: 0.2
        after_read: delete
updater:
  watchdog: {{window_s: 2}}
results:
  interval_s: 2
aggregation:
  rules_file: {rules.resolve()}
"""
    )
    print(config.read_text())
    print(f"{rules}:\n{RULES}")
    node_log = (DEMO_DIR / "node.log").open("wb")
    node = subprocess.Popen(
        [sys.executable, "-m", "edge_node", "run", "--config", str(config)],
        env={**env, "EDGEFLEET_NODE_BOOTSTRAP_TOKEN": created.json()["token"]},
        stdout=node_log,
        stderr=subprocess.STDOUT,
    )
    frames = Camera(camera)
    try:
        node_id = _wait_for(
            lambda: _enrolled(node_dir, url, headers), node, "the node to enroll and connect"
        )
        print(f"node {node_id} enrolled (mTLS certificate from the fleet CA) and online")
        _step("pin the node to 1.0.0: signed assignment, download, self-test, serve")
        _cli(env, "nodes", "pin", node_id, "--model", "detector", "--version", "1.0.0")
        _wait_for(lambda: _updated(url, headers, node_id, "1.0.0", frames), node, "1.0.0")

        _step("1.1.0 (48x48 input, mean/std 0.5) to every node: a hot swap while frames flow")
        newer = tiny_detector(work / "detector-1.1.0.onnx", seed=1, size=48)
        runtime = _runtime_file(work, "runtime-1.1.0.yaml", "0.5", "0.5")
        _cli(
            env,
            "model",
            "push",
            str(newer),
            "--name",
            "detector",
            "--version",
            "1.1.0",
            "--runtime",
            str(runtime),
        )
        _cli(env, "model", "show", "detector")
        _cli(
            env,
            "nodes",
            "pin",
            "--fleet",
            FLEET,
            "--all",
            "--model",
            "detector",
            "--version",
            "1.1.0",
        )
        _wait_for(lambda: _updated(url, headers, node_id, "1.1.0", frames), node, "1.1.0")

        _step("health: latency per model version, drift, RSS and its trend, alerts")
        _wait_for(lambda: _health_seen(url, headers, frames), node, "a health report")
        _cli(env, "nodes", "list")
        _cli(env, "nodes", "health", node_id, "--since", "10m")

        _step("what the model sees: a sample of its decoded results, named by version")
        _wait_for(lambda: _results_seen(url, headers, node_id, "1.1.0", frames), node, "results")
        _cli(env, "nodes", "results", node_id, "--limit", "3")

        # The canary is judged against its own numbers before the update: let the node
        # report enough of them on 1.1.0 first (the gates pair them with the ones after).
        _wait_for(
            lambda: _baseline_ready(url, headers, node_id, "detector@1.1.0", frames),
            node,
            "a baseline on 1.1.0",
        )
        if not _rollout(env, url, headers, work, node, frames):
            return False

        _step("events: 1.2.0's boxes through the node's rules, stored by the control plane")
        _wait_for(lambda: _events_seen(url, headers, frames), node, "events", EVENTS_TIMEOUT_S)
        _cli(env, "events", "list", "--fleet", FLEET, "--type", "zone.intrusion", "--limit", "2")
        _cli(env, "events", "list", "--fleet", FLEET, "--type", "count.interval", "--limit", "3")
        return True
    finally:
        node.terminate()
        try:
            node.wait(timeout=20)
        except subprocess.TimeoutExpired:
            node.kill()
        node_log.close()


class Camera:
    """Drops a JPEG frame (48x64 of noise) into a node's camera directory each time it is
    asked; written aside and renamed in, so a node never reads half of one. The rollout
    e2e test feeds its node processes with it too."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._count = 0

    def shoot(self) -> None:
        from io import BytesIO

        import numpy as np
        from PIL import Image

        self._count += 1
        rng = np.random.default_rng(self._count)
        pixels = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
        buffer = BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG")
        tmp = self._directory / f".frame-{self._count:06d}.tmp"
        tmp.write_bytes(buffer.getvalue())
        tmp.rename(self._directory / f"frame-{self._count:06d}.jpg")


def _rollout(
    env: dict[str, str],
    url: str,
    headers: dict[str, str],
    work: Path,
    node: subprocess.Popen[bytes],
    camera: Camera,
) -> bool:
    """1.2.0 as a canary rollout over the fleet: planned, created, followed to its end."""
    _step("1.2.0, a box detector, as a canary rollout: one node first, judged by the gates")
    newest = tiny_box_detector(work / "detector-1.2.0.onnx", size=48)
    runtime = _runtime_file(work, "runtime-1.2.0.yaml", "0.5", "0.5", BOXES)
    push = ("model", "push", str(newest), "--name", "detector", "--version", "1.2.0")
    _cli(env, *push, "--runtime", str(runtime))
    gates = work / "gates.yaml"
    gates.write_text(DEMO_GATES)
    print(f"{gates}:\n{DEMO_GATES}")
    options = [
        *("rollout", "create", "--fleet", FLEET, "--model", "detector", "--version", "1.2.0"),
        *("--stages", "1,100%", "--bake", "1m", "--control", "auto", "--gates", str(gates)),
    ]
    _cli(env, *options, "--dry-run")
    _cli(env, *options)
    listed = httpx.get(f"{url}/v1/fleets/{FLEET}/rollouts", headers=headers, timeout=10).json()
    rollout_id = str(listed[0]["id"])
    print(f"following rollout {rollout_id} (the controller steps it every second)")
    seen: list[str] = []

    def ended() -> str | None:
        camera.shoot()
        found = httpx.get(f"{url}/v1/rollouts/{rollout_id}", headers=headers, timeout=10)
        found.raise_for_status()
        body = found.json()
        status = str(body["status"])
        line = f"rollout {rollout_id}: {body.get('label') or status}"
        if not seen or seen[-1] != line:
            seen.append(line)
            print(line, flush=True)
        return status if status in ROLLOUT_ENDED else None

    status = _wait_for(ended, node, f"rollout {rollout_id}", ROLLOUT_TIMEOUT_S)
    _cli(env, "rollout", "status", rollout_id)
    return status == "done"


def _wait_for(
    check: Callable[[], T | None],
    node: subprocess.Popen[bytes],
    what: str,
    timeout_s: float = NODE_TIMEOUT_S,
) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise SystemExit(
                f"the node exited with status {node.returncode}; see {DEMO_DIR / 'node.log'}"
            )
        found = check()
        if found is not None:
            return found
        time.sleep(0.3)
    raise SystemExit(f"waited {timeout_s:.0f}s for {what}; see {DEMO_DIR / 'node.log'}")


def _enrolled(node_dir: Path, url: str, headers: dict[str, str]) -> str | None:
    identity = node_dir / "identity.json"
    if not identity.exists():
        return None
    node_id = str(json.loads(identity.read_text())["node_id"])
    answer = httpx.get(f"{url}/v1/nodes/{node_id}", headers=headers, timeout=10)
    return node_id if answer.status_code == 200 and answer.json().get("online") else None


def _updated(
    url: str, headers: dict[str, str], node_id: str, version: str, camera: Camera
) -> str | None:
    camera.shoot()
    node = httpx.get(f"{url}/v1/nodes/{node_id}", headers=headers, timeout=10).json()
    update = (node.get("reported_state") or {}).get("update") or {}
    if update.get("phase") == "failed":
        raise SystemExit(f"the update failed on the node: {update.get('detail')}")
    target = f"models/detector/{version}/model.onnx"
    if update.get("phase") == "active" and update.get("target_path") == target:
        print(f"node {node_id}: {target} active ({update.get('detail') or 'committed'})")
        return target
    return None


def _results_seen(
    url: str, headers: dict[str, str], node_id: str, version: str, camera: Camera
) -> str | None:
    """A sampled result of `version` reached the control plane."""
    camera.shoot()
    response = httpx.get(f"{url}/v1/nodes/{node_id}/results", headers=headers, timeout=10)
    for result in response.json() if response.status_code == 200 else []:
        if result.get("version") == version:
            return str(result["model_label"])
    return None


def _events_seen(url: str, headers: dict[str, str], camera: Camera) -> str | None:
    """An intrusion and a count of 1.2.0's detections are in the control plane's store."""
    camera.shoot()
    seen = []
    for kind in ("zone.intrusion", "count.interval"):
        response = httpx.get(
            f"{url}/v1/fleets/{FLEET}/events",
            params={"type": kind, "limit": 1},
            headers=headers,
            timeout=10,
        )
        events = response.json()["events"] if response.status_code == 200 else []
        if not events:
            return None
        seen.append(str(events[0]["event_id"]))
    return " ".join(seen)


def _baseline_ready(
    url: str, headers: dict[str, str], node_id: str, label: str, camera: Camera
) -> int | None:
    """The health store holds `BASELINE_POINTS` points with latency of `label` (what the
    demo's gates pair with the canary's after the update; they need 5)."""
    camera.shoot()
    answer = httpx.get(
        f"{url}/v1/nodes/{node_id}/health", params={"since": "10m"}, headers=headers, timeout=10
    )
    answer.raise_for_status()
    points = answer.json()["points"]
    found = sum(1 for point in points if label in json.dumps(point.get("latency") or {}))
    return found if found >= BASELINE_POINTS else None


def _health_seen(url: str, headers: dict[str, str], camera: Camera) -> str | None:
    """The control plane's health store turned a report with frame latency into points
    (it processes reports some seconds after their ack: a settle window)."""
    camera.shoot()
    rows = httpx.get(f"{url}/v1/health/nodes", headers=headers, timeout=10).json()
    for row in rows:
        if row.get("health_at") and row.get("latency"):
            return str(row["health_at"])
    return None


if __name__ == "__main__":
    sys.exit(main())
