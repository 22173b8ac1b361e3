"""The rollout controller as a pure state machine: `step(state, observations, verdict,
now) -> (state, actions)`, and `apply_command` for an operator's pause, resume, abort,
rollback or promote.

What it is for: every rule of a rollout's progress (ADR 0033). Stages start their nodes
at most `max_rate`, only inside the maintenance window; each node moves queued →
assigned → downloading → activating → active-unhealthy → healthy ("installed" is not
"updated": healthy means active, watchdog window passed and samples of the candidate
arriving, hawkBit#3185), and every phase has a deadline, so a silent node times out and
counts against the failure budget (hawkbit#693, greengrass#807). A settled stage bakes;
then the gates' verdict decides: pass → next stage, fail → every touched node gets its
previous version back and no other node gets the candidate, inconclusive → pause with the
reason (it never passes and never rolls back by itself, flagger#1035). Each decision is
a `Record` with the numbers behind it. What it is not for: storage, signing or delivery
(the caller turns `Assign`/`Rollback`/... into director assignments, in one transaction
with the new state) or statistics (`gates.py`). The state is plain data
(`to_dict`/`from_dict`) and `step` is deterministic, so a restarted controller continues
exactly where the last one stopped (`state.py`). Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal, Protocol

from control_plane.durations import format_duration
from control_plane.errors import ConflictError
from control_plane.rollouts.plan import Candidate, FleetNode, dry_run, pick_controls, stratum_of
from control_plane.rollouts.state import (
    Decision,
    NodePhase,
    NodeRecord,
    Pause,
    PauseKind,
    RolloutState,
    RolloutStatus,
    aware,
    phase_counts,
    plain,
)

__all__ = [
    "UNFINISHED",
    "Action",
    "Assign",
    "AssignShadow",
    "Command",
    "EndShadow",
    "NodeReport",
    "Notify",
    "Observations",
    "Outcome",
    "Record",
    "Rollback",
    "Verdict",
    "apply_command",
    "step",
]

ReportPhase = Literal["downloading", "activating", "active", "failed"]
CommandKind = Literal["pause", "resume", "abort", "rollback", "promote"]
Outcome = Literal["pass", "fail", "inconclusive"]

# The phases a node moves through towards healthy, in order; a report never moves a node
# back (except healthy → active-unhealthy: its samples stopped), so the deadlines add up
# to a bound on the whole update.
_FORWARD: Final[tuple[NodePhase, ...]] = (
    "assigned",
    "downloading",
    "activating",
    "active-unhealthy",
    "healthy",
)
_IN_FLIGHT: Final = frozenset(_FORWARD)
UNFINISHED: Final = frozenset({"queued"}) | _IN_FLIGHT - {"healthy"}
"""Once a rollout is done, the phases its nodes still move on from (a node that is
healthy by then is final: there is no rollback after done, health alerts cover it)."""
_FAILED: Final = frozenset({"failed", "timed-out"})
_SETTLED: Final = frozenset({"healthy", "failed", "timed-out", "left"})
_IN_PROGRESS: Final = frozenset({"running", "baking", "paused"})
_FOLLOWING: Final = _IN_PROGRESS | {"done"}  # statuses that take in nodes enrolling later
_WINDOW_HOLD: Final = "outside the maintenance window"
_WAITING: Final = "waiting for data: "
_MAX_NAMED: Final = 20  # node ids a decision's numbers list before cutting


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class NodeReport:
    """The newest thing the control plane heard from a node about the candidate.

    `phase` maps the node's update status (downloading and verifying → downloading,
    self-testing → activating, active → active, failed and reverted → failed); `at` is
    when the control plane received it (reports older than the node's assignment are
    ignored); `shadow` says it is about the shadow candidate; `samples` that health
    reports of the candidate are arriving (fresh ones: the caller decides how fresh), and
    `watchdog_passed` that the node's watchdog window after activation is over.
    """

    version: str
    phase: ReportPhase
    at: datetime
    shadow: bool = False
    watchdog_passed: bool = False
    samples: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Observations:
    """The fleet now: every node of it (revoked ones left out) and the newest report of
    each node that has one."""

    nodes: Sequence[FleetNode]
    reports: Mapping[str, NodeReport] = field(default_factory=dict)


class Verdict(Protocol):
    """What the gates decided for the current stage (`gates.evaluate` returns one)."""

    @property
    def outcome(self) -> Outcome: ...

    def summary(self) -> str: ...

    def to_dict(self) -> Mapping[str, Any]: ...

    @property
    def waiting_for_data(self) -> str:
        """For an inconclusive verdict that only more time can settle (too few samples,
        too little exposure yet), why; "" otherwise (no traffic, missing metrics)."""
        ...


@dataclass(frozen=True, slots=True)
class Command:
    """An operator's command: `by` (a principal's name) and `note` go into the record."""

    kind: CommandKind
    by: str
    note: str = ""


# -------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class Assign:
    """Give the node the candidate (a fresh director assignment)."""

    node_id: str
    version: str


@dataclass(frozen=True, slots=True)
class AssignShadow:
    """Keep the node serving `serving` and run `version` beside it (the shadow target)."""

    node_id: str
    version: str
    serving: str


@dataclass(frozen=True, slots=True)
class EndShadow:
    """A fresh assignment of `serving` without a shadow: the shadow work is over."""

    node_id: str
    serving: str


@dataclass(frozen=True, slots=True)
class Rollback:
    """A fresh assignment of the node's version before the rollout (None: the node had no
    version of the model and the fleet none either: the caller withdraws the candidate)."""

    node_id: str
    previous: str | None


@dataclass(frozen=True, slots=True)
class Notify:
    """An alert for people (webhooks, chat): `kind` is the decision's kind."""

    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Record:
    decision: Decision


Action = Assign | AssignShadow | EndShadow | Rollback | Notify | Record


# ---------------------------------------------------------------------------- state


# ---------------------------------------------------------------------- the machine


def step(
    state: RolloutState, observations: Observations, verdict: Verdict | None, now: datetime
) -> tuple[RolloutState, tuple[Action, ...]]:
    """One controller step: take in what the fleet reports and the gates' latest verdict
    for the current stage (None: none this step), return the new state and what to do.

    Deterministic: the same state, observations, verdict and `now` give the same result,
    whether the state was kept in memory or read back with `from_dict`.
    """
    run = _Run(state, aware(now))
    status = state.status
    if status == "pending":
        run.begin(observations)
    elif status in _FOLLOWING:
        run.follow(observations)
        if status in _IN_PROGRESS:
            run.guard(verdict)
        if run.status == "baking":
            run.judge(verdict, observations)
    elif status == "rolling-back":
        run.confirm_rollbacks(observations)
    # A stage entered above starts its nodes in this same step.
    if run.status in ("running", "baking", "done"):
        run.start_nodes()
    if run.status == "running":
        run.settle()
    return run.result()


def apply_command(
    state: RolloutState, command: Command, now: datetime
) -> tuple[RolloutState, tuple[Action, ...]]:
    """An operator's command, or `ConflictError` naming the status that refuses it.

    pause: stop starting nodes (touched nodes carry on, deadlines run, a failing verdict or
    an exceeded budget still rolls back); resume: from any pause (after an inconclusive
    or missing verdict the stage bakes again); abort: stop starting nodes, touched nodes
    keep the candidate, shadows end; rollback: every touched node gets its previous
    version; promote: end the bake now and take the next stage at the next step.
    """
    run = _Run(state, aware(now))
    kind, status = command.kind, state.status
    who = f"{command.by}" + (f": {command.note}" if command.note else "")
    if kind == "pause" and status in ("pending", "running", "baking"):
        run.pause("operator", f"paused by {who}", status)
    elif kind == "resume" and status == "paused" and state.pause is not None:
        run.resume(who)
    elif kind == "abort" and status in _FOLLOWING | {"pending"}:
        run.abort(who)
    elif kind == "rollback" and status in _FOLLOWING | {"pending", "aborted"}:
        run.roll_back("manual", f"rolled back by {who}", {"by": command.by, "note": command.note})
    elif kind == "promote" and (
        status == "baking"
        or (status == "paused" and state.pause is not None and state.pause.resume_to == "baking")
    ):
        run.request_promotion(command.by, who)
    else:
        raise ConflictError(
            f"rollout {state.rollout_id} is {state.label}: {kind} does not apply",
            rollout=state.rollout_id,
            status=status,
            command=kind,
        )
    return run.result()


class _Run:
    """One step's work on a copy of the state; `result()` freezes it again."""

    def __init__(self, state: RolloutState, now: datetime) -> None:
        self.old = state
        self.now = now
        self.spec = state.spec
        self.status: RolloutStatus = state.status
        self.stage = state.stage
        self.since = state.since
        self.nodes = dict(state.nodes)
        self.bake_started = state.bake_started
        self.controls = state.controls
        self.starts = state.starts
        self.pause_info = state.pause
        self.hold = state.hold
        self.baseline = state.baseline
        self.promote_by = state.promote_by
        self.ended = state.ended
        self.last = state.last
        self.actions: list[Action] = []

    def result(self) -> tuple[RolloutState, tuple[Action, ...]]:
        state = RolloutState(
            rollout_id=self.old.rollout_id,
            spec=self.spec,
            status=self.status,
            stage=self.stage,
            since=self.since,
            seed=self.old.seed,
            nodes=self.nodes,
            bake_started=self.bake_started,
            controls=self.controls,
            starts=self.starts,
            pause=self.pause_info,
            hold=self.hold,
            baseline=self.baseline,
            promote_by=self.promote_by,
            ended=self.ended,
            last=self.last,
        )
        return state, tuple(self.actions)

    # ------------------------------------------------------------ bookkeeping

    def record(self, kind: str, text: str, numbers: Mapping[str, Any] | None = None) -> None:
        decision = Decision(
            self.now, self.old.rollout_id, kind, self.stage, text, plain(numbers or {})
        )
        self.last = decision
        self.actions.append(Record(decision))

    def notify(self, kind: str, text: str) -> None:
        self.actions.append(Notify(kind, f"rollout {self.old.rollout_id}: {text}"))

    def enter(self, status: RolloutStatus) -> None:
        self.status, self.since = status, self.now

    @property
    def where(self) -> str:
        return self.spec.stages.label(self.stage)

    def matches(self, node: FleetNode) -> bool:
        return self.spec.selector.matches(node.labels)

    def counts(self) -> dict[str, int]:
        return phase_counts(self.nodes)

    # --------------------------------------------------------------- pending

    def begin(self, observations: Observations) -> None:
        """Take the fleet in: every matched node gets its stage (the plan's, with the
        rollout's seed), then the first stage starts."""
        plan = dry_run(self.spec, observations.nodes, seed=self.old.seed)
        numbers = {
            "matched": len(plan.order) + len(plan.already),
            "to_update": len(plan.order),
            "already": len(plan.already),
            "stages": [len(s.nodes) for s in plan.stages],
            "outside": len(plan.outside),
        }
        if not plan.order:
            if plan.already:
                self.record("done", f"all {_nodes(len(plan.already), 'matched')} run it", numbers)
                self.enter("done")
                self.notify("done", f"nothing to do: every matched node runs {self.spec.version}")
            else:
                self.pause("no-nodes", "the selector matches no node", "pending", numbers)
            return
        versions = {n.id: n.version for n in observations.nodes}
        shadow = set(plan.shadow_nodes)
        baseline = _most_common(v for i in plan.order if (v := versions[i]) is not None)
        self.nodes = {
            node_id: NodeRecord(
                stage=plan.stage_of(node_id),
                rank=rank,
                stratum=plan.strata[node_id],
                previous=versions[node_id],
                since=self.now,
                track="shadow" if node_id in shadow else "candidate",
            )
            for rank, node_id in enumerate(plan.order)
        }
        self.baseline = baseline
        self.record("started", self.spec.summary(), numbers)
        self.enter_stage(0, observations)

    # ---------------------------------------------------------------- stages

    def members(self, stage: int) -> Iterator[tuple[str, NodeRecord]]:
        """The nodes a stage judges: the shadow's nodes, or every node of a canary stage up
        to this one."""
        if self.spec.stages.is_shadow(stage):
            yield from ((i, r) for i, r in self.nodes.items() if r.track == "shadow")
        else:
            yield from (
                (i, r) for i, r in self.nodes.items() if r.stage is not None and r.stage <= stage
            )

    def enter_stage(self, stage: int, observations: Observations) -> None:
        stages = self.spec.stages
        while True:
            self.stage, self.bake_started, self.hold = stage, None, ""
            adds = (
                any(r.track == "shadow" for r in self.nodes.values())
                if stages.is_shadow(stage)
                else any(r.stage == stage for r in self.nodes.values())
            )
            if adds:
                break
            self.record("stage-skipped", f"{self.where} adds no node")
            self.ended = (*self.ended, "skipped")
            if stage + 1 == stages.count:
                self.finish()
                return
            stage += 1
        self.controls = () if stages.is_shadow(stage) else self.pick_controls(observations)
        self.enter("running")
        self.record(
            "stage-started",
            f"{self.where} starts",
            {"nodes": sum(1 for _ in self.members(stage)), "controls": list(self.controls)},
        )

    def pick_controls(self, observations: Observations) -> tuple[str, ...]:
        if self.spec.control == "none":
            return ()
        online = {n.id: n.online for n in observations.nodes}
        canaries = Counter(r.stratum for _, r in self.members(self.stage) if r.phase != "left")
        pool = (
            Candidate(node_id, r.stratum, online.get(node_id, False), r.rank)
            for node_id, r in self.nodes.items()
            if r.phase == "queued"
            and (r.stage is None or r.stage > self.stage)
            and not r.shadowing
            and r.previous is not None
            and node_id in online
        )
        return pick_controls(canaries, pool)

    def advance(self, observations: Observations) -> None:
        if self.spec.stages.is_shadow(self.stage):
            self.end_shadow_stage()
        if self.stage + 1 == self.spec.stages.count:
            self.finish()
        else:
            self.enter_stage(self.stage + 1, observations)

    def end_shadow_stage(self) -> None:
        """Healthy shadow nodes queue for their canary stage; the next stage's own keep
        shadowing until their assignment replaces it, every other shadow ends."""
        following = self.stage + 1
        for node_id, r in sorted(self.nodes.items(), key=lambda item: item[1].rank):
            if r.track != "shadow":
                continue
            healthy = r.phase == "healthy"
            keeps = healthy and r.stage == following
            if r.shadowing and not keeps and r.previous is not None:
                self.actions.append(EndShadow(node_id, r.previous))
            self.nodes[node_id] = replace(
                r,
                track="candidate",
                phase="queued" if healthy else r.phase,
                since=self.now if healthy else r.since,
                shadowing=r.shadowing and keeps,
            )

    def finish(self) -> None:
        self.enter("done")
        self.controls, self.hold = (), ""
        counts = self.counts()
        how = self.how_it_ended()
        healthy = _nodes(counts.get("healthy", 0))
        self.record("done", f"{how}; {healthy} healthy", {**counts, "stages": list(self.ended)})
        self.notify("done", f"{self.spec.model} {self.spec.version}: {how}")

    def how_it_ended(self) -> str:
        """`every stage passed`, or what passed and what a person promoted without a
        verdict (a stage that added no node is skipped and not counted)."""
        ends = Counter(self.ended)
        if not ends["promoted"]:
            return "every stage passed"
        passed = ends["passed"]
        stages = "stage" if passed == 1 else "stages"
        return f"{passed} {stages} passed, {ends['promoted']} promoted without a verdict"

    # ---------------------------------------------------------------- follow

    def follow(self, observations: Observations) -> None:
        """Nodes that enrolled or changed labels since the last step, then every node's
        phase and deadline (once done, only of the nodes not healthy yet: the late ones)."""
        self.take_in(observations)
        reports = observations.reports
        moving = UNFINISHED if self.status == "done" else _IN_FLIGHT
        for node_id, r in self.nodes.items():
            if r.phase in moving:
                self.nodes[node_id] = self.progress(node_id, r, reports.get(node_id))

    def take_in(self, observations: Observations) -> None:
        by_id = {n.id: n for n in observations.nodes}
        joined = [
            n
            for n in observations.nodes
            if self.matches(n)
            and n.version != self.spec.version
            and (n.id not in self.nodes or self.nodes[n.id].phase == "left")
        ]
        for node_id, r in self.nodes.items():
            node = by_id.get(node_id)
            if r.phase == "queued" and (node is None or not self.matches(node)):
                self.nodes[node_id] = replace(r, phase="left", since=self.now)
        if not joined:
            return
        # Where the plan would have put each of them, had they been there from the start.
        plan = dry_run(self.spec, observations.nodes, seed=self.old.seed)
        order = {node_id: i for i, node_id in enumerate(plan.order)}
        rank = max((r.rank for r in self.nodes.values()), default=-1) + 1
        placed: dict[str, int | None] = {}
        for offset, node in enumerate(sorted(joined, key=lambda n: order[n.id])):
            stage = plan.stage_of(node.id)
            placed[node.id] = stage
            self.nodes[node.id] = NodeRecord(
                stage=stage,
                rank=rank + offset,
                stratum=stratum_of(node.labels, self.spec.spread),
                previous=node.version,
                since=self.now,
            )
        self.record(
            "nodes-joined",
            f"{_nodes(len(joined), 'matching')} joined",
            {"stages": dict(list(placed.items())[:_MAX_NAMED]), "count": len(joined)},
        )

    def progress(self, node_id: str, r: NodeRecord, report: NodeReport | None) -> NodeRecord:
        started = r.started_at or r.since
        shadow = r.track == "shadow"
        if (
            report is not None
            and report.at >= started
            and report.version == self.spec.version
            and report.shadow == shadow
        ):
            if report.phase == "failed":
                return self.failed(node_id, r, "failed", report.reason or "failed on the node")
            new = _reported_phase(report, shadow)
            old_rank, new_rank = _FORWARD.index(r.phase), _FORWARD.index(new)
            if new_rank > old_rank or (r.phase == "healthy" and new == "active-unhealthy"):
                r = replace(r, phase=new, since=self.now)
        limit, waiting_for = self.deadline(r.phase)
        if limit is not None and self.now - r.since > limit:
            return self.failed(
                node_id, r, "timed-out", f"{waiting_for} within {format_duration(limit)}"
            )
        return r

    def deadline(self, phase: NodePhase) -> tuple[timedelta | None, str]:
        d = self.spec.deadlines
        version = self.spec.version
        return {
            "assigned": (d.start, "did not start"),
            "downloading": (d.download, "did not finish downloading"),
            "activating": (d.activate, "did not become active"),
            "active-unhealthy": (
                d.report,
                f"not healthy (watchdog passed and samples of {version})",
            ),
        }.get(phase, (None, ""))

    def failed(self, node_id: str, r: NodeRecord, phase: NodePhase, reason: str) -> NodeRecord:
        self.record(
            f"node-{phase}",
            f"{node_id} {phase} while {r.phase}: {reason}",
            {"node": node_id, "phase": r.phase, "reason": reason, "track": r.track},
        )
        return replace(r, phase=phase, since=self.now, reason=reason)

    # ----------------------------------------------------------------- guard

    def guard(self, verdict: Verdict | None) -> None:
        """The two automatic rollbacks: the failure budget and a failing verdict."""
        started = [r for r in self.nodes.values() if r.started_at is not None]
        failed = sorted(
            (node_id for node_id, r in self.nodes.items() if r.phase in _FAILED),
            key=lambda i: self.nodes[i].rank,
        )
        budget = self.spec.failure_budget
        if budget.exceeded(len(failed), len(started)):
            self.roll_back(
                "budget",
                f"failure budget {budget} exceeded: {len(failed)} of "
                f"{_nodes(len(started), 'started')} failed or timed out",
                {
                    "failed": len(failed),
                    "started": len(started),
                    "budget": str(budget),
                    "nodes": {i: self.nodes[i].reason for i in failed[:_MAX_NAMED]},
                },
            )
        elif verdict is not None and verdict.outcome == "fail":
            self.roll_back(
                "verdict",
                f"the gates failed {self.where}: {verdict.summary()}",
                {"verdict": verdict.to_dict()},
            )

    # ----------------------------------------------------------------- start

    def start_nodes(self) -> None:
        """Start the queued nodes the current stage (or, once done, any stage) takes: at
        most the rate allows, only while the window is open."""
        queue = sorted(self.queued(), key=lambda item: (item[1].stage or 0, item[1].rank))
        window, rate = self.spec.window, self.spec.max_rate
        was_window_hold = self.hold.startswith(_WINDOW_HOLD)
        # A baking stage starts nobody (its nodes have all settled): its hold is the wait
        # for data, kept until a verdict ends it.
        keep = self.status == "baking" and self.hold.startswith(_WAITING)
        self.hold = self.hold if keep else ""
        if queue and window is not None and not window.is_open(self.now):
            opens = window.next_open(self.now)
            self.hold = f"{_WINDOW_HOLD} ({window}); it opens at " + (
                opens.isoformat() if opens is not None else "no time in the next 8 years"
            )
            if not was_window_hold:
                self.record("window-closed", self.hold, {"queued": len(queue)})
            return
        if was_window_hold and queue:
            self.record("window-open", f"the maintenance window opened; {len(queue)} queued")
        cutoff = self.now - rate.window
        self.starts = tuple((at, n) for at, n in self.starts if at > cutoff)
        used = sum(n for _, n in self.starts)
        take = queue[: max(rate.per_window - used, 0)]
        if len(take) < len(queue):
            self.hold = (
                f"rate limit {rate}: {used + len(take)} started in the last "
                f"{format_duration(rate.window)}, {len(queue) - len(take)} waiting"
            )
        if not take:
            return
        for node_id, r in take:
            if r.track == "shadow":
                assert r.previous is not None  # the plan picks shadow nodes that serve one
                self.actions.append(AssignShadow(node_id, self.spec.version, r.previous))
            else:
                self.actions.append(Assign(node_id, self.spec.version))
            self.nodes[node_id] = replace(
                r,
                phase="assigned",
                since=self.now,
                started_at=self.now,
                shadowing=r.track == "shadow",
                touched=r.touched or r.track == "candidate",
            )
        self.starts = (*self.starts, (self.now, len(take)))
        self.record(
            "nodes-started",
            f"{_nodes(len(take))} started" + (f"; {self.hold}" if self.hold else ""),
            {"started": len(take), "waiting": len(queue) - len(take)},
        )

    def queued(self) -> Iterator[tuple[str, NodeRecord]]:
        if self.status == "done":
            last = self.spec.stages.count - 1
            yield from (
                (i, r)
                for i, r in self.nodes.items()
                if r.phase == "queued" and r.stage is not None and r.stage <= last
            )
        else:
            yield from ((i, r) for i, r in self.members(self.stage) if r.phase == "queued")

    # ------------------------------------------------------------ settle, judge

    def settle(self) -> None:
        """A stage whose nodes are all healthy, failed, timed out or gone starts baking."""
        if any(r.phase not in _SETTLED for _, r in self.members(self.stage)):
            return
        self.enter("baking")
        self.bake_started = self.now
        counts = phase_counts(dict(self.members(self.stage)))
        self.record(
            "baking",
            f"{self.where}: {_nodes(counts.get('healthy', 0))} healthy; "
            f"baking {format_duration(self.spec.bake)}",
            counts,
        )

    def judge(self, verdict: Verdict | None, observations: Observations) -> None:
        if self.promote_by:
            by, self.promote_by = self.promote_by, ""
            self.record("promoted", f"{self.where} promoted by {by} without a verdict")
            self.notify("promoted", f"{self.where} promoted by {by}")
            self.ended = (*self.ended, "promoted")
            self.advance(observations)
            return
        assert self.bake_started is not None
        bake_over = self.bake_started + self.spec.bake
        if self.now < bake_over:
            return
        if verdict is None:
            if self.now >= bake_over + self.spec.deadlines.verdict:
                self.pause(
                    "no-verdict",
                    f"no verdict from the gates {format_duration(self.spec.deadlines.verdict)} "
                    "after the bake",
                    "baking",
                )
            return
        if verdict.outcome == "pass":
            self.record(
                "stage-passed",
                f"{self.where} passed: {verdict.summary()}",
                {"verdict": verdict.to_dict()},
            )
            self.notify("stage-passed", f"{self.where} passed: {verdict.summary()}")
            self.ended = (*self.ended, "passed")
            self.advance(observations)
        elif verdict.outcome == "inconclusive":
            waiting = verdict.waiting_for_data
            deadline = self.spec.deadlines.verdict
            if waiting and self.now < bake_over + deadline:
                # Short of data only: bake on and ask again, until the verdict deadline.
                if not self.hold.startswith(_WAITING):
                    self.record(
                        "waiting-for-data",
                        f"{self.where} bakes on: {_WAITING}{waiting} (until "
                        f"{format_duration(deadline)} after the bake)",
                        {"verdict": verdict.to_dict()},
                    )
                self.hold = _WAITING + waiting
                return
            still = f" (still {format_duration(deadline)} after the bake)" if waiting else ""
            self.pause(
                "inconclusive",
                f"inconclusive{still}: {verdict.summary()}",
                "baking",
                {"verdict": verdict.to_dict()},
            )

    # ------------------------------------------------------ pause and friends

    def pause(
        self,
        kind: PauseKind,
        reason: str,
        resume_to: RolloutStatus,
        numbers: Mapping[str, Any] | None = None,
    ) -> None:
        self.pause_info = Pause(kind, reason, resume_to, self.now)
        self.enter("paused")
        self.hold = ""
        self.record("paused", f"paused at {self.where}: {reason}", numbers)
        self.notify("paused", f"paused at {self.where}: {reason}")

    def resume(self, who: str) -> None:
        pause = self.pause_info
        assert pause is not None
        self.pause_info = None
        self.enter(pause.resume_to)
        rebake = pause.kind in ("inconclusive", "no-verdict")
        if rebake:
            self.bake_started = self.now
        again = "; the stage bakes again" if rebake else ""
        self.record("resumed", f"resumed by {who} ({pause.kind} pause){again}")
        self.notify("resumed", f"{self.where} resumed by {who}")

    def abort(self, who: str) -> None:
        self.end_shadows()
        self.enter("aborted")
        self.pause_info, self.hold, self.promote_by = None, "", ""
        counts = self.counts()
        self.record("aborted", f"aborted by {who}; touched nodes keep what they run", counts)
        self.notify("aborted", f"aborted at {self.where} by {who}")

    def request_promotion(self, by: str, who: str) -> None:
        self.pause_info = None
        self.enter("baking")
        self.promote_by = by
        self.record("promote-requested", f"promotion of {self.where} requested by {who}")

    def end_shadows(self) -> None:
        for node_id, r in sorted(self.nodes.items(), key=lambda item: item[1].rank):
            if r.shadowing and r.previous is not None:
                self.actions.append(EndShadow(node_id, r.previous))
                self.nodes[node_id] = replace(r, shadowing=False)

    # --------------------------------------------------------------- rollback

    def roll_back(self, why: str, text: str, numbers: Mapping[str, Any]) -> None:
        """Every touched node gets a fresh assignment of its previous version; shadows
        end; nothing starts any more."""
        counts = self.counts()
        self.end_shadows()
        touched = 0
        for node_id, r in sorted(self.nodes.items(), key=lambda item: item[1].rank):
            if r.touched:
                touched += 1
                self.actions.append(Rollback(node_id, self.rollback_target(r)))
                self.nodes[node_id] = replace(r, phase="rolling-back", since=self.now)
        self.pause_info, self.hold, self.promote_by, self.controls = None, "", "", ()
        self.record(
            "rolling-back",
            f"{text}; {_nodes(touched)} "
            + ("gets its previous version" if touched == 1 else "get their previous version"),
            {"why": why, **numbers, "phases": counts, "touched": touched},
        )
        self.notify("rolling-back", f"rolling back at {self.where}: {text}")
        self.enter("rolling-back")
        if not touched:
            self.rolled_back()

    def rollback_target(self, r: NodeRecord) -> str | None:
        return r.previous if r.previous is not None else self.baseline

    def confirm_rollbacks(self, observations: Observations) -> None:
        """A node is rolled back once it reports its previous version active; one that does
        not within start + download + activate is recorded as timed out."""
        versions = {n.id: n.version for n in observations.nodes}
        d = self.spec.deadlines
        limit = d.start + d.download + d.activate
        for node_id, r in self.nodes.items():
            if r.phase != "rolling-back":
                continue
            target = self.rollback_target(r)
            back = node_id in versions and (
                versions[node_id] == target
                if target is not None
                else versions[node_id] != self.spec.version
            )
            if back:
                self.nodes[node_id] = replace(r, phase="rolled-back", since=self.now)
            elif self.now - r.since > limit:
                reason = f"rollback not confirmed within {format_duration(limit)}"
                self.nodes[node_id] = self.failed(node_id, r, "timed-out", reason)
        if not any(r.phase == "rolling-back" for r in self.nodes.values()):
            self.rolled_back()

    def rolled_back(self) -> None:
        counts = self.counts()
        self.enter("rolled-back")
        unconfirmed = sum(1 for r in self.nodes.values() if r.touched and r.phase == "timed-out")
        note = f"; {_nodes(unconfirmed)} did not confirm" if unconfirmed else ""
        self.record("rolled-back", f"rolled back{note}", counts)
        self.notify("rolled-back", f"{self.spec.model} {self.spec.version} rolled back{note}")


# ---------------------------------------------------------------------- helpers


def _reported_phase(report: NodeReport, shadow: bool) -> NodePhase:
    if report.phase == "downloading":
        return "downloading"
    if report.phase == "activating":
        return "activating"
    # A shadow has no watchdog: it serves nothing.
    healthy = report.samples and (report.watchdog_passed or shadow)
    return "healthy" if healthy else "active-unhealthy"


def _nodes(count: int, what: str = "") -> str:
    """`1 node`, `3 nodes`, `1 started node`."""
    noun = "node" if count == 1 else "nodes"
    return f"{count} {what} {noun}" if what else f"{count} {noun}"


def _most_common(values: Iterator[str]) -> str | None:
    counts = Counter(values)
    if not counts:
        return None
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]
