"""The gRPC front end of the node link: mTLS, node identity from the certificate, Sync.

One `grpc.aio` server with two ports:

- the **node port** requires a client certificate issued by the fleet CA
  (`require_client_auth=True`); every call is bound to the node the certificate names;
- the **enrollment port** (optional) authenticates only the server. It serves `Enroll`,
  whose credential is the bootstrap token, and refuses everything else.

`NodeLinkGuard` (a server interceptor) does what must never be forgotten per method:
resolve the caller's certificate to a node (`NodeInbox.authenticate_peer`),
parse the request bytes itself so malformed protobuf is INVALID_ARGUMENT, and turn
domain errors into status codes (`grpc_status.status_for`), counted and logged with
their reason. Servicer methods read the caller with `current_node()`; no message
carries a node id, so there is nothing to forge.

Not here: what a message means (`node_inbox`, shared with MQTT and REST), how errors
map (grpc_status), the node's side (edge_node.link.grpc_link). This module frames:
streams, acks on the stream, status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from control_plane.artifacts.base import ArtifactStore
from control_plane.clock import Clock
from control_plane.director.delivery import FanOutDelivery
from control_plane.errors import (
    AuthenticationError,
    EdgefleetError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
    RangeNotSatisfiableError,
    UnavailableError,
    reason_of,
)
from control_plane.identity.ca import CertificateAuthority, NodeIdentity
from control_plane.link import wire
from control_plane.link.desired import HubDelivery
from control_plane.link.grpc_status import REASON_TRAILER, status_for
from control_plane.link.hub import DownlinkSession, LinkHub
from control_plane.link.node_inbox import NodeClaim, NodeInbox
from control_plane.nodes.model import Node
from control_plane.registry.service import RegistryService
from protos.edgefleet.fleet.v1 import link_pb2, link_pb2_grpc

__all__ = [
    "NODE_ID_HEADER",
    "PROTOCOL_HEADER",
    "SERVICE_NAME",
    "AuthenticatedNode",
    "GrpcLinkConfig",
    "GrpcLinkServer",
    "LinkStats",
    "NodeLinkGuard",
    "NodeLinkService",
    "current_node",
]

log = logging.getLogger(__name__)

SERVICE_NAME: Final = link_pb2.DESCRIPTOR.services_by_name["NodeLink"].full_name
# Sent as initial metadata on Sync once the Hello is accepted: the node knows it is in.
NODE_ID_HEADER: Final = "edgefleet-node-id"
PROTOCOL_HEADER: Final = "edgefleet-protocol-version"
_MAX_FILENAME: Final = 64
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class GrpcLinkConfig:
    """Where the link listens and its bounds. Addresses are HOST:PORT (port 0: any)."""

    node_address: str = "127.0.0.1:50051"
    enroll_address: str | None = None
    # Names and addresses the server certificate is valid for: what nodes dial.
    hostnames: tuple[str, ...] = ("localhost",)
    ips: tuple[str, ...] = ("127.0.0.1",)
    server_cert_ttl: timedelta = timedelta(days=365)
    max_message_bytes: int = 4 << 20
    # A node's certificate is re-checked (revocation, expiry) at most this often: the
    # node inbox's authorization cache lifetime for this transport.
    auth_recheck_s: float = 5.0
    artifact_chunk_bytes: int = 1 << 20
    downlink_queue: int = 64
    keepalive_s: float = 30.0
    max_concurrent_rpcs: int | None = None
    stop_grace_s: float = 5.0


@dataclass
class AuthenticatedNode:
    """The caller of one RPC, as its certificate proved it."""

    node: Node
    identity: NodeIdentity  # from the certificate, verified against the CA at the start

    @property
    def claim(self) -> NodeClaim:
        return NodeClaim(self.identity.node_id, self.identity.fleet, self.identity.serial)


@dataclass
class LinkStats:
    streams: int = 0
    batches: int = 0
    records_acked: int = 0
    refused_batches: int = 0
    desired_sent: int = 0  # assignments sent in answer to a Hello


class _InternalError(EdgefleetError):
    """A bug or an unexpected failure; the caller sees INTERNAL, the log the traceback."""

    title = "internal error"


# What the caller got wrong or may not do: counted in the inbox's `refusals` by reason.
_REFUSALS: Final = (InvalidInputError, AuthenticationError, PermissionDeniedError, PolicyError)

_CURRENT: ContextVar[AuthenticatedNode | None] = ContextVar("edgefleet_node", default=None)


def current_node() -> AuthenticatedNode:
    """The node the guard bound to this RPC (each RPC runs in its own task)."""
    peer = _CURRENT.get()
    if peer is None:  # pragma: no cover - the guard binds every NodeLink call but Enroll
        raise AuthenticationError("no node is bound to this call", reason="unbound")
    return peer


# ------------------------------------------------------------------- the guard


class NodeLinkGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Binds every NodeLink call but Enroll to the node its client certificate names."""

    def __init__(self, inbox: NodeInbox) -> None:
        self._inbox = inbox

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is not None and method.startswith(REFLECTION_PREFIX):
            return _with_client_certificate_only(handler)
        if handler is None or not method.startswith(f"/{SERVICE_NAME}/"):
            return handler  # health: no node identity involved, answered on both ports
        return self._guarded(method.rsplit("/", 1)[-1], handler)

    def _guarded(self, name: str, handler: Any) -> Any:
        parse: Callable[[bytes], Any] = handler.request_deserializer
        serialize = handler.response_serializer
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream_stream(name, parse, handler.stream_stream),
                response_serializer=serialize,
            )
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(name, parse, handler.unary_stream),
                response_serializer=serialize,
            )
        if not handler.request_streaming:
            return grpc.unary_unary_rpc_method_handler(
                self._unary_unary(name, parse, handler.unary_unary),
                response_serializer=serialize,
            )
        raise TypeError(f"NodeLink has no client-streaming method {name}")  # pragma: no cover

    def _unary_unary(
        self, name: str, parse: Callable[[bytes], Any], inner: Callable[..., Awaitable[Any]]
    ) -> Callable[[bytes, Any], Awaitable[Any]]:
        async def unary_unary(raw: bytes, context: Any) -> Any:
            try:
                await self._bind(name, context)
                return await inner(_parsed(parse, raw, name), context)
            except EdgefleetError as exc:
                error = exc
            except grpc.aio.AbortError:
                raise
            except Exception:
                error = _unexpected(name)
            await self._abort(name, context, error)

        return unary_unary

    def _unary_stream(
        self, name: str, parse: Callable[[bytes], Any], inner: Callable[..., AsyncIterator[Any]]
    ) -> Callable[[bytes, Any], AsyncIterator[Any]]:
        async def unary_stream(raw: bytes, context: Any) -> AsyncIterator[Any]:
            try:
                await self._bind(name, context)
                async for response in inner(_parsed(parse, raw, name), context):
                    yield response
                return
            except EdgefleetError as exc:
                error = exc
            except grpc.aio.AbortError:
                raise
            except Exception:
                error = _unexpected(name)
            await self._abort(name, context, error)

        return unary_stream

    def _stream_stream(
        self, name: str, parse: Callable[[bytes], Any], inner: Callable[..., AsyncIterator[Any]]
    ) -> Callable[[AsyncIterator[bytes], Any], AsyncIterator[Any]]:
        async def stream_stream(raw: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
            try:
                try:
                    await self._bind(name, context)
                except EdgefleetError:
                    await _take_first(raw)
                    raise
                async for response in inner(_parsed_stream(parse, raw, name), context):
                    yield response
                return
            except EdgefleetError as exc:
                error = exc
            except grpc.aio.AbortError:
                raise
            except Exception:
                error = _unexpected(name)
            await self._abort(name, context, error)

        return stream_stream

    async def _bind(self, name: str, context: Any) -> None:
        if name == "Enroll":
            return  # the bootstrap token is the credential
        certificate = _peer_certificate(context)
        if certificate is None:
            # Only the enrollment port lets a client in without a certificate.
            raise AuthenticationError(
                f"{name} needs a client certificate: use the node port with your "
                "certificate (this port serves Enroll only)",
                reason="no-client-certificate",
            )
        identity, node = await asyncio.to_thread(self._inbox.authenticate_peer, certificate)
        _CURRENT.set(AuthenticatedNode(node, identity))

    async def _abort(self, name: str, context: Any, error: EdgefleetError) -> None:
        reason = reason_of(error)
        peer = _CURRENT.get()
        node_id = peer.node.id if peer is not None else None
        if isinstance(error, _REFUSALS):
            self._inbox.refuse(reason, error.message, node_id=node_id, where=name)
        elif isinstance(error, NotFoundError):
            # An answer, not a refusal: TUF clients probe for the next root version.
            log.debug("%s: not found (%s)", name, error.message)
        else:  # superseded, shutting down, internal: logged where they happen
            log.info("%s of %s ended: %s", name, node_id or context.peer(), reason)
        await context.abort(
            status_for(error), error.message, trailing_metadata=((REASON_TRAILER, reason),)
        )


async def _take_first(raw: AsyncIterator[bytes]) -> None:
    """Read the client's first message (its Hello) before refusing the stream.

    A refusal that meets the client's write of that message still in flight is
    reported to the client as a local INTERNAL error (grpc.aio's failed send), and
    the refusal's status and reason trailer are lost: a revoked node would read it
    as "unavailable". Once the message is read, its write has completed.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_FIRST_MESSAGE_WAIT_S):
            await anext(aiter(raw), None)


_FIRST_MESSAGE_WAIT_S: Final = 2.0


# Reflection lists every service and message to whoever asks. The node port asks for a
# client certificate at the TLS handshake; the enrollment port asks nobody, so there it
# answers as if reflection were not served at all.
REFLECTION_PREFIX: Final = "/grpc.reflection."


def _with_client_certificate_only(handler: Any) -> Any:
    inner = handler.stream_stream

    async def stream_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        if _peer_certificate(context) is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "reflection is served on the node port (mTLS) only",
            )
        async for response in inner(requests, context):
            yield response

    return grpc.stream_stream_rpc_method_handler(
        stream_stream,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _peer_certificate(context: Any) -> bytes | None:
    values = context.auth_context().get("x509_pem_cert") or []
    return bytes(values[0]) if values else None


def _parsed(parse: Callable[[bytes], _T], raw: bytes, name: str) -> _T:
    try:
        return parse(raw)
    except (DecodeError, ValueError, TypeError) as exc:
        raise InvalidInputError(
            f"{name}: the request is not a valid protobuf message", reason="malformed-message"
        ) from exc


async def _parsed_stream(
    parse: Callable[[bytes], _T], raw: AsyncIterator[bytes], name: str
) -> AsyncIterator[_T]:
    async for message in raw:
        yield _parsed(parse, message, name)


def _unexpected(name: str) -> _InternalError:
    log.exception("%s failed unexpectedly", name)
    return _InternalError("internal error; retry later", reason="internal")


# ------------------------------------------------------------------ servicer


class NodeLinkService(link_pb2_grpc.NodeLinkServicer):
    """The NodeLink methods: thin, each calls the node inbox (or the registry and the
    artifact store, for downloads) in a worker thread.

    Database and store calls block, so they never run on the event loop; node records
    go through the inbox's group commit, one worker-thread hop per group of batches.
    """

    def __init__(
        self,
        inbox: NodeInbox,
        registry: RegistryService,
        store: ArtifactStore,
        hub: LinkHub,
        config: GrpcLinkConfig,
        stats: LinkStats,
    ) -> None:
        self._inbox = inbox
        self._registry = registry
        self._store = store
        self._hub = hub
        self._config = config
        self.stats = stats

    # ------------------------------------------------------------ enrollment

    async def Enroll(
        self, request: link_pb2.EnrollRequest, context: Any
    ) -> link_pb2.EnrollResponse:
        answer = await asyncio.to_thread(
            functools.partial(
                self._inbox.enroll,
                request.bootstrap_token,
                request.csr_pem,
                agent_version=request.agent_version,
                transport=request.transport or "grpc",
            )
        )
        enrollment = answer.enrollment
        return link_pb2.EnrollResponse(
            node_id=enrollment.node_id,
            fleet=enrollment.fleet,
            certificate_pem=enrollment.certificate_pem,
            ca_pem=enrollment.ca_pem,
            not_after=_timestamp(enrollment.not_after),
            labels=enrollment.labels,
            tuf_root=answer.tuf_root or b"",
            # Only for a node that enrolled for the MQTT transport; shown this once.
            mqtt_username=enrollment.mqtt_username or "",
            mqtt_password=enrollment.mqtt_password or "",
            director_public_key=json.dumps(answer.director_public_key, sort_keys=True).encode(),
        )

    async def RenewCertificate(
        self, request: link_pb2.RenewRequest, context: Any
    ) -> link_pb2.RenewResponse:
        peer = current_node()
        issued = await asyncio.to_thread(
            functools.partial(
                self._inbox.renew,
                peer.node.id,
                request.csr_pem,
                presented_serial=peer.identity.serial,
            )
        )
        return link_pb2.RenewResponse(
            certificate_pem=issued.pem, not_after=_timestamp(issued.not_after)
        )

    # -------------------------------------------------------------- downloads

    async def FetchMetadata(
        self, request: link_pb2.FetchMetadataRequest, context: Any
    ) -> link_pb2.MetadataFile:
        node = current_node().node
        if not 0 < len(request.filename) <= _MAX_FILENAME:
            raise InvalidInputError("bad metadata file name", reason="bad-filename")
        body = await asyncio.to_thread(self._registry.metadata_file, node.fleet, request.filename)
        return link_pb2.MetadataFile(content=body)

    async def FetchArtifact(
        self, request: link_pb2.FetchArtifactRequest, context: Any
    ) -> AsyncIterator[link_pb2.ArtifactChunk]:
        node = current_node().node
        sha256, length = await asyncio.to_thread(
            self._registry.target_artifact, node.fleet, request.target_path
        )
        if request.sha256 != sha256:
            raise NotFoundError(
                f"target {request.target_path!r} of fleet {node.fleet!r} has another sha256",
                reason="sha256-mismatch",
            )
        offset = request.offset
        if offset > length:
            raise RangeNotSatisfiableError(
                f"offset {offset} is beyond the end of the {length}-byte artifact",
                reason="offset-beyond-end",
                length=length,
            )
        store = self._store
        chunks = await asyncio.to_thread(
            store.open_range, sha256, offset, None, self._config.artifact_chunk_bytes
        )
        try:
            while (data := await asyncio.to_thread(next, chunks, None)) is not None:
                yield link_pb2.ArtifactChunk(offset=offset, data=data)
                offset += len(data)
        finally:
            with contextlib.suppress(ValueError):  # still running in its thread: GC closes it
                chunks.close()

    # -------------------------------------------------------------------- Sync

    async def Sync(
        self, request_iterator: AsyncIterator[link_pb2.NodeMessage], context: Any
    ) -> AsyncIterator[link_pb2.ControlMessage]:
        peer = current_node()
        first = await anext(request_iterator, None)
        if first is None:
            return
        if first.WhichOneof("body") != "hello":
            raise InvalidInputError("the first message on Sync must be a Hello", reason="no-hello")
        node = await self._hello(peer, first)
        session = self._hub.attach(node.id)
        reader: asyncio.Task[None] | None = None
        try:
            await context.send_initial_metadata(
                ((NODE_ID_HEADER, node.id), (PROTOCOL_HEADER, str(wire.PROTOCOL_VERSION)))
            )
            self.stats.streams += 1
            # Attached before this lookup: a pin that commits meanwhile reaches the node
            # through the hub, one that committed before is found here. Never neither.
            await self._queue_desired(node.id, session)
            reader = asyncio.create_task(
                self._read(peer, request_iterator, session), name=f"sync-{node.id}"
            )
            async for message in _downlink(session):
                yield message
        finally:
            if reader is not None:
                reader.cancel()
            if self._hub.detach(session):
                # A newer stream of the same node keeps it online; only the last one out
                # marks it offline.
                try:
                    await asyncio.to_thread(self._inbox.offline, node.id)
                except Exception:
                    log.exception("could not mark node %s offline", node.id)

    async def _read(
        self,
        peer: AuthenticatedNode,
        requests: AsyncIterator[link_pb2.NodeMessage],
        session: DownlinkSession,
    ) -> None:
        """Handle the node's messages in order; end the session with the outcome."""
        try:
            async for message in requests:
                await self._recheck(peer)
                await self._handle(peer, message, session)
        except EdgefleetError as exc:
            session.end(exc)
            return
        except Exception:
            session.end(_unexpected("Sync"))
            return
        session.end(None)

    async def _recheck(self, peer: AuthenticatedNode) -> None:
        """Revocation and expiry cut a stream at the next message (checks cached briefly).

        The certificate was verified against the CA when the stream began; what can
        change since is in the inventory (revoked, serial replaced, expired), which the
        inbox's `authorize` reads without parsing the certificate again.
        """
        claim = peer.claim
        if self._inbox.cached(claim) is None:
            peer.node = await asyncio.to_thread(self._inbox.authorize, claim)

    async def _handle(
        self, peer: AuthenticatedNode, message: link_pb2.NodeMessage, session: DownlinkSession
    ) -> None:
        node_id = peer.node.id
        inbox = self._inbox
        if message.WhichOneof("body") != "records":
            answer = await asyncio.to_thread(inbox.handle, node_id, message)
            if answer.desired is not None:
                await session.queue.put(wire.desired(answer.desired))
                self.stats.desired_sent += 1
            return
        self.stats.batches += 1
        try:
            records = inbox.decode_records(message.records)
            # Stored with the next group commit; the loop serves other streams meanwhile.
            ids = await inbox.store_records(node_id, records)
        except InvalidInputError as exc:
            self.stats.refused_batches += 1
            self._refuse_message("records", node_id, exc)
            return
        # Acked only now: `store` returned, so the insert has committed.
        await session.queue.put(wire.ack(ids))
        self.stats.records_acked += len(ids)

    def _refuse_message(self, kind: str, node_id: str, exc: InvalidInputError) -> None:
        """A malformed batch or status is answered with nothing; the stream stays up.

        The node resends what is not acked, so a batch that is refused stays in its
        outbox and is visible in its backlog; the count and log here say why.
        """
        self._inbox.refuse_error(exc, node_id=node_id, where=kind)

    async def _queue_desired(self, node_id: str, session: DownlinkSession) -> None:
        """Answer an accepted Hello with the node's current assignment, if it has one.

        Sent whatever `director_sequence` the Hello reports: it is a few hundred bytes,
        the node drops a sequence it already holds, and a node that accepted a sequence
        but lost what it said (a crash before the download) gets it back this way.
        """
        signed = await asyncio.to_thread(self._inbox.desired, node_id)
        if signed is not None:
            await session.queue.put(wire.desired(signed))
            self.stats.desired_sent += 1

    async def _hello(self, peer: AuthenticatedNode, message: link_pb2.NodeMessage) -> Node:
        # The stream's protocol version is the Hello's (the inbox checks it).
        peer.node = await asyncio.to_thread(self._inbox.hello, peer.node.id, message)
        return peer.node


async def _downlink(session: DownlinkSession) -> AsyncIterator[link_pb2.ControlMessage]:
    """Messages for the node until the session ends; raise the error it ended with."""
    mailbox = session.queue
    while not session.ended.done():
        if mailbox.empty():
            await mailbox.wait()  # a message, or the end
            continue
        yield mailbox.get_nowait()
    error = session.ended.result()
    if error is not None:
        raise error
    # The node closed its side: its last acks are queued already; deliver them.
    while not mailbox.empty():
        yield mailbox.get_nowait()


def _timestamp(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


# -------------------------------------------------------------------- server


class GrpcLinkServer:
    """The grpc.aio server: NodeLink, grpc.health.v1 and reflection on one or two ports
    (reflection answers only callers with a client certificate: not on the enrollment port).

    `start()` issues a fresh server certificate from the fleet CA (nodes trust the CA,
    not this certificate) and listens; `stop()` ends the Sync streams, lets unary
    calls and downloads finish within the grace period and is safe to call twice.
    """

    def __init__(
        self,
        inbox: NodeInbox,
        config: GrpcLinkConfig,
        *,
        registry: RegistryService,
        store: ArtifactStore,
        ca: CertificateAuthority,
        delivery: FanOutDelivery,
        clock: Clock,
        hub: LinkHub | None = None,
    ) -> None:
        self._inbox = inbox
        self._config = config
        self._registry = registry
        self._store = store
        self._ca = ca
        self._fan_out = delivery
        self._clock = clock
        self.hub = hub if hub is not None else LinkHub(max_pending=config.downlink_queue)
        self.refusals = inbox.refusals
        self.stats = LinkStats()
        self.node_port: int | None = None
        self.enroll_port: int | None = None
        self._server: Any = None
        self._health: Any = None
        self._stopping: asyncio.Task[None] | None = None
        self._delivery = HubDelivery(self.hub)

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the gRPC link server was started already")
        config = self._config
        now = self._clock.now()
        credentials = self._ca.issue_server_certificate(
            list(config.hostnames), list(config.ips), now=now, ttl=config.server_cert_ttl
        )
        pair = [(credentials.private_key_pem, credentials.certificate_pem)]
        server = grpc.aio.server(
            interceptors=[NodeLinkGuard(self._inbox)],
            options=_server_options(config),
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        link_pb2_grpc.add_NodeLinkServicer_to_server(
            NodeLinkService(self._inbox, self._registry, self._store, self.hub, config, self.stats),
            server,
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        node_credentials = grpc.ssl_server_credentials(
            pair, root_certificates=self._ca.ca_pem, require_client_auth=True
        )
        self.node_port = _bind(server, config.node_address, node_credentials)
        if config.enroll_address is not None:
            self.enroll_port = _bind(
                server, config.enroll_address, grpc.ssl_server_credentials(pair)
            )
        await server.start()
        self._server = server
        # From now on a pin reaches the nodes connected here at once.
        self._fan_out.attach(self._delivery)
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "gRPC node link listening: node port %s (mTLS), enrollment port %s; "
            "server certificate valid until %s",
            self.node_port,
            self.enroll_port or "off",
            credentials.not_after.isoformat(),
        )

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop serving; a second call waits for the first to finish."""
        if self._server is None:
            return
        if self._stopping is None:
            grace = self._config.stop_grace_s if grace_s is None else grace_s
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace_s: float) -> None:
        self._fan_out.detach(self._delivery)
        await self._health.enter_graceful_shutdown()
        # Sync streams never finish by themselves: end them now so their nodes reconnect
        # (to another replica or to our successor) while downloads drain.
        self.hub.close_all()
        await self._server.stop(grace_s)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def _bind(server: Any, address: str, credentials: Any) -> int:
    try:
        port: int = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise UnavailableError(f"cannot listen on {address}: {exc}", address=address) from exc
    return port


def _server_options(config: GrpcLinkConfig) -> list[tuple[str, int]]:
    keepalive_ms = int(config.keepalive_s * 1000)
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # A second server on the same port must fail, not silently share it.
        ("grpc.so_reuseport", 0),
        # Find nodes that vanished without closing their connection.
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # Let nodes ping as often as every 10 s without being told to go away.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]
