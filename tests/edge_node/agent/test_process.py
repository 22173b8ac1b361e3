"""`python -m edge_node run` as a real process: it enrolls, delivers health, and on SIGTERM
drains within its deadline, exits 0 and leaves an outbox the next start can open.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from edge_node.clock import SystemClock
from edge_node.outbox import Outbox
from tests.control_plane.link.grpc_support import until
from tests.edge_node.agent.support import control_plane, write_ca

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
DEADLINE_S = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_sigterm_drains_and_exits_zero_with_the_outbox_closed(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        data_dir = tmp_path / "node"
        config_file = tmp_path / "node.yaml"
        config_file.write_text(
            json.dumps(  # JSON is YAML
                {
                    "data_dir": str(data_dir),
                    "fleet": "gates",
                    "server_grpc": plane.node_target,
                    "enroll_grpc": plane.enroll_target,
                    "server_name": "localhost",
                    "ca_file": str(write_ca(plane, tmp_path / "operator")),
                    "health_interval_s": 0.2,
                    "shutdown_deadline_s": DEADLINE_S,
                }
            )
        )
        log_path = tmp_path / "agent.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [
                    sys.executable,
                    "-m",
                    "edge_node",
                    "run",
                    "--config",
                    str(config_file),
                    "--bootstrap-token",
                    plane.token(),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                await until(lambda: (data_dir / "identity.json").exists(), timeout=20)
                node_id = json.loads((data_dir / "identity.json").read_text())["node_id"]
                await until(
                    lambda: plane.services.records.count(node_id, "health") >= 2, timeout=20
                )
                process.send_signal(signal.SIGTERM)
                started = time.monotonic()
                with anyio.fail_after(DEADLINE_S + 5):
                    code = await process.wait()
                took = time.monotonic() - started
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    output = log_path.read_text()
    assert code == 0, output
    assert took < DEADLINE_S + 2
    assert "outbox closed" in output
    Outbox.open(
        data_dir / "outbox.db", node_id=node_id, budget_bytes=1 << 20, clock=SystemClock()
    ).close()


def test_a_bad_config_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    config_file = tmp_path / "node.yaml"
    config_file.write_text("data_dir: /tmp/n\nserver_grpc: no-port\n")
    done = subprocess.run(
        [sys.executable, "-m", "edge_node", "run", "--config", str(config_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "server_grpc" in done.stderr and "HOST:PORT" in done.stderr


def test_the_kill_hook_fires_only_at_its_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_node import __main__ as entry

    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(entry.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    fault = entry.kill_at("verifying")
    fault("downloading")
    fault("activated")
    assert killed == []
    fault("verifying")
    assert killed == [(os.getpid(), signal.SIGKILL)]
