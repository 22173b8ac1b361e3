"""Enrollment: a bootstrap token and a CSR become a node and its client certificate; renewal.

Transport-independent; the enrollment *answer* a node gets (with the director key and
the fleet's TUF root) is built once in `control_plane.link.node_inbox`.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import EdgefleetError
from control_plane.identity.bootstrap import (
    BootstrapTokenError,
    BootstrapTokenState,
    check_bootstrap_token,
    hash_bootstrap_token,
    looks_like_bootstrap_token,
)
from control_plane.identity.ca import CertificateAuthority, IssuedCert
from control_plane.link.broker_accounts import BrokerAccounts, FileExportAccounts
from control_plane.link.mqtt_acl import mosquitto_password_hash, new_mqtt_password
from control_plane.nodes.model import Enrollment, NodeConfig, NodeRefusals, checked_agent
from control_plane.nodes.rows import (
    audit_node,
    fleet_name,
    node_for_node,
    unused_node_id,
    write_session,
)
from control_plane.storage.models import BootstrapTokenRow, NodeRow

__all__ = ["Enrollments"]

log = logging.getLogger(__name__)


class Enrollments:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        ca: CertificateAuthority,
        clock: Clock,
        refusals: NodeRefusals,
        config: NodeConfig | None = None,
        accounts: BrokerAccounts | None = None,
    ) -> None:
        self._sessions = sessions
        self._ca = ca
        self._clock = clock
        self._refusals = refusals
        self._config = config or NodeConfig()
        self._accounts: BrokerAccounts = accounts or FileExportAccounts()

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
            agent_version, transport = checked_agent(agent_version, transport)
            self._ca.check_csr(csr_pem)
            if transport == "mqtt" and self._accounts.manages_logins:
                return self._enroll_with_login(token, csr_pem, agent_version, request_id)
            return self._enroll(token, csr_pem, agent_version, transport, request_id)
        except EdgefleetError as exc:
            self._refusals.refused("enroll", exc)
            raise

    def _enroll_with_login(
        self, token: str, csr_pem: bytes, agent_version: str | None, request_id: str | None
    ) -> Enrollment:
        """An MQTT enrollment whose broker login the control plane creates (ADR 0043).

        The login is made before the transaction, so no database lock is held across a
        call to the broker, and only for a token that checks out: an unreachable broker
        fails the enrollment with the token still unused (the node tries again). Should
        the transaction then fail, the login is removed again (and, failing that, by the
        reconcile once it is older than its grace).
        """
        now = self._clock.now()
        with self._sessions() as session:
            row = session.scalar(
                select(BootstrapTokenRow).where(
                    BootstrapTokenRow.token_hash == hash_bootstrap_token(token)
                )
            )
            if row is None:
                raise BootstrapTokenError("unknown bootstrap token", reason="token-unknown")
            check_bootstrap_token(
                BootstrapTokenState(row.id, row.expires_at, row.used_at, row.revoked_at), now
            )
            fleet = fleet_name(session, row.fleet_id)
            node_id = unused_node_id(session)
        password = new_mqtt_password()
        self._accounts.add_node(node_id, fleet, password, now=now)
        try:
            return self._enroll(
                token, csr_pem, agent_version, "mqtt", request_id, login=(node_id, password)
            )
        except BaseException:
            try:
                self._accounts.remove_node(node_id)
            except Exception:
                log.warning(
                    "could not remove the broker login of a failed enrollment; the reconcile will",
                    extra={"node_id": node_id},
                )
            raise

    def _enroll(
        self,
        token: str,
        csr_pem: bytes,
        agent_version: str | None,
        transport: str | None,
        request_id: str | None,
        *,
        login: tuple[str, str] | None = None,
    ) -> Enrollment:
        """`login`: the node id and MQTT password a broker login was already made for."""
        now = self._clock.now()
        with write_session(self._sessions) as session:
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
            fleet = fleet_name(session, row.fleet_id)
            if login is not None and session.get(NodeRow, login[0]) is not None:
                raise RuntimeError("the node id chosen for the broker login was taken")
            node_id = login[0] if login is not None else unused_node_id(session)
            issued = self._ca.issue_node_certificate(
                csr_pem, node_id=node_id, fleet=fleet, now=now, ttl=self._config.cert_ttl
            )
            labels = {str(k): str(v) for k, v in row.labels.items()}
            if login is not None:
                mqtt_password: str | None = login[1]
            else:
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
            audit_node(
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
            with write_session(self._sessions) as session:
                row = node_for_node(session, node_id, lock=True)
                issued = self._ca.issue_node_certificate(
                    csr_pem,
                    node_id=row.id,
                    fleet=fleet_name(session, row.fleet_id),
                    now=now,
                    ttl=self._config.cert_ttl,
                )
                if presented_serial is None or presented_serial != row.previous_cert_serial:
                    row.previous_cert_serial = row.cert_serial
                    row.previous_cert_expires_at = row.cert_expires_at
                row.cert_serial = issued.serial
                row.cert_expires_at = issued.not_after
                row.public_key_sha256 = issued.public_key_sha256
                audit_node(
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
            self._refusals.refused("renew", exc, node_id=node_id)
            raise
