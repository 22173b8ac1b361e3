"""SIGKILL of `python -m edge_node run` at every updater step, then a restart: the node
converges to a consistent state every time.

Each case: a node runs det 1.0.0 (installed by a first process, stopped cleanly); 1.1.0
is pinned while it is down; a second process gets the assignment at its Hello and kills
itself at one step (EDGEFLEET_NODE_TEST_KILL_AT, the test hook of edge_node.__main__);
a third process, started plainly, must end with a consistent journal, the active model
in the store with the right hash, the previous one kept, no partial download left over
— and here, 1.1.0 active: the step the kill interrupted counts as a retryable failure,
and the assignment the control plane sends again at the Hello is retried once its
backoff passed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from control_plane.services import ServiceConfig
from edge_node.agent.update_task import JOURNAL_PATH
from edge_node.updater.journal import Journal, JournalState, ModelRef, Phase
from tests.edge_node.agent.update_support import FleetPlane, fleet_plane, target_path, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
KILL_ENV = "EDGEFLEET_NODE_TEST_KILL_AT"
PHASES = ["downloading", "verifying", "self-testing", "activated", "active"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def write_config(fp: FleetPlane, tmp_path: Path, **extra: Any) -> Path:
    """`tmp_path/node.yaml` for a node in `tmp_path/node` (`extra`: top-level keys that
    replace these)."""
    running = fp.running
    config: dict[str, Any] = {
        "data_dir": str(tmp_path / "node"),
        "fleet": "parks",
        "server_grpc": running.node_target,
        "enroll_grpc": running.enroll_target,
        "server_name": "localhost",
        "ca_file": str(fp.ca_file()),
        "health_interval_s": 0.5,
        "shutdown_deadline_s": 5,
        "runtime": {"streams": [{"name": "cam", "target_fps": 5}]},
        "updater": {
            "selftest_latency_budget_ms": 5000,
            "retry_initial_s": 0.5,  # the retry after the restart: soon
            "retry_max_s": 2,
            "watchdog": {"window_s": 1, "max_errors": 3},
        },
        **extra,
    }
    path = tmp_path / "node.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@asynccontextmanager
async def agent_process(
    config: Path, log: Path, *extra: str, kill_at: str | None = None
) -> AsyncIterator[anyio.abc.Process]:
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    if kill_at is not None:
        env[KILL_ENV] = kill_at
    with log.open("ab") as out:
        process = await anyio.open_process(
            [sys.executable, "-m", "edge_node", "run", "--config", str(config), *extra],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.move_on_after(10):
                    await process.wait()


async def stop(process: anyio.abc.Process) -> int:
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(15):
        return await process.wait()


def journal(data_dir: Path) -> JournalState:
    return Journal(data_dir / JOURNAL_PATH).load()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_consistent(data_dir: Path, state: JournalState) -> None:
    """Idle, every model the journal names in the store with its hash, nothing else kept,
    no partial download, no temp file of an atomic write."""
    assert (state.phase, state.trial) == (Phase.IDLE, None)
    objects = data_dir / "models" / "sha256"
    for ref in (state.active, state.previous):
        if ref is not None:
            assert sha256_of(objects / ref.sha256 / "model.onnx") == ref.sha256, ref
    assert {p.name for p in objects.iterdir()} == state.referenced_sha256s()
    assert list((data_dir / "models" / "staging").iterdir()) == []
    assert [p.name for p in (data_dir / JOURNAL_PATH).parent.iterdir()] == ["journal.json"]


@pytest.mark.parametrize("phase", PHASES)
async def test_a_kill_at_any_step_then_a_restart_converges(
    tmp_path: Path, sqlite_url: str, phase: str
) -> None:
    data = tmp_path / "server"
    service = ServiceConfig(
        data_dir=data,
        database_url=sqlite_url,
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
    )
    data_dir = tmp_path / "node"
    log = tmp_path / "agent.log"
    async with fleet_plane(service, tmp_path / "ops") as fp:
        old = ModelRef(target_path("1.0.0"), fp.sha256["1.0.0"])
        new = ModelRef(target_path("1.1.0"), fp.sha256["1.1.0"])
        config = write_config(fp, tmp_path)

        # 1. The node runs 1.0.0 (through its watchdog window), then stops cleanly.
        async with agent_process(config, log, "--bootstrap-token", fp.token()) as first:
            identity = data_dir / "identity.json"
            await until(identity.exists, timeout=30)
            node_id = json.loads(identity.read_text())["node_id"]
            await until(lambda: fp.services.nodes.inventory.get_node(node_id).online, timeout=30)
            await fp.pin(node_id, "1.0.0")
            await until(lambda: _settled(data_dir, old), timeout=30)
            assert await stop(first) == 0, log.read_text()

        # 2. 1.1.0 is pinned while it is down; the next process dies at `phase`.
        await fp.pin(node_id, "1.1.0")
        async with agent_process(config, log, kill_at=phase) as doomed:
            with anyio.fail_after(30):
                code = await doomed.wait()
        output = log.read_text()
        assert code == -signal.SIGKILL, output
        assert f"{KILL_ENV}={phase}: killing the process now" in output
        crashed = journal(data_dir)
        if phase == "active":  # committed, on watch: the kill blames the new model
            assert crashed.active == new and crashed.probation is not None
            assert not crashed.probation.paused
        else:  # the trial was running
            assert (crashed.phase, crashed.trial, crashed.active) == (Phase.TRIAL, new, old)
        parts = [p.name for p in (data_dir / "models" / "staging").iterdir()]
        assert len(parts) <= 2 and all(p.endswith(".part") for p in parts), parts

        # 3. A plain restart: the interrupted step is undone, the assignment (sent again
        #    at the Hello) retried, and the node ends on 1.1.0, consistent.
        async with agent_process(config, log) as restarted:
            await until(lambda: _settled(data_dir, new), timeout=40)
            assert await stop(restarted) == 0, log.read_text()

        state = journal(data_dir)
        assert (state.active, state.previous, state.director_sequence) == (new, old, 2)
        assert_consistent(data_dir, state)
        # The control plane saw the revert of the interrupted step, then the retry.
        seen = [(s["phase"], s["detail"]) for s in fp.statuses.of(node_id)]
        reverts = [detail for phase_, detail in seen if phase_ == "reverted"]
        reason = "restarted-on-watch" if phase == "active" else "restarted"
        assert any(detail.startswith(reason) for detail in reverts), json.dumps(seen, indent=1)
        assert seen[-1][0] == "active"


def _settled(data_dir: Path, target: ModelRef) -> bool:
    """`target` active and through its watchdog window (the journal is written atomically:
    a read never sees half of it)."""
    state = journal(data_dir)
    return state.active == target and state.probation is None and state.phase is Phase.IDLE
