"""Node authentication: a client certificate, or a node id and serial, to a node in good standing.

Reads the inventory only; caching checks between messages is the node inbox's
(`control_plane.link.node_inbox`), certificate rules are the CA's.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.errors import AuthenticationError, EdgefleetError
from control_plane.identity.ca import CertificateAuthority, CertificateRejectedError, NodeIdentity
from control_plane.nodes.model import MAX_NODE_ID, Node, NodeRefusals
from control_plane.nodes.rows import check_serial, node_value, refuse_revoked
from control_plane.storage.models import FleetRow, NodeRow

__all__ = ["NodeAuthentication"]


class NodeAuthentication:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        ca: CertificateAuthority,
        clock: Clock,
        refusals: NodeRefusals,
    ) -> None:
        self._sessions = sessions
        self._ca = ca
        self._clock = clock
        self._refusals = refusals

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
            self._refusals.refused("authenticate", exc)
            raise
        return identity, self.authorize(identity.node_id, identity.serial, fleet=identity.fleet)

    def authorize(self, node_id: str, cert_serial: str | None, *, fleet: str | None = None) -> Node:
        """Raise unless `node_id` exists, is not revoked, is in `fleet` (when given) and
        `cert_serial` is its current (or not yet expired previous) certificate.

        `cert_serial` None: the transport proved the node otherwise (an MQTT broker login,
        whose topic ACL binds it to its own topics), so no certificate is compared.
        """
        now = self._clock.now()
        try:
            if not isinstance(node_id, str) or len(node_id) > MAX_NODE_ID:
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
                refuse_revoked(row)
                if fleet is not None and fleet != fleet_name:
                    raise AuthenticationError(
                        f"node {node_id!r} is not in fleet {fleet!r}",
                        reason="wrong-fleet",
                        node_id=node_id,
                    )
                if cert_serial is not None:
                    check_serial(row, cert_serial, now)
                return node_value(row, fleet_name)
        except EdgefleetError as exc:
            self._refusals.refused("authorize", exc, node_id=node_id)
            raise
