"""The rollout service: create, read and command rollouts, and the controller's `tick`.

What it is for (ADR 0034): `create` checks the spec, refuses overlaps naming the other
rollout and stores a pending rollout (or, `dry_run`, returns the plan without storing);
`list`/`get` read; `command` pauses, resumes, aborts, rolls back or promotes. Every
mutation is audited. `tick(now)` steps each active rollout once: observations from the
inventory and the health store, a verdict from the `VerdictSource`, `machine.step`, the
new state with its decisions and actions stored in one transaction, then the actions
carried out through the director (and webhooks). One replica steps a rollout at a time:
it holds the rollout's lease (a conditional UPDATE, so it works the same on SQLite and
PostgreSQL) and writes only under the row lock, at the revision it read. Actions are
carried out idempotently: each is pending until marked done, and before pinning, the
node's newest assignment is read, so an action already done before a crash is not done
again, and of several pending actions for one node only the last is. What it is not for:
the rules (`machine.py`), the statistics (`gates.py`) or HTTP (`api/routes/rollouts.py`).

Roles: a viewer reads; an operator dry-runs, pauses and rolls back (the directions that
stop the candidate spreading); a release manager creates, resumes, promotes and aborts.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast, get_args

from sqlalchemy import CursorResult, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role
from control_plane.access.service import AuditedMutations, RequestContext
from control_plane.clock import Clock
from control_plane.director.service import Assignment, DirectorService
from control_plane.errors import (
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
)
from control_plane.health.queries import HealthQueries
from control_plane.nodes.inventory import NodeInventory
from control_plane.registry.service import RegistryService
from control_plane.rollouts.machine import (
    UNFINISHED,
    Command,
    CommandKind,
    NodeReport,
    Observations,
    step,
)
from control_plane.rollouts.machine import apply_command as apply_rollout_command
from control_plane.rollouts.notify import Notifier, NullNotifier
from control_plane.rollouts.observe import (
    ObservedNode,
    fleet_node,
    observe,
    running_version,
    shadow_report,
)
from control_plane.rollouts.plan import (
    Conflict,
    FleetNode,
    Plan,
    conflicts,
    dry_run,
    refuse_conflicts,
)
from control_plane.rollouts.spec import RolloutSpec, parse_rollout_spec
from control_plane.rollouts.state import (
    ENDED_VIEW_STATUSES,
    Decision,
    NodePhase,
    RolloutState,
    RolloutStatus,
    ended_phase,
)
from control_plane.rollouts.store import (
    PendingAction,
    decision_of,
    load_state,
    pending_actions,
    phase_counts_of,
    save_step,
    state_document,
)
from control_plane.rollouts.verdicts import Judgement, NoGates, VerdictSource
from control_plane.storage.models import (
    FleetRow,
    NodeRow,
    RolloutActionRow,
    RolloutDecisionRow,
    RolloutNodeRow,
    RolloutRow,
)
from control_plane.text import counted
from control_plane.trust.custom import parse_release_check

__all__ = [
    "ACTIVE_STATUSES",
    "RolloutConfig",
    "RolloutDryRun",
    "RolloutInfo",
    "RolloutRequest",
    "RolloutService",
    "RolloutSummary",
    "ShadowNodeInfo",
    "TickReport",
]

log = logging.getLogger(__name__)

ACTIVE_STATUSES: Final[tuple[RolloutStatus, ...]] = (
    "pending",
    "running",
    "baking",
    "paused",
    "rolling-back",
)
"""Statuses that hold their nodes: a new rollout for the same nodes and model is refused."""
_JUDGED: Final = frozenset({"running", "baking", "paused"})
_MAX_SHADOW_SHOWN: Final = 50  # shadow nodes a rollout's view lists
_IN_FLIGHT: Final = frozenset(
    {"assigned", "downloading", "activating", "active-unhealthy", "healthy"}
)
_COMMAND_ROLES: Final[Mapping[str, Role]] = {
    "pause": Role.OPERATOR,
    "rollback": Role.OPERATOR,
    "resume": Role.RELEASE_MANAGER,
    "promote": Role.RELEASE_MANAGER,
    "abort": Role.RELEASE_MANAGER,
}
_MAX_NOTE: Final = 500
_MAX_LISTED: Final = 500
_MAX_DECISIONS: Final = 1000
_STEP_ATTEMPTS: Final = 3
_MAX_NAMED: Final = 20


def _replica_name() -> str:
    return f"{socket.gethostname()[:64]}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """The controller's timing: `interval_s` between ticks, a `lease` a replica holds a
    rollout for (renewed every tick; a replica that stops loses it after this), how often
    the gates are asked (`evaluation_interval`), how recent a health report of the
    candidate must be to count as samples arriving (`sample_freshness`), the most actions
    carried out per rollout and tick, and this replica's name (unique per process).
    `shadow_per_mille` and `shadow_cpu_percent`: what a shadow node runs the candidate on."""

    interval_s: float = 10.0
    lease: timedelta = timedelta(seconds=60)
    evaluation_interval: timedelta = timedelta(minutes=1)
    sample_freshness: timedelta = timedelta(minutes=5)
    max_actions: int = 20_000
    shadow_per_mille: int = 100
    shadow_cpu_percent: int = 25
    replica: str = field(default_factory=_replica_name)

    def __post_init__(self) -> None:
        if not 0.1 <= self.interval_s <= 3600:
            raise InvalidInputError("rollout interval must be 0.1-3600 s", field="interval_s")
        if not timedelta(seconds=5) <= self.lease <= timedelta(hours=1):
            raise InvalidInputError("rollout lease must be 5 s-1 h", field="lease")
        if self.lease.total_seconds() < 2 * self.interval_s:
            raise InvalidInputError(
                "the rollout lease must be at least two intervals, or it lapses between ticks",
                field="lease",
            )
        for name in ("evaluation_interval", "sample_freshness"):
            if not timedelta(seconds=1) <= getattr(self, name) <= timedelta(days=1):
                raise InvalidInputError(f"{name} must be 1 s-1 d", field=name)
        if not 1 <= self.max_actions <= 1_000_000:
            raise InvalidInputError("max_actions must be 1-1,000,000", field="max_actions")
        if not 0 < len(self.replica) <= 128:
            raise InvalidInputError("the replica name must be 1-128 characters", field="replica")


@dataclass(frozen=True, slots=True)
class RolloutRequest:
    """A rollout as an operator asks for it: the CLI's and the API's strings (`spec.py`
    parses them, naming a bad field)."""

    model: str
    version: str
    stages: str
    selector: str = ""
    bake: str = "30m"
    max_rate: str = "200/min"
    failure_budget: str = "2%"
    window: tuple[str, str] | None = None
    control: str = "auto"
    gates: Mapping[str, Any] | None = None
    deadlines: str = ""
    spread: str = "site,hardware"
    partial: bool = False

    def spec(self, fleet: str) -> RolloutSpec:
        return parse_rollout_spec(
            fleet=fleet, **{f.name: getattr(self, f.name) for f in fields(self)}
        )


@dataclass(frozen=True, slots=True)
class RolloutDryRun:
    """What `create --dry-run` shows: the plan, and the rollouts it would conflict with."""

    plan: Plan
    conflicts: tuple[Conflict, ...]


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    id: str
    fleet: str
    model: str
    version: str
    status: str
    label: str
    stage: int
    counts: Mapping[str, int]
    created_by: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ShadowNodeInfo:
    """A node of the shadow stage: its phase in the rollout, and what its newest processed
    health report says of the candidate (`state`: downloading, self-testing, running or
    failed; empty before it reported one of this candidate since its assignment)."""

    node_id: str
    phase: str
    state: str = ""
    frames_compared: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RolloutInfo:
    """One rollout as `status` and `watch` show it. `state` carries no node records (the
    counts are `counts`, per phase, and `stage_counts`, per stage and phase: a node is
    counted in the shadow stage, `0`, while it shadows or after it failed there, else in
    its canary stage); `shadow_nodes` the shadow stage's nodes (at most
    `_MAX_SHADOW_SHOWN`); `verdict` is the gates' latest evaluation; `decisions` the
    newest, oldest first."""

    id: str
    fleet: str
    state: RolloutState
    counts: Mapping[str, int]
    stage_counts: Mapping[str, Mapping[str, int]]
    created_by: str
    created_at: datetime
    updated_at: datetime
    revision: int
    following: bool
    verdict: Mapping[str, Any] | None
    decisions: tuple[Decision, ...]
    pending_actions: int
    shadow_nodes: tuple[ShadowNodeInfo, ...] = ()
    warnings: tuple[str, ...] = ()
    """`create`'s: the plan's (`Plan.warnings`: a stage short of controls)."""


@dataclass(slots=True)
class TickReport:
    """What one tick did: rollouts stepped here, held by another replica, failed (with
    why), and actions carried out."""

    stepped: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    actions: int = 0


@dataclass(slots=True)
class _Outcome:
    outcome: Literal["done", "skipped", "superseded", "failed"]
    detail: str = ""
    sequence: int | None = None


class RolloutService:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        *,
        registry: RegistryService,
        inventory: NodeInventory,
        health: HealthQueries,
        director: DirectorService,
        verdicts: VerdictSource | None = None,
        notifier: Notifier | None = None,
        config: RolloutConfig | None = None,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._registry = registry
        self._inventory = inventory
        self._health = health
        self._director = director
        self._verdicts: VerdictSource = verdicts if verdicts is not None else NoGates()
        self._notifier: Notifier = notifier if notifier is not None else NullNotifier()
        self.config = config or RolloutConfig()
        self._mutations = AuditedMutations(sessions, clock)
        self.failed_ticks = 0

    # ---------------------------------------------------------------- create

    def create(self, ctx: RequestContext, fleet: str, request: RolloutRequest) -> RolloutInfo:
        """Store a pending rollout (the controller's next tick starts it); audited as
        "rollout.create". Refused: a bad option (InvalidInputError naming it), an unknown
        fleet, model or version (NotFoundError), a version below its floor (PolicyError),
        an active rollout of the same model that can take the same nodes (ConflictError
        naming it). A done rollout of the same model that could take the same nodes stops
        taking in new ones: this one supersedes it."""
        details: dict[str, Any] = {"request": _request_details(request)}
        with self._mutations.mutation(
            ctx, "rollout.create", f"fleet:{fleet}", needs=Role.RELEASE_MANAGER, details=details
        ) as session:
            spec, nodes = self._checked(fleet, request)
            # Locked: creations in one fleet take turns, so two overlapping ones cannot
            # both pass the check below.
            fleet_row = session.scalar(
                select(FleetRow).where(FleetRow.name == fleet).with_for_update()
            )
            if fleet_row is None:
                raise NotFoundError(f"no fleet named {fleet!r}", fleet=fleet)
            active, done = self._others(session, fleet_row.id, spec.model)
            refuse_conflicts(spec, {k: s for k, (s, _) in active.items()}, nodes)
            now = self._clock.now()
            superseded = [
                int(k) for k, (s, _) in done.items() if spec.selector.may_overlap(s.selector)
            ]
            row = RolloutRow(
                fleet_id=fleet_row.id,
                model=spec.model,
                version=spec.version,
                spec=spec.to_dict(),
                state={},
                status="pending",
                stage=0,
                created_by=ctx.principal.name[:128],
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            state = RolloutState.new(str(row.id), spec, now)
            row.state = state_document(state)
            for other in superseded:
                self._supersede(session, other, row.id, now)
            details.update(rollout=str(row.id), summary=spec.summary(), superseded=superseded)
            rollout_id = row.id
        log.info("rollout %s created: %s", rollout_id, spec.summary())
        warnings = dry_run(spec, nodes).warnings()
        return replace(self.get(str(rollout_id)), warnings=warnings)

    def dry_run(self, ctx: RequestContext, fleet: str, request: RolloutRequest) -> RolloutDryRun:
        """The plan `create` would start from, and the rollouts it would conflict with;
        nothing is stored (an operator may look)."""
        ctx.principal.require(Role.OPERATOR, "a rollout dry run")
        spec, nodes = self._checked(fleet, request)
        with self._sessions() as session:
            fleet_id = session.scalar(select(FleetRow.id).where(FleetRow.name == fleet))
            if fleet_id is None:
                raise NotFoundError(f"no fleet named {fleet!r}", fleet=fleet)
            active, _ = self._others(session, fleet_id, spec.model)
        found = conflicts(spec, {k: s for k, (s, _) in active.items()}, nodes)
        return RolloutDryRun(dry_run(spec, nodes), found)

    def _checked(self, fleet: str, request: RolloutRequest) -> tuple[RolloutSpec, list[FleetNode]]:
        spec = request.spec(fleet)
        self._verdicts.check(spec)
        info = self._registry.get_version(fleet, spec.model, spec.version)
        if info.revoked:
            raise PolicyError(
                f"{spec.model} {spec.version} is below its model's floor and may not run",
                model=spec.model,
                version=spec.version,
            )
        from control_plane.rollouts.gates import parse_gates  # numpy, scipy: on demand

        if parse_gates(spec.gates).require_release_check:
            _require_release_check(spec.model, spec.version, info.custom)
        return spec, self._fleet_nodes(fleet, spec.model)

    def _fleet_nodes(self, fleet: str, model: str) -> list[FleetNode]:
        return [
            fleet_node(n, model) for n in self._inventory.list_nodes(fleet=fleet) if not n.revoked
        ]

    def _others(
        self, session: Session, fleet_id: int, model: str
    ) -> tuple[dict[str, tuple[RolloutSpec, str]], dict[str, tuple[RolloutSpec, str]]]:
        """The fleet's rollouts of `model`: active ones and done ones still following."""
        rows = session.execute(
            select(RolloutRow.id, RolloutRow.spec, RolloutRow.status).where(
                RolloutRow.fleet_id == fleet_id,
                RolloutRow.model == model,
                or_(
                    RolloutRow.status.in_(ACTIVE_STATUSES),
                    (RolloutRow.status == "done") & RolloutRow.following,
                ),
            )
        )
        active: dict[str, tuple[RolloutSpec, str]] = {}
        done: dict[str, tuple[RolloutSpec, str]] = {}
        for rollout_id, spec, status in rows:
            parsed = RolloutSpec.from_dict(spec, where=f"rollout {rollout_id}.spec")
            (done if status == "done" else active)[str(rollout_id)] = (parsed, status)
        return active, done

    def _supersede(self, session: Session, rollout_id: int, by: int, now: datetime) -> None:
        row = session.get(RolloutRow, rollout_id, with_for_update=True)
        if row is None or not row.following:
            return
        row.following = False
        session.add(
            RolloutDecisionRow(
                rollout_id=rollout_id,
                revision=row.revision,
                at=now,
                kind="superseded",
                stage=row.stage,
                text=f"superseded by rollout {by}: nodes that enrol later are its",
                numbers={"by": str(by)},
            )
        )

    # ----------------------------------------------------------------- reads

    def list(
        self, *, fleet: str | None = None, active: bool = False, limit: int = 100
    ) -> list[RolloutSummary]:
        """Rollouts newest first: of one fleet, only active ones, at most `limit`."""
        if not 1 <= limit <= _MAX_LISTED:
            raise InvalidInputError(f"limit must be 1-{_MAX_LISTED}", field="limit")
        query = (
            select(RolloutRow, FleetRow.name)
            .join(FleetRow, FleetRow.id == RolloutRow.fleet_id)
            .order_by(RolloutRow.id.desc())
            .limit(limit)
        )
        if fleet is not None:
            query = query.where(FleetRow.name == fleet)
        if active:
            query = query.where(RolloutRow.status.in_(ACTIVE_STATUSES))
        with self._sessions() as session:
            rows = session.execute(query).all()
            counts = phase_counts_of(session, [r.id for r, _ in rows])
            out = []
            for row, fleet_name in rows:
                state = _bare_state(row)
                out.append(
                    RolloutSummary(
                        id=str(row.id),
                        fleet=fleet_name,
                        model=row.model,
                        version=row.version,
                        status=row.status,
                        label=state.label,
                        stage=row.stage,
                        counts=_in_phase_order(counts[row.id]),
                        created_by=row.created_by,
                        created_at=row.created_at,
                        updated_at=row.updated_at,
                    )
                )
        return out

    def get(self, rollout_id: str, *, decisions: int = 20) -> RolloutInfo:
        """One rollout with its counts, latest verdict and newest `decisions`."""
        if not 0 <= decisions <= _MAX_DECISIONS:
            raise InvalidInputError(f"decisions must be 0-{_MAX_DECISIONS}", field="decisions")
        number = _rollout_number(rollout_id)
        with self._sessions() as session:
            found = _with_fleet(session, number)
            if found is None:
                raise NotFoundError(f"no rollout {rollout_id!r}", rollout=rollout_id)
            row, fleet_name = found
            state = _bare_state(row)
            ended = state.status in ENDED_VIEW_STATUSES
            newest = session.scalars(
                select(RolloutDecisionRow)
                .where(RolloutDecisionRow.rollout_id == number)
                .order_by(RolloutDecisionRow.id.desc())
                .limit(decisions)
            ).all()
            stage_counts: dict[str, dict[str, int]] = {}
            for stage, track, phase, count in session.execute(
                select(
                    RolloutNodeRow.stage, RolloutNodeRow.track, RolloutNodeRow.phase, func.count()
                )
                .where(RolloutNodeRow.rollout_id == number)
                .group_by(RolloutNodeRow.stage, RolloutNodeRow.track, RolloutNodeRow.phase)
            ):
                # A shadow node's `stage` is the canary stage it joins once the shadow
                # stage passed; while its phase is about the shadow it is the shadow's.
                key = "0" if track == "shadow" else "none" if stage is None else str(stage)
                if ended:
                    phase = ended_phase(track, phase)
                per_phase = stage_counts.setdefault(key, {})
                per_phase[phase] = per_phase.get(phase, 0) + count
            shadowed = session.execute(
                select(RolloutNodeRow.node_id, RolloutNodeRow.phase, RolloutNodeRow.started_at)
                .where(RolloutNodeRow.rollout_id == number, RolloutNodeRow.track == "shadow")
                .order_by(RolloutNodeRow.rank)
                .limit(_MAX_SHADOW_SHOWN)
            ).all()
            pending = session.scalar(
                select(func.count())
                .select_from(RolloutActionRow)
                .where(RolloutActionRow.rollout_id == number, RolloutActionRow.done_at.is_(None))
            )
            counts: dict[str, int] = {}
            for per_phase in stage_counts.values():
                for phase, count in per_phase.items():
                    counts[phase] = counts.get(phase, 0) + count
            stage_counts = {k: _in_phase_order(v) for k, v in stage_counts.items()}
            return RolloutInfo(
                id=str(row.id),
                fleet=fleet_name,
                state=state,
                counts=_in_phase_order(counts),
                stage_counts=stage_counts,
                created_by=row.created_by,
                created_at=row.created_at,
                updated_at=row.updated_at,
                revision=row.revision,
                following=row.following,
                verdict=row.verdict,
                decisions=tuple(decision_of(d, str(row.id)) for d in reversed(newest)),
                pending_actions=pending or 0,
                shadow_nodes=self._shadow_nodes(state, shadowed),
            )

    def _shadow_nodes(self, state: RolloutState, rows: Sequence[Any]) -> tuple[ShadowNodeInfo, ...]:
        """The shadow stage's nodes with what their newest processed report says of the
        candidate (a report of another candidate, or from before the assignment, says
        nothing)."""
        if not rows:
            return ()
        latest = self._health.latest([node_id for node_id, _, _ in rows])
        candidate = f"{state.spec.model}@{state.spec.version}"
        ended = state.status in ENDED_VIEW_STATUSES
        found = []
        for node_id, phase, started_at in rows:
            if ended:
                # What it ended as; its newest report's state ("running") is no longer
                # the rollout's, the frames it compared until then still are.
                phase = ended_phase("shadow", phase)
            health = latest.get(node_id)
            section = health.shadow if health is not None else None
            fresh = (
                health is not None
                and isinstance(section, Mapping)
                and section.get("candidate") == candidate
                and (started_at is None or health.at >= started_at)
            )
            if not fresh or section is None:
                found.append(ShadowNodeInfo(node_id, phase))
                continue
            compared = section.get("frames_compared")
            found.append(
                ShadowNodeInfo(
                    node_id,
                    phase,
                    "" if ended and phase == "shadow-cleared" else str(section.get("state") or ""),
                    compared if isinstance(compared, int) else None,
                    str(section.get("reason") or section.get("detail") or ""),
                )
            )
        return tuple(found)

    def state(self, rollout_id: str) -> RolloutState:
        """The whole state, node records included (tests, the dashboard's detail)."""
        with self._sessions() as session:
            row = session.get(RolloutRow, _rollout_number(rollout_id))
            if row is None:
                raise NotFoundError(f"no rollout {rollout_id!r}", rollout=rollout_id)
            return load_state(session, row)

    # -------------------------------------------------------------- commands

    def command(
        self, ctx: RequestContext, rollout_id: str, kind: CommandKind, note: str = ""
    ) -> RolloutInfo:
        """An operator's pause, resume, abort, rollback or promote; audited as
        "rollout.<kind>". Refused with ConflictError when the rollout's status does not
        allow it. Its actions (a rollback's assignments) are carried out at once when this
        replica can take the rollout's lease, else by the replica holding it."""
        if kind not in _COMMAND_ROLES:
            raise InvalidInputError(
                f"unknown command {kind!r}; one of {', '.join(_COMMAND_ROLES)}", field="command"
            )
        details: dict[str, Any] = {"note": note[:_MAX_NOTE]}
        number = _rollout_number(rollout_id)
        with self._mutations.mutation(
            ctx, f"rollout.{kind}", f"rollout:{number}", needs=_COMMAND_ROLES[kind], details=details
        ) as session:
            if len(note) > _MAX_NOTE:
                raise InvalidInputError(f"a note is at most {_MAX_NOTE} characters", field="note")
            row = session.get(RolloutRow, number, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no rollout {rollout_id!r}", rollout=rollout_id)
            now = self._clock.now()
            state = load_state(session, row)
            new, actions = apply_rollout_command(
                state, Command(kind, ctx.principal.name, note), now
            )
            details.update(before=state.status, after=new.status, stage=new.stage)
            save_step(session, row, state, new, actions, now, expected_revision=row.revision)
        log.info("rollout %s: %s by %s", number, kind, ctx.principal.name)
        if self._acquire(number, self._clock.now()):
            self._carry_out(number, self._clock.now())
        return self.get(str(number))

    # ------------------------------------------------------------ controller

    def tick(self, now: datetime | None = None) -> TickReport:
        """Step every rollout that needs it once, and carry out what is pending; a rollout
        another replica holds is left to it. One rollout's failure is logged and counted,
        and the others go on."""
        now = now or self._clock.now()
        report = TickReport()
        with self._sessions() as session:
            pending = exists().where(
                RolloutActionRow.rollout_id == RolloutRow.id, RolloutActionRow.done_at.is_(None)
            )
            ids = session.scalars(
                select(RolloutRow.id)
                .where(
                    or_(
                        RolloutRow.status.in_(ACTIVE_STATUSES),
                        (RolloutRow.status == "done") & RolloutRow.following,
                        pending,
                    )
                )
                .order_by(RolloutRow.id)
            ).all()
        judged: set[str] = set()
        for number in ids:
            if not self._acquire(number, now):
                report.elsewhere.append(str(number))
                continue
            try:
                if self._step(number, now) in _JUDGED:
                    judged.add(str(number))
                report.actions += self._carry_out(number, now)
                report.stepped.append(str(number))
            except Exception as exc:  # one rollout's fault must not stop the others
                self.failed_ticks += 1
                report.failed[str(number)] = f"{type(exc).__name__}: {exc}"
                log.exception("stepping rollout %s failed; retrying next tick", number)
        # What the gates keep between evaluations is for the rollouts still judged here:
        # one that ended, or went to another replica, starts cold if it comes back.
        self._verdicts.retain(judged)
        return report

    def release(self) -> None:
        """Give up this replica's leases (a clean stop: another replica takes over now)."""
        with self._sessions.begin() as session:
            session.execute(
                update(RolloutRow)
                .where(RolloutRow.lease_owner == self.config.replica)
                .values(lease_owner=None, lease_expires_at=None)
            )

    def _acquire(self, number: int, now: datetime) -> bool:
        """Take or renew the rollout's lease; False: another replica holds it."""
        with self._sessions.begin() as session:
            result = cast(
                CursorResult[Any],
                session.execute(
                    update(RolloutRow)
                    .where(
                        RolloutRow.id == number,
                        or_(
                            RolloutRow.lease_owner.is_(None),
                            RolloutRow.lease_owner == self.config.replica,
                            RolloutRow.lease_expires_at < now,
                        ),
                    )
                    .values(
                        lease_owner=self.config.replica, lease_expires_at=now + self.config.lease
                    )
                ),
            )
            return result.rowcount == 1

    def _step(self, number: int, now: datetime) -> RolloutStatus | None:
        """One machine step, computed from a read of the state and stored under the row
        lock if nobody stored another meanwhile (else read again, a few times); the
        rollout's status after it (None: not stepped here)."""
        for _ in range(_STEP_ATTEMPTS):
            with self._sessions() as session:
                found = _with_fleet(session, number)
                if found is None:
                    return None
                row, fleet = found
                if row.status not in ACTIVE_STATUSES and not (
                    row.status == "done" and row.following
                ):
                    return None
                if row.status == "done" and not _done_has_work(session, row, fleet):
                    return "done"  # nothing moves and nobody new: not worth a step
                revision, previous = row.revision, row.verdict
                sequences: dict[str, int | None] = {}
                state = load_state(session, row, sequences)
            nodes = self._inventory.fleet_members(fleet)  # the unrevoked ones, lean
            judgement = self._judge(state, previous, now)
            observations = observe(
                nodes,
                model=state.spec.model,
                version=state.spec.version,
                sequences={k: v for k, v in sequences.items() if v is not None},
                sampling=self._sampling(state, nodes, now),
                now=now,
            )
            shadows = self._shadow_reports(state, now)
            if shadows:
                observations = Observations(observations.nodes, {**observations.reports, **shadows})
            new, actions = step(state, observations, judgement.verdict if judgement else None, now)
            if new == state and not actions and judgement is None:
                return state.status
            with self._sessions() as session:
                session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
                locked = session.get(RolloutRow, number, with_for_update=True)
                if locked is None or locked.lease_owner != self.config.replica:
                    return None  # the lease went to another replica: it steps from here
                if locked.revision != revision:
                    continue  # a command came in meanwhile: step from what it stored
                if judgement is not None:
                    locked.verdict = {
                        "stage": state.stage,
                        "evaluated_at": now.isoformat(),
                        "outcome": judgement.verdict.outcome,
                        "summary": judgement.verdict.summary(),
                        "document": dict(judgement.document),
                    }
                save_step(session, locked, state, new, actions, now, expected_revision=revision)
                session.commit()
            return new.status
        raise ConflictError(f"rollout {number} kept changing; stepping it next tick")

    def _judge(
        self, state: RolloutState, previous: Mapping[str, Any] | None, now: datetime
    ) -> Judgement | None:
        """The gates' verdict, at most once per evaluation interval per stage."""
        if state.status not in _JUDGED:
            return None
        same_stage = previous is not None and previous.get("stage") == state.stage
        if same_stage and previous is not None:
            try:
                last = datetime.fromisoformat(str(previous.get("evaluated_at")))
            except ValueError:
                last = None
            if last is not None and now - last < self.config.evaluation_interval:
                return None
        document = previous.get("document") if same_stage and previous is not None else None
        return self._verdicts.judge(state, document if isinstance(document, Mapping) else None, now)

    def _sampling(
        self, state: RolloutState, nodes: Sequence[ObservedNode], now: datetime
    ) -> set[str]:
        """The rollout's nodes in flight whose newest health report, fresh and made after
        their assignment, carries samples of the candidate."""
        flying = {node_id: r for node_id, r in state.nodes.items() if r.phase in _IN_FLIGHT}
        if not flying:
            return set()
        label = f"{state.spec.model}@{state.spec.version}"
        cutoff = now - self.config.sample_freshness
        found = set()
        for node_id, latest in self._health.latest(sorted(flying)).items():
            record = flying[node_id]
            started = record.started_at or record.since
            if latest.at < cutoff or latest.at < started:
                continue
            if record.track == "shadow":
                if latest.metrics.get("shadow_running") == 1.0:
                    found.add(node_id)
            elif label in latest.latency:
                found.add(node_id)
        return found

    def _shadow_reports(self, state: RolloutState, now: datetime) -> dict[str, NodeReport]:
        """What the shadow nodes in flight say of the candidate: the `shadow` section of
        each one's newest processed health report (`health_latest.shadow`, one query for
        all of them); a report made before the node's shadow assignment says nothing."""
        flying = {
            node_id: r
            for node_id, r in state.nodes.items()
            if r.track == "shadow" and r.shadowing and r.phase in _IN_FLIGHT
        }
        if not flying:
            return {}
        reports: dict[str, NodeReport] = {}
        for node_id, latest in sorted(self._health.latest(sorted(flying)).items()):
            record = flying[node_id]
            report = shadow_report(
                latest.shadow,
                reported_at=latest.at,
                model=state.spec.model,
                version=state.spec.version,
                started=record.started_at or record.since,
                now=now,
            )
            if report is not None:
                reports[node_id] = report
        return reports

    # --------------------------------------------------------------- actions

    def _carry_out(self, number: int, now: datetime) -> int:
        """Carry out the rollout's pending actions; how many were settled."""
        with self._sessions() as session:
            found = _with_fleet(session, number)
            if found is None:
                return 0
            row, fleet = found
            spec = RolloutSpec.from_dict(row.spec, where=f"rollout {number}.spec")
            revision = row.revision
            pending = pending_actions(session, number, self.config.max_actions)
        if not pending:
            return 0
        ctx = RequestContext(
            Principal(f"rollout-{number}", f"rollout:{number}", Role.RELEASE_MANAGER),
            f"rollout-{number}-{revision}",
        )
        outcomes = self._outcomes(ctx, number, fleet, spec, pending, now)
        self._settle(number, revision, pending, outcomes, now)
        return len(outcomes)

    def _outcomes(
        self,
        ctx: RequestContext,
        number: int,
        fleet: str,
        spec: RolloutSpec,
        pending: Sequence[PendingAction],
        now: datetime,
    ) -> dict[int, _Outcome]:
        outcomes: dict[int, _Outcome] = {}
        last: dict[str, PendingAction] = {}
        for action in pending:
            if action.kind == "notify":
                event = {
                    "rollout": str(number),
                    "fleet": fleet,
                    "model": spec.model,
                    "version": spec.version,
                    "at": action.created_at.isoformat(),
                    **action.payload,
                }
                taken = self._notifier.submit(event)
                outcomes[action.id] = _Outcome("done", "" if taken else "not sent")
            elif action.node_id is not None:
                earlier = last.get(action.node_id)
                if earlier is not None:
                    outcomes[earlier.id] = _Outcome("superseded", f"by action {action.id}")
                last[action.node_id] = action
        newest = self._director.latest_many(sorted(last))
        pins: dict[str, list[PendingAction]] = {}
        for node_id, action in last.items():
            held = newest.get(node_id)
            if action.kind in ("assign", "rollback"):
                if action.version is None:
                    outcomes[action.id] = _Outcome(
                        "failed", "no version to roll back to: the node had none"
                    )
                elif _already(held, spec.model, action.version, now):
                    assert held is not None
                    outcomes[action.id] = _Outcome(
                        "skipped", "the node's assignment says so already", held.sequence
                    )
                else:
                    pins.setdefault(action.version, []).append(action)
            else:
                outcomes[action.id] = self._shadow_action(ctx, action, spec)
        for version, group in sorted(pins.items()):
            outcomes.update(self._pin(ctx, number, fleet, spec.model, version, group, now))
        return outcomes

    def _pin(
        self,
        ctx: RequestContext,
        number: int,
        fleet: str,
        model: str,
        version: str,
        group: Sequence[PendingAction],
        now: datetime,
    ) -> dict[int, _Outcome]:
        by_node = {a.node_id: a for a in group if a.node_id is not None}
        try:
            result = self._director.pin_many(
                ctx, model, version, fleet=fleet, node_ids=sorted(by_node)
            )
        except NotFoundError:
            return self._pin_one_by_one(ctx, model, version, group)
        except EdgefleetError as exc:
            return {a.id: _Outcome("failed", exc.message[:1000]) for a in group}
        finally:
            self._acquire(number, self._clock.now())  # a long pin must not lose the lease
        outcomes = {
            by_node[a.node_id].id: _Outcome("done", "", a.sequence)
            for a in result.assignments
            if a.node_id in by_node
        }
        for skipped in result.skipped:
            if skipped.node_id in by_node:
                outcomes[by_node[skipped.node_id].id] = _Outcome("failed", skipped.reason)
        return outcomes

    def _pin_one_by_one(
        self, ctx: RequestContext, model: str, version: str, group: Sequence[PendingAction]
    ) -> dict[int, _Outcome]:
        """A node of the group left the fleet: the others are pinned one at a time."""
        outcomes: dict[int, _Outcome] = {}
        for action in group:
            assert action.node_id is not None
            try:
                assignment = self._director.pin(ctx, action.node_id, model, version)
            except EdgefleetError as exc:
                outcomes[action.id] = _Outcome("failed", exc.message[:1000])
            else:
                outcomes[action.id] = _Outcome("done", "", assignment.sequence)
        return outcomes

    def _shadow_action(
        self, ctx: RequestContext, action: PendingAction, spec: RolloutSpec
    ) -> _Outcome:
        """assign-shadow or end-shadow through the director's shadow assignments."""
        if action.node_id is None:
            return _Outcome("failed", "a shadow action without a node")
        try:
            if action.kind == "assign-shadow":
                assignment = self._director.assign_shadow(
                    ctx,
                    action.node_id,
                    spec.model,
                    spec.version,
                    sample_per_mille=self.config.shadow_per_mille,
                    max_cpu_percent=self.config.shadow_cpu_percent,
                )
            else:
                assignment = self._director.clear_shadow(ctx, action.node_id)
        except EdgefleetError as exc:
            return _Outcome("failed", exc.message[:1000])
        return _Outcome("done", "", assignment.sequence)

    def _settle(
        self,
        number: int,
        revision: int,
        pending: Sequence[PendingAction],
        outcomes: Mapping[int, _Outcome],
        now: datetime,
    ) -> None:
        """Mark the actions carried out, note each node's new sequence, and record the
        failures as one decision."""
        actions = {a.id: a for a in pending}
        failed = {
            actions[i].node_id or "?": o.detail
            for i, o in outcomes.items()
            if o.outcome == "failed"
        }
        with self._sessions() as session:
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            session.execute(
                update(RolloutActionRow),
                [
                    {
                        "id": i,
                        "done_at": now,
                        "outcome": o.outcome,
                        "detail": o.detail,
                        "sequence": o.sequence,
                    }
                    for i, o in outcomes.items()
                ],
            )
            sequences = [
                {"rollout_id": number, "node_id": actions[i].node_id, "sequence": o.sequence}
                for i, o in outcomes.items()
                if o.sequence is not None and actions[i].node_id is not None
            ]
            if sequences:
                session.execute(update(RolloutNodeRow), sequences)
            if failed:
                named = dict(sorted(failed.items())[:_MAX_NAMED])
                session.add(
                    RolloutDecisionRow(
                        rollout_id=number,
                        revision=revision,
                        at=now,
                        kind="actions-failed",
                        stage=session.scalar(
                            select(RolloutRow.stage).where(RolloutRow.id == number)
                        )
                        or 0,
                        text=f"{counted(len(failed), 'assignment')} could not be made; "
                        "their nodes time out unless they are made later",
                        numbers={"failed": len(failed), "nodes": named},
                    )
                )
            session.commit()
        if failed:
            log.warning("rollout %s: %d actions failed: %s", number, len(failed), failed)


# ------------------------------------------------------------------ helpers


def _require_release_check(model: str, version: str, custom: Mapping[str, Any]) -> None:
    """The gates file's `require_release_check`: the version's signed release check
    passed on its own figures (ADR 0048)."""
    raw = custom.get("release_check")
    if raw is None:
        raise PolicyError(
            f"the gates require a passed release check and {model} {version} was pushed "
            "without one; push a new version with `model push --baseline FP32.onnx --data DIR`",
            model=model,
            version=version,
        )
    check = parse_release_check(raw)
    if not check.passed:
        how = "failed and was forced through" if check.forced else "failed"
        raise PolicyError(
            f"the gates require a passed release check and {model} {version}'s {how}: "
            f"{check.judged_on} {check.value} against the threshold {check.threshold}",
            model=model,
            version=version,
        )


def _done_has_work(session: Session, row: RolloutRow, fleet: str) -> bool:
    """Whether a done rollout that follows has anything to step (ADR 0034): a node of it
    not final yet (queued, or in flight short of healthy: a late one), or an unrevoked
    node of its fleet outside it (or gone from it) that matches its selector and does
    not run its version. Two plain queries; the second reads only the nodes outside."""
    unfinished = session.scalar(
        select(
            exists().where(
                RolloutNodeRow.rollout_id == row.id, RolloutNodeRow.phase.in_(UNFINISHED)
            )
        )
    )
    if unfinished:
        return True
    spec = RolloutSpec.from_dict(row.spec, where=f"rollout {row.id}.spec")
    inside = exists().where(
        RolloutNodeRow.rollout_id == row.id,
        RolloutNodeRow.node_id == NodeRow.id,
        RolloutNodeRow.phase != "left",
    )
    outside = (
        select(NodeRow.labels, NodeRow.reported_state)
        .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
        .where(FleetRow.name == fleet, NodeRow.revoked_at.is_(None), ~inside)
    )
    for labels, reported in session.execute(outside):
        named = {str(k): str(v) for k, v in (labels or {}).items()}
        if spec.selector.matches(named) and (
            running_version(reported or {}, spec.model) != spec.version
        ):
            return True
    return False


def _with_fleet(session: Session, number: int) -> tuple[RolloutRow, str] | None:
    """The rollout's row and its fleet's name (None: no such rollout)."""
    found = session.execute(
        select(RolloutRow, FleetRow.name)
        .join(FleetRow, FleetRow.id == RolloutRow.fleet_id)
        .where(RolloutRow.id == number)
    ).first()
    return None if found is None else (found[0], found[1])


def _rollout_number(rollout_id: str) -> int:
    text = str(rollout_id).strip()
    if not text.isdigit() or len(text) > 18:
        raise NotFoundError(f"no rollout {rollout_id!r}", rollout=str(rollout_id)[:64])
    return int(text)


def _in_phase_order(counts: Mapping[str, int]) -> dict[str, int]:
    """Nodes per phase, the phases in the order a node moves through them."""
    order = {phase: i for i, phase in enumerate(get_args(NodePhase))}
    return {p: counts[p] for p in sorted(counts, key=lambda p: (order.get(p, len(order)), p))}


def _bare_state(row: RolloutRow) -> RolloutState:
    """The rollout's state without node records (what views need, cheaply)."""
    return RolloutState.from_dict(
        {**row.state, "spec": row.spec, "nodes": {}}, where=f"rollout {row.id}"
    )


def _already(held: Assignment | None, model: str, version: str, now: datetime) -> bool:
    """The node's newest assignment already names `model` `version`, unexpired and with
    no shadow beside it: pinning again would only repeat it."""
    if held is None or held.model != model or held.version != version or held.expired(now):
        return False
    return held.shadow is None


def _request_details(request: RolloutRequest) -> dict[str, Any]:
    return {
        "model": request.model,
        "version": request.version,
        "stages": request.stages,
        "selector": request.selector,
        "bake": request.bake,
        "max_rate": request.max_rate,
        "failure_budget": request.failure_budget,
        "window": list(request.window) if request.window else None,
        "control": request.control,
        "deadlines": request.deadlines,
        "spread": request.spread,
        "partial": request.partial,
        "gates": bool(request.gates),
    }
