"""The director: decides which model target one node shall run, signs it, keeps the history.

`pin` is the operator's decision for one node (rollouts will call the same path later);
every assignment gets the node's next sequence and is stored signed, exactly as the node
receives it. Once the pin has committed it goes to the `AssignmentDelivery` port (the
transports running in this process push it to a connected node); the transports also
answer every node's Hello with `current(node_id)`, so a node that was not reachable gets
it then. The signing rules live in `control_plane.director.assignments`; no transport is
imported here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from securesystemslib.signer import Signer
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext
from control_plane.clock import Clock
from control_plane.director.assignments import sign_assignment
from control_plane.director.delivery import AssignmentDelivery, FanOutDelivery
from control_plane.errors import ConflictError, InvalidInputError, NotFoundError, PolicyError
from control_plane.nodes.service import NodeService
from control_plane.registry.service import RegistryService
from control_plane.storage.models import DirectorAssignmentRow, FleetRow, NodeRow
from control_plane.trust.custom import parse_target_path, validate_model_name, validate_version
from control_plane.trust.keys import public_key_dict
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

__all__ = ["DEFAULT_ASSIGNMENT_TTL", "Assignment", "DirectorService"]

log = logging.getLogger(__name__)

DEFAULT_ASSIGNMENT_TTL: Final = timedelta(days=7)
_MIN_TTL: Final = timedelta(minutes=1)
_MAX_TTL: Final = timedelta(days=366)
_MAX_NODE_ID: Final = 64


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

    def expired(self, now: datetime) -> bool:
        """The node ignores an assignment from `expires_at` on (and keeps what it runs)."""
        return now >= self.expires_at

    def signed_message(self) -> SignedDirectorAssignment:
        return SignedDirectorAssignment.FromString(self.signed)


class DirectorService:
    """Signed per-node assignments over the relational store, with one online Ed25519 key."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        registry: RegistryService,
        nodes: NodeService,
        key: Signer,
        clock: Clock,
        ttl: timedelta = DEFAULT_ASSIGNMENT_TTL,
        delivery: AssignmentDelivery | None = None,
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
            if len(node_id) > _MAX_NODE_ID:
                raise NotFoundError("no such node", node_id=node_id[:_MAX_NODE_ID])
            # The node row stays locked until commit: the sequence below is read-then-write.
            row = session.get(NodeRow, node_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no node {node_id!r}", node_id=node_id)
            if row.revoked_at is not None:
                raise PolicyError(
                    f"node {node_id!r} was revoked; it gets no assignments", node_id=node_id
                )
            fleet = session.get_one(FleetRow, row.fleet_id).name
            info = self._registry.get_version(fleet, model, version)
            if info.revoked:
                raise PolicyError(
                    f"version {version!r} of model {model!r} (release counter "
                    f"{info.release_counter}) is below the fleet's floor and may not run; "
                    "pin a newer version",
                    model=model,
                    version=version,
                    release_counter=info.release_counter,
                )
            last = session.scalar(
                select(func.max(DirectorAssignmentRow.sequence)).where(
                    DirectorAssignmentRow.node_id == node_id
                )
            )
            sequence = (last or 0) + 1
            issued_at = self._clock.now().replace(microsecond=0)
            expires_at = issued_at + self._ttl
            signed = sign_assignment(
                self._key,
                fleet=fleet,
                node_id=node_id,
                sequence=sequence,
                target_path=info.target_path,
                sha256=info.sha256,
                length=info.length,
                issued_at=issued_at,
                expires_at=expires_at,
            )
            assignment_row = DirectorAssignmentRow(
                node_id=node_id,
                sequence=sequence,
                target_path=info.target_path,
                sha256=info.sha256,
                length=info.length,
                issued_at=issued_at,
                expires_at=expires_at,
                signed=signed.SerializeToString(deterministic=True),
                created_by=ctx.principal.name,
            )
            session.add(assignment_row)
            try:
                session.flush()
            except IntegrityError as exc:
                raise ConflictError(
                    f"another assignment of node {node_id!r} took sequence {sequence}; retry",
                    node_id=node_id,
                    sequence=sequence,
                ) from exc
            assignment = _assignment(assignment_row, fleet)
        log.info(
            "node pinned",
            extra={"node_id": node_id, "target": info.target_path, "sequence": sequence},
        )
        self._deliver(assignment)
        return assignment

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

    def current(self, node_id: str) -> SignedDirectorAssignment | None:
        """What the node is sent at its Hello: its newest signed assignment, or None when
        it has none or the newest has expired (the node would refuse it; it keeps running
        what it runs until an operator pins again)."""
        latest = self.latest(node_id)
        if latest is None or latest.expired(self._clock.now()):
            return None
        return latest.signed_message()


def _assignment(row: DirectorAssignmentRow, fleet: str) -> Assignment:
    parsed = parse_target_path(row.target_path)
    if parsed is None or parsed.version is None:  # only model targets are ever stored
        raise ValueError(f"stored assignment names {row.target_path!r}, not a model target")
    signed = SignedDirectorAssignment.FromString(row.signed)
    return Assignment(
        node_id=row.node_id,
        fleet=fleet,
        sequence=row.sequence,
        model=parsed.model,
        version=parsed.version,
        target_path=row.target_path,
        sha256=row.sha256,
        length=row.length,
        issued_at=row.issued_at,
        expires_at=row.expires_at,
        created_by=row.created_by,
        keyid=signed.keyid,
        signed=row.signed,
    )
