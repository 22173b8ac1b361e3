"""Issue 13 §4's end-to-end rollout: a real control plane (REST + gRPC, SQLite) with its
rollout controller and health processor on a short interval, five in-process node agents
(the real `Agent`: enrollment, TUF, signed assignments, ONNX Runtime, watchdog, health
reports) fed camera frames, and real ONNX models built with `onnx.helper`; the operator's
`edgefleet rollout create|status` through the CLI.

A good version (`det` 1.1.0 over 1.0.0, both `sample_models.tiny_detector`) goes
`--stages 1,100% --control auto` and completes: its canary is judged by the real gates
against three controls and its own baseline, then every node, and every node ends healthy
on it. A bad one (`fragile_model`: passes its self-test, fails on the camera's white
frames) is reverted by its canary's watchdog, spends the failure budget and is rolled
back in its first stage: no other node ever gets it. Last, a good candidate goes through a
shadow stage (`--stages shadow:1,1,100%`, both versions with a signed classification
runtime): it runs beside the served model on one node, the output-agreement gate finds
it names the same class on every frame, and it goes on to done. The same shadow stage
with real node processes and a candidate that disagrees: `test_rollout_processes.py`.

Agents run in this process, not as `edgefleet node run` processes: they share the test's
clock with the control plane, so a stage's one-minute bake (the shortest `--bake`) is
skipped once its gates pass, instead of slept through. Everything else runs at its own
pace: frames, health reports every half second, the gates on seconds of real latency.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.health.config import HealthConfig
from control_plane.registry.sample_models import tiny_detector, tiny_detector_runtime
from control_plane.rollouts.service import RolloutConfig, RolloutInfo
from control_plane.services import ServiceConfig
from control_plane.storage.models import HealthPointRow
from edge_node.agent import Agent
from edge_node.runtime.config import RuntimeConfig, StreamConfig
from protos.bundle.spec import parse_runtime_spec
from tests.control_plane.link.desired_support import FLEET
from tests.edge_node.agent.update_support import (
    MODEL,
    FleetPlane,
    fleet_plane,
    fragile_model,
    frame,
    node_of,
    run_cli,
    target_path,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NODES = 5
DONE = "watchdog window passed"
BAKE = timedelta(minutes=1)
# Thin data on purpose: seconds of half-second health reports, not a real bake's hours.
GATES_YAML = """\
min_samples:
  latency_intervals: 6
  baseline_pairs: 6
  baseline_pairs_per_node: 3
  frames: 100
  node_hours: 0.001
  shadow_frames: 100
  shadow_boxes: 100
# Five agents and the control plane share two CPU cores: latency is judged, but only a
# model twice as slow fails here.
latency_vs_control: {max_increase: 1.0, shift_tolerance: 0.5, max_tail_increase: 2.0}
latency_vs_baseline: {max_increase: 1.0}
# In-process agents report one process's RSS between them: a slope would be everybody's.
rss_slope: {enabled: false}
"""
ENDED = ("done", "paused", "rolled-back")
# Each node reports this many health points of 1.0.0 before the rollout: the canary's
# own baseline.
BASELINE_POINTS = 8


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SkipClock:
    """The wall clock plus an offset that only grows: the control plane and the agents
    share it, so jumping over a bake moves the whole world at once. Sleeps and
    monotonic time (intervals, watch windows) stay real."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))

    def skip_to(self, when: datetime) -> None:
        self.offset += max(when - self.now(), timedelta(0))


@dataclass
class Controller:
    """The server's rollout and health loops (`api/app.py`), run by the test at test
    speed on the shared clock."""

    fp: FleetPlane
    interval_s: float = 0.2
    ticks: int = 0

    async def run(self) -> None:
        services = self.fp.services

        def once() -> None:
            services.health.processor.process_pending()
            report = services.rollouts.tick()
            assert not report.failed, report.failed
            self.ticks += 1

        while True:
            await anyio.to_thread.run_sync(once)
            await anyio.sleep(self.interval_s)


@asynccontextmanager
async def running_agent(fp: FleetPlane, clock: SkipClock, data_dir: Path) -> AsyncIterator[Agent]:
    """An enrolled, connected agent with one camera fed white frames at ~50/s."""
    config = fp.node_config(
        data_dir, runtime=RuntimeConfig(streams=(StreamConfig("cam", target_fps=200),))
    )
    agent = Agent(config, clock)
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run)
        with anyio.fail_after(20):
            await agent.ready.wait()
        await until(lambda: fp.services.nodes.inventory.get_node(node_of(agent)).online)
        group.start_soon(feed, agent)
        try:
            yield agent
        finally:
            await agent.shutdown()


async def feed(agent: Agent) -> None:
    image = frame(255)  # white: a good model's frame, and what breaks the fragile one
    while not agent.stopping:
        pipeline = agent.pipeline
        if pipeline is not None:
            pipeline.submit("cam", image)
        await anyio.sleep(0.02)


def update_of(fp: FleetPlane, node_id: str) -> dict[str, Any]:
    """The node's last update status (one read: it moves meanwhile)."""
    update: dict[str, Any] = fp.reported(node_id).get("update") or {}
    return update


def serving(agent: Agent) -> str | None:
    pipeline = agent.pipeline
    return None if pipeline is None else pipeline.session.label


def settled_on(fp: FleetPlane, node_id: str, version: str) -> bool:
    update = update_of(fp, node_id)
    return update.get("target_path") == target_path(version) and update.get("detail") == DONE


def health_points(fp: FleetPlane, node_id: str, version: str) -> int:
    """The node's stored health points with latency of `version`."""
    label = f"{MODEL}@{version}"
    with Session(fp.services.engine) as session:
        rows = session.scalars(
            select(HealthPointRow.latency).where(HealthPointRow.node_id == node_id)
        ).all()
    return sum(1 for latency in rows if label in (latency or {}))


async def create(
    fp: FleetPlane,
    capsys: pytest.CaptureFixture[str],
    version: str,
    gates: Path,
    stages: str = "1,100%",
) -> tuple[str, str]:
    """`edgefleet rollout create … --dry-run`, then for real: (the plan shown, the id)."""
    options = (
        *("rollout", "create", "--fleet", FLEET, "--model", MODEL, "--version", version),
        *("--stages", stages, "--bake", "1m", "--control", "auto", "--max-rate", "60/s"),
        *("--failure-budget", "0", "--gates", str(gates)),
    )
    plan = await run_cli(fp, capsys, *options, "--dry-run")
    created = json.loads(await run_cli(fp, capsys, "-o", "json", *options))
    return plan, str(created["id"])


async def follow(
    fp: FleetPlane,
    clock: SkipClock | None,
    rollout_id: str,
    done: Callable[[RolloutInfo], bool],
    timeout: float = 40.0,
    context: Callable[[], str] = str,
) -> RolloutInfo:
    """Wait (bounded) until `done(rollout)`; on a `clock`, a baking stage whose gates
    passed has the rest of its bake skipped (the verdict after it then decides, as it
    would). A timeout's message has the decisions, the gates and `context()`."""
    with anyio.move_on_after(timeout):
        while True:
            info = fp.services.rollouts.get(rollout_id, decisions=100)
            if done(info):
                return info
            state, verdict = info.state, info.verdict or {}
            if (
                clock is not None
                and state.status == "baking"
                and state.bake_started is not None
                and verdict.get("stage") == state.stage
                and verdict.get("outcome") == "pass"
            ):
                clock.skip_to(state.bake_started + BAKE)
            await anyio.sleep(0.1)
    info = fp.services.rollouts.get(rollout_id, decisions=100)
    raise AssertionError(
        f"rollout {rollout_id} {info.state.status} after {timeout:.0f} s; "
        f"decisions: {[d.text for d in info.decisions]}; "
        f"gates: {(info.verdict or {}).get('summary')}; nodes: {dict(info.counts)}"
        f"{context()}"
    )


def service_config(tmp_path: Path, database_url: str, **rollouts: Any) -> ServiceConfig:
    """The control plane at test speed: health points half a second after their report,
    the controller every 0.2 s, the gates asked every second (`rollouts`: more of
    `RolloutConfig`)."""
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data,
        database_url=database_url,
        artifacts_url=(data / "artifacts").as_uri(),
        max_artifact_bytes=64 << 20,
        refresh_interval_s=3600,
        health=HealthConfig(settle=timedelta(seconds=0.5)),
        rollouts=RolloutConfig(
            interval_s=0.2,
            lease=timedelta(seconds=10),
            evaluation_interval=timedelta(seconds=1),
            **rollouts,
        ),
    )


def kinds(info: RolloutInfo) -> list[str]:
    return [d.kind for d in info.decisions]


async def test_a_good_version_rolls_out_and_a_bad_one_stops_at_its_canary(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # tables as wide as their rows
    clock = SkipClock()
    config = service_config(tmp_path, sqlite_url, shadow_per_mille=1000)
    gates = tmp_path / "gates.yaml"
    gates.write_text(GATES_YAML)
    async with (
        fleet_plane(config, tmp_path / "ops", clock=clock) as fp,
        anyio.create_task_group() as loops,
    ):
        controller = Controller(fp)
        loops.start_soon(controller.run)
        async with AsyncExitStack() as stack:
            await the_rollouts(fp, clock, stack, tmp_path, gates, capsys)
        loops.cancel_scope.cancel()
    assert controller.ticks > 0


async def the_rollouts(
    fp: FleetPlane,
    clock: SkipClock,
    stack: AsyncExitStack,
    tmp_path: Path,
    gates: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    agents = [
        await stack.enter_async_context(running_agent(fp, clock, tmp_path / f"node-{i}"))
        for i in range(NODES)
    ]
    nodes = [node_of(a) for a in agents]

    # Every node on 1.0.0, reporting health long enough to have a baseline.
    pin_all = ("nodes", "pin", "--fleet", FLEET, "--all", "--model", MODEL, "--version", "1.0.0")
    await run_cli(fp, capsys, *pin_all)
    await until(lambda: all(settled_on(fp, n, "1.0.0") for n in nodes), timeout=30)
    await until(
        lambda: all(health_points(fp, n, "1.0.0") >= BASELINE_POINTS for n in nodes),
        timeout=30,
    )

    # --- the good version: one canary against three controls, then everybody.
    plan, good = await create(fp, capsys, "1.1.0", gates)
    assert "stage 1 of 2 (1): +1 → 1 of 5" in plan, plan
    assert "stage 2 of 2 (100%): +4 → 5 of 5" in plan, plan
    info = await follow(fp, clock, good, lambda i: i.state.status in ("done", "paused"))
    assert info.state.status == "done", [d.text for d in info.decisions]
    state = fp.services.rollouts.state(good)
    assert {n: r.phase for n, r in state.nodes.items()} == dict.fromkeys(nodes, "healthy")
    assert all(settled_on(fp, n, "1.1.0") for n in nodes)
    assert sorted(r.stage for r in state.nodes.values()) == [0, 1, 1, 1, 1]
    # The decisions are stored, each stage's pass with the gates' numbers behind it.
    assert kinds(info)[:3] == ["started", "stage-started", "nodes-started"]
    assert kinds(info).count("stage-passed") == 2 and kinds(info)[-1] == "done"
    passed = [d for d in info.decisions if d.kind == "stage-passed"]
    canary_gates = {g["name"]: g for g in passed[0].numbers["verdict"]["gates"]}
    assert canary_gates["latency_vs_control"]["outcome"] == "pass"
    assert canary_gates["latency_vs_control"]["numbers"]["control_nodes"] == 3
    assert canary_gates["latency_vs_baseline"]["outcome"] == "pass"
    assert canary_gates["error_rate"]["numbers"]["events_canary"] == 0
    # The last stage has nobody left on 1.0.0: judged against the nodes' own baselines.
    last_gates = {g["name"]: g for g in passed[1].numbers["verdict"]["gates"]}
    assert "latency_vs_control" not in last_gates
    assert last_gates["latency_vs_baseline"]["outcome"] == "pass"
    shown = await run_cli(fp, capsys, "rollout", "status", good)
    assert "status           done" in shown and "healthy=5" in shown, shown

    # --- the bad version: passes its self-test, then fails on every camera frame.
    await fp.push(fragile_model(tmp_path / "fragile.onnx"), "1.2.0")
    before = {n: len(fp.statuses.of(n)) for n in nodes}
    plan, bad = await create(fp, capsys, "1.2.0", gates)
    info = await follow(fp, clock, bad, lambda i: i.state.status in ("done", "rolled-back"))
    assert info.state.status == "rolled-back", [d.text for d in info.decisions]
    state = fp.services.rollouts.state(bad)
    canary = [n for n, r in state.nodes.items() if r.started_at is not None]
    assert len(canary) == 1 and state.nodes[canary[0]].stage == 0
    (failed,) = [d for d in info.decisions if d.kind == "node-failed"]
    assert failed.numbers["node"] == canary[0]
    assert failed.numbers["reason"].startswith("watchdog-errors"), failed.numbers
    rolling = next(d for d in info.decisions if d.kind == "rolling-back")
    assert rolling.numbers["why"] == "budget" and rolling.numbers["touched"] == 1
    # The canary runs 1.1.0 again, by a fresh assignment; no other node ever saw 1.2.0.
    await until(lambda: update_of(fp, canary[0]).get("phase") == "active", timeout=20)
    assert update_of(fp, canary[0])["target_path"] == target_path("1.1.0")
    latest = fp.services.director.latest(canary[0])
    assert latest is not None and latest.version == "1.1.0"
    got_bad = [
        s["director_sequence"]
        for s in fp.statuses.of(canary[0])
        if s["target_path"] == target_path("1.2.0")
    ]
    assert got_bad and latest.sequence > max(got_bad)
    assert [serving(a) for a in agents] == [f"{MODEL}@1.1.0"] * NODES
    for node_id in nodes:
        seen = {s["target_path"] for s in fp.statuses.of(node_id)[before[node_id] :]}
        if node_id != canary[0]:
            assert target_path("1.2.0") not in seen, node_id
            other = fp.services.director.latest(node_id)
            assert other is not None and other.version == "1.1.0"
            assert settled_on(fp, node_id, "1.1.0")
    shown = await run_cli(fp, capsys, "rollout", "status", bad)
    assert "rolled-back" in shown, shown

    # --- a good version through a shadow stage: beside the served model on one node, it
    #     names the same class on every frame; then one canary, then everybody.
    runtime = parse_runtime_spec(tiny_detector_runtime())
    for version, seed in (("1.3.0", 0), ("1.4.0", 7)):  # both say "person" on white
        model = tiny_detector(tmp_path / f"det-{version}.onnx", seed=seed)
        await fp.push(model, version, runtime=runtime)
    pin_all = (*pin_all[:-1], "1.3.0")
    await run_cli(fp, capsys, *pin_all)
    # No wait for baselines: every node reports 1.3.0 while the shadow stage runs.
    await until(lambda: all(settled_on(fp, n, "1.3.0") for n in nodes), timeout=30)
    plan, shadowed = await create(fp, capsys, "1.4.0", gates, stages="shadow:1,1,100%")
    assert "shadow (1): 1 node runs it beside its model" in plan, plan
    info = await follow(fp, clock, shadowed, lambda i: i.state.status in ENDED)
    assert info.state.status == "done", [d.text for d in info.decisions]
    passed = [d for d in info.decisions if d.kind == "stage-passed"]
    assert [d.stage for d in passed] == [0, 1, 2], [d.text for d in info.decisions]
    shadow_gates = {g["name"]: g for g in passed[0].numbers["verdict"]["gates"]}
    agreement = shadow_gates["output_agreement"]
    assert agreement["outcome"] == "pass" and agreement["numbers"]["top1"] == 1.0, agreement
    assert all(settled_on(fp, n, "1.4.0") for n in nodes)
    assert [serving(a) for a in agents] == [f"{MODEL}@1.4.0"] * NODES
