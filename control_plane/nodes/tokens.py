"""Bootstrap tokens: operators create, list and revoke the single-use enrollment tokens.

Audited through `AuditedMutations`; using a token is enrollment's (`enrollment`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext
from control_plane.clock import Clock
from control_plane.errors import InvalidInputError, NotFoundError
from control_plane.identity.bootstrap import (
    hash_bootstrap_token,
    new_bootstrap_token,
    validate_labels,
)
from control_plane.nodes.model import BootstrapTokenInfo, NodeConfig, human_duration
from control_plane.nodes.rows import fleet_name, fleet_row, token_value
from control_plane.storage.models import BootstrapTokenRow, FleetRow

__all__ = ["BootstrapTokens"]

_MAX_LISTED_TOKENS: Final = 1000


class BootstrapTokens:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, config: NodeConfig | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._config = config or NodeConfig()
        self._mutations = AuditedMutations(sessions, clock)

    def create_bootstrap_token(
        self,
        ctx: RequestContext,
        fleet: str,
        labels: Mapping[str, str],
        ttl: timedelta,
    ) -> tuple[str, BootstrapTokenInfo]:
        """A single-use token that enrolls one node into `fleet` with `labels`; shown once."""
        token = new_bootstrap_token()
        token_id = uuid.uuid4().hex
        details: dict[str, Any] = {}
        with self._mutations.mutation(
            ctx, "node-token.create", f"node-token:{token_id}", needs=Role.OPERATOR, details=details
        ) as session:
            low, high = self._config.min_token_ttl, self._config.max_token_ttl
            if not low <= ttl <= high:
                raise InvalidInputError(
                    f"a bootstrap token lives between {human_duration(low)} and "
                    f"{human_duration(high)}",
                    ttl_s=int(ttl.total_seconds()),
                )
            checked = validate_labels(labels)
            fleet_id = fleet_row(session, fleet).id
            now = self._clock.now()
            row = BootstrapTokenRow(
                id=token_id,
                fleet_id=fleet_id,
                token_hash=hash_bootstrap_token(token),
                labels=checked,
                created_at=now,
                created_by=ctx.principal.name,
                expires_at=now + ttl,
            )
            session.add(row)
            session.flush()
            details.update(fleet=fleet, labels=checked, expires_at=row.expires_at.isoformat())
            info = token_value(row, fleet)
        return token, info

    def list_bootstrap_tokens(
        self, ctx: RequestContext, fleet: str | None = None
    ) -> list[BootstrapTokenInfo]:
        """The newest tokens first (never their secrets)."""
        ctx.principal.require(Role.OPERATOR, "listing bootstrap tokens")
        query = (
            select(BootstrapTokenRow, FleetRow.name)
            .join(FleetRow, FleetRow.id == BootstrapTokenRow.fleet_id)
            .order_by(BootstrapTokenRow.created_at.desc(), BootstrapTokenRow.id)
            .limit(_MAX_LISTED_TOKENS)
        )
        with self._sessions() as session:
            if fleet is not None:
                query = query.where(BootstrapTokenRow.fleet_id == fleet_row(session, fleet).id)
            return [token_value(row, name) for row, name in session.execute(query)]

    def revoke_bootstrap_token(self, ctx: RequestContext, token_id: str) -> BootstrapTokenInfo:
        """An unused token stops working at once; idempotent."""
        with self._mutations.mutation(
            ctx, "node-token.revoke", f"node-token:{token_id}", needs=Role.OPERATOR
        ) as session:
            row = session.get(BootstrapTokenRow, token_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no bootstrap token {token_id!r}", token_id=token_id)
            if row.revoked_at is None and row.used_at is None:
                row.revoked_at = self._clock.now()
            session.flush()
            info = token_value(row, fleet_name(session, row.fleet_id))
        return info
