"""Row helpers the node role services share: lookups, node-side audit rows, row → value.

SQLAlchemy only; the rules on the values are in `model`, the use cases in the role
services (`tokens`, `enrollment`, `authentication`, `presence`, `inventory`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.errors import (
    AuthenticationError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from control_plane.identity.bootstrap import new_node_id
from control_plane.nodes.model import MAX_NODE_ID, BootstrapTokenInfo, Node
from control_plane.storage.models import AuditRow, BootstrapTokenRow, FleetRow, NodeRow


@contextmanager
def write_session(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session that takes SQLite's write lock at BEGIN (read-then-write safely)."""
    with sessions() as session:
        session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
        yield session


def checked_state(reported_state: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """A node's reported state as plain JSON of at most `limit` bytes."""
    if not isinstance(reported_state, Mapping):
        raise InvalidInputError("reported state must be an object", reason="bad-state")
    try:
        encoded = json.dumps(dict(reported_state), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError("reported state must be plain JSON", reason="bad-state") from exc
    if len(encoded) > limit:
        raise InvalidInputError(
            f"reported state is over {limit} bytes", reason="state-too-large", limit=limit
        )
    state: dict[str, Any] = json.loads(encoded)
    return state


def check_serial(row: NodeRow, cert_serial: str, now: datetime) -> None:
    for serial, expires in (
        (row.cert_serial, row.cert_expires_at),
        (row.previous_cert_serial, row.previous_cert_expires_at),
    ):
        if serial is not None and cert_serial == serial:
            if expires is not None and now > expires:
                raise AuthenticationError(
                    f"certificate {serial} of node {row.id!r} has expired; renew or re-enroll",
                    reason="cert-expired",
                    node_id=row.id,
                )
            return
    raise AuthenticationError(
        f"certificate {str(cert_serial)[:40]} is not a current certificate of node {row.id!r}",
        reason="cert-not-current",
        node_id=row.id,
    )


def refuse_revoked(row: NodeRow) -> None:
    if row.revoked_at is not None:
        raise PermissionDeniedError(
            f"node {row.id!r} was revoked at {row.revoked_at.isoformat()}",
            reason="node-revoked",
            node_id=row.id,
        )


def node_for_node(session: Session, node_id: str, *, lock: bool = False) -> NodeRow:
    """The node row for a node-facing call: unknown and revoked nodes are refused."""
    row = (
        session.get(NodeRow, node_id, with_for_update=lock)
        if isinstance(node_id, str) and len(node_id) <= MAX_NODE_ID
        else None
    )
    if row is None:
        raise AuthenticationError(f"unknown node {node_id!r}", reason="node-unknown")
    refuse_revoked(row)
    return row


def node_row(session: Session, node_id: str, *, lock: bool = False) -> NodeRow:
    """The node row for an operator: an unknown node is simply not found."""
    row = (
        session.get(NodeRow, node_id, with_for_update=lock) if len(node_id) <= MAX_NODE_ID else None
    )
    if row is None:
        raise NotFoundError(f"no node {node_id!r}", node_id=node_id)
    return row


def unused_node_id(session: Session) -> str:
    # 48 random bits: a clash is unlikely but not impossible in a large fleet.
    for _ in range(5):
        node_id = new_node_id()
        if session.get(NodeRow, node_id) is None:
            return node_id
    raise RuntimeError("could not find an unused node id")  # pragma: no cover


def fleet_row(session: Session, name: str) -> FleetRow:
    row = session.scalar(select(FleetRow).where(FleetRow.name == name))
    if row is None:
        raise NotFoundError(f"no fleet named {name!r}", fleet=name)
    return row


def fleet_name(session: Session, fleet_id: int) -> str:
    name = session.scalar(select(FleetRow.name).where(FleetRow.id == fleet_id))
    if name is None:  # pragma: no cover - the foreign key forbids it
        raise NotFoundError(f"no fleet with id {fleet_id}")
    return name


def audit_node(
    session: Session,
    node_id: str,
    *,
    at: datetime,
    action: str,
    request_id: str | None,
    details: dict[str, Any],
) -> None:
    """An audit row whose actor is the node itself (role "node"), not an API token."""
    session.add(
        AuditRow(
            at=at,
            actor=f"node:{node_id}",
            role="node",
            action=action,
            target=f"node:{node_id}",
            request_id=(request_id or uuid.uuid4().hex)[:64],
            outcome="ok",
            details=details,
        )
    )


def node_value(row: NodeRow, fleet: str) -> Node:
    return Node(
        id=row.id,
        fleet=fleet,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        agent_version=row.agent_version,
        transport=row.transport,
        reported_state=dict(row.reported_state or {}),
        created_at=row.created_at,
        last_seen=row.last_seen,
        online=row.online,
        cert_serial=row.cert_serial,
        cert_expires_at=row.cert_expires_at,
        revoked_at=row.revoked_at,
        public_key_sha256=row.public_key_sha256,
    )


def token_value(row: BootstrapTokenRow, fleet: str) -> BootstrapTokenInfo:
    return BootstrapTokenInfo(
        id=row.id,
        fleet=fleet,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        used_at=row.used_at,
        node_id=row.node_id,
        revoked_at=row.revoked_at,
    )
