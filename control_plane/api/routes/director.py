"""Director assignments: pin a node to a model version, read its assignment, the director key.

Thin: parse, call `DirectorService`, render. The signed assignment travels base64-encoded
in `signed` (the serialized SignedDirectorAssignment, exactly as the node verifies it).
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from control_plane.api.deps import ContextDep, PrincipalDep, ServicesDep
from control_plane.director.service import Assignment
from control_plane.errors import NotFoundError

router = APIRouter(prefix="/v1", tags=["director"])


class PinRequest(BaseModel):
    model: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)


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
    )


@router.post("/nodes/{node_id}/pin", status_code=status.HTTP_201_CREATED)
def pin_node(
    node_id: str, body: PinRequest, ctx: ContextDep, services: ServicesDep
) -> AssignmentOut:
    """Assign a model version of the node's fleet to the node (a new signed assignment)."""
    assignment = services.director.pin(ctx, node_id, body.model, body.version)
    return _out(assignment, services.clock.now())


@router.get("/nodes/{node_id}/assignment")
def get_assignment(node_id: str, _: PrincipalDep, services: ServicesDep) -> SignedAssignmentOut:
    """The node's newest assignment with its signed bytes; 404 when it has none."""
    assignment = services.director.latest(node_id)
    if assignment is None:
        raise NotFoundError(f"node {node_id!r} has no assignment", node_id=node_id)
    out = _out(assignment, services.clock.now())
    return SignedAssignmentOut(
        **out.model_dump(), signed=base64.b64encode(assignment.signed).decode("ascii")
    )


@router.get("/director/key")
def director_key(services: ServicesDep) -> dict[str, Any]:
    """The director's public key (TUF key dict plus keyid). Open, like TUF metadata: it is
    public, and a node gets it over its authenticated enrollment, not from here."""
    return services.director.director_public_key()
