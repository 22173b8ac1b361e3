"""Enrollment and the node inventory: bootstrap tokens, node certificates, liveness, labels.

Transport-independent: the gRPC and MQTT front ends call `enroll`, `renew`,
`authenticate_peer` (a call's certificate) and `authorize` (again at most every few
seconds per node), `record_hello`, `touch`, `record_update_status` and `set_online`;
operators reach the token, label and revoke methods through REST and the CLI. Every
refusal of a node-facing call is counted by reason (`refusals`) and logged at WARNING,
never with a token value. The rules live in `control_plane.identity`.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import CursorResult, not_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Role
from control_plane.access.service import AuditedMutations, RequestContext, record_audit
from control_plane.clock import Clock
from control_plane.errors import (
    AuthenticationError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from control_plane.identity.bootstrap import (
    BootstrapTokenError,
    BootstrapTokenState,
    LabelSelector,
    check_bootstrap_token,
    hash_bootstrap_token,
    looks_like_bootstrap_token,
    new_bootstrap_token,
    new_node_id,
    validate_labels,
)
from control_plane.identity.ca import (
    CertificateAuthority,
    CertificateRejectedError,
    IssuedCert,
    NodeIdentity,
)
from control_plane.link.mqtt_acl import (
    NodeMqttAccount,
    mosquitto_password_hash,
    new_mqtt_password,
)
from control_plane.storage.models import AuditRow, BootstrapTokenRow, FleetRow, NodeRow

__all__ = [
    "TRANSPORTS",
    "BootstrapTokenInfo",
    "Enrollment",
    "Node",
    "NodeConfig",
    "NodeService",
    "RefusalCounter",
]

log = logging.getLogger(__name__)

TRANSPORTS: Final = ("grpc", "mqtt", "rest")
_MAX_AGENT_VERSION: Final = 64
_MAX_NODE_ID: Final = 64
_MAX_LISTED_TOKENS: Final = 1000
_MAX_TOUCHED: Final = 200_000


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Lifetimes and bounds of enrollment and liveness."""

    cert_ttl: timedelta = timedelta(days=7)
    min_token_ttl: timedelta = timedelta(minutes=1)
    max_token_ttl: timedelta = timedelta(days=30)
    heartbeat_timeout: timedelta = timedelta(seconds=90)
    # `touch` writes last_seen at most this often per node: heartbeats stay cheap.
    touch_resolution: timedelta = timedelta(seconds=5)
    max_reported_state_bytes: int = 64 * 1024


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    fleet: str
    labels: dict[str, str]
    agent_version: str | None
    transport: str | None
    reported_state: dict[str, Any]
    created_at: datetime
    last_seen: datetime | None
    online: bool
    cert_serial: str | None
    cert_expires_at: datetime | None
    revoked_at: datetime | None
    public_key_sha256: str

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, slots=True)
class BootstrapTokenInfo:
    id: str
    fleet: str
    labels: dict[str, str]
    created_at: datetime
    created_by: str
    expires_at: datetime
    used_at: datetime | None
    node_id: str | None
    revoked_at: datetime | None

    def state(self, now: datetime) -> str:
        """active | used | revoked | expired."""
        if self.revoked_at is not None:
            return "revoked"
        if self.used_at is not None:
            return "used"
        return "expired" if now >= self.expires_at else "active"


@dataclass(frozen=True, slots=True)
class Enrollment:
    """What a freshly enrolled node needs: its id, its certificate and the CA to trust."""

    node_id: str
    fleet: str
    labels: dict[str, str]
    certificate_pem: bytes
    ca_pem: bytes
    cert_serial: str
    not_after: datetime
    # Nodes enrolled for transport "mqtt": their broker login (username = node id). The
    # password is shown here once; the control plane keeps only its Mosquitto hash.
    mqtt_username: str | None = None
    mqtt_password: str | None = field(default=None, repr=False)


class RefusalCounter:
    """Refused node-facing calls by reason; thread-safe. Reasons are a small fixed set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1

    def __getitem__(self, reason: str) -> int:
        with self._lock:
            return self._counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class NodeService:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        ca: CertificateAuthority,
        clock: Clock,
        config: NodeConfig | None = None,
    ) -> None:
        self._sessions = sessions
        self._ca = ca
        self._clock = clock
        self._config = config or NodeConfig()
        self._mutations = AuditedMutations(sessions, clock)
        self.refusals = RefusalCounter()
        # node id -> when this process last wrote its last_seen (see `touch`).
        self._touched: dict[str, datetime] = {}

    @property
    def ca(self) -> CertificateAuthority:
        return self._ca

    @property
    def config(self) -> NodeConfig:
        return self._config

    # ------------------------------------------------------- bootstrap tokens

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
        with self._audited(
            ctx, "node-token.create", f"node-token:{token_id}", needs=Role.OPERATOR
        ) as (session, details):
            low, high = self._config.min_token_ttl, self._config.max_token_ttl
            if not low <= ttl <= high:
                raise InvalidInputError(
                    f"a bootstrap token lives between {_human(low)} and {_human(high)}",
                    ttl_s=int(ttl.total_seconds()),
                )
            checked = validate_labels(labels)
            fleet_row = _fleet_row(session, fleet)
            now = self._clock.now()
            row = BootstrapTokenRow(
                id=token_id,
                fleet_id=fleet_row.id,
                token_hash=hash_bootstrap_token(token),
                labels=checked,
                created_at=now,
                created_by=ctx.principal.name,
                expires_at=now + ttl,
            )
            session.add(row)
            session.flush()
            details.update(fleet=fleet, labels=checked, expires_at=row.expires_at.isoformat())
            info = _token_info(row, fleet)
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
                query = query.where(BootstrapTokenRow.fleet_id == _fleet_row(session, fleet).id)
            return [_token_info(row, name) for row, name in session.execute(query)]

    def revoke_bootstrap_token(self, ctx: RequestContext, token_id: str) -> BootstrapTokenInfo:
        """An unused token stops working at once; idempotent."""
        with self._audited(
            ctx, "node-token.revoke", f"node-token:{token_id}", needs=Role.OPERATOR
        ) as (session, _):
            row = session.get(BootstrapTokenRow, token_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"no bootstrap token {token_id!r}", token_id=token_id)
            if row.revoked_at is None and row.used_at is None:
                row.revoked_at = self._clock.now()
            session.flush()
            info = _token_info(row, _fleet_name(session, row.fleet_id))
        return info

    # -------------------------------------------------------------- enrollment

    def enroll(
        self,
        token: str,
        csr_pem: bytes,
        *,
        agent_version: str | None = None,
        transport: str | None = None,
        request_id: str | None = None,
    ) -> Enrollment:
        """Trade a bootstrap token and a CSR for a node id and a client certificate.

        One transaction with the token row locked (and, on SQLite, the write lock taken
        at BEGIN): of two enrollments racing with one token exactly one succeeds. A bad
        CSR is refused before the token is touched, so the node can retry with it.
        """
        try:
            if not looks_like_bootstrap_token(token):
                raise BootstrapTokenError("not a bootstrap token", reason="token-malformed")
            agent_version, transport = _checked_agent(agent_version, transport)
            self._ca.check_csr(csr_pem)
            return self._enroll(token, csr_pem, agent_version, transport, request_id)
        except EdgefleetError as exc:
            self._refused("enroll", exc)
            raise

    def _enroll(
        self,
        token: str,
        csr_pem: bytes,
        agent_version: str | None,
        transport: str | None,
        request_id: str | None,
    ) -> Enrollment:
        now = self._clock.now()
        with self._write_session() as session:
            row = session.scalar(
                select(BootstrapTokenRow)
                .where(BootstrapTokenRow.token_hash == hash_bootstrap_token(token))
                .with_for_update()
            )
            if row is None:
                raise BootstrapTokenError("unknown bootstrap token", reason="token-unknown")
            check_bootstrap_token(
                BootstrapTokenState(row.id, row.expires_at, row.used_at, row.revoked_at), now
            )
            fleet = _fleet_name(session, row.fleet_id)
            node_id = _unused_node_id(session)
            issued = self._ca.issue_node_certificate(
                csr_pem, node_id=node_id, fleet=fleet, now=now, ttl=self._config.cert_ttl
            )
            labels = {str(k): str(v) for k, v in row.labels.items()}
            mqtt_password = new_mqtt_password() if transport == "mqtt" else None
            session.add(
                NodeRow(
                    id=node_id,
                    fleet_id=row.fleet_id,
                    labels=labels,
                    public_key_sha256=issued.public_key_sha256,
                    created_at=now,
                    agent_version=agent_version,
                    transport=transport,
                    cert_serial=issued.serial,
                    cert_expires_at=issued.not_after,
                    mqtt_password_hash=(
                        mosquitto_password_hash(mqtt_password) if mqtt_password else None
                    ),
                )
            )
            session.flush()
            # The row lock already serialises users of this token; the guarded UPDATE
            # makes single use hold even where a lock is weaker than we think.
            claimed = cast(
                CursorResult[Any],
                session.execute(
                    update(BootstrapTokenRow)
                    .where(
                        BootstrapTokenRow.id == row.id,
                        BootstrapTokenRow.used_at.is_(None),
                        BootstrapTokenRow.revoked_at.is_(None),
                    )
                    .values(used_at=now, node_id=node_id)
                    .execution_options(synchronize_session=False)
                ),
            )
            if claimed.rowcount != 1:
                raise BootstrapTokenError(
                    "this bootstrap token was already used", reason="token-used", token_id=row.id
                )
            _audit_node(
                session,
                node_id,
                at=now,
                action="node.enroll",
                request_id=request_id,
                details={
                    "fleet": fleet,
                    "labels": labels,
                    "token_id": row.id,
                    "cert_serial": issued.serial,
                    "transport": transport,
                },
            )
            session.commit()
        log.info("node enrolled", extra={"node_id": node_id, "fleet": fleet})
        return Enrollment(
            node_id=node_id,
            fleet=fleet,
            labels=labels,
            certificate_pem=issued.pem,
            ca_pem=self._ca.ca_pem,
            cert_serial=issued.serial,
            not_after=issued.not_after,
            mqtt_username=node_id if mqtt_password else None,
            mqtt_password=mqtt_password,
        )

    def renew(
        self,
        node_id: str,
        csr_pem: bytes,
        *,
        presented_serial: str | None = None,
        request_id: str | None = None,
    ) -> IssuedCert:
        """A new certificate for an enrolled node (called over its authenticated link).

        The key may change. The previous certificate keeps working until it expires,
        so connections opened with it are not cut by the renewal.

        `presented_serial` is the certificate the call was authenticated with. When it
        is the node's *previous* one, the current certificate never reached the node
        (it crashed before storing it); the previous one then stays previous, so the
        certificate the node holds keeps working and a crash during renewal cannot
        lock it out.
        """
        try:
            self._ca.check_csr(csr_pem)
            now = self._clock.now()
            with self._write_session() as session:
                row = _node_for_node(session, node_id, lock=True)
                issued = self._ca.issue_node_certificate(
                    csr_pem,
                    node_id=row.id,
                    fleet=_fleet_name(session, row.fleet_id),
                    now=now,
                    ttl=self._config.cert_ttl,
                )
                if presented_serial is None or presented_serial != row.previous_cert_serial:
                    row.previous_cert_serial = row.cert_serial
                    row.previous_cert_expires_at = row.cert_expires_at
                row.cert_serial = issued.serial
                row.cert_expires_at = issued.not_after
                row.public_key_sha256 = issued.public_key_sha256
                _audit_node(
                    session,
                    row.id,
                    at=now,
                    action="node.renew",
                    request_id=request_id,
                    details={"cert_serial": issued.serial, "previous": row.previous_cert_serial},
                )
                session.commit()
            return issued
        except EdgefleetError as exc:
            self._refused("renew", exc, node_id=node_id)
            raise

    def revoke(self, ctx: RequestContext, node_id: str) -> Node:
        """The node is refused from its next message on; idempotent."""
        with self._audited(ctx, "node.revoke", f"node:{node_id}", needs=Role.OPERATOR) as (
            session,
            _,
        ):
            row = _node_row(session, node_id, lock=True)
            if row.revoked_at is None:
                row.revoked_at = self._clock.now()
            row.online = False
            self._touched.pop(node_id, None)
            session.flush()
            node = _node(row, _fleet_name(session, row.fleet_id))
        return node

    # ---------------------------------------------------------- authentication

    def authenticate_peer(self, certificate: bytes) -> tuple[NodeIdentity, Node]:
        """What a TLS client certificate (PEM or DER) says and the node it proves.

        For the gRPC interceptor: pass the peer certificate from the auth context. The
        certificate is verified against the CA once here; a long stream re-checks with
        `authorize(identity.node_id, identity.serial, fleet=identity.fleet)`, which sees
        revocation, a replaced serial and expiry in the inventory.
        """
        try:
            identity = self._ca.node_identity_from_certificate(certificate, now=self._clock.now())
        except CertificateRejectedError as exc:
            self._refused("authenticate", exc)
            raise
        return identity, self.authorize(identity.node_id, identity.serial, fleet=identity.fleet)

    def authorize(self, node_id: str, cert_serial: str, *, fleet: str | None = None) -> Node:
        """Raise unless `node_id` exists, is not revoked and `cert_serial` is its current
        (or not yet expired previous) certificate. Called by the transports per message.
        """
        now = self._clock.now()
        try:
            if not isinstance(node_id, str) or len(node_id) > _MAX_NODE_ID:
                raise AuthenticationError("unknown node", reason="node-unknown")
            with self._sessions() as session:
                found = session.execute(
                    select(NodeRow, FleetRow.name)
                    .join(FleetRow, FleetRow.id == NodeRow.fleet_id)
                    .where(NodeRow.id == node_id)
                ).first()
                if found is None:
                    raise AuthenticationError(f"unknown node {node_id!r}", reason="node-unknown")
                row, fleet_name = found
                _refuse_revoked(row)
                if fleet is not None and fleet != fleet_name:
                    raise AuthenticationError(
                        f"the certificate names fleet {fleet!r}, node {node_id!r} is in another",
                        reason="cert-wrong-fleet",
                        node_id=node_id,
                    )
                _check_serial(row, cert_serial, now)
                return _node(row, fleet_name)
        except EdgefleetError as exc:
            self._refused("authorize", exc, node_id=node_id)
            raise

    # ----------------------------------------------------------------- liveness

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
            agent_version, transport = _checked_agent(agent_version, transport)
            state = self._checked_state(reported_state)
            with self._write_session() as session:
                row = _node_for_node(session, node_id, lock=True)
                row.agent_version = agent_version
                row.transport = transport
                row.reported_state = state
                row.last_seen = now
                row.online = True
                session.flush()
                node = _node(row, _fleet_name(session, row.fleet_id))
                session.commit()
            return node
        except EdgefleetError as exc:
            self._refused("hello", exc, node_id=node_id)
            raise

    def record_update_status(
        self, node_id: str, status: Mapping[str, Any], now: datetime | None = None
    ) -> Node:
        """The node reported progress of an update; kept as `reported_state["update"]`.

        Only the latest status is kept: the history of an update belongs to the rollout
        that asked for it, not to the inventory. The next Hello replaces the whole
        reported state, this key included: a node reports what it runs when it connects.
        """
        now = now or self._clock.now()
        try:
            with self._write_session() as session:
                row = _node_for_node(session, node_id, lock=True)
                state = self._checked_state({**(row.reported_state or {}), "update": dict(status)})
                row.reported_state = state
                row.last_seen = now
                row.online = True
                session.flush()
                node = _node(row, _fleet_name(session, row.fleet_id))
                session.commit()
            return node
        except EdgefleetError as exc:
            self._refused("update-status", exc, node_id=node_id)
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
        with self._write_session() as session:
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

    def set_online(self, node_id: str, online: bool, now: datetime | None = None) -> bool:
        """Connection opened (True) or closed / MQTT Last Will (False); False if no such node."""
        values: dict[str, Any] = {"online": online}
        if online:
            values["last_seen"] = now or self._clock.now()
        else:
            self._touched.pop(node_id, None)
        with self._write_session() as session:
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
        with self._write_session() as session:
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
            self._touched.pop(node_id, None)
        if ids:
            log.info("nodes went offline (no heartbeat)", extra={"node_ids": ids[:100]})
        return ids

    # -------------------------------------------------------------------- mqtt

    def mqtt_accounts(self, ctx: RequestContext) -> list[NodeMqttAccount]:
        """Every unrevoked node's MQTT login (hashes only), for the broker's password file.

        Admin only and audited: whoever holds these hashes can configure a broker that
        admits the nodes. Revoked nodes are left out, so a regenerated file locks them out.
        """
        with self._audited(ctx, "mqtt.credentials.export", "mqtt", needs=Role.ADMIN) as (
            session,
            details,
        ):
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

    # ------------------------------------------------------------------ labels

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
        with self._audited(ctx, "node.labels", f"node:{node_id}", needs=Role.OPERATOR) as (
            session,
            details,
        ):
            row = _node_row(session, node_id, lock=True)
            before = {str(k): str(v) for k, v in row.labels.items()}
            merged = changes if replace else {**before, **changes}
            after = validate_labels({k: v for k, v in merged.items() if v is not None})
            row.labels = after
            session.flush()
            details.update(before=before, after=after)
            node = _node(row, _fleet_name(session, row.fleet_id))
        return node

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
                query = query.where(NodeRow.fleet_id == _fleet_row(session, fleet).id)
            nodes = [_node(row, name) for row, name in session.execute(query)]
        # Label matching happens here, not in SQL: JSON operators differ per backend and
        # a fleet's node list is small enough to filter in memory.
        if selector is not None:
            nodes = [n for n in nodes if selector.matches(n.labels)]
        return nodes

    def get_node(self, node_id: str) -> Node:
        with self._sessions() as session:
            row = _node_row(session, node_id)
            return _node(row, _fleet_name(session, row.fleet_id))

    # ----------------------------------------------------------------- helpers

    @contextmanager
    def _write_session(self) -> Iterator[Session]:
        """A session that takes SQLite's write lock at BEGIN (read-then-write safely)."""
        with self._sessions() as session:
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            yield session

    @contextmanager
    def _audited(
        self, ctx: RequestContext, action: str, target: str, *, needs: Role
    ) -> Iterator[tuple[Session, dict[str, Any]]]:
        """Like `AuditedMutations.mutation`, and the body may fill in the audit details."""
        session = self._sessions()
        details: dict[str, Any] = {}
        try:
            ctx.principal.require(needs, action)
            session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})
            yield session, details
            record_audit(
                session, ctx, at=self._clock.now(), action=action, target=target, details=details
            )
            session.commit()
        except EdgefleetError as exc:
            session.rollback()
            self._mutations.record_refusal(ctx, action, target, exc)
            raise
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _checked_state(self, reported_state: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(reported_state, Mapping):
            raise InvalidInputError("reported state must be an object", reason="bad-state")
        try:
            encoded = json.dumps(dict(reported_state), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                "reported state must be plain JSON", reason="bad-state"
            ) from exc
        limit = self._config.max_reported_state_bytes
        if len(encoded) > limit:
            raise InvalidInputError(
                f"reported state is over {limit} bytes", reason="state-too-large", limit=limit
            )
        state: dict[str, Any] = json.loads(encoded)
        return state

    def _refused(self, action: str, exc: EdgefleetError, *, node_id: str | None = None) -> None:
        reason = str(exc.fields.get("reason") or _fallback_reason(exc))
        self.refusals.add(reason)
        log.warning(
            "refused node %s: %s (%s)",
            action,
            reason,
            exc.message,
            extra={"action": action, "reason": reason, "node_id": node_id},
        )


# ---------------------------------------------------------------------- helpers


def _fallback_reason(exc: EdgefleetError) -> str:
    if isinstance(exc, InvalidInputError):
        return "invalid-input"
    if isinstance(exc, PermissionDeniedError):
        return "permission-denied"
    if isinstance(exc, AuthenticationError):
        return "unauthenticated"
    return "error"


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _checked_agent(
    agent_version: str | None, transport: str | None
) -> tuple[str | None, str | None]:
    """Checked agent version and transport; "" (protobuf's unset string) becomes None."""
    agent_version, transport = agent_version or None, transport or None
    if agent_version is not None and (
        not isinstance(agent_version, str)
        or not 0 < len(agent_version) <= _MAX_AGENT_VERSION
        or not agent_version.isprintable()
    ):
        raise InvalidInputError(
            f"agent version must be 1-{_MAX_AGENT_VERSION} printable characters",
            reason="bad-hello",
        )
    if transport is not None and transport not in TRANSPORTS:
        raise InvalidInputError(
            f"transport must be one of {', '.join(TRANSPORTS)}",
            reason="bad-hello",
            transport=str(transport)[:32],
        )
    return agent_version, transport


def _check_serial(row: NodeRow, cert_serial: str, now: datetime) -> None:
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


def _refuse_revoked(row: NodeRow) -> None:
    if row.revoked_at is not None:
        raise PermissionDeniedError(
            f"node {row.id!r} was revoked at {row.revoked_at.isoformat()}",
            reason="node-revoked",
            node_id=row.id,
        )


def _node_for_node(session: Session, node_id: str, *, lock: bool = False) -> NodeRow:
    """The node row for a node-facing call: unknown and revoked nodes are refused."""
    row = (
        session.get(NodeRow, node_id, with_for_update=lock)
        if isinstance(node_id, str) and len(node_id) <= _MAX_NODE_ID
        else None
    )
    if row is None:
        raise AuthenticationError(f"unknown node {node_id!r}", reason="node-unknown")
    _refuse_revoked(row)
    return row


def _node_row(session: Session, node_id: str, *, lock: bool = False) -> NodeRow:
    """The node row for an operator: an unknown node is simply not found."""
    row = session.get(NodeRow, node_id, with_for_update=lock) if len(node_id) <= 64 else None
    if row is None:
        raise NotFoundError(f"no node {node_id!r}", node_id=node_id)
    return row


def _unused_node_id(session: Session) -> str:
    # 48 random bits: a clash is unlikely but not impossible in a large fleet.
    for _ in range(5):
        node_id = new_node_id()
        if session.get(NodeRow, node_id) is None:
            return node_id
    raise RuntimeError("could not find an unused node id")  # pragma: no cover


def _fleet_row(session: Session, name: str) -> FleetRow:
    row = session.scalar(select(FleetRow).where(FleetRow.name == name))
    if row is None:
        raise NotFoundError(f"no fleet named {name!r}", fleet=name)
    return row


def _fleet_name(session: Session, fleet_id: int) -> str:
    name = session.scalar(select(FleetRow.name).where(FleetRow.id == fleet_id))
    if name is None:  # pragma: no cover - the foreign key forbids it
        raise NotFoundError(f"no fleet with id {fleet_id}")
    return name


def _audit_node(
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


def _node(row: NodeRow, fleet: str) -> Node:
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


def _token_info(row: BootstrapTokenRow, fleet: str) -> BootstrapTokenInfo:
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
