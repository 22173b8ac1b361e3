"""Model updates end to end: a real control plane on loopback (REST + gRPC, SQLite and
PostgreSQL), a fleet pushed and signed as an operator does, `nodes pin`, and the node
agent downloading, self-testing, hot-swapping under camera load and reporting every
phase — plus the bad updates a node must refuse or undo on its own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from control_plane.registry import onnx_inspect, sample_models
from control_plane.registry.onnx_inspect import ReferencePair, make_reference
from control_plane.services import ServiceConfig
from edge_node.agent import Agent
from edge_node.agent.update_task import JOURNAL_PATH
from edge_node.clock import SystemClock
from edge_node.enroll import enroll_over_grpc
from edge_node.updater.journal import Journal, JournalState
from tests.control_plane.link.desired_support import FLEET
from tests.control_plane.link.grpc_support import ADMIN
from tests.edge_node.agent.update_support import (
    FleetPlane,
    cli,
    fleet_plane,
    fragile_model,
    frame,
    node_of,
    target_path,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DONE = "watchdog window passed"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def service_config(tmp_path: Path, database_url: str) -> ServiceConfig:
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data,
        database_url=database_url,
        artifacts_url=(data / "artifacts").as_uri(),
        max_artifact_bytes=64 << 20,
        refresh_interval_s=3600,
    )


@dataclass
class Camera:
    """The frames fed to the node: dark ones, or white ones (`level` 255)."""

    level: int = 0


@asynccontextmanager
async def running_agent(
    fp: FleetPlane, data_dir: Path, camera: Camera | None = None, **config: Any
) -> AsyncIterator[Agent]:
    """An enrolled, connected agent fed camera frames until the block ends."""
    agent = Agent(fp.node_config(data_dir, **config), SystemClock())
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run)
        with anyio.fail_after(20):
            await agent.ready.wait()
        assert agent.files is not None
        node_id = agent.files.node_id
        await until(lambda: fp.services.nodes.inventory.get_node(node_id).online)
        group.start_soon(feed, agent, camera or Camera())
        try:
            yield agent
        finally:
            await agent.shutdown()


async def feed(agent: Agent, camera: Camera) -> None:
    """Frames at ~200/s into the runtime while it serves."""
    while not agent.stopping:
        pipeline = agent.pipeline
        if pipeline is not None:
            pipeline.submit("cam", frame(camera.level))
        await anyio.sleep(0.005)


def journal(data_dir: Path) -> JournalState:
    return Journal(data_dir / JOURNAL_PATH).load()


def serving(agent: Agent) -> Path | None:
    pipeline = agent.pipeline
    return None if pipeline is None else pipeline.session.path


def last_update(fp: FleetPlane, node_id: str) -> dict[str, Any]:
    update: dict[str, Any] = fp.reported(node_id).get("update") or {}
    return update


async def update_where(fp: FleetPlane, node_id: str, **wanted: str) -> dict[str, Any]:
    """The node's last update status once it has `wanted`'s values, from one read: a
    reconnect's Hello clears the stored status until the node sends it again."""
    found: dict[str, Any] = {}

    def seen() -> bool:
        update = last_update(fp, node_id)
        if all(update.get(k) == v for k, v in wanted.items()):
            found.update(update)
            return True
        return False

    await until(seen)
    return found


def store_path(data_dir: Path, sha256: str) -> Path:
    return data_dir / "models" / "sha256" / sha256 / "model.onnx"


async def settled(fp: FleetPlane, agent: Agent, version: str) -> None:
    """`version` is active on the node and through its watchdog window."""
    node_id = node_of(agent)
    wanted = {"detail": DONE, "target_path": target_path(version)}

    def done() -> bool:
        update = last_update(fp, node_id)  # one read: the status moves meanwhile
        return all(update.get(k) == v for k, v in wanted.items())

    await until(done)


# ------------------------------------------------------------------------- cases


async def test_a_pin_is_downloaded_self_tested_hot_swapped_and_shown(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "node"
    async with fleet_plane(service_config(tmp_path, database_url), tmp_path / "ops") as fp:
        async with running_agent(fp, data_dir) as agent:
            node_id = node_of(agent)
            assert serving(agent) is None  # nothing assigned yet: no model, no runtime

            await fp.pin(node_id, "1.0.0")
            await settled(fp, agent, "1.0.0")
            first = store_path(data_dir, fp.sha256["1.0.0"])
            assert serving(agent) == first
            pipeline = agent.pipeline
            assert pipeline is not None
            await until(lambda: pipeline.stats()["cam"].processed > 20)

            await fp.pin(node_id, "1.1.0")
            await settled(fp, agent, "1.1.0")
            second = store_path(data_dir, fp.sha256["1.1.0"])
            assert serving(agent) == second  # swapped in the running pipeline
            assert agent.pipeline is pipeline
            before = pipeline.stats()["cam"].processed
            await until(lambda: pipeline.stats()["cam"].processed > before + 20)
            stats = pipeline.stats()["cam"]
            assert (dict(stats.failed), dict(stats.bad)) == ({}, {})

            # A fresh Hello after each update: the inventory says what runs now.
            reported = fp.reported(node_id)
            assert reported["active_target"] == target_path("1.1.0")
            assert reported["director_sequence"] == 2
            assert reported["update"]["detail"] == DONE

        # Every phase reached the control plane, in order, with the director sequence.
        # (A status is sent again after each Hello: consecutive repeats are one phase.)
        statuses = fp.statuses.of(node_id)
        walk = [(s["phase"], s["target_path"], s["director_sequence"]) for s in statuses]
        for sequence, version in ((1, "1.0.0"), (2, "1.1.0")):
            path = target_path(version)
            mine = [(s["phase"], s["detail"]) for s in statuses if s["target_path"] == path]
            steps = [m for i, m in enumerate(mine) if i == 0 or m != mine[i - 1]]
            assert [phase for phase, _ in steps] == [
                "downloading",
                "verifying",
                "self-testing",
                "active",  # on watch until ...
                "active",  # watchdog window passed
            ], walk
            assert {w[2] for w in walk if w[1] == path} == {sequence}
        assert [s["detail"] for s in statuses if s["phase"] == "active"][-1] == DONE

        state = journal(data_dir)
        assert (state.active, state.previous) is not None
        assert state.active is not None and state.active.path == target_path("1.1.0")
        assert state.previous is not None and state.previous.path == target_path("1.0.0")
        assert (state.director_sequence, state.probation) == (2, None)
        assert sorted(p.name for p in (data_dir / "models" / "sha256").iterdir()) == sorted(
            [fp.sha256["1.0.0"], fp.sha256["1.1.0"]]
        )
        assert list((data_dir / "models" / "staging").iterdir()) == []

        # A restart: the node serves what it ran, says so in its Hello, and sends its
        # last update status again (the Hello reset it on the control plane).
        async with running_agent(fp, data_dir, bootstrap_token=None) as agent:
            assert serving(agent) == second
            # Until the new Hello is in, the control plane still shows the last run's status.
            await until(
                lambda: (
                    (fp.reported(node_id).get("update") or {}).get("detail")
                    == "served again after a restart"
                )
            )
            reported = fp.reported(node_id)
            assert reported["active_target"] == target_path("1.1.0")
            assert sorted(reported["installed_targets"]) == [
                target_path("1.0.0"),
                target_path("1.1.0"),
            ]
            assert reported["director_sequence"] == 2
            assert reported["update"]["phase"] == "active"
            assert reported["update"]["detail"] == "served again after a restart"

            # What the operator sees.
            capsys.readouterr()
            code = await anyio.to_thread.run_sync(cli, fp, "-o", "json", "nodes", "show", node_id)
            shown = json.loads(capsys.readouterr().out)
            assert code == 0
            assert shown["reported_state"]["update"]["phase"] == "active"
            assert shown["reported_state"]["update"]["target_path"] == target_path("1.1.0")
            assert await anyio.to_thread.run_sync(cli, fp, "nodes", "show", node_id) == 0
            table = capsys.readouterr().out
            assert "active" in table and "1.1.0" in table


async def test_bad_updates_leave_the_node_on_its_model_and_say_why(
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One node through the cases a node must refuse or undo by itself; after each it
    still serves 1.0.0 and the control plane shows why."""
    data_dir = tmp_path / "node"
    async with fleet_plane(service_config(tmp_path, sqlite_url), tmp_path / "ops") as fp:
        services = fp.services
        good = store_path(data_dir, fp.sha256["1.0.0"])

        async def refused(node_id: str, reason: str, version: str | None = None) -> None:
            def seen() -> bool:
                update = last_update(fp, node_id)
                path_ok = version is None or update.get("target_path") == target_path(version)
                return path_ok and str(update.get("detail", "")).startswith(reason)

            await until(seen)

        camera = Camera()
        async with running_agent(fp, data_dir, camera) as agent:
            node_id = node_of(agent)
            await fp.pin(node_id, "1.0.0")
            await settled(fp, agent, "1.0.0")

            # A tampered artifact on the server: the bytes do not hash to the signed sha256.
            sha = fp.sha256["1.1.0"]
            stored = services.store.path_of(sha)
            stored.chmod(0o644)
            stored.write_bytes(stored.read_bytes()[:-8] + b"tampered")
            await fp.pin(node_id, "1.1.0")
            await refused(node_id, "hash-mismatch", "1.1.0")
            assert serving(agent) == good

            # Outputs on the node differ from those recorded at push (here: the operator's
            # tooling recorded them 0.5 off): the self-test refuses the model.
            def skewed(*args: Any, **kwargs: Any) -> ReferencePair:
                pair = make_reference(*args, **kwargs)
                return ReferencePair(pair.inputs, {k: v + 0.5 for k, v in pair.outputs.items()})

            monkeypatch.setattr(onnx_inspect, "make_reference", skewed)
            model = sample_models.tiny_detector(tmp_path / "det-2.onnx", seed=2)
            await fp.push(model, "2.0.0")
            monkeypatch.undo()
            await fp.pin(node_id, "2.0.0")
            await refused(node_id, "self-test: output-mismatch", "2.0.0")
            assert serving(agent) == good
            # The operator reads why, with the numbers, where the node's log had it alone.
            update = await update_where(
                fp, node_id, phase="reverted", target_path=target_path("2.0.0")
            )
            assert update["reason"] == "self-test: output-mismatch"
            assert "out of tolerance" in update["detail"]
            assert float(update["facts"]["max_abs_err"]) == pytest.approx(0.5, rel=0.01)
            monkeypatch.setenv("COLUMNS", "100")
            capsys.readouterr()
            assert await anyio.to_thread.run_sync(cli, fp, "nodes", "show", node_id) == 0
            shown = capsys.readouterr().out
            assert "last update: reverted — self-test: output-mismatch: " in shown
            assert f"serving {target_path('1.0.0')}" in shown

            # Another node's assignment, delivered to this one (a routing bug upstream).
            token, _ = services.nodes.tokens.create_bootstrap_token(
                ADMIN, FLEET, {}, timedelta(hours=1)
            )
            other = await enroll_over_grpc(
                fp.running.enroll_target,
                services.ca.ca_pem,
                token,
                "0.1.0",
                tmp_path / "other",
                server_name="localhost",
            )
            await fp.pin(other.node_id, "1.0.0")
            signed = services.director.current(other.node_id)
            assert signed is not None
            services.delivery.deliver(node_id, FLEET, signed)
            await refused(node_id, "wrong-node")
            assert serving(agent) == good

            # A model that passes its self-test, then fails on the cameras: the watchdog
            # reverts it on the node, without waiting for the control plane.
            await fp.push(fragile_model(tmp_path / "fragile.onnx"), "3.0.0")
            await fp.pin(node_id, "3.0.0")
            await until(lambda: serving(agent) == store_path(data_dir, fp.sha256["3.0.0"]))
            camera.level = 255
            update = await update_where(
                fp, node_id, phase="reverted", target_path=target_path("3.0.0")
            )
            camera.level = 0
            assert update["detail"].startswith("watchdog-errors: ")
            assert update["detail"].endswith(f"serving {target_path('1.0.0')}")
            assert serving(agent) == good

        # Pinned while the node was away, then revoked with every older version (the floor
        # rises above 4.0.0): the director has no version to move it to (ADR 0035). At its
        # next Hello the node refuses the assignment against the floor it verified itself,
        # learns that its own 1.0.0 is below the floor too, and stops serving it.
        model = sample_models.tiny_detector(tmp_path / "det-4.onnx", seed=4)
        await fp.push(model, "4.0.0")
        await fp.pin(node_id, "4.0.0")
        await fp.revoke("4.0.0")
        async with running_agent(fp, data_dir, bootstrap_token=None) as agent:
            update = await update_where(fp, node_id, phase="failed", reason="revoked-active")
            assert update["target_path"] == target_path("1.0.0")
            assert update["detail"].endswith("serving nothing")
            await until(lambda: serving(agent) is None)
            capsys.readouterr()
            assert await anyio.to_thread.run_sync(cli, fp, "nodes", "show", node_id) == 0
            shown = capsys.readouterr().out
            assert "last update: failed — revoked-active" in shown
            assert "floor=6, model=det, release_counter=1" in shown

        state = journal(data_dir)
        assert state.active is None and state.previous is None
        assert state.trial is None and state.probation is None
        assert list((data_dir / "models" / "sha256").iterdir()) == []
