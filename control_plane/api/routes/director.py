"""Director assignments: pin a node, or many nodes of a fleet, to a model version; read a
node's assignment; the director key.

Thin: parse, call `DirectorService`, render. The signed assignment travels base64-encoded
in `signed` (the serialized SignedDirectorAssignment, exactly as the node verifies it).
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from control_plane.api.deps import ClockDep, ContextDep, DirectorDep, PrincipalDep
from control_plane.director.service import MAX_PIN_NODE_IDS, Assignment
from control_plane.errors import NotFoundError

router = APIRouter(prefix="/v1", tags=["director"])


class PinRequest(BaseModel):
    model: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)


class PinManyRequest(BaseModel):
    """Nodes by id (`node_ids`) or by labels (`labels`: every node having all of them;
    `{}` is the whole fleet); exactly one of the two."""

    model: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    node_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_PIN_NODE_IDS)
    labels: dict[str, str] | None = None


class PinnedNodeOut(BaseModel):
    node_id: str
    sequence: int


class SkippedNodeOut(BaseModel):
    node_id: str
    reason: str = Field(description="revoked | gone (left the fleet meanwhile)")


class PinManyOut(BaseModel):
    fleet: str
    model: str
    version: str
    target_path: str
    issued_at: datetime | None
    expires_at: datetime | None
    selected: int
    pinned: int
    delivered: int = Field(description="assignments a transport of this replica took at once")
    chunks: int
    assignments: list[PinnedNodeOut]
    skipped: list[SkippedNodeOut]


class AssignmentOut(BaseModel):
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
    expired: bool
    created_by: str
    keyid: str
    renewal: bool = Field(
        default=False, description="only renews the assignment before it (same target)"
    )
    shadow: dict[str, Any] | None = Field(
        default=None,
        description="the candidate run in shadow beside the target: target_path, sha256, "
        "length, sample_per_mille, max_cpu_percent",
    )


class SignedAssignmentOut(AssignmentOut):
    signed: str = Field(description="base64 of the serialized SignedDirectorAssignment")


def _out(assignment: Assignment, now: datetime) -> AssignmentOut:
    return AssignmentOut(
        node_id=assignment.node_id,
        fleet=assignment.fleet,
        sequence=assignment.sequence,
        model=assignment.model,
        version=assignment.version,
        target_path=assignment.target_path,
        sha256=assignment.sha256,
        length=assignment.length,
        issued_at=assignment.issued_at,
        expires_at=assignment.expires_at,
        expired=assignment.expired(now),
        created_by=assignment.created_by,
        keyid=assignment.keyid,
        renewal=assignment.renewal,
        shadow=None if assignment.shadow is None else assignment.shadow.to_dict(),
    )


@router.post("/nodes/{node_id}/pin", status_code=status.HTTP_201_CREATED)
def pin_node(
    node_id: str, body: PinRequest, ctx: ContextDep, director: DirectorDep, clock: ClockDep
) -> AssignmentOut:
    """Assign a model version of the node's fleet to the node (a new signed assignment)."""
    assignment = director.pin(ctx, node_id, body.model, body.version)
    return _out(assignment, clock.now())


@router.post("/fleets/{fleet}/pin", status_code=status.HTTP_201_CREATED)
def pin_fleet_nodes(
    fleet: str, body: PinManyRequest, ctx: ContextDep, director: DirectorDep
) -> PinManyOut:
    """Assign a model version to many nodes of a fleet at once (by ids or by labels).

    Unknown ids refuse the whole request (404, nothing pinned); revoked nodes are skipped
    and listed in `skipped`.
    """
    result = director.pin_many(
        ctx, body.model, body.version, fleet=fleet, node_ids=body.node_ids, labels=body.labels
    )
    first = result.assignments[0] if result.assignments else None
    return PinManyOut(
        fleet=result.fleet,
        model=result.model,
        version=result.version,
        target_path=result.target_path,
        issued_at=first.issued_at if first else None,
        expires_at=first.expires_at if first else None,
        selected=result.selected,
        pinned=result.pinned,
        delivered=result.delivered,
        chunks=result.chunks,
        assignments=[
            PinnedNodeOut(node_id=a.node_id, sequence=a.sequence) for a in result.assignments
        ],
        skipped=[SkippedNodeOut(node_id=s.node_id, reason=s.reason) for s in result.skipped],
    )


@router.get("/nodes/{node_id}/assignment")
def get_assignment(
    node_id: str, _: PrincipalDep, director: DirectorDep, clock: ClockDep
) -> SignedAssignmentOut:
    """The node's newest assignment with its signed bytes; 404 when it has none."""
    assignment = director.latest(node_id)
    if assignment is None:
        raise NotFoundError(f"node {node_id!r} has no assignment", node_id=node_id)
    out = _out(assignment, clock.now())
    return SignedAssignmentOut(
        **out.model_dump(), signed=base64.b64encode(assignment.signed).decode("ascii")
    )


@router.get("/director/key")
def director_key(director: DirectorDep) -> dict[str, Any]:
    """The director's public key (TUF key dict plus keyid). Open, like TUF metadata: it is
    public, and a node gets it over its authenticated enrollment, not from here."""
    return director.director_public_key()


@router.post("/director/keys", status_code=status.HTTP_201_CREATED)
def new_director_key(ctx: ContextDep, director: DirectorDep) -> dict[str, Any]:
    """A new director key for a rotation (a stolen director key): the operator lists it in
    a fleet's root N+1 (`edgefleet keys rotate-director`); from then on it signs that
    fleet's assignments and nodes accept no other (ADR 0045)."""
    return director.new_key(ctx)
