"""`make demo`: the registry on embedded defaults, driven through the real CLI.

Starts `edgefleet server` as a process (SQLite, local artifact store), creates
offline keys and a fleet, pushes a generated ONNX model, lists it, verifies it with
an unmodified TUF client that knows only the fleet's first root, and stops.
Everything lives under `.demo/` and is made fresh on each run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from tuf.ngclient import Updater

from control_plane.registry.sample_models import tiny_detector

DEMO_DIR = Path(".demo")
FLEET = "demo-parks"
STARTUP_TIMEOUT_S = 30.0


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


def main() -> int:
    if DEMO_DIR.exists():
        shutil.rmtree(DEMO_DIR)
    data, keys, work = DEMO_DIR / "server", DEMO_DIR / "keys", DEMO_DIR / "work"
    work.mkdir(parents=True)
    port = _free_port()
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
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
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
        }
        print(f"first admin token written once to {data / 'admin-token'} (mode 0600)")

        _step("offline keys: 3 root keys (any 2 sign root) and a release key")
        _cli(env, "keys", "init", "--out", str(keys))

        _step("a fleet whose root you sign; the server keeps only snapshot/timestamp keys")
        _cli(env, "fleet", "create", FLEET)

        _step("a generated ONNX model, checked, signed on this machine, uploaded")
        model = tiny_detector(work / "detector.onnx")
        _cli(env, "model", "push", str(model), "--name", "detector", "--version", "1.0.0")
        _cli(env, "model", "list")

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
  .venv/bin/edgefleet model push other.onnx --name detector --version 1.1.0
  .venv/bin/edgefleet model revoke detector 1.0.0
  .venv/bin/edgefleet token create --role viewer --name dashboard
  See docs/operator-guide.md for every command.""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
