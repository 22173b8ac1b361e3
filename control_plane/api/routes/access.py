"""API tokens and the audit log."""

from __future__ import annotations

from fastapi import APIRouter, status

from control_plane.access.roles import Role
from control_plane.access.service import TokenInfo
from control_plane.api.deps import AccessDep, ContextDep
from control_plane.api.params import ZonedTime
from control_plane.api.schemas import AuditOut, TokenCreate, TokenCreated, TokenOut

router = APIRouter(prefix="/v1", tags=["access"])


def _token_out(info: TokenInfo) -> TokenOut:
    return TokenOut(
        id=info.id,
        name=info.name,
        role=info.role,
        created_at=info.created_at,
        created_by=info.created_by,
        revoked_at=info.revoked_at,
        last_used_at=info.last_used_at,
    )


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, ctx: ContextDep, access: AccessDep) -> TokenCreated:
    token, info = access.create_token(ctx, name=body.name, role=Role.parse(body.role))
    return TokenCreated(token=token, **_token_out(info).model_dump())


@router.get("/tokens")
def list_tokens(ctx: ContextDep, access: AccessDep) -> list[TokenOut]:
    return [_token_out(t) for t in access.list_tokens(ctx)]


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: str, ctx: ContextDep, access: AccessDep) -> TokenOut:
    return _token_out(access.revoke_token(ctx, token_id))


@router.get("/audit")
def list_audit(
    ctx: ContextDep,
    access: AccessDep,
    limit: int = 100,
    action: str | None = None,
    since: ZonedTime | None = None,
) -> list[AuditOut]:
    entries = access.list_audit(ctx, limit=limit, action=action, since=since)
    return [AuditOut.model_validate(e, from_attributes=True) for e in entries]
