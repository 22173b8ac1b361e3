"""The director: decides which model target nodes shall run, signs it, keeps the history.

`pin` is the operator's decision for one node; `pin_many` the same decision for many
nodes of one fleet (by id or by labels), made in chunks of one transaction each, so a
10,000-node change is a few statements per thousand nodes rather than per node (rollouts
will call it too). Every assignment gets its node's next sequence and is stored signed,
exactly as the node receives it. Once a pin, or a chunk, has committed it goes to the
`AssignmentDelivery` port (the transports running in this process push it to connected
nodes); the transports also answer every node's Hello with `current(node_id)`, so a node
that was not reachable gets it then. The signing rules live in
`control_plane.director.assignments`; no transport is imported here.

`renew_expiring` re-signs every current assignment that expires within a third of the
lifetime, marked `renewal` (ADR 0032): the same target and shadow, the next sequence, a
later expiry; the server runs it on a schedule, so assignments never lapse. The node
takes a renewal only for the target it already holds and never retries a failed one
because of it. `assign_shadow` / `clear_shadow` sign the node's current target again with
or without a shadow candidate (ADR 0031), marked as renewals too: the served target is
not a new decision, so a target that failed on the node is not tried again.

`move_off_revoked` is revocation as a rollout (ADR 0035): after a push raises a floor
(`after_push`), and in a periodic pass (`move_all_off_revoked`), every node assigned a
version below its model's floor is pinned to the newest version at or above it (the plan:
`control_plane.director.revocation`); with none, the nodes are left and named.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from securesystemslib.signer import Signer
from sqlalchemy import and_, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import SYSTEM, AuditedMutations, RequestContext
from control_plane.clock import Clock
from control_plane.director.assignments import (
    DirectorKeyring,
    ShadowSpec,
    check_shadow_settings,
    shadow_of,
    sign_assignment,
    sign_assignments,
)
from control_plane.director.delivery import AssignmentDelivery, FanOutDelivery
from control_plane.director.revocation import Release, plan_revocation
from control_plane.errors import (
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
    UnavailableError,
)
from control_plane.identity.bootstrap import validate_labels
from control_plane.nodes.inventory import NodeInventory
from control_plane.registry.service import ModelVersionInfo, PushResult, RegistryService
from control_plane.storage.copy import BinaryCopy, copy_rows
from control_plane.storage.models import (
    DirectorAssignmentRow,
    FleetRow,
    ModelFloorRow,
    ModelVersionRow,
    NodeRow,
)
from control_plane.trust.custom import parse_target_path, validate_model_name, validate_version
from control_plane.trust.keys import public_key_dict
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment, SignedDirectorAssignment

__all__ = [
    "DEFAULT_ASSIGNMENT_TTL",
    "MAX_PIN_NODE_IDS",
    "PIN_CHUNK",
    "Assignment",
    "DirectorService",
    "PinManyResult",
    "RevocationMoves",
    "SkippedNode",
]

log = logging.getLogger(__name__)

DEFAULT_ASSIGNMENT_TTL: Final = timedelta(days=7)
_MIN_TTL: Final = timedelta(minutes=1)
_MAX_TTL: Final = timedelta(days=366)
_MAX_NODE_ID: Final = 64

PIN_CHUNK: Final = 1000
"""Nodes per transaction of `pin_many`: long enough to amortise the round trips, short
enough that row locks are held for tens of milliseconds and a chunk's delivery starts
early."""
_MAX_PIN_CHUNK: Final = 10_000
MAX_PIN_NODE_IDS: Final = 50_000
"""Explicit node ids one `pin_many` takes (a label selector is bounded by the fleet)."""
_ID_QUERY_BATCH: Final = 500  # ids per IN (...) list: well inside every backend's limit
_MAX_NAMED: Final = 20  # unknown node ids named in an error message


@dataclass(frozen=True, slots=True)
class Assignment:
    """One stored assignment; `signed` is the serialized SignedDirectorAssignment."""

    node_id: str
    fleet: str
    sequence: int
    model: str
    version: str
    target_path: str
    sha256: str
    length: int
    issued_at: datetime
    expires_at: datetime
    created_by: str
    keyid: str
    signed: bytes
    renewal: bool = False
    """It only renews the assignment before it (same target, later expiry)."""
    shadow: ShadowSpec | None = None
    """The candidate the node runs in shadow beside the target, if any."""

    def expired(self, now: datetime) -> bool:
        """The node ignores an assignment from `expires_at` on (and keeps what it runs)."""
        return now >= self.expires_at

    def signed_message(self) -> SignedDirectorAssignment:
        return SignedDirectorAssignment.FromString(self.signed)


@dataclass(frozen=True, slots=True)
class SkippedNode:
    """A selected node that got no assignment, and why ("revoked")."""

    node_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class PinManyResult:
    """What one `pin_many` did: the assignments in node-id order, the nodes skipped, and how
    many of the assignments a transport running here took at once."""

    fleet: str
    model: str
    version: str
    target_path: str
    assignments: tuple[Assignment, ...]
    skipped: tuple[SkippedNode, ...]
    delivered: int
    chunks: int

    @property
    def pinned(self) -> int:
        return len(self.assignments)

    @property
    def selected(self) -> int:
        return len(self.assignments) + len(self.skipped)


@dataclass(frozen=True, slots=True)
class RevocationMoves:
    """What `move_off_revoked` did for one model: the floor, the version the nodes were
    moved to (None: none is allowed), their new assignments, the nodes left on a revoked
    version for want of one, and the nodes skipped (revoked or gone meanwhile)."""

    fleet: str
    model: str
    floor: int
    to_version: str | None
    moved: tuple[Assignment, ...]
    left: tuple[str, ...]
    skipped: tuple[SkippedNode, ...]


class DirectorService:
    """Signed per-node assignments over the relational store, with one online Ed25519 key."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        registry: RegistryService,
        nodes: NodeInventory,
        key: Signer,
        clock: Clock,
        ttl: timedelta = DEFAULT_ASSIGNMENT_TTL,
        delivery: AssignmentDelivery | None = None,
        keyring: DirectorKeyring | None = None,
    ) -> None:
        if not _MIN_TTL <= ttl <= _MAX_TTL:
            raise InvalidInputError(
                f"assignment lifetime must be between {_MIN_TTL} and {_MAX_TTL}, got {ttl}",
                ttl_s=int(ttl.total_seconds()),
            )
        self._sessions = sessions
        self._registry = registry
        self._nodes = nodes
        self._key = key
        # Rotated director keys (ADR 0045); without a keyring only `key` signs.
        self._keyring = keyring
        self._clock = clock
        self._ttl = ttl
        # Nothing attached: assignments wait for the node's next Hello.
        self._delivery: AssignmentDelivery = delivery if delivery is not None else FanOutDelivery()
        self._mutations = AuditedMutations(sessions, clock)

    @property
    def ttl(self) -> timedelta:
        return self._ttl

    def director_public_key(self) -> dict[str, Any]:
        """The director's public key as TUF's key dict plus its keyid (given at enrollment)."""
        return public_key_dict(self._key.public_key)

    def holds_key(self, keyid: str) -> bool:
        """Does this director hold the private half of `keyid` (for root N+1's check)?"""
        if keyid == self._key.public_key.keyid:
            return True
        return self._keyring is not None and self._keyring.holds(keyid)

    def new_key(self, ctx: RequestContext) -> dict[str, Any]:
        """A new director key for a rotation; it signs once a fleet's root lists it."""
        with self._mutations.mutation(
            ctx, "director-key.create", "director", needs=Role.ADMIN
        ) as _session:
            if self._keyring is None:
                raise UnavailableError("this control plane has no director keyring")
            key = self._keyring.new_key()
        return public_key_dict(key)

    def _signer_for(self, fleet: str) -> Signer:
        """The key that signs the fleet's assignments: the first director key its root
        lists that this director holds; its default key when the root lists none."""
        listed = self._registry.director_keyids(fleet)
        if not listed:
            return self._key
        for keyid in listed:
            if keyid == self._key.public_key.keyid:
                return self._key
            found = None if self._keyring is None else self._keyring.get(keyid)
            if found is not None:
                return found
        raise UnavailableError(
            f"the root of fleet {fleet!r} lists director keys {', '.join(listed)}, none of "
            "which this control plane holds; restore the data dir's director/ from backup",
            fleet=fleet,
            keyids=listed,
        )

    # ------------------------------------------------------------------ writes

    def pin(self, ctx: RequestContext, node_id: str, model: str, version: str) -> Assignment:
        """Assign `model` `version` of the node's fleet to the node; audited as "node.pin".

        Refused: an unknown node or version (NotFoundError), a revoked node or a
        version below its model's floor (PolicyError). The assignment gets the node's
        next sequence; the node row is locked meanwhile, so concurrent pins of one node
        take turns and never share a sequence. After the commit the assignment goes to
        the delivery port; a delivery that fails is logged and the pin stands (the node
        gets it at its next Hello).
        """
        with self._mutations.mutation(
            ctx, "node.pin", f"node:{node_id}", needs=Role.OPERATOR
        ) as session:
            validate_model_name(model)
            validate_version(version)
            fleet = self._locked_node(session, node_id)
            info = self._registry.get_version(fleet, model, version)
            _require_runnable(info)
            assignment = self._sign_next(
                session,
                ctx,
                node_id,
                fleet,
                target_path=info.target_path,
                sha256=info.sha256,
                length=info.length,
            )
        log.info(
            "node pinned",
            extra={
                "node_id": node_id,
                "target": info.target_path,
                "sequence": assignment.sequence,
            },
        )
        self._deliver(assignment)
        return assignment

    def assign_shadow(
        self,
        ctx: RequestContext,
        node_id: str,
        model: str,
        version: str,
        *,
        sample_per_mille: int,
        max_cpu_percent: int,
    ) -> Assignment:
        """Have the node run `model` `version` in shadow beside its current target, on
        `sample_per_mille` of its frames and at most `max_cpu_percent` of a core; audited
        as "node.shadow".

        The node's current (newest) assignment is signed again with the candidate, the
        next sequence and a fresh expiry, marked `renewal` (the target is no new decision).
        Refused: an unknown node or version (NotFoundError), a revoked node, a candidate
        below its floor (PolicyError), a node with no assignment yet (ConflictError,
        `no-assignment`), a candidate of another model or the assigned version itself,
        values out of range (InvalidInputError naming the field).
        """
        details: dict[str, Any] = {
            "model": model,
            "version": version,
            "sample_per_mille": sample_per_mille,
            "max_cpu_percent": max_cpu_percent,
        }
        with self._mutations.mutation(
            ctx, "node.shadow", f"node:{node_id}", needs=Role.OPERATOR, details=details
        ) as session:
            validate_model_name(model)
            validate_version(version)
            check_shadow_settings(sample_per_mille, max_cpu_percent)
            fleet = self._locked_node(session, node_id)
            latest = self._current_row(session, node_id)
            assigned = _model_version(latest.target_path)
            if assigned[0] != model:
                raise InvalidInputError(
                    f"node {node_id!r} is assigned model {assigned[0]!r}; a shadow candidate "
                    f"must be a version of it, not of {model!r}",
                    field="model",
                )
            if assigned[1] == version:
                raise InvalidInputError(
                    f"node {node_id!r} is assigned {model}@{version} itself; shadow another "
                    "version",
                    field="version",
                )
            info = self._registry.get_version(fleet, model, version)
            _require_runnable(info)
            shadow = ShadowSpec(
                info.target_path, info.sha256, info.length, sample_per_mille, max_cpu_percent
            )
            assignment = self._sign_again(session, ctx, latest, fleet, shadow)
            details["sequence"] = assignment.sequence
        log.info(
            "shadow assigned",
            extra={"node_id": node_id, "target": info.target_path, "sequence": assignment.sequence},
        )
        self._deliver(assignment)
        return assignment

    def clear_shadow(self, ctx: RequestContext, node_id: str) -> Assignment:
        """Stop the node's shadow candidate: its current target signed again without one
        (a renewal); audited as "node.shadow.clear". A node without a candidate gets
        nothing new: its current assignment is returned as it is."""
        with self._mutations.mutation(
            ctx, "node.shadow.clear", f"node:{node_id}", needs=Role.OPERATOR
        ) as session:
            fleet = self._locked_node(session, node_id)
            latest = self._current_row(session, node_id)
            current = _assignment(latest, fleet)
            if current.shadow is None:
                return current
            assignment = self._sign_again(session, ctx, latest, fleet, None)
        self._deliver(assignment)
        return assignment

    def renew_expiring(self, ctx: RequestContext = SYSTEM, *, chunk_size: int = PIN_CHUNK) -> int:
        """Renew every unrevoked node's newest assignment that expires within a third of
        the lifetime (or has expired): the same target and shadow, marked `renewal`, the
        next sequence, expiring a full lifetime from now. In chunks of `chunk_size` nodes,
        one transaction and one audit row ("node.renew" on "director") each, rows locked
        as for a pin, and each chunk delivered once committed. Safe with several replicas:
        under the lock an assignment renewed meanwhile is no longer due and is skipped.
        Returns how many were renewed."""
        if not 1 <= chunk_size <= _MAX_PIN_CHUNK:
            raise InvalidInputError(
                f"chunk size must be 1..{_MAX_PIN_CHUNK}", chunk_size=chunk_size
            )
        due_before = self._clock.now() + self._ttl / 3
        newest = _newest()
        with self._sessions() as session:
            due = list(
                session.scalars(
                    select(DirectorAssignmentRow.node_id)
                    .join(newest, _is_newest(newest))
                    .join(NodeRow, NodeRow.id == DirectorAssignmentRow.node_id)
                    .where(DirectorAssignmentRow.expires_at <= due_before)
                    .where(NodeRow.revoked_at.is_(None))
                    .order_by(DirectorAssignmentRow.node_id)
                )
            )
        renewed = 0
        chunks = [due[i : i + chunk_size] for i in range(0, len(due), chunk_size)]
        for number, chunk in enumerate(chunks, start=1):
            details: dict[str, Any] = {"chunk": number, "chunks": len(chunks)}
            with self._mutations.mutation(
                ctx, "node.renew", "director", needs=Role.OPERATOR, details=details
            ) as session:
                done = self._renew_chunk(session, ctx, chunk, due_before)
                details.update(nodes=len(done), node_ids=[a.node_id for a in done])
            by_fleet: dict[str, list[tuple[str, SignedDirectorAssignment]]] = {}
            for assignment in done:
                by_fleet.setdefault(assignment.fleet, []).append(
                    (assignment.node_id, assignment.signed_message())
                )
            for fleet, signed in by_fleet.items():
                self._deliver_many(fleet, signed)
            renewed += len(done)
        if renewed:
            log.info("renewed %d assignments before they expire", renewed)
        return renewed

    def _renew_chunk(
        self, session: Session, ctx: RequestContext, node_ids: list[str], due_before: datetime
    ) -> list[Assignment]:
        locked = session.execute(
            select(NodeRow.id, FleetRow.name)
            .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
            .where(NodeRow.id.in_(node_ids), NodeRow.revoked_at.is_(None))
            .order_by(NodeRow.id)
            .with_for_update(of=NodeRow, key_share=True)
        ).all()
        fleets = {node_id: fleet for node_id, fleet in locked}
        if not fleets:
            return []
        newest = _newest()
        rows = session.scalars(
            select(DirectorAssignmentRow)
            .join(newest, _is_newest(newest))
            .where(DirectorAssignmentRow.node_id.in_(sorted(fleets)))
            .order_by(DirectorAssignmentRow.node_id)
        ).all()
        issued_at = self._clock.now().replace(microsecond=0)
        expires_at = issued_at + self._ttl
        stored: list[tuple[Any, ...]] = []
        done: list[Assignment] = []
        signers: dict[str, Signer] = {}
        for row in rows:
            if row.expires_at > due_before:
                continue  # renewed (or pinned) meanwhile, by another replica
            fleet = fleets[row.node_id]
            shadow = _assignment(row, fleet).shadow
            signed = sign_assignment(
                signers.get(fleet) or signers.setdefault(fleet, self._signer_for(fleet)),
                fleet=fleet,
                node_id=row.node_id,
                sequence=row.sequence + 1,
                target_path=row.target_path,
                sha256=row.sha256,
                length=row.length,
                issued_at=issued_at,
                expires_at=expires_at,
                renewal=True,
                shadow=shadow,
            )
            data = signed.SerializeToString(deterministic=True)
            values = (
                row.node_id,
                row.sequence + 1,
                row.target_path,
                row.sha256,
                row.length,
                issued_at,
                expires_at,
                data,
                ctx.principal.name,
            )
            stored.append(values)
            model, version = _model_version(row.target_path)
            done.append(
                Assignment(
                    node_id=row.node_id,
                    fleet=fleet,
                    sequence=row.sequence + 1,
                    model=model,
                    version=version,
                    target_path=row.target_path,
                    sha256=row.sha256,
                    length=row.length,
                    issued_at=issued_at,
                    expires_at=expires_at,
                    created_by=ctx.principal.name,
                    keyid=signed.keyid,
                    signed=data,
                    renewal=True,
                    shadow=shadow,
                )
            )
        if stored:
            try:
                _insert_assignments(session, stored)
            except IntegrityError as exc:  # only if a writer ignored the row locks
                raise ConflictError(
                    f"another assignment took a sequence of one of {len(stored)} nodes; retry"
                ) from exc
        return done

    def _locked_node(self, session: Session, node_id: str) -> str:
        """Lock the node's row until commit (sequences are read-then-write); its fleet.
        FOR NO KEY UPDATE, so foreign-key checks of record inserts do not wait on it."""
        if len(node_id) > _MAX_NODE_ID:
            raise NotFoundError("no such node", node_id=node_id[:_MAX_NODE_ID])
        row = session.get(NodeRow, node_id, with_for_update={"key_share": True})
        if row is None:
            raise NotFoundError(f"no node {node_id!r}", node_id=node_id)
        if row.revoked_at is not None:
            raise PolicyError(
                f"node {node_id!r} was revoked; it gets no assignments", node_id=node_id
            )
        return session.get_one(FleetRow, row.fleet_id).name

    def _current_row(self, session: Session, node_id: str) -> DirectorAssignmentRow:
        row = session.scalars(
            select(DirectorAssignmentRow)
            .where(DirectorAssignmentRow.node_id == node_id)
            .order_by(DirectorAssignmentRow.sequence.desc())
            .limit(1)
        ).first()
        if row is None:
            raise ConflictError(
                f"node {node_id!r} has no assignment yet; pin it first",
                node_id=node_id,
                reason="no-assignment",
            )
        return row

    def _sign_again(
        self,
        session: Session,
        ctx: RequestContext,
        latest: DirectorAssignmentRow,
        fleet: str,
        shadow: ShadowSpec | None,
    ) -> Assignment:
        """The node's current target signed again as a renewal, with `shadow` or none."""
        return self._sign_next(
            session,
            ctx,
            latest.node_id,
            fleet,
            target_path=latest.target_path,
            sha256=latest.sha256,
            length=latest.length,
            renewal=True,
            shadow=shadow,
        )

    def _sign_next(
        self,
        session: Session,
        ctx: RequestContext,
        node_id: str,
        fleet: str,
        *,
        target_path: str,
        sha256: str,
        length: int,
        renewal: bool = False,
        shadow: ShadowSpec | None = None,
    ) -> Assignment:
        """Sign and store the node's next assignment (its row locked by the caller)."""
        last = session.scalar(
            select(func.max(DirectorAssignmentRow.sequence)).where(
                DirectorAssignmentRow.node_id == node_id
            )
        )
        sequence = (last or 0) + 1
        issued_at = self._clock.now().replace(microsecond=0)
        expires_at = issued_at + self._ttl
        signed = sign_assignment(
            self._signer_for(fleet),
            fleet=fleet,
            node_id=node_id,
            sequence=sequence,
            target_path=target_path,
            sha256=sha256,
            length=length,
            issued_at=issued_at,
            expires_at=expires_at,
            renewal=renewal,
            shadow=shadow,
        )
        row = DirectorAssignmentRow(
            node_id=node_id,
            sequence=sequence,
            target_path=target_path,
            sha256=sha256,
            length=length,
            issued_at=issued_at,
            expires_at=expires_at,
            signed=signed.SerializeToString(deterministic=True),
            created_by=ctx.principal.name,
        )
        session.add(row)
        try:
            session.flush()
        except IntegrityError as exc:
            raise ConflictError(
                f"another assignment of node {node_id!r} took sequence {sequence}; retry",
                node_id=node_id,
                sequence=sequence,
            ) from exc
        return _assignment(row, fleet)

    def pin_many(
        self,
        ctx: RequestContext,
        model: str,
        version: str,
        *,
        fleet: str,
        node_ids: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        chunk_size: int = PIN_CHUNK,
    ) -> PinManyResult:
        """Assign `model` `version` to many nodes of `fleet`: the nodes named in `node_ids`,
        or every node whose labels include all of `labels` (``{}``: the whole fleet).

        Checked before anything is written (and audited as refused, "node.pin_many"):
        the caller's role, the names, that every id is a node of `fleet` (NotFoundError
        naming the others: nothing is pinned), and the version, looked up once (a version
        below its floor: PolicyError). Revoked nodes are skipped and reported, not fatal.
        Then, `chunk_size` nodes per transaction: the rows are locked (PostgreSQL
        ``FOR UPDATE``, in id order; SQLite's write lock serialises anyway), one grouped
        query reads each node's last sequence, every assignment is signed, one insert
        stores them, one audit entry ("node.pin_many" on "fleet:NAME") records the chunk;
        after the commit the chunk goes to the delivery port in one call. A pin of one
        node running meanwhile takes its turn on the row lock and never shares a
        sequence. A failure part way raises and leaves the earlier chunks committed and
        delivered; asking again pins every node again, each with a newer sequence.
        """
        action, target = "node.pin_many", f"fleet:{fleet}"
        try:
            ctx.principal.require(Role.OPERATOR, action)
            validate_model_name(model)
            validate_version(version)
            if not 1 <= chunk_size <= _MAX_PIN_CHUNK:
                raise InvalidInputError(
                    f"chunk size must be 1..{_MAX_PIN_CHUNK}, got {chunk_size}",
                    chunk_size=chunk_size,
                )
            fleet_id, selected = self._select_nodes(fleet, node_ids, labels)
            info = self._registry.get_version(fleet, model, version)
            _require_runnable(info)
        except EdgefleetError as exc:
            self._mutations.record_refusal(ctx, action, target, exc)
            raise

        issued_at = self._clock.now().replace(microsecond=0)
        expires_at = issued_at + self._ttl
        chunks = [selected[i : i + chunk_size] for i in range(0, len(selected), chunk_size)]
        assignments: list[Assignment] = []
        skipped: list[SkippedNode] = []
        delivered = 0
        for number, chunk in enumerate(chunks, start=1):
            details: dict[str, Any] = {
                "model": model,
                "version": version,
                # Who was pinned, for "who pinned node X to V": the selector, and the
                # chunk's node ids.
                "selector": {"labels": dict(labels)} if labels is not None else "node_ids",
                "node_ids": list(chunk),
                "target_path": info.target_path,
                "chunk": number,
                "chunks": len(chunks),
            }
            with self._mutations.mutation(
                ctx, action, target, needs=Role.OPERATOR, details=details
            ) as session:
                if number > 1:
                    # The floor may have been raised while earlier chunks were pinned:
                    # the rest of the fleet is not sent a version that may no longer run.
                    _require_runnable(self._registry.get_version(fleet, model, version))
                pinned, signed, passed = self._pin_chunk(
                    session, ctx, fleet, fleet_id, chunk, info, issued_at, expires_at
                )
                details.update(
                    nodes=len(pinned),
                    sequences=_sequence_range(pinned),
                    skipped=[f"{s.node_id} ({s.reason})" for s in passed],
                )
            log.info(
                "pinned %d nodes of fleet %s to %s (chunk %d of %d)",
                len(pinned),
                fleet,
                info.target_path,
                number,
                len(chunks),
                extra={"fleet": fleet, "target": info.target_path},
            )
            assignments.extend(pinned)
            skipped.extend(passed)
            delivered += self._deliver_many(fleet, signed)
        return PinManyResult(
            fleet=fleet,
            model=model,
            version=version,
            target_path=info.target_path,
            assignments=tuple(assignments),
            skipped=tuple(skipped),
            delivered=delivered,
            chunks=len(chunks),
        )

    def _select_nodes(
        self,
        fleet: str,
        node_ids: Sequence[str] | None,
        labels: Mapping[str, str] | None,
    ) -> tuple[int, list[str]]:
        """The fleet's id and the selected node ids, sorted (the order rows are locked in)."""
        if (node_ids is None) == (labels is None):
            raise InvalidInputError("select nodes by node ids or by labels (one of the two)")
        if isinstance(node_ids, str):
            raise InvalidInputError("node ids must be a list of ids")
        wanted = validate_labels(labels) if labels is not None else None
        with self._sessions() as session:
            fleet_id = session.scalar(select(FleetRow.id).where(FleetRow.name == fleet))
            if fleet_id is None:
                raise NotFoundError(f"no fleet named {fleet!r}", fleet=fleet)
            if wanted is not None:
                rows = session.execute(
                    select(NodeRow.id, NodeRow.labels).where(NodeRow.fleet_id == fleet_id)
                )
                chosen = [
                    node_id
                    for node_id, node_labels in rows
                    if all((node_labels or {}).get(k) == v for k, v in wanted.items())
                ]
                return fleet_id, sorted(chosen)
            assert node_ids is not None
            ids = sorted(set(node_ids))
            if not ids:
                raise InvalidInputError("no node ids given")
            if len(ids) > MAX_PIN_NODE_IDS:
                raise InvalidInputError(
                    f"at most {MAX_PIN_NODE_IDS} node ids per request; select by labels",
                    count=len(ids),
                )
            known: set[str] = set()
            plausible = [i for i in ids if isinstance(i, str) and 0 < len(i) <= _MAX_NODE_ID]
            for start in range(0, len(plausible), _ID_QUERY_BATCH):
                batch = plausible[start : start + _ID_QUERY_BATCH]
                known.update(
                    session.scalars(
                        select(NodeRow.id).where(
                            NodeRow.id.in_(batch), NodeRow.fleet_id == fleet_id
                        )
                    )
                )
        unknown = [i for i in ids if i not in known]
        if unknown:
            named = ", ".join(repr(str(i)[:_MAX_NODE_ID]) for i in unknown[:_MAX_NAMED])
            more = f" and {len(unknown) - _MAX_NAMED} more" if len(unknown) > _MAX_NAMED else ""
            raise NotFoundError(
                f"no node {named}{more} in fleet {fleet!r}; nothing was pinned",
                fleet=fleet,
                node_ids=[str(i)[:_MAX_NODE_ID] for i in unknown[:_MAX_NAMED]],
                unknown=len(unknown),
            )
        return fleet_id, ids

    def _pin_chunk(
        self,
        session: Session,
        ctx: RequestContext,
        fleet: str,
        fleet_id: int,
        node_ids: list[str],
        info: ModelVersionInfo,
        issued_at: datetime,
        expires_at: datetime,
    ) -> tuple[list[Assignment], list[tuple[str, SignedDirectorAssignment]], list[SkippedNode]]:
        """One chunk inside its transaction: lock, read sequences, sign, insert. Returns
        the assignments, the signed messages to deliver, and the nodes skipped."""
        # Locked until commit, in id order (two bulk pins never wait on each other in a
        # cycle): the sequences below are read-then-write. A node that left the fleet or
        # was revoked since the selection is skipped here, under the lock.
        locked = session.execute(
            select(NodeRow.id, NodeRow.revoked_at)
            .where(NodeRow.id.in_(node_ids), NodeRow.fleet_id == fleet_id)
            .order_by(NodeRow.id)
            # FOR NO KEY UPDATE: pins of a node take turns, while the foreign-key checks of
            # record and health inserts (FOR KEY SHARE) do not wait on a pin.
            .with_for_update(key_share=True)
        ).all()
        present = {node_id: revoked_at for node_id, revoked_at in locked}
        skipped: list[SkippedNode] = []
        live: list[str] = []
        for node_id in node_ids:
            if node_id not in present:
                skipped.append(SkippedNode(node_id, "gone"))
            elif present[node_id] is not None:
                skipped.append(SkippedNode(node_id, "revoked"))
            else:
                live.append(node_id)
        if not live:
            return [], [], skipped
        last: dict[str, int] = {
            node_id: sequence
            for node_id, sequence in session.execute(
                select(DirectorAssignmentRow.node_id, func.max(DirectorAssignmentRow.sequence))
                .where(DirectorAssignmentRow.node_id.in_(live))
                .group_by(DirectorAssignmentRow.node_id)
            )
        }
        sequences = [(node_id, (last.get(node_id) or 0) + 1) for node_id in live]
        signed = sign_assignments(
            self._signer_for(fleet),
            fleet=fleet,
            nodes=sequences,
            target_path=info.target_path,
            sha256=info.sha256,
            length=info.length,
            issued_at=issued_at,
            expires_at=expires_at,
        )
        keyid = signed[0].keyid
        created_by = ctx.principal.name
        rows: list[tuple[Any, ...]] = []
        assignments: list[Assignment] = []
        for (node_id, sequence), message in zip(sequences, signed, strict=True):
            data = message.SerializeToString(deterministic=True)
            rows.append(
                (
                    node_id,
                    sequence,
                    info.target_path,
                    info.sha256,
                    info.length,
                    issued_at,
                    expires_at,
                    data,
                    created_by,
                )
            )
            assignments.append(
                Assignment(
                    node_id=node_id,
                    fleet=fleet,
                    sequence=sequence,
                    model=info.model,
                    version=info.version,
                    target_path=info.target_path,
                    sha256=info.sha256,
                    length=info.length,
                    issued_at=issued_at,
                    expires_at=expires_at,
                    created_by=created_by,
                    keyid=keyid,
                    signed=data,
                )
            )
        try:
            _insert_assignments(session, rows)
        except IntegrityError as exc:  # only if a writer ignored the row locks
            raise ConflictError(
                f"another assignment took a sequence of one of {len(live)} nodes; retry",
                fleet=fleet,
            ) from exc
        return assignments, list(zip(live, signed, strict=True)), skipped

    def _deliver_many(
        self, fleet: str, assignments: list[tuple[str, SignedDirectorAssignment]]
    ) -> int:
        """Hand a committed chunk to the delivery port; how many nodes it reached now."""
        if not assignments:
            return 0
        try:
            via = self._delivery.deliver_many(fleet, assignments)
        except Exception:  # committed already: the nodes get it at their next Hello
            log.exception("delivering %d assignments of fleet %s failed", len(assignments), fleet)
            return 0
        return len(via)

    def _deliver(self, assignment: Assignment) -> None:
        try:
            via = self._delivery.deliver(
                assignment.node_id, assignment.fleet, assignment.signed_message()
            )
        except Exception:  # committed already: the node gets it at its next Hello
            log.exception("delivering assignment to node %s failed", assignment.node_id)
            return
        if via:
            log.info(
                "assignment %d delivered to node %s over %s",
                assignment.sequence,
                assignment.node_id,
                ", ".join(via),
                extra={"node_id": assignment.node_id, "sequence": assignment.sequence},
            )

    # -------------------------------------------------------------- revocation

    def move_off_revoked(
        self,
        fleet: str,
        model: str,
        *,
        ctx: RequestContext = SYSTEM,
        chunk_size: int = PIN_CHUNK,
    ) -> RevocationMoves:
        """Give every unrevoked node of `fleet` whose current assignment is a version of
        `model` below its floor a fresh assignment of the newest version at or above the
        floor (ADR 0035). The pins go as `pin_many`'s do: `chunk_size` nodes per
        transaction, rows locked in id order, one audit entry per chunk ("node.pin" on
        "fleet:NAME", reason "revoked"), each chunk delivered once committed. Under the
        lock each node's current assignment is read again: a node moved meanwhile (by a
        replica, a retry, an operator) is not pinned twice. With no allowed version the
        nodes are left as they are and named in `left`; the next push of a good version
        moves them (`after_push`)."""
        if not 1 <= chunk_size <= _MAX_PIN_CHUNK:
            raise InvalidInputError(
                f"chunk size must be 1..{_MAX_PIN_CHUNK}", chunk_size=chunk_size
            )
        validate_model_name(model)
        with self._sessions() as session:
            fleet_id, floor, releases, revoked_paths, current = self._on_revoked(
                session, fleet, model
            )
        plan = plan_revocation(model, floor, releases.values(), current)
        if not plan.affected or plan.to is None:
            if plan.left:
                log.warning(
                    "%d nodes of fleet %s are left on a revoked version of %s: no version "
                    "at or above the floor %d",
                    len(plan.left),
                    fleet,
                    model,
                    floor,
                    extra={"fleet": fleet, "model": model},
                )
            return RevocationMoves(fleet, model, floor, None, (), plan.left, ())
        info = self._registry.get_version(fleet, model, plan.to.version)
        _require_runnable(info)
        issued_at = self._clock.now().replace(microsecond=0)
        expires_at = issued_at + self._ttl
        affected = list(plan.affected)
        chunks = [affected[i : i + chunk_size] for i in range(0, len(affected), chunk_size)]
        moved: list[Assignment] = []
        skipped: list[SkippedNode] = []
        for number, chunk in enumerate(chunks, start=1):
            details: dict[str, Any] = {
                "reason": "revoked",
                "model": model,
                "version": info.version,
                "target_path": info.target_path,
                "floor": floor,
                "node_ids": list(chunk),
                "chunk": number,
                "chunks": len(chunks),
            }
            with self._mutations.mutation(
                ctx, "node.pin", f"fleet:{fleet}", needs=Role.OPERATOR, details=details
            ) as session:
                if number > 1:  # the floor may have risen again meanwhile
                    _require_runnable(self._registry.get_version(fleet, model, info.version))
                still = self._still_on(session, fleet_id, chunk, revoked_paths)
                pinned, signed, passed = (
                    self._pin_chunk(
                        session, ctx, fleet, fleet_id, still, info, issued_at, expires_at
                    )
                    if still
                    else ([], [], [])
                )
                details.update(
                    nodes=len(pinned),
                    sequences=_sequence_range(pinned),
                    skipped=[f"{s.node_id} ({s.reason})" for s in passed],
                )
            moved.extend(pinned)
            skipped.extend(passed)
            self._deliver_many(fleet, signed)
        log.info(
            "moved %d nodes of fleet %s off revoked versions of %s to %s",
            len(moved),
            fleet,
            model,
            info.version,
            extra={"fleet": fleet, "target": info.target_path},
        )
        return RevocationMoves(fleet, model, floor, info.version, tuple(moved), (), tuple(skipped))

    def after_push(self, push: PushResult) -> list[RevocationMoves]:
        """After a push is stored: move the nodes off what it revoked (the models whose
        floor it raised) and off what an earlier revoke left them on (the models it adds a
        version of). The push stands whatever happens here: a failure is logged and the
        periodic pass (`move_all_off_revoked`) tries again."""
        models = set(push.floors)
        for path in push.added:
            parsed = parse_target_path(path)
            if parsed is not None and parsed.version is not None:
                models.add(parsed.model)
        done: list[RevocationMoves] = []
        for model in sorted(models):
            try:
                moves = self.move_off_revoked(push.fleet, model)
            except Exception:  # the push committed already; the periodic pass retries
                log.exception(
                    "moving the nodes of fleet %s off revoked %s failed", push.fleet, model
                )
                continue
            if model in push.floors or moves.moved or moves.left:
                done.append(moves)
        return done

    def move_all_off_revoked(self) -> int:
        """The periodic pass: every (fleet, model) with a node assigned below the model's
        floor is moved (`move_off_revoked`): a move a crash interrupted, a node pinned by
        an older replica. Returns how many nodes were moved."""
        newest = _newest()
        with self._sessions() as session:
            pairs = session.execute(
                select(FleetRow.name, ModelVersionRow.model)
                .select_from(DirectorAssignmentRow)
                .join(newest, _is_newest(newest))
                .join(NodeRow, NodeRow.id == DirectorAssignmentRow.node_id)
                .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
                .join(
                    ModelVersionRow,
                    and_(
                        ModelVersionRow.fleet_id == NodeRow.fleet_id,
                        ModelVersionRow.target_path == DirectorAssignmentRow.target_path,
                    ),
                )
                .join(
                    ModelFloorRow,
                    and_(
                        ModelFloorRow.fleet_id == NodeRow.fleet_id,
                        ModelFloorRow.model == ModelVersionRow.model,
                    ),
                )
                .where(NodeRow.revoked_at.is_(None))
                .where(ModelVersionRow.release_counter < ModelFloorRow.floor)
                .distinct()
                .order_by(FleetRow.name, ModelVersionRow.model)
            ).all()
        moved = 0
        for fleet, model in pairs:
            try:
                moved += len(self.move_off_revoked(fleet, model).moved)
            except EdgefleetError as exc:
                log.error("cannot move nodes of fleet %s off revoked %s: %s", fleet, model, exc)
        return moved

    def left_on_revoked(self, fleet: str, model: str) -> dict[str, list[str]]:
        """Each revoked version of `model` with the unrevoked nodes whose current
        assignment it still is (for `model show`), sorted by node id."""
        validate_model_name(model)
        with self._sessions() as session:
            _, _, releases, _, current = self._on_revoked(session, fleet, model)
        by_counter = {r.release_counter: r.version for r in releases.values()}
        left: dict[str, list[str]] = {}
        for node_id in sorted(current):
            left.setdefault(by_counter[current[node_id]], []).append(node_id)
        return left

    def _on_revoked(
        self, session: Session, fleet: str, model: str
    ) -> tuple[int, int, dict[str, Release], list[str], dict[str, int]]:
        """The fleet's id, the model's floor, its releases by target path, the target
        paths below the floor, and each unrevoked node currently assigned one of those
        (node id -> release counter)."""
        fleet_id = session.scalar(select(FleetRow.id).where(FleetRow.name == fleet))
        if fleet_id is None:
            raise NotFoundError(f"no fleet named {fleet!r}", fleet=fleet)
        floor = session.scalar(
            select(ModelFloorRow.floor).where(
                ModelFloorRow.fleet_id == fleet_id, ModelFloorRow.model == model
            )
        )
        releases = {
            path: Release(version, counter)
            for path, version, counter in session.execute(
                select(
                    ModelVersionRow.target_path,
                    ModelVersionRow.version,
                    ModelVersionRow.release_counter,
                ).where(ModelVersionRow.fleet_id == fleet_id, ModelVersionRow.model == model)
            )
        }
        revoked_paths = sorted(p for p, r in releases.items() if r.release_counter < (floor or 0))
        current: dict[str, int] = {}
        if revoked_paths:
            newest = _newest()
            for start in range(0, len(revoked_paths), _ID_QUERY_BATCH):
                batch = revoked_paths[start : start + _ID_QUERY_BATCH]
                for node_id, path in session.execute(
                    select(DirectorAssignmentRow.node_id, DirectorAssignmentRow.target_path)
                    .join(newest, _is_newest(newest))
                    .join(NodeRow, NodeRow.id == DirectorAssignmentRow.node_id)
                    .where(NodeRow.fleet_id == fleet_id, NodeRow.revoked_at.is_(None))
                    .where(DirectorAssignmentRow.target_path.in_(batch))
                ):
                    current[node_id] = releases[path].release_counter
        return fleet_id, floor or 0, releases, revoked_paths, current

    def _still_on(
        self, session: Session, fleet_id: int, node_ids: list[str], paths: list[str]
    ) -> list[str]:
        """Of `node_ids`, those whose current assignment is still one of `paths`, read with
        their rows locked (in id order, as `_pin_chunk` locks them)."""
        session.execute(
            select(NodeRow.id)
            .where(NodeRow.id.in_(node_ids), NodeRow.fleet_id == fleet_id)
            .order_by(NodeRow.id)
            .with_for_update(key_share=True)
        ).all()
        newest = _newest()
        wanted = set(paths)
        return sorted(
            node_id
            for node_id, path in session.execute(
                select(DirectorAssignmentRow.node_id, DirectorAssignmentRow.target_path)
                .join(newest, _is_newest(newest))
                .where(DirectorAssignmentRow.node_id.in_(node_ids))
            )
            if path in wanted
        )

    # ------------------------------------------------------------------- reads

    def latest(self, node_id: str) -> Assignment | None:
        """The node's newest assignment (expired or not), or None; NotFoundError if no node."""
        node = self._nodes.get_node(node_id)
        with self._sessions() as session:
            row = session.scalars(
                select(DirectorAssignmentRow)
                .where(DirectorAssignmentRow.node_id == node_id)
                .order_by(DirectorAssignmentRow.sequence.desc())
                .limit(1)
            ).first()
            return None if row is None else _assignment(row, node.fleet)

    def latest_many(self, node_ids: Sequence[str]) -> dict[str, Assignment]:
        """The newest assignment of each of `node_ids` that has one (unknown ids and nodes
        without one are left out); a few statements per 500 nodes."""
        found: dict[str, Assignment] = {}
        ids = sorted({i for i in node_ids if isinstance(i, str) and 0 < len(i) <= _MAX_NODE_ID})
        with self._sessions() as session:
            for start in range(0, len(ids), _ID_QUERY_BATCH):
                batch = ids[start : start + _ID_QUERY_BATCH]
                newest = (
                    select(
                        DirectorAssignmentRow.node_id,
                        func.max(DirectorAssignmentRow.sequence).label("sequence"),
                    )
                    .where(DirectorAssignmentRow.node_id.in_(batch))
                    .group_by(DirectorAssignmentRow.node_id)
                    .subquery()
                )
                rows = session.execute(
                    select(DirectorAssignmentRow, FleetRow.name)
                    .join(
                        newest,
                        (newest.c.node_id == DirectorAssignmentRow.node_id)
                        & (newest.c.sequence == DirectorAssignmentRow.sequence),
                    )
                    .join(NodeRow, NodeRow.id == DirectorAssignmentRow.node_id)
                    .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
                )
                for row, fleet in rows:
                    found[row.node_id] = _assignment(row, fleet)
        return found

    def current(self, node_id: str) -> SignedDirectorAssignment | None:
        """What the node is sent at its Hello: its newest signed assignment, or None when
        it has none or the newest has expired (the node would refuse it; it keeps running
        what it runs until an operator pins again)."""
        latest = self.latest(node_id)
        if latest is None or latest.expired(self._clock.now()):
            return None
        return latest.signed_message()


def _newest() -> Any:
    """Each node's highest sequence (a subquery to join the assignment rows with)."""
    return (
        select(
            DirectorAssignmentRow.node_id.label("newest_node"),
            func.max(DirectorAssignmentRow.sequence).label("newest_sequence"),
        )
        .group_by(DirectorAssignmentRow.node_id)
        .subquery("newest")
    )


def _is_newest(newest: Any) -> Any:
    return and_(
        DirectorAssignmentRow.node_id == newest.c.newest_node,
        DirectorAssignmentRow.sequence == newest.c.newest_sequence,
    )


def _model_version(target_path: str) -> tuple[str, str]:
    parsed = parse_target_path(target_path)
    if parsed is None or parsed.version is None:  # only model targets are ever stored
        raise ValueError(f"stored assignment names {target_path!r}, not a model target")
    return parsed.model, parsed.version


def _assignment(row: DirectorAssignmentRow, fleet: str) -> Assignment:
    model, version = _model_version(row.target_path)
    signed = SignedDirectorAssignment.FromString(row.signed)
    body = DirectorAssignment.FromString(signed.assignment)
    return Assignment(
        node_id=row.node_id,
        fleet=fleet,
        sequence=row.sequence,
        model=model,
        version=version,
        target_path=row.target_path,
        sha256=row.sha256,
        length=row.length,
        issued_at=row.issued_at,
        expires_at=row.expires_at,
        created_by=row.created_by,
        keyid=signed.keyid,
        signed=row.signed,
        renewal=body.renewal,
        shadow=shadow_of(body),
    )


def _require_runnable(info: ModelVersionInfo) -> None:
    if info.revoked:
        raise PolicyError(
            f"version {info.version!r} of model {info.model!r} (release counter "
            f"{info.release_counter}) is below the fleet's floor and may not run; "
            "pin a newer version",
            model=info.model,
            version=info.version,
            release_counter=info.release_counter,
        )


def _sequence_range(assignments: Sequence[Assignment]) -> list[int]:
    """[lowest, highest] sequence of a chunk's assignments (audit details), or []."""
    if not assignments:
        return []
    sequences = [a.sequence for a in assignments]
    return [min(sequences), max(sequences)]


_COLUMNS: Final = (
    "node_id",
    "sequence",
    "target_path",
    "sha256",
    "length",
    "issued_at",
    "expires_at",
    "signed",
    "created_by",
)
# PostgreSQL: binary COPY straight into the table (the rows are locked, so there is no
# conflict to skip): a few µs of Python per row against tens for an ORM executemany.
_ASSIGNMENTS_COPY: Final = BinaryCopy(
    "director_assignments",
    _COLUMNS,
    (
        "varchar",
        "int8",
        "varchar",
        "varchar",
        "int8",
        "timestamptz",
        "timestamptz",
        "bytea",
        "varchar",
    ),
)


def _insert_assignments(session: Session, rows: list[tuple[Any, ...]]) -> None:
    """Store a chunk's rows (in `_COLUMNS` order) in one statement, in the session's
    transaction. A duplicate (node, sequence) raises IntegrityError on every backend."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        session.execute(
            insert(DirectorAssignmentRow), [dict(zip(_COLUMNS, r, strict=True)) for r in rows]
        )
        return
    copy_rows(connection, _ASSIGNMENTS_COPY, rows)
