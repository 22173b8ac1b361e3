"""TUF metadata and artifacts over the gRPC link, with resumable offsets (both backends).

A model is pushed the way operators push it (ReleaseClient over REST, real signatures),
then a node of that fleet fetches it over its mTLS link.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.cli.release import ReleaseClient
from control_plane.errors import NotFoundError
from control_plane.registry import sample_models
from control_plane.trust.keys import OperatorKeyset, init_operator_keys
from edge_node.enroll import EnrollmentFiles
from edge_node.link.base import LinkNotFoundError, LinkRequestError
from edge_node.link.grpc_link import GrpcNodeLink
from tests.control_plane.conftest import LiveServer
from tests.control_plane.link.grpc_support import GrpcPlane, hello, running_link

pytestmark = pytest.mark.anyio

FLEET = "parks"
MODEL_PATH = "models/detector/1.0.0/model.onnx"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def model(live_server: LiveServer, tmp_path: Path) -> bytes:
    keyset: OperatorKeyset = init_operator_keys(
        tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None
    )
    path = sample_models.tiny_detector(tmp_path / "det.onnx")
    with live_server.api() as api:
        release = ReleaseClient(api, keyset)
        release.create_fleet(FLEET)
        release.push_model(FLEET, path, name="detector", version="1.0.0")
    return path.read_bytes()


@pytest.fixture
async def plane(live_server: LiveServer, model: bytes) -> AsyncIterator[GrpcPlane]:
    # Small chunks, so even a tiny model arrives in several.
    async with running_link(live_server.services, fleet=FLEET, artifact_chunk_bytes=1000) as p:
        yield p


@pytest.fixture
async def link(plane: GrpcPlane, tmp_path: Path) -> AsyncIterator[GrpcNodeLink]:
    files = await plane.enroll(tmp_path / "node")
    node_link = plane.link(files)
    try:
        yield node_link
    finally:
        await node_link.close()


async def collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def test_enrolling_into_an_active_fleet_writes_its_first_tuf_root(
    plane: GrpcPlane, tmp_path: Path
) -> None:
    files = await plane.enroll(tmp_path / "node")
    assert files.tuf_root_path.read_bytes() == plane.services.registry.metadata_file(
        FLEET, "1.root.json"
    )
    assert EnrollmentFiles.load(files.directory).fleet == FLEET


async def test_metadata_of_the_nodes_fleet(plane: GrpcPlane, link: GrpcNodeLink) -> None:
    registry = plane.services.registry
    # No Sync stream is needed for downloads.
    assert await link.fetch_metadata("timestamp.json") == registry.metadata_file(
        FLEET, "timestamp.json"
    )
    assert await link.fetch_metadata("2.targets.json") == registry.metadata_file(
        FLEET, "2.targets.json"
    )
    with pytest.raises(LinkNotFoundError):  # what a TUF client probes for: the next root
        await link.fetch_metadata("2.root.json")
    with pytest.raises(LinkRequestError):
        await link.fetch_metadata("x" * 100)
    assert plane.server.refusals.snapshot() == {"bad-filename": 1}


async def test_an_artifact_resumes_from_an_offset(
    plane: GrpcPlane, link: GrpcNodeLink, model: bytes
) -> None:
    sha256 = hashlib.sha256(model).hexdigest()
    whole = await collect(link.fetch_artifact(MODEL_PATH, sha256))
    assert b"".join(whole) == model
    assert len(whole) == -(-len(model) // 1000)
    assert all(len(chunk) <= 1000 for chunk in whole)

    # Interrupted after the first chunk: resume from where it stopped.
    partial = bytearray()
    async for chunk in link.fetch_artifact(MODEL_PATH, sha256):
        partial += chunk
        break
    rest = await collect(link.fetch_artifact(MODEL_PATH, sha256, offset=len(partial)))
    assert bytes(partial) + b"".join(rest) == model
    odd = 1234
    assert (
        b"".join(await collect(link.fetch_artifact(MODEL_PATH, sha256, offset=odd)))
        == (model[odd:])
    )
    assert await collect(link.fetch_artifact(MODEL_PATH, sha256, offset=len(model))) == []
    # Link still fine for Sync afterwards.
    await link.connect(hello())


def test_target_artifact_names_only_what_the_fleets_targets_list(
    live_server: LiveServer, model: bytes
) -> None:
    registry = live_server.services.registry
    sha256 = hashlib.sha256(model).hexdigest()
    assert registry.target_artifact(FLEET, MODEL_PATH) == (sha256, len(model))
    for missing in ("models/detector/9.9.9/model.onnx", "models/detector/1.0.0"):
        with pytest.raises(NotFoundError):
            registry.target_artifact(FLEET, missing)
    with pytest.raises(NotFoundError):
        registry.target_artifact("no-such-fleet", MODEL_PATH)


async def test_refused_downloads(plane: GrpcPlane, link: GrpcNodeLink, model: bytes) -> None:
    sha256 = hashlib.sha256(model).hexdigest()
    with pytest.raises(LinkRequestError) as beyond:
        await collect(link.fetch_artifact(MODEL_PATH, sha256, offset=len(model) + 1))
    assert beyond.value.fields["code"] == "OUT_OF_RANGE"
    assert not isinstance(beyond.value, LinkNotFoundError)
    with pytest.raises(LinkNotFoundError) as wrong_hash:
        await collect(link.fetch_artifact(MODEL_PATH, "0" * 64))
    assert wrong_hash.value.fields["reason"] == "sha256-mismatch"
    with pytest.raises(LinkNotFoundError):
        await collect(link.fetch_artifact("models/other/1.0.0/model.onnx", sha256))
    assert plane.server.refusals.snapshot() == {"offset-beyond-end": 1}
