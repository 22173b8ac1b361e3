"""Health retention: deletes raw points, roll-ups and cleared alerts past their retention.

Not for deciding what to keep: the spans are ``HealthConfig``'s (validated at start); the
processor (``control_plane.health.processor``) calls ``apply_if_due`` after each pass.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.health.config import HealthConfig
from control_plane.health.rollup import Resolution, bucket_start
from control_plane.health.rows import CURSOR_NAME, write_session
from control_plane.storage.models import (
    HealthAlertRow,
    HealthCursorRow,
    HealthPointRow,
    HealthRollupRow,
)

__all__ = ["HealthRetention"]

log = logging.getLogger(__name__)


class HealthRetention:
    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, config: HealthConfig | None = None
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.config = config or HealthConfig()

    def apply_retention(self, now: datetime | None = None) -> dict[str, int]:
        """Delete raw points, roll-ups and cleared alerts past their retention."""
        now = now or self._clock.now()
        config = self.config
        raw_cutoff = now - config.raw_retention
        deleted: dict[str, int] = {}
        with write_session(self._sessions) as session:
            # A point received recently stays, however old its window: it is what makes
            # reprocessing a record a no-op (see the processor's _without_stored).
            deleted["raw"] = _rowcount(
                session.execute(
                    delete(HealthPointRow).where(
                        HealthPointRow.at < raw_cutoff, HealthPointRow.received_at < raw_cutoff
                    )
                )
            )
            kept: tuple[tuple[Resolution, timedelta], ...] = (
                ("minute", config.minute_retention),
                ("hour", config.hour_retention),
            )
            for resolution, keep in kept:
                cutoff = bucket_start(now - keep, resolution)
                deleted[resolution] = _rowcount(
                    session.execute(
                        delete(HealthRollupRow).where(
                            HealthRollupRow.resolution == resolution,
                            HealthRollupRow.bucket < cutoff,
                        )
                    )
                )
            deleted["alerts"] = _rowcount(
                session.execute(
                    delete(HealthAlertRow).where(
                        HealthAlertRow.cleared_at < now - config.hour_retention,
                        HealthAlertRow.ended_at.is_not(None),
                    )
                )
            )
            session.commit()
        if any(deleted.values()):
            log.info("health retention", extra={"deleted": deleted})
        return deleted

    def apply_if_due(self, now: datetime) -> None:
        """Apply the retention when ``retention_every`` has passed since any replica last
        did (the time is on the cursor row, so replicas take turns, not all at once)."""
        with write_session(self._sessions) as session:
            cursor = session.get(HealthCursorRow, CURSOR_NAME)
            if cursor is None or (
                cursor.retention_at is not None
                and now - cursor.retention_at < self.config.retention_every
            ):
                return
            cursor.retention_at = now
            session.commit()
        self.apply_retention(now)


def _rowcount(result: Any) -> int:
    count = getattr(result, "rowcount", 0)
    return int(count) if count and count > 0 else 0
