"""Issue 13 §4's rollout through a shadow stage with real node processes: a real control
plane (REST + gRPC, SQLite) with its rollout controller and health processor on a short
interval and the real clock, four `python -m edge_node run` processes (what `edgefleet
node run` execs) each fed JPEG frames through a camera drop directory, and real ONNX
models built with `onnx.helper` (`sample_models.tiny_detector` with its classification
runtime, signed with each version).

Every node serves `det` 2.0.0. The operator creates `--stages shadow:1,1,100%` of 2.1.0:
the same input and output, it passes its self-test, but it names another class on every
frame. The shadow node runs it beside 2.0.0 on every served frame and reports how often
the two agree; the output-agreement gate fails it on three evaluations in a row and the
rollout is rolled back in its shadow stage. No node ever served 2.1.0: the director never
assigned it as a target (only as the shadow node's candidate, since cleared), every node
reports 2.0.0 active, and no health point carries 2.1.0's latency. SIGTERM then drains
every process to exit 0.

The in-process e2e (`test_rollout_e2e.py`) shares one clock between agents and control
plane to skip bakes; here the nodes run on their own clocks, so nothing is skipped: the
stage fails within seconds of its first compared frames, long before its bake is over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.demo import Camera
from control_plane.registry.sample_models import tiny_detector, tiny_detector_runtime
from control_plane.rollouts.observe import running_version
from control_plane.storage.models import DirectorAssignmentRow, HealthPointRow
from protos.bundle.spec import parse_runtime_spec
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment, SignedDirectorAssignment
from tests.control_plane.link.desired_support import FLEET
from tests.edge_node.agent.test_kill_at_every_phase import agent_process, stop, write_config
from tests.edge_node.agent.test_rollout_e2e import (
    Controller,
    create,
    follow,
    kinds,
    service_config,
    settled_on,
)
from tests.edge_node.agent.update_support import (
    MODEL,
    FleetPlane,
    fleet_plane,
    run_cli,
    target_path,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NODES = 4  # one shadow node, and the three controls its canary stage would need
ACTIVE, CANDIDATE = "2.0.0", "2.1.0"
# tiny_detector's top class on noise frames: seed 0 says "person", seed 1 "bicycle".
SEEDS = {ACTIVE: 0, CANDIDATE: 1}
FPS = 20
# Seconds of frames, not a bake's hours: the agreement is judged on 40 compared frames.
GATES_YAML = """\
min_samples: {shadow_frames: 40, shadow_boxes: 40, baseline_pairs: 4, baseline_pairs_per_node: 2}
# Four nodes and the control plane share the machine's cores: only a candidate twice as
# slow as the served model fails on latency.
latency_vs_baseline: {max_increase: 1.0}
rss_slope: {enabled: false}
"""
LOG_TAIL = 2000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Nodes:
    """The node processes: their directories, cameras, ids and logs."""

    def __init__(self, root: Path) -> None:
        self.dirs = [root / f"node-{i}" for i in range(NODES)]
        self.cameras = [Camera(d / "camera") for d in self.dirs]
        self.processes: list[anyio.abc.Process] = []
        self.ids: list[str] = []

    def logs(self) -> str:
        """Every node log's tail, for a failure's message."""
        out = []
        for i, directory in enumerate(self.dirs):
            log = directory / "agent.log"
            text = log.read_text(errors="replace")[-LOG_TAIL:] if log.exists() else "(none)"
            code = self.processes[i].returncode if i < len(self.processes) else None
            out.append(f"\n--- node-{i} (exit {code}) {log}:\n{text}")
        return "".join(out)

    async def wait(self, what: str, condition: Callable[[], object], timeout: float) -> None:
        """Poll `condition` until true, bounded; a node that exits or a timeout fails the
        test with the nodes' logs."""
        with anyio.move_on_after(timeout):
            while not condition():
                if any(p.returncode is not None for p in self.processes):
                    raise AssertionError(f"a node exited while waiting for {what}{self.logs()}")
                await anyio.sleep(0.05)
            return
        raise AssertionError(f"waited {timeout:.0f} s for {what}{self.logs()}")

    async def feed(self) -> None:
        """A frame into every camera directory at the nodes' frame rate, until cancelled."""
        while True:
            for camera in self.cameras:
                camera.shoot()
            await anyio.sleep(1 / FPS)


def node_config(fp: FleetPlane, directory: Path) -> Path:
    camera = directory / "camera"
    camera.mkdir(parents=True)
    source = {"url": camera.as_uri(), "settle_s": 0, "after_read": "delete"}
    streams = [{"name": "cam", "target_fps": FPS, "source": source}]
    return write_config(fp, directory, runtime={"streams": streams})


def assignments(fp: FleetPlane, node_id: str) -> list[DirectorAssignment]:
    """Every assignment the director signed for the node (rows are never updated)."""
    with Session(fp.services.engine) as session:
        rows = session.scalars(
            select(DirectorAssignmentRow.signed)
            .where(DirectorAssignmentRow.node_id == node_id)
            .order_by(DirectorAssignmentRow.sequence)
        ).all()
    return [
        DirectorAssignment.FromString(SignedDirectorAssignment.FromString(s).assignment)
        for s in rows
    ]


def served_labels(fp: FleetPlane) -> set[str]:
    """The model labels any node's stored health points carry latency of."""
    with Session(fp.services.engine) as session:
        rows = session.scalars(select(HealthPointRow.latency)).all()
    return {label for latency in rows for label in (latency or {})}


async def test_a_diverging_candidate_is_rolled_back_in_its_shadow_stage(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    # The candidate beside every served frame.
    config = service_config(tmp_path, sqlite_url, shadow_per_mille=1000)
    gates = tmp_path / "gates.yaml"
    gates.write_text(GATES_YAML)
    nodes = Nodes(tmp_path)
    async with (
        fleet_plane(config, tmp_path / "ops") as fp,
        anyio.create_task_group() as loops,
    ):
        controller = Controller(fp)
        loops.start_soon(controller.run)
        runtime = parse_runtime_spec(tiny_detector_runtime())
        for version, seed in SEEDS.items():
            model = tiny_detector(tmp_path / f"det-{version}.onnx", seed=seed)
            await fp.push(model, version, runtime=runtime)
        async with AsyncExitStack() as stack:
            for directory in nodes.dirs:
                log = directory / "agent.log"
                process = await stack.enter_async_context(
                    agent_process(node_config(fp, directory), log, "--bootstrap-token", fp.token())
                )
                nodes.processes.append(process)
            loops.start_soon(nodes.feed)
            await the_shadow_stage(fp, nodes, gates, capsys)
            # A clean stop: every node drains its outbox and exits 0.
            try:
                codes = [await stop(p) for p in nodes.processes]
            except TimeoutError:
                raise AssertionError(f"a node did not stop on SIGTERM{nodes.logs()}") from None
            assert codes == [0] * NODES, nodes.logs()
        loops.cancel_scope.cancel()
    for directory in nodes.dirs:
        assert "outbox closed" in (directory / "agent.log").read_text()
    assert controller.ticks > 0


async def the_shadow_stage(
    fp: FleetPlane, nodes: Nodes, gates: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    identities = [d / "node" / "identity.json" for d in nodes.dirs]
    await nodes.wait("every node to enroll", lambda: all(p.exists() for p in identities), 40)
    nodes.ids = [json.loads(p.read_text())["node_id"] for p in identities]
    inventory = fp.services.nodes.inventory
    await nodes.wait(
        "every node online", lambda: all(inventory.get_node(n).online for n in nodes.ids), 20
    )

    pin = ("nodes", "pin", "--fleet", FLEET, "--all", "--model", MODEL, "--version", ACTIVE)
    await run_cli(fp, capsys, *pin)
    await nodes.wait(
        f"every node on {ACTIVE}, past its watchdog",
        lambda: all(settled_on(fp, n, ACTIVE) for n in nodes.ids),
        30,
    )
    before = {n: len(assignments(fp, n)) for n in nodes.ids}

    plan, rollout = await create(fp, capsys, CANDIDATE, gates, stages="shadow:1,1,100%")
    assert "shadow (1): 1 node runs it beside its model" in plan, plan
    assert "stage 1 of 2 (1): +1 → 1 of 4" in plan and "controls: none" in plan, plan
    info = await follow(
        fp,
        None,
        rollout,
        lambda i: i.state.status in ("done", "paused", "rolled-back", "aborted"),
        timeout=40,
        context=nodes.logs,
    )
    decisions = [d.text for d in info.decisions]
    assert info.state.status == "rolled-back", decisions
    assert info.state.stage == 0, decisions  # in the shadow stage
    state = fp.services.rollouts.state(rollout)
    (shadow,) = [n for n, r in state.nodes.items() if r.started_at is not None]
    assert state.nodes[shadow].track == "shadow"
    # Healthy on the shadow first (its reports said the candidate runs), then stopped.
    assert kinds(info)[-3:] == ["baking", "rolling-back", "rolled-back"], decisions
    rolling = info.decisions[-2]
    assert rolling.numbers["why"] == "verdict" and rolling.numbers["touched"] == 0
    verdict = {g["name"]: g for g in rolling.numbers["verdict"]["gates"]}
    agreement = verdict["output_agreement"]
    assert agreement["outcome"] == "fail", agreement
    assert agreement["consecutive_failures"] == agreement["required_failures"] == 3
    numbers = agreement["numbers"]
    # Judged on the minimum sample, or before it on overwhelming evidence (early_fail_p):
    # on a loaded machine the third failing evaluation may come before 40 frames.
    enough = 40 if not numbers.get("early_fail") else 1
    assert numbers["shadow_nodes"] == 1 and numbers["frames"] >= enough, numbers
    assert numbers["top1_compared"] >= enough and numbers["top1"] < 0.5, numbers
    assert numbers["top1_min"] == 0.95 and numbers["top1_p_value"] < 0.02, numbers
    assert "output_agreement" in rolling.text and "top1" in rolling.text, rolling.text

    # The shadow ends by a fresh signature of 2.0.0 without a candidate; the node drops it.
    def cleared() -> bool:
        latest = fp.services.director.latest(shadow)
        return latest is not None and latest.shadow is None

    await nodes.wait("the shadow to be cleared", cleared, 10)

    def stopped() -> bool:  # the node's health reports no running candidate any more
        latest = fp.services.health.queries.latest([shadow]).get(shadow)
        return latest is not None and latest.metrics.get("shadow_running") != 1.0

    await nodes.wait("the shadow node to stop the candidate", stopped, 10)
    # No node ever served 2.1.0: only the shadow node's assignments named it, as the
    # candidate beside 2.0.0; every node reports 2.0.0 active, and only 2.0.0 served frames.
    for node_id in nodes.ids:
        signed = assignments(fp, node_id)[before[node_id] :]
        assert {a.target_path for a in assignments(fp, node_id)} == {target_path(ACTIVE)}
        candidates = [a.shadow.target_path for a in signed if a.HasField("shadow")]
        assert candidates == ([target_path(CANDIDATE)] if node_id == shadow else []), node_id
        assert target_path(CANDIDATE) not in {s["target_path"] for s in fp.statuses.of(node_id)}
        # What it serves, as its statuses and Hellos report it (a Hello drops `update`).
        assert running_version(fp.reported(node_id), MODEL) == ACTIVE, fp.reported(node_id)
    assert served_labels(fp) == {f"{MODEL}@{ACTIVE}"}
    shown = await run_cli(fp, capsys, "rollout", "status", rollout)
    assert "rolled-back" in shown, shown
