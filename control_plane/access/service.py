"""API tokens and the append-only audit log, over the relational store.

Mutations elsewhere record their audit row in their own transaction through
`record_audit`, so an action and its audit entry commit or roll back together.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role, hash_token, new_token, token_matches
from control_plane.clock import Clock
from control_plane.errors import (
    AuthenticationError,
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
)
from control_plane.fsutil import atomic_write, make_private_dirs
from control_plane.storage.models import ApiTokenRow, AuditRow


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who asks, and under which request id; passed to every mutating service call."""

    principal: Principal
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


LAST_USED_RESOLUTION = timedelta(minutes=1)

SYSTEM = RequestContext(Principal(token_id="system", name="system", role=Role.ADMIN), "system")


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    name: str
    role: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    request_id: str
    outcome: str
    details: dict[str, Any]


def record_audit(
    session: Session,
    ctx: RequestContext,
    *,
    at: datetime,
    action: str,
    target: str,
    outcome: str = "ok",
    details: dict[str, Any] | None = None,
) -> None:
    session.add(
        AuditRow(
            at=at,
            actor=ctx.principal.name,
            role=ctx.principal.role.label,
            action=action,
            target=target[:512],
            request_id=ctx.request_id[:64],
            outcome=outcome,
            details=details or {},
        )
    )


class AuditedMutations:
    """Runs a mutation in one transaction with its audit row; a refused one is audited too."""

    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self._sessions = sessions
        self._clock = clock

    @contextmanager
    def mutation(
        self,
        ctx: RequestContext,
        action: str,
        target: str,
        *,
        needs: Role,
        details: dict[str, Any] | None = None,
    ) -> Iterator[Session]:
        """Check the caller's role, run the body in a transaction, audit either outcome.

        `details` goes into the audit row as it is at commit, so the body may fill it in.
        """
        session = self._sessions()
        try:
            ctx.principal.require(needs, action)
            # Read-then-write: on SQLite take the write lock at BEGIN, or two writers
            # deadlock on the lock upgrade. Other backends ignore the option.
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            yield session
            record_audit(
                session,
                ctx,
                at=self._clock.now(),
                action=action,
                target=target,
                details=dict(details) if details else None,
            )
            session.commit()
        except EdgefleetError as exc:
            session.rollback()
            self.record_refusal(ctx, action, target, exc)
            raise
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def record_refusal(
        self, ctx: RequestContext, action: str, target: str, exc: EdgefleetError
    ) -> None:
        """Audit a refused attempt in its own small transaction."""
        details = {"error": type(exc).__name__, "message": exc.message[:1000]}
        with self._sessions() as session:
            record_audit(
                session,
                ctx,
                at=self._clock.now(),
                action=action,
                target=target,
                outcome="refused",
                details=details,
            )
            session.commit()


class AccessService:
    """Issues, checks and revokes API tokens; reads the audit log."""

    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self._sessions = sessions
        self._clock = clock
        self._mutations = AuditedMutations(sessions, clock)

    def bootstrap_admin(self, token_file: Path) -> bool:
        """On first start (no token at all) create an admin token and write it once, 0600."""
        with self._sessions() as session:
            count = session.scalar(select(func.count()).select_from(ApiTokenRow)) or 0
        if count:
            return False
        token = self.create_token(SYSTEM, name="bootstrap-admin", role=Role.ADMIN)[0]
        make_private_dirs(token_file.parent)
        # Replaces a file left from an earlier database: that token is useless now.
        atomic_write(token_file, (token + "\n").encode(), mode=0o600)
        return True

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthenticationError("missing API token (Authorization: Bearer ...)")
        digest = hash_token(token)
        with self._sessions() as session:
            row = session.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == digest))
            if row is None or not token_matches(token, row.token_hash):
                raise AuthenticationError("unknown API token")
            if row.revoked_at is not None:
                raise AuthenticationError(f"API token {row.name!r} was revoked")
            principal = Principal(token_id=row.id, name=row.name, role=Role.parse(row.role))
            last_used = row.last_used_at
        now = self._clock.now()
        # Throttled so that reads do not turn into a write per request.
        if last_used is None or now - last_used > LAST_USED_RESOLUTION:
            self._note_use(principal.token_id, now)
        return principal

    def _note_use(self, token_id: str, now: datetime) -> None:
        """Move the token's `last_used_at`, in a transaction of its own that writes first.

        Not in the read's transaction: on SQLite a transaction that read and then writes
        must upgrade its lock, which fails at once ("database is locked", no busy wait)
        while another connection writes, or has written since the read; that made a REST
        request fail now and then while the controllers wrote. Written first, the UPDATE
        waits for the lock like any writer. Conditional, so replicas do not all write it.
        """
        with self._sessions.begin() as session:
            session.execute(
                update(ApiTokenRow)
                .where(
                    ApiTokenRow.id == token_id,
                    or_(
                        ApiTokenRow.last_used_at.is_(None),
                        ApiTokenRow.last_used_at < now - LAST_USED_RESOLUTION,
                    ),
                )
                .values(last_used_at=now)
                .execution_options(synchronize_session=False)
            )

    def create_token(self, ctx: RequestContext, *, name: str, role: Role) -> tuple[str, TokenInfo]:
        token = new_token()
        name = name.strip()
        with self._mutations.mutation(
            ctx, "token.create", f"token:{name}", needs=Role.ADMIN
        ) as session:
            if not name or len(name) > 128:
                raise InvalidInputError("token name must be 1-128 characters", name=name)
            row = ApiTokenRow(
                id=uuid.uuid4().hex,
                name=name,
                role=role.label,
                token_hash=hash_token(token),
                created_at=self._clock.now(),
                created_by=ctx.principal.name,
            )
            session.add(row)
            session.flush()
            info = _token_info(row)
        return token, info

    def revoke_token(self, ctx: RequestContext, token_id: str) -> TokenInfo:
        with self._mutations.mutation(
            ctx, "token.revoke", f"token:{token_id}", needs=Role.ADMIN
        ) as session:
            row = session.get(ApiTokenRow, token_id)
            if row is None:
                raise NotFoundError(f"no API token with id {token_id!r}", token_id=token_id)
            if row.revoked_at is None:
                if row.role == Role.ADMIN.label:
                    self._refuse_revoking_last_admin(session, row)
                row.revoked_at = self._clock.now()
            info = _token_info(row)
        return info

    @staticmethod
    def _refuse_revoking_last_admin(session: Session, row: ApiTokenRow) -> None:
        """Nobody could create a token again: only `edgefleet token recover` on the server.

        The active admin rows are locked (PostgreSQL; SQLite holds its write lock), so
        two admins revoking each other at once cannot both succeed.
        """
        active_admins = session.scalars(
            select(ApiTokenRow.id)
            .where(ApiTokenRow.role == Role.ADMIN.label, ApiTokenRow.revoked_at.is_(None))
            .with_for_update()
        ).all()
        if set(active_admins) <= {row.id}:
            raise ConflictError(
                f"API token {row.name!r} is the last active admin token; create another "
                "admin token first (revoking it would leave no one able to manage tokens)",
                token_id=row.id,
            )

    def recover_admin(self, token_file: Path, *, name: str = "recovery-admin") -> TokenInfo:
        """Create a new admin token and write it to `token_file` (0600), for an operator
        who holds the server's data dir and no working admin token. Audited as `system`."""
        token, info = self.create_token(SYSTEM, name=name, role=Role.ADMIN)
        make_private_dirs(token_file.parent)
        atomic_write(token_file, (token + "\n").encode(), mode=0o600)
        return info

    def list_tokens(self, ctx: RequestContext) -> list[TokenInfo]:
        ctx.principal.require(Role.ADMIN, "listing API tokens")
        with self._sessions() as session:
            rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at))
            return [_token_info(r) for r in rows]

    def list_audit(
        self,
        ctx: RequestContext,
        *,
        limit: int = 100,
        action: str | None = None,
        since: datetime | None = None,
    ) -> list[AuditEntry]:
        ctx.principal.require(Role.OPERATOR, "reading the audit log")
        limit = max(1, min(limit, 1000))
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if action:
            query = query.where(AuditRow.action == action)
        if since:
            query = query.where(AuditRow.at >= since)
        with self._sessions() as session:
            return [
                AuditEntry(
                    id=r.id,
                    at=r.at,
                    actor=r.actor,
                    role=r.role,
                    action=r.action,
                    target=r.target,
                    request_id=r.request_id,
                    outcome=r.outcome,
                    details=dict(r.details or {}),
                )
                for r in session.scalars(query)
            ]


def _token_info(row: ApiTokenRow) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        name=row.name,
        role=row.role,
        created_at=row.created_at,
        created_by=row.created_by,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
    )
