"""The node inbox: what every transport's node messages mean, handled once.

gRPC, MQTT and REST adapters frame, ack and PUBACK; this object authorizes (one cache,
one set of refusal reasons), applies the one protocol-version rule, and handles Hello,
heartbeat, update status, record batches, Last Will and the enrollment answer by
calling the node services, the record ingest and the director. One instance per
transport: it stamps Hellos with the transport and counts that transport's refusals
(`edgefleet_link_refusals_total{transport,reason}`). Blocking: adapters on an event
loop call it from worker threads, except `cached` and `store_records`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from control_plane.clock import Clock
from control_plane.director.service import DirectorService
from control_plane.errors import (
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
    reason_of,
)
from control_plane.identity.ca import IssuedCert, NodeIdentity
from control_plane.link import wire
from control_plane.link.ingest import LoopGroupCommit, RecordIngest, ValidatedBatch
from control_plane.link.records import IncomingRecord
from control_plane.nodes.authentication import NodeAuthentication
from control_plane.nodes.enrollment import Enrollments
from control_plane.nodes.model import Enrollment, Node, RefusalCounter
from control_plane.nodes.presence import NodePresence
from control_plane.registry.service import RegistryService
from protos.edgefleet.fleet.v1 import director_pb2, link_pb2

__all__ = [
    "AUTH_CACHE_MAX",
    "MIN_PROTOCOL_VERSION",
    "Answer",
    "EnrollmentAnswer",
    "NodeClaim",
    "NodeInbox",
]

log = logging.getLogger(__name__)

# Bound of the authorization cache; when full it starts over (one lookup per node).
AUTH_CACHE_MAX: Final = 100_000
# The oldest `NodeMessage.protocol_version` this server reads (0 is protobuf's unset).
# Raised only when a version's messages can no longer be read, never merely because a
# newer one exists: mixed-version fleets are normal.
MIN_PROTOCOL_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class NodeClaim:
    """Who a message says it is from, as its transport proved it.

    gRPC: the client certificate's node id, fleet and serial. MQTT: the topic's fleet
    and node id, with no serial (the broker login and its ACL bound the publisher to
    those topics).
    """

    node_id: str
    fleet: str | None = None
    cert_serial: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What a transport sends back for one node message, framed its own way."""

    # The node's current assignment (the answer to a Hello), when it has one.
    desired: director_pb2.SignedDirectorAssignment | None = None


_NOTHING: Final = Answer()


@dataclass(frozen=True, slots=True)
class EnrollmentAnswer:
    """What every enrollment front end returns: the node's certificate and its trust anchors."""

    enrollment: Enrollment
    # The director's public key (TUF key dict plus keyid): the only key the node trusts
    # for its assignments.
    director_public_key: dict[str, Any]
    # The fleet's 1.root.json as stored; None while the fleet has no trust root (the
    # node fetches it later).
    tuf_root: bytes | None


class NodeInbox:
    """Node messages in, decisions and stored state out, for one transport."""

    def __init__(
        self,
        transport: str,
        *,
        authentication: NodeAuthentication,
        enrollment: Enrollments,
        presence: NodePresence,
        records: RecordIngest,
        director: DirectorService,
        registry: RegistryService,
        clock: Clock,
        auth_cache_s: float = 5.0,
    ) -> None:
        self.transport = transport
        self._authentication = authentication
        self._enrollment = enrollment
        self._presence = presence
        self._records = records
        self._director = director
        self._registry = registry
        self._clock = clock
        self._auth_ttl = timedelta(seconds=auth_cache_s)
        self.refusals = RefusalCounter()
        self._lock = threading.Lock()
        # claim -> (the node, when it was checked); see `authorize`.
        self._known: dict[NodeClaim, tuple[Node, datetime]] = {}
        # Records of every gRPC stream share group commits (one transaction per group).
        self._group_commit = LoopGroupCommit(records)

    # -------------------------------------------------------------- refusals

    def refuse(
        self,
        reason: str,
        detail: str,
        *,
        node_id: str | None = None,
        where: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Count and log one refused message or call of this transport."""
        self.refusals.add(reason)
        log.warning(
            "refused %s %s of %s: %s (%s)",
            self.transport,
            where or "message",
            node_id or "an unidentified node",
            reason,
            detail,
            extra={
                "transport": self.transport,
                "reason": reason,
                "node_id": node_id,
                "where": where,
                # `extra` keys must not clash with LogRecord attributes.
                **{f"error_{k}": v for k, v in (fields or {}).items()},
            },
        )

    def refuse_error(
        self, exc: EdgefleetError, *, node_id: str | None = None, where: str | None = None
    ) -> str:
        """`refuse` under the error's reason (`errors.reason_of`); returns the reason."""
        reason = reason_of(exc)
        self.refuse(reason, exc.message, node_id=node_id, where=where, fields=exc.fields)
        return reason

    # ------------------------------------------------------------ enrollment

    def enroll(
        self,
        token: str,
        csr_pem: bytes,
        *,
        agent_version: str | None = None,
        transport: str | None = None,
        request_id: str | None = None,
    ) -> EnrollmentAnswer:
        """Enroll and build the answer every front end renders (`EnrollmentAnswer`)."""
        enrollment = self._enrollment.enroll(
            token,
            csr_pem,
            agent_version=agent_version,
            transport=transport,
            request_id=request_id,
        )
        return EnrollmentAnswer(
            enrollment=enrollment,
            director_public_key=self._director.director_public_key(),
            tuf_root=self._first_root(enrollment.fleet),
        )

    def _first_root(self, fleet: str) -> bytes | None:
        try:
            return self._registry.metadata_file(fleet, "1.root.json")
        except (PolicyError, NotFoundError):
            return None  # the fleet has no trust root yet; the node fetches it later

    def renew(self, node_id: str, csr_pem: bytes, *, presented_serial: str | None) -> IssuedCert:
        return self._enrollment.renew(node_id, csr_pem, presented_serial=presented_serial)

    # --------------------------------------------------------- authorization

    def authenticate_peer(self, certificate: bytes) -> tuple[NodeIdentity, Node]:
        """The node a TLS client certificate proves (verified against the CA); cached."""
        identity, node = self._authentication.authenticate_peer(certificate)
        self._remember(NodeClaim(identity.node_id, identity.fleet, identity.serial), node)
        return identity, node

    def cached(self, claim: NodeClaim) -> Node | None:
        """The node of a claim checked within `auth_cache_s`, or None; no database call."""
        found = self._known.get(claim)
        if found is None:
            return None
        node, checked = found
        # A clock that went back counts as expired, never as fresh for longer.
        return node if timedelta(0) <= self._clock.now() - checked < self._auth_ttl else None

    def authorize(self, claim: NodeClaim) -> Node:
        """The node of `claim` if it is known, unrevoked, in the claimed fleet and holds
        the claimed certificate; looked up at most every `auth_cache_s` per claim, so a
        revocation stops a node's messages within that time.
        """
        node = self.cached(claim)
        if node is not None:
            return node
        try:
            node = self._authentication.authorize(
                claim.node_id, claim.cert_serial, fleet=claim.fleet
            )
        except EdgefleetError:
            with self._lock:
                self._known.pop(claim, None)
            raise
        self._remember(claim, node)
        return node

    def _remember(self, claim: NodeClaim, node: Node) -> None:
        with self._lock:
            if len(self._known) >= AUTH_CACHE_MAX:
                self._known.clear()
            self._known[claim] = (node, self._clock.now())

    # -------------------------------------------------------------- messages

    def check_protocol(self, version: int) -> None:
        """The one version rule: refuse only versions this server cannot read.

        Older supported versions are read as they are; newer ones only add fields and
        bodies, which protobuf readers ignore, so they are read as the current one.
        """
        if version < MIN_PROTOCOL_VERSION:
            raise InvalidInputError(
                f"protocol version {version} is not supported (this server reads "
                f"{MIN_PROTOCOL_VERSION} and later, and speaks {wire.PROTOCOL_VERSION})",
                reason="protocol-version",
                protocol_version=version,
            )

    def handle(self, node_id: str, message: link_pb2.NodeMessage) -> Answer:
        """What one message from an authorized node means, whatever carried it: the one
        dispatch by kind (a new kind is added here, never in an adapter). Blocking.

        Not for record batches: their group commit is the transport's to wait for
        (`store_records` on an event loop, `submit_records` from a thread), and their ack
        its to send. A malformed update status is refused (counted, logged) and answered
        with nothing; the link stays up. A body from a newer protocol version is ignored,
        as unknown fields are, and counted (`unknown-message`).
        """
        kind = message.WhichOneof("body")
        if kind == "hello":
            self.hello(node_id, message)
            return Answer(desired=self.desired(node_id))
        if kind == "heartbeat":
            self.heartbeat(node_id)
        elif kind == "update_status":
            try:
                self.update_status(node_id, message.update_status)
            except InvalidInputError as exc:
                self.refuse_error(exc, node_id=node_id, where="update_status")
        elif kind == "records":
            raise ValueError("record batches go through store_records / submit_records")
        else:
            self.refusals.add("unknown-message")
            log.debug(
                "node %s sent a message this server does not know",
                node_id,
                extra={"node_id": node_id, "transport": self.transport},
            )
        return _NOTHING

    def hello(self, node_id: str, message: link_pb2.NodeMessage) -> Node:
        """A node (re)connected: record who it is and what it runs."""
        self.check_protocol(message.protocol_version)
        return self._presence.record_hello(
            node_id, message.hello.agent_version, self.transport, wire.hello_state(message)
        )

    def desired(self, node_id: str) -> director_pb2.SignedDirectorAssignment | None:
        """The node's current assignment, answered to every Hello whatever sequence it
        reports (a few hundred bytes; the node drops one it holds already)."""
        return self._director.current(node_id)

    def heartbeat(self, node_id: str) -> None:
        self._presence.touch(node_id)

    def update_status(self, node_id: str, status: link_pb2.UpdateStatus) -> None:
        """Keep the node's latest update status; malformed: reason ``bad-update-status``."""
        try:
            self._presence.record_update_status(node_id, wire.update_status(status))
        except InvalidInputError as exc:
            raise _as_reason(exc, "bad-update-status") from exc

    def offline(self, node_id: str) -> None:
        """The node's link ended (the last gRPC stream closed, an MQTT Last Will)."""
        self._presence.set_online(node_id, False)

    def decode_records(self, batch: link_pb2.RecordBatch) -> list[IncomingRecord]:
        """The batch's records; malformed: reason ``bad-batch`` (refused whole, not acked,
        so the node keeps it and the problem stays visible in its backlog)."""
        try:
            return wire.incoming_records(batch)
        except InvalidInputError as exc:
            raise _as_reason(exc, "bad-batch") from exc

    def submit_records(self, node_id: str, records: Sequence[IncomingRecord]) -> Future[list[str]]:
        """Hand a batch to the group commit; the future holds the ids once committed."""
        batch = self._validated(node_id, records)
        try:
            return self._records.submit_validated(batch)
        except InvalidInputError as exc:
            raise _as_reason(exc, "bad-batch") from exc

    async def store_records(self, node_id: str, records: Sequence[IncomingRecord]) -> list[str]:
        """`submit_records` for callers on one event loop: the ids once committed."""
        batch = self._validated(node_id, records)
        try:
            return await self._group_commit.store_validated(batch)
        except InvalidInputError as exc:
            raise _as_reason(exc, "bad-batch") from exc

    def _validated(self, node_id: str, records: Sequence[IncomingRecord]) -> ValidatedBatch:
        """The batch checked (malformed: ``bad-batch``, refused whole). A results document
        that cannot be read is refused alone, as ``bad-results`` (counted, logged with
        what is wrong), and acked with the batch: a sample is not worth a resend loop."""
        try:
            batch = self._records.validated(node_id, records)
        except InvalidInputError as exc:
            raise _as_reason(exc, "bad-batch") from exc
        for bad in batch.unreadable:
            self.refuse(
                "bad-results",
                bad.message,
                node_id=node_id,
                where="results",
                fields={"record_id": bad.record_id, "index": bad.index},
            )
        # An event the event store cannot read stays in node_records as sent; counted
        # and logged here so the node's operator sees it (the record is acked).
        for bad_event in batch.bad_events:
            self.refuse(
                "bad-event",
                bad_event.message,
                node_id=node_id,
                where="event",
                fields={"record_id": bad_event.record_id, "index": bad_event.index},
            )
        return batch


def _as_reason(exc: InvalidInputError, reason: str) -> InvalidInputError:
    fields = {k: v for k, v in exc.fields.items() if k != "reason"}
    return InvalidInputError(exc.message, reason=reason, **fields)
