"""A rollout's state as rows, inside the caller's transaction: load, save the new state with
the decisions and actions of its step, read what is pending.

What it is for: the service's storage (ADR 0034). The rollout row keeps the spec and the
state without its nodes, `rollout_nodes` one row per node (only the rows a step changed
are written), `rollout_decisions` each `Record` (of the routine kinds only the newest),
`rollout_actions` each action, pending until carried out. What it is not for:
transactions, locks, leases or policy (the service), or the rules (the machine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from control_plane.errors import ConflictError
from control_plane.rollouts.machine import (
    Action,
    Assign,
    AssignShadow,
    EndShadow,
    Notify,
    Record,
    Rollback,
)
from control_plane.rollouts.state import (
    ENDED_VIEW_STATUSES,
    Decision,
    NodeRecord,
    RolloutState,
    ended_phase,
    stored_record,
)
from control_plane.storage.models import (
    RolloutActionRow,
    RolloutDecisionRow,
    RolloutNodeRow,
    RolloutRow,
)

__all__ = [
    "ROUTINE_DECISIONS",
    "ROUTINE_KEPT",
    "PendingAction",
    "decision_of",
    "load_state",
    "node_sequences",
    "pending_actions",
    "phase_counts_of",
    "prune_routine_decisions",
    "save_step",
    "state_document",
]

_NODE_BATCH: Final = 1000  # rows per bulk statement

# Decisions that repeat while nothing changes state: each kind keeps only its newest
# `ROUTINE_KEPT` per rollout (a done rollout that follows enrolments, a rate limit or a
# daily window would otherwise add rows for ever). Every other kind, the stage and status
# changes, node failures and the commands, is kept for good.
ROUTINE_DECISIONS: Final = frozenset(
    {"nodes-started", "nodes-joined", "window-closed", "window-open", "actions-failed"}
)
ROUTINE_KEPT: Final = 50


def state_document(state: RolloutState) -> dict[str, Any]:
    """What the rollout row keeps: the state without its spec (a column) and nodes (rows)."""
    document = state.to_dict()
    del document["spec"], document["nodes"]
    return document


def _node_row(rollout_id: int, node_id: str, r: NodeRecord) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "node_id": node_id,
        "stage": r.stage,
        "rank": r.rank,
        "stratum": r.stratum,
        "previous": r.previous,
        "since": r.since,
        "phase": r.phase,
        "track": r.track,
        "shadowing": r.shadowing,
        "touched": r.touched,
        "started_at": r.started_at,
        "reason": r.reason,
    }


_RECORD_COLUMNS: Final = (
    RolloutNodeRow.node_id,
    RolloutNodeRow.stage,
    RolloutNodeRow.rank,
    RolloutNodeRow.stratum,
    RolloutNodeRow.previous,
    RolloutNodeRow.since,
    RolloutNodeRow.phase,
    RolloutNodeRow.track,
    RolloutNodeRow.shadowing,
    RolloutNodeRow.touched,
    RolloutNodeRow.started_at,
    RolloutNodeRow.reason,
)


def load_state(
    session: Session, row: RolloutRow, sequences: dict[str, int | None] | None = None
) -> RolloutState:
    """The rollout's state, read back through `RolloutState.from_dict` and, its node
    records, `stored_record` (every field checked, a bad one named); `sequences`, when
    given, gets what `node_sequences` would answer, from the same read."""
    # Plain rows, not ORM objects: a rollout of 10,000 nodes is read every tick, and
    # building an instance per row cost more than the query (bench/rollout_controller).
    nodes = session.execute(
        select(*_RECORD_COLUMNS, RolloutNodeRow.sequence)
        .where(RolloutNodeRow.rollout_id == row.id)
        .order_by(RolloutNodeRow.rank)
    ).all()
    if sequences is not None:
        sequences.update((n.node_id, n.sequence) for n in nodes)
    where = f"rollout {row.id}"
    state = RolloutState.from_dict({**row.state, "spec": row.spec, "nodes": {}}, where=where)
    records = {
        n.node_id: stored_record(
            f"{where}.nodes.{n.node_id}",
            stage=n.stage,
            rank=n.rank,
            stratum=n.stratum,
            previous=n.previous,
            since=n.since,
            phase=n.phase,
            track=n.track,
            shadowing=n.shadowing,
            touched=n.touched,
            started_at=n.started_at,
            reason=n.reason,
        )
        for n in nodes
    }
    return replace(state, nodes=records)


def node_sequences(session: Session, rollout_id: int) -> dict[str, int | None]:
    """Each node's director sequence of the rollout's last assignment (None: none out)."""
    found = session.execute(
        select(RolloutNodeRow.node_id, RolloutNodeRow.sequence).where(
            RolloutNodeRow.rollout_id == rollout_id
        )
    )
    return {node_id: sequence for node_id, sequence in found}


def _chunks(rows: Sequence[dict[str, Any]]) -> Iterable[Sequence[dict[str, Any]]]:
    for start in range(0, len(rows), _NODE_BATCH):
        yield rows[start : start + _NODE_BATCH]


def save_step(
    session: Session,
    row: RolloutRow,
    before: RolloutState,
    after: RolloutState,
    actions: Sequence[Action],
    now: datetime,
    *,
    expected_revision: int,
) -> int:
    """Store `after` over `before` with its step's decisions and actions in the session's
    transaction; the new revision. `ConflictError` when the row is no longer at
    `expected_revision` (another writer stored a step since it was read)."""
    if row.revision != expected_revision:
        raise ConflictError(
            f"rollout {row.id} changed meanwhile (revision {row.revision}, not "
            f"{expected_revision}); try again",
            rollout=str(row.id),
        )
    revision = expected_revision + 1
    added, changed = [], []
    for node_id, record in after.nodes.items():
        old = before.nodes.get(node_id)
        if old is None:
            added.append(_node_row(row.id, node_id, record))
        elif old != record:
            changed.append(_node_row(row.id, node_id, record))
    for batch in _chunks(added):
        session.execute(insert(RolloutNodeRow), list(batch))
    for batch in _chunks(changed):
        session.execute(update(RolloutNodeRow), list(batch))
    _store_actions(session, row.id, revision, actions, now)
    row.state = state_document(after)
    row.status = after.status
    row.stage = after.stage
    row.updated_at = now
    row.revision = revision
    return revision


def _store_actions(
    session: Session, rollout_id: int, revision: int, actions: Sequence[Action], now: datetime
) -> None:
    decisions: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    records = {a.decision.kind: a.decision for a in actions if isinstance(a, Record)}

    def action(what: str, node_id: str | None, version: str | None, **payload: Any) -> None:
        pending.append(
            {
                "rollout_id": rollout_id,
                "revision": revision,
                "kind": what,
                "node_id": node_id,
                "version": version,
                "payload": payload,
                "created_at": now,
                "detail": "",
            }
        )

    for a in actions:
        if isinstance(a, Record):
            d = a.decision
            decisions.append(
                {
                    "rollout_id": rollout_id,
                    "revision": revision,
                    "at": d.at,
                    "kind": d.kind[:32],
                    "stage": d.stage,
                    "text": d.text,
                    "numbers": dict(d.to_dict()["numbers"]),
                }
            )
        elif isinstance(a, Assign):
            action("assign", a.node_id, a.version)
        elif isinstance(a, AssignShadow):
            action("assign-shadow", a.node_id, a.version, serving=a.serving)
        elif isinstance(a, EndShadow):
            action("end-shadow", a.node_id, a.serving)
        elif isinstance(a, Rollback):
            action("rollback", a.node_id, a.previous)
        elif isinstance(a, Notify):
            decision = records.get(a.kind)
            numbers = dict(decision.to_dict()["numbers"]) if decision is not None else {}
            action("notify", None, None, kind=a.kind, text=a.text, numbers=numbers)
    for batch in _chunks(decisions):
        session.execute(insert(RolloutDecisionRow), list(batch))
    for batch in _chunks(pending):
        session.execute(insert(RolloutActionRow), list(batch))
    if any(d["kind"] in ROUTINE_DECISIONS for d in decisions):
        prune_routine_decisions(session, rollout_id)


def prune_routine_decisions(session: Session, rollout_id: int, keep: int = ROUTINE_KEPT) -> int:
    """Delete the rollout's routine decisions (`ROUTINE_DECISIONS`) older than the newest
    `keep` of their kind; how many went. Runs with each step that stores one, so all of
    them stay bounded (a step that starts nodes records one, and `actions-failed` follows
    such steps only)."""
    deleted = 0
    for kind in sorted(ROUTINE_DECISIONS):
        mine = (RolloutDecisionRow.rollout_id == rollout_id, RolloutDecisionRow.kind == kind)
        oldest_kept = (
            select(RolloutDecisionRow.id)
            .where(*mine)
            .order_by(RolloutDecisionRow.id.desc())
            .offset(keep - 1)
            .limit(1)
            .scalar_subquery()
        )
        # Fewer than `keep`: the subquery is NULL and `id < NULL` deletes nothing.
        result = session.execute(
            delete(RolloutDecisionRow)
            .where(*mine, RolloutDecisionRow.id < oldest_kept)
            .execution_options(synchronize_session=False)
        )
        deleted += max(getattr(result, "rowcount", 0) or 0, 0)
    return deleted


@dataclass(frozen=True, slots=True)
class PendingAction:
    id: int
    kind: str
    node_id: str | None
    version: str | None
    payload: Mapping[str, Any]
    created_at: datetime


def pending_actions(session: Session, rollout_id: int, limit: int) -> list[PendingAction]:
    """The rollout's actions not yet carried out, oldest first."""
    rows = session.scalars(
        select(RolloutActionRow)
        .where(RolloutActionRow.rollout_id == rollout_id, RolloutActionRow.done_at.is_(None))
        .order_by(RolloutActionRow.id)
        .limit(limit)
    ).all()
    return [
        PendingAction(r.id, r.kind, r.node_id, r.version, dict(r.payload), r.created_at)
        for r in rows
    ]


def decision_of(row: RolloutDecisionRow, rollout_id: str) -> Decision:
    return Decision(row.at, rollout_id, row.kind, row.stage, row.text, dict(row.numbers))


def phase_counts_of(session: Session, rollout_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Nodes per phase of each rollout, counted by the database; of an aborted or rolled-back
    rollout, per `ended_phase` (what each node ended as)."""
    counts: dict[int, dict[str, int]] = {i: {} for i in rollout_ids}
    if not rollout_ids:
        return counts
    found = session.execute(
        select(
            RolloutNodeRow.rollout_id,
            RolloutRow.status,
            RolloutNodeRow.track,
            RolloutNodeRow.phase,
            func.count(),
        )
        .join(RolloutRow, RolloutRow.id == RolloutNodeRow.rollout_id)
        .where(RolloutNodeRow.rollout_id.in_(list(rollout_ids)))
        .group_by(
            RolloutNodeRow.rollout_id, RolloutRow.status, RolloutNodeRow.track, RolloutNodeRow.phase
        )
    )
    for rollout_id, status, track, phase, count in found:
        shown = ended_phase(track, phase) if status in ENDED_VIEW_STATUSES else phase
        per_phase = counts[rollout_id]
        per_phase[shown] = per_phase.get(shown, 0) + count
    return counts
