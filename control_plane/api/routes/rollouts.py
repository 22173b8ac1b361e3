"""Rollouts: create (or dry-run), list, read, and the operator's commands.

Thin: parse, call `RolloutService`, render. Refusals are RFC 9457 problems through the
one error handler (a bad option 400 naming its field, an overlap 409 naming the other
rollout, a command the status refuses 409, a role too low 403).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, Field

from control_plane.api.deps import ClockDep, ContextDep, PrincipalDep, RolloutsDep
from control_plane.rollouts.plan import Conflict, Plan
from control_plane.rollouts.service import RolloutInfo, RolloutRequest, RolloutSummary
from control_plane.rollouts.state import Decision, plain

router = APIRouter(prefix="/v1", tags=["rollouts"])


class WindowIn(BaseModel):
    cron: str = Field(min_length=1, max_length=200, description="`cron 0 2 * * *` (UTC)")
    duration: str = Field(min_length=1, max_length=32, description="e.g. 3h")


class RolloutCreate(BaseModel):
    """The `edgefleet rollout create` options, as strings the service parses (a bad one
    is refused naming its field)."""

    model: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    stages: str = Field(min_length=1, max_length=500, description="shadow:5,1,10%,50%,100%")
    selector: str = Field(default="", max_length=1000, description="site=a,role!=gate")
    bake: str = Field(default="30m", max_length=32)
    max_rate: str = Field(default="200/min", max_length=32)
    failure_budget: str = Field(default="2%", max_length=32)
    window: WindowIn | None = None
    control: str = Field(default="auto", max_length=16, description="auto | none")
    gates: dict[str, Any] | None = Field(default=None, description="a gates.yaml, as JSON")
    deadlines: str = Field(default="", max_length=500, description="start=10m,download=2h")
    spread: str = Field(default="site,hardware", max_length=300)
    partial: bool = False
    dry_run: bool = Field(default=False, description="return the plan; store nothing")


class CommandIn(BaseModel):
    note: str = Field(default="", max_length=500, description="kept in the decision and audit")


class DecisionOut(BaseModel):
    at: datetime
    kind: str
    stage: int
    text: str
    numbers: dict[str, Any]


class PauseOut(BaseModel):
    kind: str
    reason: str
    since: datetime


class ShadowNodeOut(BaseModel):
    node_id: str
    phase: str = Field(description="the node's phase in the rollout")
    state: str = Field(
        description="the candidate on the node: downloading, self-testing, running, failed "
        "(empty: no report of it since the assignment)"
    )
    frames_compared: int | None
    reason: str


class RolloutOut(BaseModel):
    id: str
    fleet: str
    model: str
    version: str
    status: str
    label: str = Field(description="`stage 2 of 4 (10%) baking`, `paused at …: <reason>`")
    stage: int
    stage_label: str
    stages: list[str] = Field(description="every stage's label, the shadow stage first")
    summary: str
    spec: dict[str, Any]
    counts: dict[str, int] = Field(
        description="nodes per phase (aborted or rolled back: what each ended as, "
        "never-started and shadow-cleared among them)"
    )
    stage_counts: dict[str, dict[str, int]] = Field(
        description="nodes per phase of each stage by index, the shadow stage `0` (its "
        "nodes while they shadow or once they failed there; `none`: past a partial rollout)"
    )
    shadow_nodes: list[ShadowNodeOut] = Field(
        default_factory=list, description="the shadow stage's nodes (at most 50)"
    )
    bake_left_s: float | None
    hold: str
    pause: PauseOut | None
    controls: list[str]
    verdict: dict[str, Any] | None = Field(description="the gates' latest evaluation")
    last: DecisionOut | None
    decisions: list[DecisionOut] = Field(description="the newest, oldest first")
    created_by: str
    created_at: datetime
    updated_at: datetime
    revision: int
    following: bool = Field(description="a done rollout still takes in nodes enrolling later")
    pending_actions: int
    warnings: list[str] = Field(
        default_factory=list,
        description="create's: a stage with fewer controls than the gates need",
    )


class RolloutListed(BaseModel):
    id: str
    fleet: str
    model: str
    version: str
    status: str
    label: str
    stage: int
    counts: dict[str, int]
    created_by: str
    created_at: datetime
    updated_at: datetime


class StagePlanOut(BaseModel):
    index: int
    label: str
    shadow: bool
    target: int
    nodes: list[str]
    controls: list[str]
    filled: list[str] = Field(description="the controls from strata the canaries are not in")


class ConflictOut(BaseModel):
    rollout: str
    text: str
    nodes: list[str]


class DryRunOut(BaseModel):
    summary: str = Field(description="what `rollout create --dry-run` prints")
    matched: int
    to_update: int
    already: int
    stages: list[StagePlanOut]
    outside: list[str]
    conflicts: list[ConflictOut]
    warnings: list[str] = Field(description="stages with fewer controls than the gates need")


def _decision(decision: Decision) -> DecisionOut:
    return DecisionOut(
        at=decision.at,
        kind=decision.kind,
        stage=decision.stage,
        text=decision.text,
        numbers=plain(decision.numbers),
    )


def rollout_out(info: RolloutInfo, now: datetime) -> RolloutOut:
    state, spec = info.state, info.state.spec
    left = state.bake_left(now)
    return RolloutOut(
        id=info.id,
        fleet=info.fleet,
        model=spec.model,
        version=spec.version,
        status=state.status,
        label=state.label,
        stage=state.stage,
        stage_label=spec.stages.label(state.stage),
        stages=[spec.stages.label(i) for i in range(spec.stages.count)],
        summary=spec.summary(),
        spec=spec.to_dict(),
        counts=dict(info.counts),
        stage_counts={k: dict(v) for k, v in info.stage_counts.items()},
        shadow_nodes=[
            ShadowNodeOut(
                node_id=n.node_id,
                phase=n.phase,
                state=n.state,
                frames_compared=n.frames_compared,
                reason=n.reason,
            )
            for n in info.shadow_nodes
        ],
        bake_left_s=None if left is None else left.total_seconds(),
        hold=state.hold,
        pause=None
        if state.pause is None
        else PauseOut(kind=state.pause.kind, reason=state.pause.reason, since=state.pause.since),
        controls=list(state.controls),
        verdict=None if info.verdict is None else dict(info.verdict),
        last=None if state.last is None else _decision(state.last),
        decisions=[_decision(d) for d in info.decisions],
        created_by=info.created_by,
        created_at=info.created_at,
        updated_at=info.updated_at,
        revision=info.revision,
        following=info.following,
        pending_actions=info.pending_actions,
        warnings=list(info.warnings),
    )


def _listed(summary: RolloutSummary) -> RolloutListed:
    return RolloutListed.model_validate(summary, from_attributes=True)


def _dry_run_out(plan: Plan, found: tuple[Conflict, ...]) -> DryRunOut:
    return DryRunOut(
        summary=plan.summary(),
        matched=len(plan.order) + len(plan.already),
        to_update=len(plan.order),
        already=len(plan.already),
        stages=[
            StagePlanOut(
                index=s.index,
                label=s.label,
                shadow=s.shadow,
                target=s.target,
                nodes=list(s.nodes),
                controls=list(s.controls),
                filled=list(s.filled),
            )
            for s in plan.stages
        ],
        outside=list(plan.outside),
        conflicts=[
            ConflictOut(rollout=c.rollout_id, text=c.describe(), nodes=list(c.nodes)) for c in found
        ],
        warnings=list(plan.warnings()),
    )


@router.post(
    "/fleets/{fleet}/rollouts",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": DryRunOut, "description": "dry run: the plan, nothing stored"}},
)
def create_rollout(
    fleet: str,
    body: RolloutCreate,
    response: Response,
    ctx: ContextDep,
    rollouts: RolloutsDep,
    clock: ClockDep,
) -> RolloutOut | DryRunOut:
    """Start a rollout (release-manager), or with `dry_run` see its plan (operator)."""
    request = RolloutRequest(
        **body.model_dump(exclude={"dry_run", "window"}),
        window=None if body.window is None else (body.window.cron, body.window.duration),
    )
    if body.dry_run:
        planned = rollouts.dry_run(ctx, fleet, request)
        response.status_code = status.HTTP_200_OK
        return _dry_run_out(planned.plan, planned.conflicts)
    return rollout_out(rollouts.create(ctx, fleet, request), clock.now())


@router.get("/fleets/{fleet}/rollouts")
def list_fleet_rollouts(
    fleet: str,
    _: PrincipalDep,
    rollouts: RolloutsDep,
    active: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[RolloutListed]:
    """The fleet's rollouts, newest first (`active`: only those in progress)."""
    return [_listed(s) for s in rollouts.list(fleet=fleet, active=active, limit=limit)]


@router.get("/rollouts")
def list_rollouts(
    _: PrincipalDep,
    rollouts: RolloutsDep,
    active: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[RolloutListed]:
    """Every fleet's rollouts, newest first."""
    return [_listed(s) for s in rollouts.list(active=active, limit=limit)]


@router.get("/rollouts/{rollout_id}")
def get_rollout(
    rollout_id: str,
    _: PrincipalDep,
    rollouts: RolloutsDep,
    clock: ClockDep,
    decisions: Annotated[int, Query(ge=0, le=1000)] = 20,
) -> RolloutOut:
    """One rollout: where it is, nodes per phase, the latest verdict, recent decisions."""
    return rollout_out(rollouts.get(rollout_id, decisions=decisions), clock.now())


@router.post("/rollouts/{rollout_id}/{command}")
def command_rollout(
    rollout_id: str,
    command: Literal["pause", "resume", "abort", "rollback", "promote"],
    ctx: ContextDep,
    rollouts: RolloutsDep,
    clock: ClockDep,
    body: CommandIn | None = None,
) -> RolloutOut:
    """pause and rollback: operator; resume, promote and abort: release-manager. 409 when
    the rollout's status does not allow the command."""
    note = body.note if body is not None else ""
    return rollout_out(rollouts.command(ctx, rollout_id, command, note), clock.now())
