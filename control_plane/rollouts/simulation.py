"""A simulated fleet for the rollout controller: assignments go in, node reports come out,
each node following a scripted behaviour on the caller's clock.

What it is for: tests and benchmarks of `machine.step` without a control plane, nodes or
sleeping (a node's report is a function of the time since its assignment). What it is not
for: statistics (a `StaticVerdict` stands in for the gates) or the wire (no director,
no signatures). Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from control_plane.rollouts.machine import (
    Action,
    Assign,
    AssignShadow,
    EndShadow,
    NodeReport,
    Observations,
    Outcome,
    Rollback,
    Verdict,
    step,
)
from control_plane.rollouts.plan import FleetNode
from control_plane.rollouts.state import RolloutState

__all__ = ["Behaviour", "SimulatedFleet", "SimulatedNode", "StaticVerdict", "drive"]

Behaviour = Literal[
    "good",  # downloads, activates, passes its watchdog, reports samples
    "fails-self-test",  # downloads, then fails the self-test and keeps its old version
    "crashes",  # healthy for a while, then the watchdog reverts it
    "silent",  # never answers anything (unplugged); an offline node misses actions too
    "goes-silent",  # healthy, then its reports stop
    "never-healthy",  # active, but no samples ever arrive ("installed", not "updated")
]
_TERMINAL: Final = frozenset({"done", "aborted", "rolled-back"})


@dataclass(frozen=True, slots=True)
class StaticVerdict:
    """A verdict fixed in advance, in the shape `machine.Verdict` asks for."""

    outcome: Outcome
    text: str = ""
    numbers: Mapping[str, Any] = field(default_factory=dict)
    waiting_for_data: str = ""  # an inconclusive one that only needs more time: why

    def summary(self) -> str:
        return self.text or self.outcome

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "text": self.text, **self.numbers}


@dataclass(slots=True)
class _Work:
    kind: Literal["candidate", "shadow", "rollback"]
    version: str | None
    started: datetime


@dataclass(slots=True)
class SimulatedNode:
    id: str
    labels: dict[str, str]
    version: str | None
    behaviour: Behaviour = "good"
    online: bool = True
    enrolled_at: datetime | None = None
    work: _Work | None = None
    before: str | None = None  # the version it ran when its candidate work began

    def fleet_node(self) -> FleetNode:
        return FleetNode(self.id, dict(self.labels), self.version, self.online, self.enrolled_at)


class SimulatedFleet:
    """Nodes by id; every phase of a node's script takes `phase_time` (assigned →
    downloading → activating → active → healthy), a crash comes `3 * phase_time` after
    healthy, a rollback takes one `phase_time`."""

    def __init__(
        self, nodes: Iterable[SimulatedNode], phase_time: timedelta = timedelta(minutes=1)
    ) -> None:
        self.nodes: dict[str, SimulatedNode] = {n.id: n for n in nodes}
        self.phase_time = phase_time
        self.received: list[Action] = []

    def add(self, node: SimulatedNode) -> None:
        self.nodes[node.id] = node

    def apply(self, actions: Sequence[Action], now: datetime) -> None:
        for action in actions:
            if isinstance(action, Assign | AssignShadow | EndShadow | Rollback):
                self.received.append(action)
            node = self.nodes.get(getattr(action, "node_id", ""))
            if node is None or node.behaviour == "silent" or not node.online:
                continue
            if isinstance(action, Assign):
                node.before = node.version
                node.work = _Work("candidate", action.version, now)
            elif isinstance(action, AssignShadow):
                node.work = _Work("shadow", action.version, now)
            elif isinstance(action, EndShadow) and node.work and node.work.kind == "shadow":
                node.work = None
            elif isinstance(action, Rollback):
                node.work = _Work("rollback", action.previous, now)

    def observe(self, now: datetime) -> Observations:
        """Every node's state and report at `now` (versions move as their scripts say)."""
        reports: dict[str, NodeReport] = {}
        for node in self.nodes.values():
            report = self._advance(node, now)
            if report is not None:
                reports[node.id] = report
        return Observations(tuple(n.fleet_node() for n in self.nodes.values()), reports)

    def _advance(self, node: SimulatedNode, now: datetime) -> NodeReport | None:
        work = node.work
        if work is None or node.behaviour == "silent":
            return None
        steps = int((now - work.started) / self.phase_time)
        at = work.started + steps * self.phase_time
        if work.kind == "rollback":
            if steps >= 1:
                node.version, node.work = work.version, None
            return None
        assert work.version is not None
        shadow = work.kind == "shadow"
        behaviour = node.behaviour
        if steps < 1:
            return None
        if steps == 1:
            return NodeReport(work.version, "downloading", at, shadow)
        if steps == 2 or (behaviour == "fails-self-test" and steps >= 2):
            if behaviour == "fails-self-test" and steps >= 3:
                return NodeReport(
                    work.version, "failed", at, shadow, reason="self-test: output-mismatch"
                )
            return NodeReport(work.version, "activating", at, shadow)
        if not shadow:
            node.version = work.version
        if behaviour == "crashes" and steps >= 7:
            node.version = node.before if not shadow else node.version
            return NodeReport(work.version, "failed", at, shadow, reason="watchdog: errors")
        healthy = steps >= 4 and behaviour != "never-healthy"
        if behaviour == "goes-silent" and steps >= 7:
            healthy = False
        return NodeReport(
            work.version, "active", at, shadow, watchdog_passed=healthy, samples=healthy
        )


def drive(
    state: RolloutState,
    fleet: SimulatedFleet,
    verdict_for: Callable[[RolloutState, datetime], Verdict | None],
    start: datetime,
    *,
    tick: timedelta = timedelta(minutes=1),
    max_steps: int = 10_000,
    until: Callable[[RolloutState], bool] = lambda s: s.status in _TERMINAL,
    between: Callable[[RolloutState, datetime], RolloutState] | None = None,
) -> tuple[RolloutState, list[tuple[datetime, tuple[Action, ...]]]]:
    """Step the controller every `tick` until `until(state)` (default: a terminal status)
    or `max_steps`; returns the last state and every step's actions. `between` may
    replace the state between steps (a restart: `from_dict(to_dict())`)."""
    now = start
    history: list[tuple[datetime, tuple[Action, ...]]] = []
    for _ in range(max_steps):
        observations = fleet.observe(now)
        state, actions = step(state, observations, verdict_for(state, now), now)
        fleet.apply(actions, now)
        history.append((now, actions))
        if until(state):
            break
        now += tick
        if between is not None:
            state = between(state, now)
    return state, history
