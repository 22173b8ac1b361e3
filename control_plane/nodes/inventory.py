"""The node inventory for operators: list and read nodes, change labels, revoke, MQTT logins.

Operator-facing and audited (`AuditedMutations`); what nodes themselves report goes
through `presence`, enrollment through `enrollment`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext
from control_plane.clock import Clock
from control_plane.errors import UnavailableError
from control_plane.identity.bootstrap import LabelSelector, validate_labels
from control_plane.link.broker_accounts import BrokerAccounts, FileExportAccounts
from control_plane.link.mqtt_acl import NodeMqttAccount
from control_plane.nodes.model import FleetMember, Node
from control_plane.nodes.presence import NodePresence
from control_plane.nodes.rows import fleet_name, fleet_row, node_row, node_value
from control_plane.storage.models import FleetRow, NodeRow

__all__ = ["NodeInventory"]

log = logging.getLogger(__name__)


class NodeInventory:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        presence: NodePresence,
        accounts: BrokerAccounts | None = None,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._presence = presence
        self._accounts: BrokerAccounts = accounts or FileExportAccounts()
        self._mutations = AuditedMutations(sessions, clock)

    # ------------------------------------------------------------------- reads

    def list_nodes(
        self, selector: LabelSelector | None = None, fleet: str | None = None
    ) -> list[Node]:
        query = (
            select(NodeRow, FleetRow.name)
            .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
            .order_by(FleetRow.name, NodeRow.id)
        )
        with self._sessions() as session:
            if fleet is not None:
                query = query.where(NodeRow.fleet_id == fleet_row(session, fleet).id)
            nodes = [node_value(row, name) for row, name in session.execute(query)]
        # Label matching happens here, not in SQL: JSON operators differ per backend and
        # a fleet's node list is small enough to filter in memory.
        if selector is not None:
            nodes = [n for n in nodes if selector.matches(n.labels)]
        return nodes

    def fleet_members(self, fleet: str) -> list[FleetMember]:
        """The fleet's unrevoked nodes, by id, with only what the rollout controller reads
        of them each tick (one query; an unknown fleet has none)."""
        query = (
            select(
                NodeRow.id,
                NodeRow.labels,
                NodeRow.reported_state,
                NodeRow.online,
                NodeRow.created_at,
            )
            .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
            .where(FleetRow.name == fleet, NodeRow.revoked_at.is_(None))
            .order_by(NodeRow.id)
        )
        with self._sessions() as session:
            return [
                FleetMember(
                    node_id,
                    {str(k): str(v) for k, v in (labels or {}).items()},
                    dict(reported or {}),
                    online,
                    created_at,
                )
                for node_id, labels, reported, online, created_at in session.execute(query)
            ]

    def get_node(self, node_id: str) -> Node:
        with self._sessions() as session:
            row = node_row(session, node_id)
            return node_value(row, fleet_name(session, row.fleet_id))

    # --------------------------------------------------------------- mutations

    def revoke(self, ctx: RequestContext, node_id: str) -> Node:
        """The node is refused from its next message on; idempotent.

        Its broker login (where the control plane manages them) is removed after the
        commit, which drops its connection; a broker that cannot be reached leaves that to
        the reconcile, and the bridge refuses the node's messages meanwhile.
        """
        with self._mutations.mutation(
            ctx, "node.revoke", f"node:{node_id}", needs=Role.OPERATOR
        ) as session:
            row = node_row(session, node_id, lock=True)
            if row.revoked_at is None:
                row.revoked_at = self._clock.now()
            row.online = False
            self._presence.forget(node_id)
            session.flush()
            node = node_value(row, fleet_name(session, row.fleet_id))
            has_login = row.mqtt_password_hash is not None
        if has_login and self._accounts.manages_logins:
            try:
                self._accounts.remove_node(node_id)
            except UnavailableError as exc:
                log.warning(
                    "revoked node keeps its broker login until the next reconcile: %s",
                    exc,
                    extra={"node_id": node_id},
                )
        return node

    def set_labels(self, ctx: RequestContext, node_id: str, labels: Mapping[str, str]) -> Node:
        """Replace a node's labels (audited with before and after)."""
        return self._change_labels(ctx, node_id, dict(labels), replace=True)

    def update_labels(
        self, ctx: RequestContext, node_id: str, changes: Mapping[str, str | None]
    ) -> Node:
        """Set some labels and remove those mapped to None (JSON merge-patch)."""
        return self._change_labels(ctx, node_id, dict(changes), replace=False)

    def _change_labels(
        self,
        ctx: RequestContext,
        node_id: str,
        changes: dict[str, str | None],
        *,
        replace: bool,
    ) -> Node:
        details: dict[str, Any] = {}
        with self._mutations.mutation(
            ctx, "node.labels", f"node:{node_id}", needs=Role.OPERATOR, details=details
        ) as session:
            row = node_row(session, node_id, lock=True)
            before = {str(k): str(v) for k, v in row.labels.items()}
            merged = changes if replace else {**before, **changes}
            after = validate_labels({k: v for k, v in merged.items() if v is not None})
            row.labels = after
            session.flush()
            details.update(before=before, after=after)
            node = node_value(row, fleet_name(session, row.fleet_id))
        return node

    # -------------------------------------------------------------------- mqtt

    def mqtt_accounts(self, ctx: RequestContext) -> list[NodeMqttAccount]:
        """Every unrevoked node's MQTT login (hashes only), for the broker's password file.

        Admin only and audited: whoever holds these hashes can configure a broker that
        admits the nodes. Revoked nodes are left out, so a regenerated file locks them out.
        """
        details: dict[str, Any] = {}
        with self._mutations.mutation(
            ctx, "mqtt.credentials.export", "mqtt", needs=Role.ADMIN, details=details
        ) as session:
            found = session.execute(
                select(NodeRow.id, FleetRow.name, NodeRow.mqtt_password_hash)
                .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
                .where(NodeRow.revoked_at.is_(None), NodeRow.mqtt_password_hash.is_not(None))
                .order_by(FleetRow.name, NodeRow.id)
            ).all()
            accounts = [
                NodeMqttAccount(node_id=node_id, fleet=fleet, password_hash=str(password_hash))
                for node_id, fleet, password_hash in found
            ]
            details["nodes"] = len(accounts)
        return accounts
