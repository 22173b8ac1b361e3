"""An operator clears a health alert (audited, refusals too).

Not for the alert rules (``control_plane.health.alerts``) nor for the processor's own
raising and clearing (``control_plane.health.processor``): a cleared alert stays silent
until its condition ends, and the processor keeps that promise.
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext, record_audit
from control_plane.clock import Clock
from control_plane.errors import ConflictError, EdgefleetError, NotFoundError
from control_plane.health.queries import Alert, alert_from_row
from control_plane.health.rows import write_session
from control_plane.storage.models import HealthAlertRow

__all__ = ["AlertClearing"]


class AlertClearing:
    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self._sessions = sessions
        self._clock = clock

    def clear_alert(self, ctx: RequestContext, alert_id: int) -> Alert:
        """An operator clears an alert (audited, refusals too); it stays silent until its
        condition ends."""
        try:
            return self._clear_alert(ctx, alert_id)
        except EdgefleetError as exc:
            AuditedMutations(self._sessions, self._clock).record_refusal(
                ctx, "alert.clear", f"alert:{alert_id}", exc
            )
            raise

    def _clear_alert(self, ctx: RequestContext, alert_id: int) -> Alert:
        ctx.principal.require(Role.OPERATOR, "alert.clear")
        now = self._clock.now()
        with write_session(self._sessions) as session:
            row = session.get(HealthAlertRow, alert_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no alert {alert_id}", alert_id=alert_id)
            if row.cleared_at is not None:
                raise ConflictError(
                    f"alert {alert_id} was already cleared",
                    alert_id=alert_id,
                    cleared_by=row.cleared_by,
                )
            row.cleared_at = max(now, row.since)
            row.cleared_by = f"operator:{ctx.principal.name}"[:160]
            record_audit(
                session,
                ctx,
                at=now,
                action="alert.clear",
                target=f"alert:{alert_id}",
                details={"node_id": row.node_id, "kind": row.kind},
            )
            session.commit()
            return alert_from_row(row)
