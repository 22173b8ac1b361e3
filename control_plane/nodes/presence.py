"""Presence: what a connected node says (Hello, update status), heartbeats, online/offline.

Called by the node inbox for every transport and by the liveness loop; who the node is
was settled before (`authentication`). Not for operator changes (`inventory`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import CursorResult, not_, or_, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import EdgefleetError
from control_plane.nodes.model import (
    ACTIVE_TARGET,
    FAILURE_PHASES,
    LAST_FAILURE,
    UPDATE,
    Node,
    NodeConfig,
    NodeRefusals,
    checked_agent,
    served_target,
)
from control_plane.nodes.rows import (
    checked_state,
    fleet_name,
    node_for_node,
    node_value,
    write_session,
)
from control_plane.storage.models import NodeRow

__all__ = ["NodePresence"]

log = logging.getLogger(__name__)

_MAX_TOUCHED: Final = 200_000


class NodePresence:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        refusals: NodeRefusals,
        config: NodeConfig | None = None,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self._refusals = refusals
        self._config = config or NodeConfig()
        # node id -> when this process last wrote its last_seen (see `touch`).
        self._touched: dict[str, datetime] = {}

    def record_hello(
        self,
        node_id: str,
        agent_version: str | None,
        transport: str | None,
        reported_state: Mapping[str, Any],
        now: datetime | None = None,
    ) -> Node:
        """A node (re)connected and said who it is and what it runs."""
        now = now or self._clock.now()
        try:
            agent_version, transport = checked_agent(agent_version, transport)
            state = checked_state(reported_state, self._config.max_reported_state_bytes)
            with write_session(self._sessions) as session:
                row = node_for_node(session, node_id, lock=True)
                kept = (row.reported_state or {}).get(LAST_FAILURE)
                if isinstance(kept, dict):
                    # What the node said went wrong outlives its connection: an operator
                    # still reads why the last update failed after the node reconnects.
                    state = checked_state(
                        {**state, LAST_FAILURE: kept}, self._config.max_reported_state_bytes
                    )
                row.agent_version = agent_version
                row.transport = transport
                row.reported_state = state
                row.last_seen = now
                row.online = True
                session.flush()
                node = node_value(row, fleet_name(session, row.fleet_id))
                session.commit()
            return node
        except EdgefleetError as exc:
            self._refusals.refused("hello", exc, node_id=node_id)
            raise

    def record_update_status(
        self, node_id: str, status: Mapping[str, Any], now: datetime | None = None
    ) -> Node:
        """The node reported progress of an update; kept as `reported_state["update"]`,
        and a `failed` or `reverted` one also as `reported_state["last_failure"]`. A status
        that says what the node serves now (active, or reverted "serving X") moves
        `reported_state["active_target"]`, so it stays true between Hellos.

        Only the latest status is kept: the history of an update belongs to the rollout
        that asked for it, not to the inventory. The next Hello replaces the whole
        reported state, `update` included (a node reports what it runs when it connects,
        then its last status again), but not `last_failure`: why the last update failed
        stays readable until another one fails.
        """
        now = now or self._clock.now()
        try:
            with write_session(self._sessions) as session:
                row = node_for_node(session, node_id, lock=True)
                update = dict(status)
                changes: dict[str, Any] = {UPDATE: update}
                if update.get("phase") in FAILURE_PHASES:
                    changes[LAST_FAILURE] = update
                serving = served_target(update)
                if serving is not None:
                    changes[ACTIVE_TARGET] = serving
                state = checked_state(
                    {**(row.reported_state or {}), **changes},
                    self._config.max_reported_state_bytes,
                )
                row.reported_state = state
                row.last_seen = now
                row.online = True
                session.flush()
                node = node_value(row, fleet_name(session, row.fleet_id))
                session.commit()
            return node
        except EdgefleetError as exc:
            self._refusals.refused("update-status", exc, node_id=node_id)
            raise

    def touch(self, node_id: str, now: datetime | None = None) -> None:
        """A heartbeat: the node is online; last_seen moves (at most every few seconds).

        Within `touch_resolution` of this process's last write for the node the call
        returns without a database round trip (a heartbeat was one UPDATE per message).
        Marking the node offline here forgets that write; one marked offline by another
        replica shows online again at the first heartbeat after the resolution.
        """
        now = now or self._clock.now()
        last = self._touched.get(node_id)
        if last is not None and timedelta(0) <= now - last < self._config.touch_resolution:
            return
        with write_session(self._sessions) as session:
            session.execute(
                update(NodeRow)
                .where(
                    NodeRow.id == node_id,
                    NodeRow.revoked_at.is_(None),
                    or_(
                        not_(NodeRow.online),
                        NodeRow.last_seen.is_(None),
                        NodeRow.last_seen <= now - self._config.touch_resolution,
                    ),
                )
                .values(last_seen=now, online=True)
                .execution_options(synchronize_session=False)
            )
            session.commit()
        if len(self._touched) >= _MAX_TOUCHED:
            self._touched.clear()
        self._touched[node_id] = now

    def forget(self, node_id: str) -> None:
        """Drop this process's last heartbeat write of a node (it went offline or was
        revoked), so its next heartbeat writes again."""
        self._touched.pop(node_id, None)

    def set_online(self, node_id: str, online: bool, now: datetime | None = None) -> bool:
        """Connection opened (True) or closed / MQTT Last Will (False); False if no such node."""
        values: dict[str, Any] = {"online": online}
        if online:
            values["last_seen"] = now or self._clock.now()
        else:
            self.forget(node_id)
        with write_session(self._sessions) as session:
            query = update(NodeRow).where(NodeRow.id == node_id)
            if online:
                query = query.where(NodeRow.revoked_at.is_(None))
            result = cast(
                CursorResult[Any],
                session.execute(
                    query.values(**values).execution_options(synchronize_session=False)
                ),
            )
            session.commit()
        return result.rowcount == 1

    def mark_offline_stale(
        self, now: datetime | None = None, heartbeat_timeout: timedelta | None = None
    ) -> list[str]:
        """Mark nodes not heard from within the timeout offline; returns their ids.

        One UPDATE ... RETURNING: a heartbeat that lands meanwhile is never reported
        as offline. Safe to run on every replica.
        """
        now = now or self._clock.now()
        cutoff = now - (heartbeat_timeout or self._config.heartbeat_timeout)
        with write_session(self._sessions) as session:
            ids = sorted(
                session.scalars(
                    update(NodeRow)
                    .where(
                        NodeRow.online,
                        or_(NodeRow.last_seen.is_(None), NodeRow.last_seen < cutoff),
                    )
                    .values(online=False)
                    .returning(NodeRow.id),
                    execution_options={"synchronize_session": False},
                )
            )
            session.commit()
        for node_id in ids:
            self.forget(node_id)
        if ids:
            log.info("nodes went offline (no heartbeat)", extra={"node_ids": ids[:100]})
        return ids
