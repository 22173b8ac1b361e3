"""Controller cost: one evaluation cycle of the rollout controller over 10,000 nodes, and a
stage of 10,000 assignments started and stored (issue 13 §5), on SQLite and PostgreSQL.

The control plane's services run in this process on a throwaway database with a manual
clock (`bench._harness.InProcessPlane`); the controller is its `RolloutService` with the
real gates (`GatesVerdicts`), inventory, health store and director. The fleet is
``--nodes`` + ``--canaries`` nodes written straight into the inventory (labels over 10
sites and 2 kinds of hardware, every node serving det 1.0.0), each with health points of
the last two hours (one every 10 minutes). The rollout of det 1.1.0 has two stages,
``--canaries`` nodes then 100 % (so the second stage starts exactly ``--nodes``), a bake
of ``--bake`` minutes, a rate limit that lets a whole stage start at once, and automatic
controls.

The clock moves a minute per tick. Each minute the canaries report health points of the
candidate (P99 lognormal around 20 ms, RSS, frames) and the controls of the old version,
as stored raw points and latest values, one every 30 s (the agent's default, and so over
the two hours before); the canaries' update statuses say active with
the watchdog passed. Measured:

- **tick**: `RolloutService.tick` while the first stage bakes: read the rollout (10,100
  node records), list the fleet, observe, ask the gates (points of up to 200 canaries and
  controls over the last hours, `gates.evaluate`), `machine.step`, store; the median of
  the last ``--ticks`` ticks of the bake. Anchor: `machine.step` alone on the same state
  and observations (median of 5).
- **stage**: the tick at the end of the bake: the gates pass, the second stage starts
  ``--nodes`` nodes, their actions are stored, then carried out (`pin_many` through the
  director: signed, stored, handed to the delivery port, which has no transport attached
  here: delivery over gRPC/MQTT to connected nodes is bench/link_fanout's figure), and
  marked done. Anchors: `machine.step` alone for that tick, and `pin_many` of the same
  nodes alone.

Each tick is also split by its calls into the collaborators (the inventory's
`fleet_members`, `list_nodes` before it, the gates' `judge`, the health store's `latest`,
the director's `latest_many` and `pin_many`); the rest is reading, stepping and storing the rollout.
Not a test: asserts nothing unless ``--check``. See docs/benchmarks.md.

    python -m bench.rollout_controller [--nodes 10000] [--databases sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from bench._harness import InProcessPlane, database
from bench._report import Report, parse_benchmark_args
from bench._util import BENCH_DIR, git_describe

GOAL_TICK_S = 1.0
GOAL_STAGE_S = 10.0
GOAL_NODES = 10_000
"""Issue goals: a tick over 10,000 nodes < 1 s; a stage of 10,000 assignments < 10 s."""

FLEET = "bench"
MODEL = "det"
OLD, NEW = "1.0.0", "1.1.0"
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SITES, HARDWARE = 10, ("jetson", "x86")
HISTORY = timedelta(hours=2)
BACKGROUND_EVERY = timedelta(minutes=10)
REPORT_EVERY = timedelta(seconds=30)  # the agent's default health_interval_s
_MINUTE = timedelta(minutes=1)
ANCHOR_REPEATS = 5
TIMED = {
    "inventory": ("list_nodes", "fleet_members"),
    "verdicts": ("judge",),
    "health": ("latest",),
    "director": ("latest_many", "pin_many"),
}


def target(version: str) -> str:
    return f"models/{MODEL}/{version}/model.onnx"


# ----------------------------------------------------------------------------- timing


class Timed:
    """`target` with the calls named in `names` timed into `times` (seconds by name)."""

    def __init__(self, target: Any, names: Sequence[str], times: dict[str, float]) -> None:
        self._target, self._names, self._times = target, frozenset(names), times

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._names:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._times[name] += time.perf_counter() - started

        return timed


@dataclass
class TickTiming:
    at: str
    status: str
    label: str
    seconds: float
    parts: dict[str, float]
    actions: int


@dataclass
class BackendResult:
    database: str
    nodes: int
    fleet: int
    setup_s: float = 0.0
    first_stage_s: float = math.nan  # the tick that starts the canaries
    ticks: list[TickTiming] = field(default_factory=list)
    tick_s: float = math.nan  # the median of the last `measured` baking ticks
    measured: int = 0
    tick_parts: dict[str, float] = field(default_factory=dict)
    step_s: float = math.nan  # machine.step alone, a baking tick's inputs
    stage: TickTiming | None = None
    stage_path: str = ""  # how the second stage started: the gates' pass, or a promote
    stage_assigned: int = 0  # stage nodes whose newest assignment is the candidate
    stage_pending: int = -1  # actions still pending after the stage tick
    stage_step_s: float = math.nan  # machine.step alone, the stage tick's inputs
    pin_many_s: float = math.nan  # pin_many of the stage's nodes alone
    verdicts: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- the fleet


class Fleet:
    """The nodes, their health points and update statuses, written as the control plane
    stores what nodes send (the ingest and the health processor have their own benches)."""

    def __init__(self, plane: InProcessPlane, count: int, seed: int) -> None:
        from control_plane.storage import session_factory

        self.plane = plane
        self.sessions = session_factory(plane.services.engine)
        self.rng = random.Random(seed)
        self.ids = [f"n-{i:06d}" for i in range(count)]
        self.offset = {n: self.rng.lognormvariate(0.0, 0.05) for n in self.ids}
        self.rss = {n: 300e6 + self.rng.gauss(0.0, 50e6) for n in self.ids}

    def enroll(self) -> None:
        self.plane.add_model_version(MODEL, OLD, 1, sha256="ab" * 32, length=4_700_000)
        self.plane.add_model_version(MODEL, NEW, 2, sha256="cd" * 32, length=4_700_000)
        self.plane.add_nodes(
            self.ids,
            lambda i: {"site": f"s{i % SITES}", "hardware": HARDWARE[(i // SITES) % 2]},
            {"active_target": target(OLD)},
            START - HISTORY,
        )

    def point(self, node_id: str, at: datetime, version: str) -> dict[str, Any]:
        p99 = 20.0 * self.offset[node_id] * self.rng.lognormvariate(0.0, 0.15)
        return {
            "node_id": node_id,
            "record_id": str(uuid.UUID(int=self.rng.getrandbits(128))),
            "at": at,
            "received_at": at,
            "schema": "edgefleet.agent.health/2",
            "metrics": {
                "frames": 600.0,
                "frames_dropped": float(self.rng.randint(0, 4)),
                "errors": 0.0,
                "window_s": 60.0,
                "uptime_s": (at - START + 2 * HISTORY).total_seconds(),
                "rss_bytes": self.rss[node_id] + self.rng.gauss(0.0, 1e6),
            },
            "latency": {
                f"{MODEL}@{version}": {
                    "end_to_end": {"p50_ms": p99 * 0.6, "p99_ms": p99},
                    "compute": {"p50_ms": p99 * 0.5, "p99_ms": p99 * 0.8},
                }
            },
        }

    def store(self, points: list[dict[str, Any]], *, latest: bool) -> None:
        """Raw points, and (`latest`) each node's newest as its latest value."""
        from sqlalchemy import delete, insert

        from control_plane.storage.models import HealthLatestRow, HealthPointRow

        with self.sessions() as session:
            for start in range(0, len(points), 5_000):
                session.execute(insert(HealthPointRow), points[start : start + 5_000])
            if latest:
                newest: dict[str, dict[str, Any]] = {}
                for p in points:
                    if p["node_id"] not in newest or p["at"] >= newest[p["node_id"]]["at"]:
                        newest[p["node_id"]] = p
                session.execute(
                    delete(HealthLatestRow).where(HealthLatestRow.node_id.in_(list(newest)))
                )
                session.execute(
                    insert(HealthLatestRow),
                    [
                        {k: p[k] for k in ("node_id", "record_id", "at", "schema", "metrics")}
                        | {"latency": p["latency"]}
                        for p in newest.values()
                    ],
                )
            session.commit()

    def background(self) -> int:
        """Every node's points of the last two hours, one per `BACKGROUND_EVERY`."""
        steps = int(HISTORY / BACKGROUND_EVERY)
        points = [
            self.point(n, START - HISTORY + k * BACKGROUND_EVERY, OLD)
            for n in self.ids
            for k in range(steps)
        ]
        self.store(points, latest=True)
        return len(points)

    def history(self, node_ids: Sequence[str]) -> None:
        """A point every `REPORT_EVERY` over the last two hours for the nodes the gates
        read."""
        count = int(HISTORY / REPORT_EVERY)
        self.store(
            [
                self.point(n, START - HISTORY + k * REPORT_EVERY, OLD)
                for n in node_ids
                for k in range(count)
            ],
            latest=False,
        )

    def report(self, canaries: Sequence[str], controls: Sequence[str], now: datetime) -> None:
        """This minute's points, one every `REPORT_EVERY`: the canaries of the candidate,
        the controls of the old version."""
        times = [now - k * REPORT_EVERY for k in reversed(range(int(_MINUTE / REPORT_EVERY)))]
        self.store(
            [self.point(n, at, NEW) for n in canaries for at in times]
            + [self.point(n, at, OLD) for n in controls for at in times],
            latest=True,
        )

    def activated(self, canaries: Sequence[str]) -> None:
        """The canaries' update statuses: active on their assignment, watchdog passed (the
        presence path a node's status message takes)."""
        director, presence = self.plane.services.director, self.plane.services.nodes.presence
        newest = director.latest_many(canaries)
        for node_id in canaries:
            presence.record_update_status(
                node_id,
                {
                    "target_path": target(NEW),
                    "phase": "active",
                    "detail": "watchdog window passed",
                    "director_sequence": newest[node_id].sequence,
                    "at": None,
                    "reason": "",
                    "facts": {},
                },
            )


# ----------------------------------------------------------------------------- one backend


def controller(plane: InProcessPlane, times: dict[str, float]) -> Any:
    """The plane's rollout service again, with its collaborators' calls timed."""
    from control_plane.rollouts.gates_source import GatesVerdicts
    from control_plane.rollouts.service import RolloutConfig, RolloutService
    from control_plane.storage import session_factory

    services = plane.services
    sessions = session_factory(services.engine)
    parts: dict[str, Any] = {
        "inventory": services.nodes.inventory,
        "verdicts": GatesVerdicts(sessions, retention=services.config.health.raw_retention),
        "health": services.health.queries,
        "director": services.director,
    }
    timed = {k: cast(Any, Timed(v, TIMED[k], times)) for k, v in parts.items()}
    return RolloutService(
        sessions,
        services.clock,
        registry=services.registry,
        inventory=timed["inventory"],
        health=timed["health"],
        director=timed["director"],
        verdicts=timed["verdicts"],
        config=RolloutConfig(replica="bench"),
    )


def step_alone(service: Any, rollout: str, fleet: Fleet, verdict: Any, now: datetime) -> float:
    """`machine.step` alone on the rollout's stored state and the observations a tick at
    `now` makes of the fleet (the canaries sampling): the median of `ANCHOR_REPEATS`."""
    from control_plane.rollouts.machine import step
    from control_plane.rollouts.observe import observe
    from control_plane.rollouts.store import node_sequences

    state = service.state(rollout)
    nodes = [
        n for n in fleet.plane.services.nodes.inventory.list_nodes(fleet=FLEET) if not n.revoked
    ]
    with fleet.sessions() as session:
        sequences = node_sequences(session, int(rollout))
    observations = observe(
        nodes,
        model=MODEL,
        version=NEW,
        sequences={k: v for k, v in sequences.items() if v is not None},
        sampling={n for n, sequence in sequences.items() if sequence is not None},
        now=now,
    )
    runs = []
    for _ in range(ANCHOR_REPEATS):
        started = time.perf_counter()
        step(state, observations, verdict, now)
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def run_backend(kind: str, args: argparse.Namespace, work: Path) -> BackendResult:
    from control_plane.clock import ManualClock
    from control_plane.rollouts.service import RolloutRequest
    from control_plane.rollouts.simulation import StaticVerdict

    total = args.nodes + args.canaries
    result = BackendResult(kind, args.nodes, total)
    clock = ManualClock(START)
    with database(kind, work, prefix="edgefleet_bench_rollout") as made:
        plane = InProcessPlane(work / kind, made.url, FLEET, clock=clock)
        try:
            started = time.monotonic()
            fleet = Fleet(plane, total, seed=13)
            fleet.enroll()
            points = fleet.background()
            result.setup_s = time.monotonic() - started
            print(
                f"  {kind}: {total} nodes and {points} health points in {result.setup_s:.1f} s",
                flush=True,
            )
            times: dict[str, float] = defaultdict(float)
            service = controller(plane, times)
            rate = min(total, 100_000)
            info = service.create(
                plane.admin,
                FLEET,
                RolloutRequest(
                    model=MODEL,
                    version=NEW,
                    stages=f"{args.canaries},100%",
                    bake=f"{args.bake}m",
                    max_rate=f"{rate}/min",
                    spread="site,hardware",
                ),
            )
            rollout = info.id

            def tick() -> TickTiming:
                times.clear()
                began = time.perf_counter()
                report = service.tick()
                seconds = time.perf_counter() - began
                if report.failed:
                    raise RuntimeError(f"the tick failed: {report.failed}")
                after = service.get(rollout, decisions=0).state
                return TickTiming(
                    clock.now().isoformat(),
                    after.status,
                    after.label,
                    seconds,
                    dict(times),
                    report.actions,
                )

            first = tick()
            result.first_stage_s = first.seconds
            state = service.state(rollout)
            canaries = sorted(n for n, r in state.nodes.items() if r.stage == 0)
            controls = list(state.controls)
            print(
                f"  {kind}: stage 1 started {len(canaries)} canaries ({len(controls)} controls) "
                f"in {first.seconds:.2f} s",
                flush=True,
            )
            fleet.history([*canaries, *controls])
            fleet.activated(canaries)
            bake_over: datetime | None = None
            for _minute in range(args.bake + 5):
                clock.advance(timedelta(minutes=1))
                now = clock.now()
                fleet.report(canaries, controls, now)
                info = service.get(rollout, decisions=0)
                if info.state.bake_started is not None:
                    bake_over = info.state.bake_started + timedelta(minutes=args.bake)
                if bake_over is not None and now >= bake_over:
                    break
                timing = tick()
                result.ticks.append(timing)
                verdict = (service.get(rollout, decisions=0).verdict or {}).get("outcome")
                result.verdicts.append(str(verdict))
            else:
                raise RuntimeError(f"the first stage did not bake: {info.state.label}")
            baking = [t for t in result.ticks if t.status == "baking"]
            measured = baking[-args.ticks :]
            result.tick_s = statistics.median(t.seconds for t in measured)
            result.measured = len(measured)
            result.tick_parts = {
                name: statistics.median(t.parts.get(name, 0.0) for t in measured)
                for name in sorted({n for t in measured for n in t.parts})
            }
            now = clock.now()
            result.step_s = step_alone(
                service, rollout, fleet, StaticVerdict("pass", "anchor"), now - timedelta(minutes=1)
            )
            result.stage_step_s = step_alone(
                service, rollout, fleet, StaticVerdict("pass", "anchor"), now
            )
            stage = tick()
            result.stage_path = "gates passed"
            if stage.actions < args.nodes:
                # The gates did not pass (inconclusive pauses): an operator promotes, and
                # the next tick starts the stage.
                last = service.get(rollout, decisions=1)
                print(f"  {kind}: no pass at the bake's end: {last.state.label}", flush=True)
                service.command(plane.admin, rollout, "promote", "bench")
                clock.advance(timedelta(minutes=1))
                stage = tick()
                result.stage_path = "promoted (the gates did not pass)"
            result.stage = stage
            stage_nodes = [n for n in fleet.ids if n not in set(canaries)]
            newest = plane.services.director.latest_many(stage_nodes)
            result.stage_assigned = sum(
                1 for n in stage_nodes if n in newest and newest[n].version == NEW
            )
            result.stage_pending = service.get(rollout, decisions=0).pending_actions
            began = time.perf_counter()
            plane.services.director.pin_many(
                plane.admin, MODEL, NEW, fleet=FLEET, node_ids=stage_nodes
            )
            result.pin_many_s = time.perf_counter() - began
            print(
                f"  {kind}: tick {result.tick_s:.3f} s (step alone {result.step_s:.3f} s); "
                f"stage of {stage.actions} assignments {stage.seconds:.2f} s "
                f"({result.stage_path}; step alone {result.stage_step_s:.3f} s, "
                f"pin_many alone {result.pin_many_s:.2f} s)",
                flush=True,
            )
        finally:
            plane.close()
    return result


# ----------------------------------------------------------------------------- main


def _parts(parts: dict[str, float], total: float) -> str:
    rest = total - sum(parts.values())
    shown = [f"{k} {v:.3f}" for k, v in parts.items() if v > 0.0005]
    return ", ".join([*shown, f"rest {rest:.3f}"])


def render(results: list[BackendResult]) -> str:
    lines = ["rollout controller: seconds (the rest: read, observe, step, store the rollout)"]
    for r in results:
        lines.append(
            f"  {r.database}: fleet {r.fleet} nodes; tick (median of the last {r.measured} "
            f"baking ticks) {r.tick_s:.3f} s = {_parts(r.tick_parts, r.tick_s)}; "
            f"machine.step alone {r.step_s:.3f} s"
        )
        if r.stage is not None:
            lines.append(
                f"  {r.database}: stage tick {r.stage.seconds:.2f} s for {r.stage.actions} "
                f"actions ({r.stage_path}) = {_parts(r.stage.parts, r.stage.seconds)}; "
                f"{r.stage_assigned}/{r.nodes} stage nodes assigned, {r.stage_pending} pending; "
                f"machine.step alone {r.stage_step_s:.3f} s, pin_many alone {r.pin_many_s:.2f} s"
            )
        lines.append(
            f"  {r.database}: first stage ({r.fleet - r.nodes} canaries) {r.first_stage_s:.2f} s"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rollout_controller", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=GOAL_NODES, help="nodes of the second stage")
    parser.add_argument("--canaries", type=int, default=100, help="nodes of the first stage")
    parser.add_argument("--bake", type=int, default=20, help="bake of the first stage, minutes")
    parser.add_argument("--ticks", type=int, default=5, help="baking ticks measured (median)")
    parser.add_argument("--databases", default="sqlite,postgresql", help="sqlite, postgresql")
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "rollout_controller")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={"nodes": 200, "canaries": 10, "bake": 3, "ticks": 2, "databases": "sqlite"},
    )
    kinds = [k.strip() for k in args.databases.split(",") if k.strip()]
    if not kinds or set(kinds) - {"sqlite", "postgresql"}:
        parser.error("--databases takes sqlite and/or postgresql")
    if args.nodes < 1 or args.canaries < 1 or args.bake < 1 or args.ticks < 1:
        parser.error("--nodes, --canaries, --bake and --ticks must be positive")
    if args.ticks >= args.bake:
        parser.error("--ticks must be fewer than --bake minutes")
    args.databases = kinds
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work: Path = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    report = Report("rollout_controller")
    results: list[BackendResult] = []
    try:
        for kind in args.databases:
            print(f"{kind}:", flush=True)
            results.append(run_backend(kind, args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(render(results))
    print(f"code: {git_describe()}")
    print(report.load_line())
    full = args.nodes >= GOAL_NODES
    for r in results:
        report.figure(
            f"{r.database}: tick over {r.fleet} nodes",
            r.tick_s,
            "s",
            anchor=r.step_s,
            anchor_name="machine.step alone",
            goal=f"{GOAL_NODES} nodes in < {GOAL_TICK_S:.0f} s",
            met=full and r.tick_s < GOAL_TICK_S,
        )
        if r.stage is not None:
            complete = r.stage_assigned == r.nodes and r.stage_pending == 0
            report.figure(
                f"{r.database}: stage of {r.nodes} assignments",
                r.stage.seconds,
                "s",
                anchor=r.pin_many_s,
                anchor_name="pin_many alone",
                goal=f"{GOAL_NODES} assigned in < {GOAL_STAGE_S:.0f} s",
                met=full and complete and r.stage.seconds < GOAL_STAGE_S,
            )
            report.figure(f"{r.database}: machine.step starting the stage", r.stage_step_s, "s")
    return report.finish(args, {"backends": [asdict(r) for r in results]})


if __name__ == "__main__":
    sys.exit(main())
