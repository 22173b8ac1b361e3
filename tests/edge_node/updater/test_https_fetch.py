"""`HttpsRepository`: the TUF repository over HTTPS for MQTT nodes, against a fake server
(`httpx.MockTransport`) that honours one byte range as the control plane does, and can
cut a download part way, ignore the range, or answer a wrong one."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from edge_node.errors import InvalidInputError
from edge_node.link.base import LinkNotFoundError, LinkRequestError, LinkUnavailableError
from edge_node.updater.director import TargetInfo
from edge_node.updater.download import download_target
from edge_node.updater.https_fetch import HttpsRepository, HttpsRepositoryConfig

pytestmark = pytest.mark.anyio

BASE = "https://cp.example.com"
BLOB = bytes(range(256)) * 400  # 102,400 bytes
SHA = hashlib.sha256(BLOB).hexdigest()
TARGET_URL = f"/v1/fleets/gates/tuf/targets/models/det/1.0.0/{SHA}.model.onnx"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Cut(httpx.AsyncByteStream):
    """A body that fails after `after` bytes, as a dropped connection does."""

    def __init__(self, data: bytes, after: int) -> None:
        self._data, self._after = data, after

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data[: self._after]
        raise httpx.ReadError("connection reset")


@dataclass
class FakeServer:
    """The control plane's TUF routes: metadata by name, one target with ranges."""

    metadata: dict[str, bytes] = field(default_factory=dict)
    status: int | None = None  # answer every request with this status instead
    cut_after: int | None = None  # the next target download fails after these bytes
    ignore_range: bool = False
    wrong_range: bool = False
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status is not None:
            return httpx.Response(self.status, json={"title": "nope", "reason": "test"})
        path = request.url.path
        prefix = "/v1/fleets/gates/tuf/metadata/"
        if path.startswith(prefix):
            body = self.metadata.get(path.removeprefix(prefix))
            return httpx.Response(404) if body is None else httpx.Response(200, content=body)
        if path != TARGET_URL:
            return httpx.Response(404)
        start = 0
        header = request.headers.get("range")
        if header and not self.ignore_range:
            start = int(header.removeprefix("bytes=").rstrip("-"))
        body = BLOB[start:]
        headers = {}
        status = 200
        if start:
            status = 206
            first = start + 1 if self.wrong_range else start
            headers["Content-Range"] = f"bytes {first}-{len(BLOB) - 1}/{len(BLOB)}"
        if self.cut_after is not None:
            after, self.cut_after = self.cut_after, None
            return httpx.Response(status, headers=headers, stream=_Cut(body, after))
        return httpx.Response(status, headers=headers, content=body)


def repository(server: FakeServer, **config: object) -> HttpsRepository:
    return HttpsRepository(
        HttpsRepositoryConfig(BASE, "gates", **config),  # type: ignore[arg-type]
        transport=httpx.MockTransport(server),
    )


async def collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def test_metadata_by_name_and_not_found_as_tuf_expects() -> None:
    server = FakeServer(metadata={"timestamp.json": b'{"signed": 1}'})
    repo = repository(server)
    try:
        assert await repo.fetch_metadata("timestamp.json") == b'{"signed": 1}'
        assert str(server.requests[0].url) == f"{BASE}/v1/fleets/gates/tuf/metadata/timestamp.json"
        with pytest.raises(LinkNotFoundError):
            await repo.fetch_metadata("2.root.json")
        with pytest.raises(LinkNotFoundError):
            await repo.fetch_metadata("../secrets")
        assert len(server.requests) == 2  # the bad name never left the node
    finally:
        await repo.close()
        await repo.close()  # idempotent


@pytest.mark.parametrize(
    ("status", "error"),
    [(503, LinkUnavailableError), (500, LinkUnavailableError), (400, LinkRequestError)],
)
async def test_server_errors_are_outages_and_other_refusals_are_final(
    status: int, error: type[Exception]
) -> None:
    repo = repository(FakeServer(status=status))
    try:
        with pytest.raises(error):
            await repo.fetch_metadata("timestamp.json")
        with pytest.raises(error):
            await collect(repo.fetch_artifact("models/det/1.0.0/model.onnx", SHA))
    finally:
        await repo.close()


async def test_metadata_over_the_cap_is_refused() -> None:
    server = FakeServer(metadata={"1.root.json": b"x" * 5000})
    repo = repository(server, max_metadata_bytes=4096)
    try:
        with pytest.raises(LinkRequestError, match="over 4096"):
            await repo.fetch_metadata("1.root.json")
    finally:
        await repo.close()


async def test_a_target_whole_and_from_an_offset() -> None:
    server = FakeServer()
    repo = repository(server)
    try:
        assert await collect(repo.fetch_artifact("models/det/1.0.0/model.onnx", SHA)) == BLOB
        assert "range" not in server.requests[-1].headers
        tail = await collect(repo.fetch_artifact("models/det/1.0.0/model.onnx", SHA, 1000))
        assert tail == BLOB[1000:]
        assert server.requests[-1].headers["range"] == "bytes=1000-"
        server.ignore_range = True  # a proxy that drops Range: the bytes before are skipped
        again = await collect(repo.fetch_artifact("models/det/1.0.0/model.onnx", SHA, 1000))
        assert again == BLOB[1000:]
        server.ignore_range, server.wrong_range = False, True
        with pytest.raises(LinkRequestError, match="asked for bytes from 1000"):
            await collect(repo.fetch_artifact("models/det/1.0.0/model.onnx", SHA, 1000))
        with pytest.raises(LinkNotFoundError):
            await collect(repo.fetch_artifact("models/../etc/passwd", SHA))
    finally:
        await repo.close()


async def test_a_cut_download_resumes_with_a_range_and_verifies(tmp_path: Path) -> None:
    server = FakeServer(cut_after=40_000)
    repo = repository(server)
    target = TargetInfo("models/det/1.0.0/model.onnx", SHA, len(BLOB), {})
    try:
        with pytest.raises(LinkUnavailableError):
            await download_target(repo, target, tmp_path, max_bytes=1 << 20)
        part = tmp_path / f"{SHA}.part"
        assert part.stat().st_size == 40_000  # kept for the resume
        path = await download_target(repo, target, tmp_path, max_bytes=1 << 20)
        assert path.read_bytes() == BLOB
        assert server.requests[-1].headers["range"] == "bytes=40000-"
    finally:
        await repo.close()


@pytest.mark.parametrize(
    "url",
    ["http://cp.example.com", "ftp://cp.example.com", "cp.example.com", "http://10.0.0.5:8080"],
)
def test_plain_http_is_only_for_this_machine(url: str) -> None:
    with pytest.raises(InvalidInputError):
        HttpsRepositoryConfig(url, "gates")
    HttpsRepositoryConfig("http://127.0.0.1:8080", "gates")
    HttpsRepositoryConfig("http://localhost:8080", "gates")
    HttpsRepositoryConfig("http://[::1]:8080", "gates")


class _Endless(httpx.AsyncByteStream):
    """A body that never ends (bounded here at 16 MiB); counts what it served."""

    def __init__(self) -> None:
        self.served = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.served < 16 << 20:
            self.served += 1024
            yield b" " * 1024


async def test_an_endless_timestamp_is_cut_at_python_tufs_16_kib() -> None:
    endless = _Endless()

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=endless)  # no Content-Length

    repo = HttpsRepository(
        HttpsRepositoryConfig(BASE, "gates"), transport=httpx.MockTransport(serve)
    )
    try:
        with pytest.raises(LinkRequestError, match="over 16384 bytes"):
            await repo.fetch_metadata("timestamp.json")
    finally:
        await repo.close()
    assert endless.served <= 16384 + 1024


@pytest.mark.parametrize(
    ("filename", "limit"),
    [
        ("timestamp.json", 16_384),
        ("7.root.json", 512_000),
        ("12.snapshot.json", 2_000_000),
        ("12.targets.json", 5_000_000),
        ("3.cameras.north.json", 5_000_000),  # a delegated role
    ],
)
async def test_each_role_is_capped_at_python_tufs_limit(filename: str, limit: int) -> None:
    # The limits are ngclient's own defaults: a stock client refuses at the same size.
    from tuf.ngclient import UpdaterConfig

    assert UpdaterConfig().timestamp_max_length == 16_384
    assert HttpsRepositoryConfig(BASE, "gates").metadata_limit(filename) == limit
    server = FakeServer(metadata={filename: b"x" * (limit + 1)})
    repo = repository(server)
    try:
        with pytest.raises(LinkRequestError, match=f"over {limit} bytes"):
            await repo.fetch_metadata(filename)
    finally:
        await repo.close()
