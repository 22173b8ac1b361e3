"""SIGKILL of `python -m edge_node run` in the middle of every updater phase of a large
update, then a restart: the node converges to a consistent state every time (issue 12 §4).

The candidate is a 50 MB model (a 3072x4096 float32 initializer, built with onnx.helper),
so that downloading, verifying (hashing, fsync, install) and the self-test (an ONNX Runtime
session of 50 MB) each take measurable time, and the test kills the process by its PID
while the phase runs, not between two phases: when the partial download is on disk, when
the control plane saw `verifying` or `self-testing`, when the log says the self-test
passed (the activation's session is loading), and when the model is active on watch. The
commit itself (a journal rename) is too short to hit from outside: there the agent kills
itself right after the hot swap, before the commit is journalled (the `activated` hook of
`edge_node.__main__`). After each kill the journal holds the interrupted state, and a
plain restart ends on the new model with the old one kept, the store holding exactly those
two and no partial file (test_kill_at_every_phase.py does the same at each step boundary
with a tiny model).

One control plane and one enrolled node for all phases: the node installs 1.0.0 and stops
cleanly, 2.0.0 is pinned, and each phase starts a copy of that data dir.
"""

from __future__ import annotations

import json
import shutil
import signal
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import numpy as np
import pytest

from control_plane.services import ServiceConfig
from edge_node.updater.journal import ModelRef, Phase
from tests.edge_node.agent.test_kill_at_every_phase import (
    KILL_ENV,
    agent_process,
    assert_consistent,
    journal,
    stop,
)
from tests.edge_node.agent.update_support import FleetPlane, fleet_plane, target_path, until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PHASES = ["downloading", "verifying", "self-testing", "activating", "committing", "on-watch"]
OUTPUTS = 4096  # [1,3072] x [3072,4096] float32: a 50 MB initializer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def large_model(path: Path) -> Path:
    """`images` [1,3,32,32] -> Flatten -> MatMul by a 3072x4096 weight -> Sigmoid ->
    `scores` [1,4096]: det's input, 50 MB on disk."""
    from onnx import TensorProto, helper

    weights = np.random.default_rng(7).random((3 * 32 * 32, OUTPUTS), dtype=np.float32)
    weights -= 0.5
    weights *= 0.02
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
            helper.make_node("Sigmoid", ["logits"], ["scores"]),
        ],
        "large",
        inputs=[helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        outputs=[helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, OUTPUTS])],
        initializer=[
            helper.make_tensor("w", TensorProto.FLOAT, list(weights.shape), weights.tobytes(), True)
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def write_config(fp: FleetPlane, path: Path, data_dir: Path) -> Path:
    running = fp.running
    config = {
        "data_dir": str(data_dir),
        "fleet": "parks",
        "server_grpc": running.node_target,
        "enroll_grpc": running.enroll_target,
        "server_name": "localhost",
        "ca_file": str(fp.ca_file()),
        "health_interval_s": 0.5,
        "shutdown_deadline_s": 5,
        "memory_budget_mb": 4096,
        "runtime": {"streams": [{"name": "cam", "target_fps": 5}]},
        "updater": {
            "selftest_latency_budget_ms": 10_000,
            "retry_initial_s": 0.5,
            "retry_max_s": 2,
            "watchdog": {"window_s": 1, "max_errors": 3},
        },
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


HOOKS = {"activating": "self-tested", "committing": "activated"}
"""Phases too short to hit from outside: the agent kills itself there (the test hook).
Since issue 12 the self-test runs on the session that then serves, so activating is the
swap right after it passes."""


def settled(data_dir: Path, target: ModelRef) -> bool:
    state = journal(data_dir)
    return state.active == target and state.probation is None and state.phase is Phase.IDLE


def seen_phases(fp: FleetPlane, node_id: str, since: int, target: ModelRef) -> list[str]:
    statuses = fp.statuses.of(node_id)[since:]
    return [s["phase"] for s in statuses if s["target_path"] == target.path]


async def kill_in(
    phase: str,
    process: anyio.abc.Process,
    *,
    fp: FleetPlane,
    node_id: str,
    since: int,
    data_dir: Path,
    log: Path,
    new: ModelRef,
    length: int,
) -> dict[str, Any]:
    """Wait until `process` is inside `phase` of the update to `new`, SIGKILL it by its
    PID, and return what shows where it was."""
    part = data_dir / "models" / "staging" / f"{new.sha256}.part"
    served = str(data_dir / "models" / "sha256" / new.sha256 / "model.onnx")

    def size() -> int:
        try:
            return part.stat().st_size
        except FileNotFoundError:
            return 0

    def statuses() -> list[tuple[str, str]]:
        updates = fp.statuses.of(node_id)[since:]
        return [(s["phase"], s["detail"]) for s in updates if s["target_path"] == new.path]

    conditions = {
        "downloading": lambda: 0 < size() < length,
        "verifying": lambda: ("verifying", "") in statuses(),
        "self-testing": lambda: ("self-testing", "") in statuses(),
        "on-watch": lambda: any(
            p == "active" and d.startswith("on watch until") for p, d in statuses()
        ),
    }
    if phase in HOOKS:  # it kills itself: after the self-test / after the swap
        with anyio.fail_after(60):
            await process.wait()
    else:
        await until(conditions[phase], timeout=60)
        process.kill()  # SIGKILL, to this process's PID only
        with anyio.fail_after(10):
            await process.wait()
    assert process.returncode == -signal.SIGKILL, log.read_text()
    await anyio.sleep(0.5)  # what the process sent before it died has reached the server
    text = log.read_text()
    return {
        "partial": size(),
        "statuses": [p for p, _ in statuses()],
        "self-tested": "=self-tested: killing the process now" in text,
        "swapped": any(
            "serving model" in line and f"from {served}" in line for line in text.splitlines()
        ),
    }


def assert_killed_inside(phase: str, seen: dict[str, Any], length: int) -> None:
    """What was on disk and said before the kill places it inside `phase`."""
    statuses = seen["statuses"]
    if phase == "downloading":
        assert 0 < seen["partial"] < length, seen
        assert "verifying" not in statuses, seen
    elif phase == "verifying":
        assert "verifying" in statuses and "self-testing" not in statuses, seen
    elif phase == "self-testing":
        assert "self-testing" in statuses and not seen["self-tested"], seen
    elif phase == "activating":
        assert seen["self-tested"] and not seen["swapped"], seen
    elif phase == "committing":
        assert seen["swapped"] and "active" not in statuses, seen
    else:
        assert "active" in statuses, seen


async def test_a_sigkill_inside_every_phase_of_a_large_update_converges(
    tmp_path: Path, sqlite_url: str
) -> None:
    data = tmp_path / "server"
    service = ServiceConfig(
        data_dir=data,
        database_url=sqlite_url,
        artifacts_url=(data / "artifacts").as_uri(),
        max_artifact_bytes=256 << 20,
        refresh_interval_s=3600,
    )
    model = large_model(tmp_path / "large.onnx")
    length = model.stat().st_size
    async with fleet_plane(service, tmp_path / "ops") as fp:
        await fp.push(model, "2.0.0")
        old = ModelRef(target_path("1.0.0"), fp.sha256["1.0.0"])
        new = ModelRef(target_path("2.0.0"), fp.sha256["2.0.0"])

        # The node installs 1.0.0 (through its watch window) and stops cleanly.
        template = tmp_path / "template"
        config = write_config(fp, tmp_path / "template.yaml", template)
        log = tmp_path / "template.log"
        async with agent_process(config, log, "--bootstrap-token", fp.token()) as first:
            identity = template / "identity.json"
            await until(identity.exists, timeout=30)
            node_id = json.loads(identity.read_text())["node_id"]
            await until(lambda: fp.services.nodes.inventory.get_node(node_id).online, timeout=30)
            await fp.pin(node_id, "1.0.0")
            await until(lambda: settled(template, old), timeout=30)
            assert await stop(first) == 0, log.read_text()
        await fp.pin(node_id, "2.0.0")  # while it is down: each copy gets it at its Hello

        for phase in PHASES:
            data_dir = tmp_path / f"node-{phase}"
            shutil.copytree(template, data_dir)
            config = write_config(fp, tmp_path / f"{phase}.yaml", data_dir)
            log = tmp_path / f"{phase}.log"
            since = len(fp.statuses.of(node_id))
            hook = HOOKS.get(phase)
            async with agent_process(config, log, kill_at=hook) as doomed:
                seen = await kill_in(
                    phase,
                    doomed,
                    fp=fp,
                    node_id=node_id,
                    since=since,
                    data_dir=data_dir,
                    log=log,
                    new=new,
                    length=length,
                )
            assert_killed_inside(phase, seen, length)
            if hook is not None:
                assert f"{KILL_ENV}={hook}: killing the process now" in log.read_text()
            crashed = journal(data_dir)
            if phase == "on-watch":  # committed, on watch: the kill blames the new model
                assert crashed.active == new and crashed.probation is not None
                assert not crashed.probation.paused
            else:  # the trial was running: the journal says so
                assert (crashed.phase, crashed.trial, crashed.active) == (Phase.TRIAL, new, old)
            staged = [p.name for p in (data_dir / "models" / "staging").iterdir()]
            assert len(staged) <= 2 and all(p.endswith(".part") for p in staged), staged

            # A plain restart: the interrupted step is undone, retried after its backoff,
            # and the node ends on 2.0.0 with 1.0.0 kept, nothing else in the store.
            async with agent_process(config, log) as restarted:
                await until(partial(settled, data_dir, new), timeout=90)
                assert await stop(restarted) == 0, log.read_text()
            state = journal(data_dir)
            assert (state.active, state.previous, state.director_sequence) == (new, old, 2)
            assert_consistent(data_dir, state)
            updates = fp.statuses.of(node_id)[since:]
            reverts = [s for s in updates if s["phase"] == "reverted"]
            reason = "restarted-on-watch" if phase == "on-watch" else "restarted"
            assert any(s["detail"].startswith(reason) for s in reverts), (phase, updates)
            assert seen_phases(fp, node_id, since, new)[-1] == "active", phase
