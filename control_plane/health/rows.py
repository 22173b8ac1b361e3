"""Row helpers the health processor, queries and retention share: the cursor and its order.

Not for policy (``control_plane.health.alerts``) nor for roll-up math
(``control_plane.health.rollup``); nothing here decides, it only reads and locks rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.storage.models import HealthCursorRow, NodeRecordRow

__all__ = [
    "CONDITION_ENDED",
    "CURSOR_NAME",
    "after_position",
    "cursor_position",
    "locked_cursor",
    "percentiles_only",
    "write_session",
]

CURSOR_NAME: Final = "health"
# `cleared_by` of an alert its condition cleared (an operator's clearing names the operator).
CONDITION_ENDED: Final = "condition-ended"


@contextmanager
def write_session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction takes the write lock at once (``BEGIN IMMEDIATE`` on
    SQLite), so it never fails half-way on a lock upgrade."""
    with sessions() as session:
        session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
        yield session


def locked_cursor(session: Session) -> HealthCursorRow | None:
    """The cursor row, locked for this transaction; None while another replica holds it."""
    return session.scalars(
        select(HealthCursorRow)
        .where(HealthCursorRow.name == CURSOR_NAME)
        .with_for_update(skip_locked=True)
    ).first()


def cursor_position(cursor: HealthCursorRow | None) -> tuple[datetime, str, str] | None:
    if cursor is None or cursor.received_at is None:
        return None
    return cursor.received_at, cursor.node_id, cursor.record_id


def after_position(received_at: datetime, node_id: str, record_id: str) -> Any:
    """Records strictly after a cursor position in (received_at, node_id, record_id) order."""
    return or_(
        NodeRecordRow.received_at > received_at,
        and_(
            NodeRecordRow.received_at == received_at,
            or_(
                NodeRecordRow.node_id > node_id,
                and_(NodeRecordRow.node_id == node_id, NodeRecordRow.record_id > record_id),
            ),
        ),
    )


def percentiles_only(latency: dict[str, Any]) -> dict[str, Any]:
    return {
        model: {
            kind: {k: v for k, v in values.items() if k != "sketch_ms"}
            for kind, values in kinds.items()
        }
        for model, kinds in latency.items()
    }
