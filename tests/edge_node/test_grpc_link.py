"""`GrpcNodeLink` against a scripted control plane: a small grpc.aio server in the test.

The real control plane is exercised in tests/control_plane/link; here the server does
exactly what each test needs (refuse, stall, hang up, send chunks out of order), so
the node's mapping of every outcome to the `NodeLink` contract is pinned down. What
every link must do is in tests/edge_node/link_contract (there over a real control plane).
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

from edge_node.clock import SystemClock
from edge_node.fsutil import atomic_write
from edge_node.link.base import (
    Backoff,
    LinkNotFoundError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    node_message,
)
from edge_node.link.grpc_link import (
    NODE_ID_HEADER,
    REASON_TRAILER,
    GrpcLinkSettings,
    GrpcNodeLink,
    NodeCredentials,
    link_error,
)
from edge_node.link.uplink import Uplink, UplinkConfig
from edge_node.outbox import Outbox
from protos.edgefleet.fleet.v1 import link_pb2, link_pb2_grpc
from tests.conftest import free_port, let_grpc_settle
from tests.edge_node.tls_support import Pki, make_pki

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


class ScriptedControlPlane(link_pb2_grpc.NodeLinkServicer):
    """Acks every batch; `refuse`, `stall` and `hang_up` script the other outcomes."""

    def __init__(self) -> None:
        self.received: list[link_pb2.NodeMessage] = []
        self.refuse: tuple[Any, str] | None = None
        self.stall = False
        self.hang_up_after_hello = False
        self.metadata: dict[str, bytes] = {}
        self.artifact = bytes(range(256)) * 4
        self.skip_chunk = False

    async def Sync(
        self, request_iterator: AsyncIterator[link_pb2.NodeMessage], context: Any
    ) -> AsyncIterator[link_pb2.ControlMessage]:
        if self.refuse is not None:
            code, reason = self.refuse
            # As the control plane's guard does: the Hello is read first, so the
            # refusal never meets the client's write (which would read as INTERNAL).
            await anext(request_iterator, None)
            await context.abort(
                code, "refused by the script", trailing_metadata=((REASON_TRAILER, reason),)
            )
        first = await anext(request_iterator)
        self.received.append(first)
        if self.stall:
            await anyio.sleep_forever()
        await context.send_initial_metadata(((NODE_ID_HEADER, "n-test"),))
        if self.hang_up_after_hello:
            return
        async for message in request_iterator:
            self.received.append(message)
            if message.WhichOneof("body") == "records":
                ids = [r.id for r in message.records.records]
                yield link_pb2.ControlMessage(ack=link_pb2.Ack(record_ids=ids))

    async def FetchMetadata(
        self, request: link_pb2.FetchMetadataRequest, context: Any
    ) -> link_pb2.MetadataFile:
        if request.filename not in self.metadata:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such file")
        return link_pb2.MetadataFile(content=self.metadata[request.filename])

    async def FetchArtifact(
        self, request: link_pb2.FetchArtifactRequest, context: Any
    ) -> AsyncIterator[link_pb2.ArtifactChunk]:
        if request.offset > len(self.artifact):
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, "beyond the end")
        offset = request.offset
        while offset < len(self.artifact):
            data = self.artifact[offset : offset + 100]
            if self.skip_chunk and offset > request.offset:
                offset += 100  # a broken server: a gap in the stream
            yield link_pb2.ArtifactChunk(offset=offset, data=data)
            offset += len(data)


class Server:
    def __init__(self, pki: Pki, port: int) -> None:
        self.pki, self.port = pki, port
        self.script = ScriptedControlPlane()
        self._server: Any = None

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        link_pb2_grpc.add_NodeLinkServicer_to_server(self.script, server)
        # Port 0 unless given: the kernel's pick, never one another worker took meanwhile.
        self.port = server.add_secure_port(
            f"127.0.0.1:{self.port}",
            grpc.ssl_server_credentials(
                [(self.pki.server_key_pem, self.pki.server_cert_pem)],
                root_certificates=self.pki.ca_pem,
                require_client_auth=True,
            ),
        )
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[Server]:
    running = Server(pki, 0)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
        await let_grpc_settle()


def settings(port: int, **overrides: Any) -> GrpcLinkSettings:
    values: dict[str, Any] = {
        "target": f"127.0.0.1:{port}",
        "server_name": "localhost",
        "connect_timeout_s": 5.0,
    }
    values.update(overrides)
    return GrpcLinkSettings(**values)


@pytest.fixture
async def link(server: Server, pki: Pki) -> AsyncIterator[GrpcNodeLink]:
    node_link = GrpcNodeLink(settings(server.port), pki.client)
    try:
        yield node_link
    finally:
        await node_link.close()


def hello() -> link_pb2.Hello:
    return link_pb2.Hello(agent_version="0.1.0")


async def first(messages: AsyncIterator[link_pb2.ControlMessage]) -> link_pb2.ControlMessage:
    with anyio.fail_after(10):
        async for message in messages:
            return message
    raise AssertionError("no message")  # pragma: no cover


# ------------------------------------------------------------------- Sync


async def test_connect_sends_the_hello_and_acks_come_back(
    server: Server, link: GrpcNodeLink
) -> None:
    await link.connect(hello())
    assert link.node_id == "n-test"
    assert server.script.received[0].hello.agent_version == "0.1.0"
    assert server.script.received[0].protocol_version == 1
    record = link_pb2.Record(id="r-1", seq=1)
    await link.send(node_message(records=link_pb2.RecordBatch(records=[record])))
    assert list((await first(link.incoming())).ack.record_ids) == ["r-1"]


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, LinkRefusedError),
        (grpc.StatusCode.PERMISSION_DENIED, LinkRefusedError),
        (grpc.StatusCode.INVALID_ARGUMENT, LinkUnavailableError),
        (grpc.StatusCode.UNAVAILABLE, LinkUnavailableError),
        (grpc.StatusCode.INTERNAL, LinkUnavailableError),
    ],
)
async def test_a_refused_hello_maps_to_the_link_contract(
    server: Server, link: GrpcNodeLink, code: Any, error: type[Exception]
) -> None:
    server.script.refuse = (code, "node-revoked")
    with pytest.raises(error) as info:
        await link.connect(hello())
    assert type(info.value) is error
    assert info.value.fields == {"code": code.name, "reason": "node-revoked"}  # type: ignore[attr-defined]


async def test_an_unreachable_control_plane_is_unavailable(pki: Pki) -> None:
    link = GrpcNodeLink(settings(free_port()), pki.client)
    with anyio.fail_after(5), pytest.raises(LinkUnavailableError):
        await link.connect(hello())
    with pytest.raises(LinkUnavailableError):
        await link.fetch_metadata("timestamp.json")
    await link.close()
    await link.close()  # idempotent


async def test_a_hello_nobody_answers_times_out(server: Server, pki: Pki) -> None:
    server.script.stall = True
    link = GrpcNodeLink(settings(server.port, connect_timeout_s=0.3), pki.client)
    with anyio.fail_after(5), pytest.raises(LinkUnavailableError, match="did not accept"):
        await link.connect(hello())
    await link.close()


async def test_a_stream_the_server_ends_is_unavailable(server: Server, link: GrpcNodeLink) -> None:
    server.script.hang_up_after_hello = True
    await link.connect(hello())
    with pytest.raises(LinkUnavailableError, match="closed the stream"):
        await first(link.incoming())


async def test_a_message_over_the_limit_is_refused_before_sending(server: Server, pki: Pki) -> None:
    link = GrpcNodeLink(settings(server.port, max_message_bytes=1000), pki.client)
    await link.connect(hello())
    big = link_pb2.Record(id="r", payload=b"x" * 2000)
    with pytest.raises(LinkRequestError):
        await link.send(node_message(records=link_pb2.RecordBatch(records=[big])))
    await link.close()


async def test_the_link_reconnects_to_a_restarted_control_plane(
    server: Server, link: GrpcNodeLink
) -> None:
    await link.connect(hello())
    await server.stop()
    with pytest.raises(LinkUnavailableError):
        await first(link.incoming())
    with pytest.raises(LinkUnavailableError):
        await link.connect(hello())
    await server.start()
    # A fresh channel: no waiting out gRPC's own reconnect backoff.
    with anyio.fail_after(5):
        await link.connect(hello())
    await link.send(node_message(records=link_pb2.RecordBatch(records=[link_pb2.Record(id="x")])))
    assert list((await first(link.incoming())).ack.record_ids) == ["x"]


async def test_unreadable_credentials_refuse_the_link(server: Server, tmp_path: Path) -> None:
    def missing() -> NodeCredentials:
        return NodeCredentials(b"", (tmp_path / "node.crt").read_bytes(), b"")

    link = GrpcNodeLink(settings(server.port), missing)
    with pytest.raises(LinkRefusedError):
        await link.connect(hello())


async def test_the_uplink_drains_an_outbox_over_grpc(
    server: Server, link: GrpcNodeLink, tmp_path: Path
) -> None:
    outbox = Outbox.open(
        tmp_path / "outbox.db", node_id="n-test", budget_bytes=1 << 20, clock=SystemClock()
    )
    appended = {outbox.append("event", b"{}").id for _ in range(40)}
    uplink = Uplink(
        outbox,
        link,
        clock=SystemClock(),
        config=UplinkConfig(batch_records=15, idle_poll_s=0.01, backoff=Backoff(0.01, 0.05)),
    )
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(uplink.run, hello, stop)
        with anyio.fail_after(10):
            while outbox.stats().pending_events:
                await anyio.sleep(0.01)
        stop.set()
    outbox.close()
    sent = {
        r.id
        for m in server.script.received
        if m.WhichOneof("body") == "records"
        for r in m.records.records
    }
    assert sent == appended


# -------------------------------------------------------------- downloads


async def test_metadata_and_not_found(server: Server, link: GrpcNodeLink) -> None:
    server.script.metadata["timestamp.json"] = b'{"signed": {}}'
    assert await link.fetch_metadata("timestamp.json") == b'{"signed": {}}'
    with pytest.raises(LinkNotFoundError):
        await link.fetch_metadata("2.root.json")


async def test_an_artifact_resumes_from_an_offset(server: Server, link: GrpcNodeLink) -> None:
    artifact = server.script.artifact
    assert b"".join([c async for c in link.fetch_artifact("t", "s")]) == artifact
    assert b"".join([c async for c in link.fetch_artifact("t", "s", 250)]) == artifact[250:]
    with pytest.raises(LinkRequestError) as beyond:
        async for _ in link.fetch_artifact("t", "s", len(artifact) + 1):
            pass
    assert beyond.value.fields["code"] == "OUT_OF_RANGE"


async def test_a_gap_in_the_artifact_stream_is_an_error(server: Server, link: GrpcNodeLink) -> None:
    server.script.skip_chunk = True
    received = bytearray()
    with pytest.raises(LinkUnavailableError) as info:
        async for chunk in link.fetch_artifact("t", "s"):
            received += chunk
    assert info.value.fields["offset"] == len(received) == 100


# --------------------------------------------------------------- mapping


@pytest.mark.parametrize(
    ("code", "request_call", "error"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, True, LinkRefusedError),
        (grpc.StatusCode.NOT_FOUND, True, LinkNotFoundError),
        (grpc.StatusCode.NOT_FOUND, False, LinkUnavailableError),
        (grpc.StatusCode.OUT_OF_RANGE, True, LinkRequestError),
        (grpc.StatusCode.INVALID_ARGUMENT, False, LinkUnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, LinkUnavailableError),
        (grpc.StatusCode.CANCELLED, False, LinkUnavailableError),
    ],
)
def test_link_error_mapping(code: Any, request_call: bool, error: type[Exception]) -> None:
    assert type(link_error(code, "x", request=request_call)) is error


# ------------------------------------------------------------------ fsutil


@pytest.fixture
def umask() -> Iterator[None]:
    import os

    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_atomic_write_replaces_with_the_exact_mode(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "node.crt"
    atomic_write(target, b"one", mode=0o644)
    atomic_write(target, b"two", mode=0o644)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic_write(tmp_path / "node.key", b"k", mode=0o600)
    assert stat.S_IMODE((tmp_path / "node.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.crt", "node.key"]
