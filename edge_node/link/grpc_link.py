"""`GrpcNodeLink`: the `NodeLink` port over gRPC with mutual TLS (`grpc.aio`).

The node dials the control plane's node port with its own key and certificate and
trusts only the fleet CA. `connect()` opens the one `Sync` stream, sends the Hello and
waits until the control plane accepts it (initial metadata `edgefleet-node-id`), so a
revoked or unknown node learns it at once as `LinkRefusedError`. Failures are mapped
in one place (`link_error`): UNAUTHENTICATED / PERMISSION_DENIED refuse the node, every
other status of the stream is an outage the caller retries with backoff.

Not here: the retry loop (edge_node.link.uplink), enrollment (edge_node.enroll), what
the messages mean.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from edge_node.link.base import (
    LinkError,
    LinkNotFoundError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    NodeLink,
    node_message,
)
from protos.edgefleet.fleet.v1 import link_pb2, link_pb2_grpc

__all__ = [
    "NODE_ID_HEADER",
    "REASON_TRAILER",
    "GrpcLinkSettings",
    "GrpcNodeLink",
    "NodeCredentials",
    "channel_options",
    "link_error",
]

# The wire names the control plane uses (docs/protocol.md); copied, not imported.
NODE_ID_HEADER: Final = "edgefleet-node-id"
REASON_TRAILER: Final = "edgefleet-reason"

_REFUSED: Final = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
_REQUEST: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
_BROKEN: Final = frozenset(
    {grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN}
)


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    """The node's TLS identity: its key, its certificate and the fleet CA (all PEM)."""

    key_pem: bytes = field(repr=False)
    certificate_pem: bytes
    ca_pem: bytes


@dataclass(frozen=True, slots=True)
class GrpcLinkSettings:
    """Where the control plane's node port is and the link's time and size bounds."""

    target: str  # HOST:PORT of the node port
    # The name the server certificate must carry, when `target` is an address that is
    # not in it (e.g. dialing 10.0.0.5 whose certificate says cp.example.com).
    server_name: str | None = None
    connect_timeout_s: float = 10.0
    call_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    # A download that delivers nothing for this long is given up (and resumed later).
    chunk_timeout_s: float = 60.0
    keepalive_s: float = 30.0
    max_message_bytes: int = 4 << 20


def channel_options(settings: GrpcLinkSettings) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # Notice a control plane that vanished without closing the connection.
        ("grpc.keepalive_time_ms", int(settings.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if settings.server_name:
        options.append(("grpc.ssl_target_name_override", settings.server_name))
    return options


def link_error(
    code: Any, details: str | None, *, reason: str | None = None, request: bool = False
) -> LinkError:
    """The link error for a gRPC status. `request`: a single call (fetch, enroll) whose
    NOT_FOUND / INVALID_ARGUMENT / ... concern that request, not the link.
    """
    name = getattr(code, "name", str(code))
    message = f"{name}: {details or 'no details'}"
    fields: dict[str, Any] = {"code": name, "reason": reason}
    if code in _REFUSED:
        return LinkRefusedError(message, **fields)
    if request and code == grpc.StatusCode.NOT_FOUND:
        return LinkNotFoundError(message, **fields)
    if request and code in _REQUEST:
        return LinkRequestError(message, **fields)
    return LinkUnavailableError(message, **fields)


def _rpc_error(exc: grpc.aio.AioRpcError, *, request: bool = False) -> LinkError:
    return link_error(
        exc.code(), exc.details(), reason=_reason(exc.trailing_metadata()), request=request
    )


def _reason(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == REASON_TRAILER:
            return str(value)
    return None


class GrpcNodeLink(NodeLink):
    """One node's link; `credentials` may be a function so a renewed certificate is
    picked up at the next connect.
    """

    def __init__(
        self,
        settings: GrpcLinkSettings,
        credentials: NodeCredentials | Callable[[], NodeCredentials],
    ) -> None:
        self._settings = settings
        self._credentials = credentials if callable(credentials) else (lambda: credentials)
        self._channel: Any = None
        self._channel_credentials: NodeCredentials | None = None
        self._call: Any = None
        self._write_lock = asyncio.Lock()
        self.node_id: str | None = None  # as the control plane confirmed it

    # ------------------------------------------------------------------ Sync

    async def connect(self, hello: link_pb2.Hello) -> None:
        self._cancel_call()
        channel = await self._ready_channel()
        call = link_pb2_grpc.NodeLinkStub(channel).Sync()
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                try:
                    await call.write(node_message(hello=hello))
                    metadata = await call.initial_metadata()
                except asyncio.InvalidStateError:
                    metadata = ()
                accepted = dict(metadata or ()).get(NODE_ID_HEADER)
                if accepted is None:
                    raise await _ended(call)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from exc
        except TimeoutError as exc:
            call.cancel()
            raise LinkUnavailableError(
                f"the control plane did not accept the Hello within "
                f"{self._settings.connect_timeout_s:g}s"
            ) from exc
        self.node_id = str(accepted)
        self._call = call

    async def send(self, message: link_pb2.NodeMessage) -> None:
        call = self._call
        if call is None:
            raise LinkUnavailableError("not connected")
        size, limit = message.ByteSize(), self._settings.max_message_bytes
        if size > limit:
            # Resending cannot help: a bug or a misconfigured batch size. Fail loudly.
            raise LinkRequestError(
                f"a message of {size} bytes is over the {limit}-byte limit", size=size
            )
        async with self._write_lock:  # one write in flight per stream
            try:
                async with asyncio.timeout(self._settings.send_timeout_s):
                    await call.write(message)
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error(exc) from exc
            except asyncio.InvalidStateError:
                raise await _ended(call) from None
            except TimeoutError as exc:
                raise LinkUnavailableError(
                    f"the control plane took no message for {self._settings.send_timeout_s:g}s"
                ) from exc

    async def incoming(self) -> AsyncIterator[link_pb2.ControlMessage]:
        call = self._call
        if call is None:
            raise LinkUnavailableError("not connected")
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error(exc) from exc
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # The call was cancelled here (connect or close), not this task.
                raise LinkUnavailableError("the link was closed") from None
            if message is grpc.aio.EOF:
                break
            yield message
        raise await _ended(call)

    # ------------------------------------------------------------- downloads

    async def fetch_metadata(self, filename: str) -> bytes:
        stub = link_pb2_grpc.NodeLinkStub(await self._ready_channel())
        try:
            response = await stub.FetchMetadata(
                link_pb2.FetchMetadataRequest(filename=filename),
                timeout=self._settings.call_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc, request=True) from exc
        return bytes(response.content)

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        """The target's bytes from `offset` on; the caller verifies length and hash."""
        stub = link_pb2_grpc.NodeLinkStub(await self._ready_channel())
        call = stub.FetchArtifact(
            link_pb2.FetchArtifactRequest(target_path=target_path, sha256=sha256, offset=offset)
        )
        expected = offset
        try:
            while True:
                try:
                    async with asyncio.timeout(self._settings.chunk_timeout_s):
                        chunk = await call.read()
                except grpc.aio.AioRpcError as exc:
                    raise _rpc_error(exc, request=True) from exc
                except TimeoutError as exc:
                    raise LinkUnavailableError(
                        f"no artifact data for {self._settings.chunk_timeout_s:g}s",
                        offset=expected,
                    ) from exc
                if chunk is grpc.aio.EOF:
                    return
                if chunk.offset != expected:
                    raise LinkUnavailableError(
                        f"artifact chunk at offset {chunk.offset}, expected {expected}",
                        offset=expected,
                    )
                expected += len(chunk.data)
                yield bytes(chunk.data)
        finally:
            call.cancel()  # a no-op when finished; frees the stream when stopped early

    # ----------------------------------------------------------- certificate

    async def renew_certificate(self, csr_pem: bytes) -> link_pb2.RenewResponse:
        """A new certificate for a CSR (the caller stores it; the next connect uses it)."""
        stub = link_pb2_grpc.NodeLinkStub(await self._ready_channel())
        try:
            response: link_pb2.RenewResponse = await stub.RenewCertificate(
                link_pb2.RenewRequest(csr_pem=csr_pem), timeout=self._settings.call_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc, request=True) from exc
        return response

    def credentials_renewed(
        self, credentials: NodeCredentials | Callable[[], NodeCredentials] | None = None
    ) -> None:
        """The node's key and certificate were renewed: use them from the next connect on.

        `credentials` replaces the source (needed when the link was built with fixed
        credentials; a link that reads the node's files picks the new ones up anyway).
        The open Sync stream is ended now, so the caller's reconnect (the uplink's, at
        once) brings the new certificate into use: the old one is valid only until it
        expires, and a stream still holding it then would be refused for good.
        """
        if credentials is not None:
            self._credentials = credentials if callable(credentials) else (lambda: credentials)
        self._cancel_call()

    # ------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        self._cancel_call()
        channel, self._channel = self._channel, None
        self._channel_credentials = None
        if channel is not None:
            await channel.close()

    def _cancel_call(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _ready_channel(self) -> Any:
        """The channel, made anew when it failed or the credentials changed.

        A fresh channel connects at once; a failed one would wait out gRPC's own
        reconnect backoff, on top of the caller's.
        """
        try:
            credentials = self._credentials()
        except OSError as exc:
            raise LinkRefusedError(f"cannot read the node's credentials: {exc}") from exc
        channel = self._channel
        if (
            channel is not None
            and credentials == self._channel_credentials
            and channel.get_state() not in _BROKEN
        ):
            return channel
        self._channel = grpc.aio.secure_channel(
            self._settings.target,
            grpc.ssl_channel_credentials(
                root_certificates=credentials.ca_pem,
                private_key=credentials.key_pem,
                certificate_chain=credentials.certificate_pem,
            ),
            options=channel_options(self._settings),
        )
        self._channel_credentials = credentials
        if channel is not None:
            # In-flight downloads on the old channel fail and resume from their offset.
            await channel.close()
        return self._channel


async def _ended(call: Any) -> LinkError:
    """The error for a Sync call that finished (or was refused before it began)."""
    code = await call.code()
    details = await call.details()
    if code == grpc.StatusCode.OK:
        return LinkUnavailableError("the control plane closed the stream")
    return link_error(code, details, reason=_reason(await call.trailing_metadata()))
