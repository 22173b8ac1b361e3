"""The periodic reconcile of the broker's node logins against the database.

What it is for: revocations whose broker call failed, logins left by an enrollment that
did not commit, and bindings changed by hand are brought back in line; enrolled nodes the
broker has lost are counted and logged (only a hash of their password is stored, which
the plugin cannot take). What it is not: enrollment or revocation themselves, which call
the `BrokerAccounts` port directly and rely on this pass only when the broker was away.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.link.broker_accounts import BrokerAccounts, ReconcilePlan, plan_reconcile
from control_plane.storage.models import FleetRow, NodeRow

__all__ = ["BrokerLogins", "ReconcileReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    plan: ReconcilePlan
    control_plane_changed: bool


class BrokerLogins:
    def __init__(
        self, sessions: sessionmaker[Session], accounts: BrokerAccounts, clock: Clock
    ) -> None:
        self._sessions = sessions
        self.accounts = accounts
        self._clock = clock
        # The last pass's figures, for /metrics and the logs.
        self.missing = 0
        self.removed = 0
        self.repaired = 0
        self.failed_passes = 0

    def reconcile(self) -> ReconcileReport:
        """One pass; raises the port's UnavailableError when the broker is away."""
        try:
            changed = self.accounts.ensure_control_plane()
            enrolled, revoked = self._database()
            plan = plan_reconcile(enrolled, revoked, self.accounts.logins(), self._clock.now())
            for node_id in plan.remove:
                self.accounts.remove_node(node_id)
            for node_id, fleet in plan.repair.items():
                self.accounts.bind_node(node_id, fleet)
        except Exception:
            self.failed_passes += 1
            raise
        self.removed, self.repaired, self.missing = (
            len(plan.remove),
            len(plan.repair),
            len(plan.missing),
        )
        if plan.remove or plan.repair:
            log.info(
                "MQTT broker logins reconciled: %d removed, %d repaired",
                len(plan.remove),
                len(plan.repair),
                extra={"removed": list(plan.remove)[:20], "repaired": list(plan.repair)[:20]},
            )
        if plan.missing:
            log.error(
                "%d enrolled MQTT nodes have no broker login (the broker lost them; "
                "re-enroll them or restore the broker's dynamic-security file): %s",
                len(plan.missing),
                ", ".join(plan.missing[:20]),
            )
        return ReconcileReport(plan, changed)

    def _database(self) -> tuple[dict[str, str], set[str]]:
        with self._sessions() as session:
            rows = session.execute(
                select(NodeRow.id, FleetRow.name, NodeRow.revoked_at)
                .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
                .where(NodeRow.mqtt_password_hash.is_not(None))
            ).all()
        enrolled = {node_id: fleet for node_id, fleet, revoked_at in rows if revoked_at is None}
        revoked = {node_id for node_id, _, revoked_at in rows if revoked_at is not None}
        return enrolled, revoked
