"""download_target: resume after a cut, a corrupt prefix, the length cap, the hash check."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edge_node.link.base import LinkUnavailableError
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from edge_node.updater.director import TargetInfo
from edge_node.updater.download import (
    ArtifactHashError,
    ArtifactIncompleteError,
    ArtifactTooLargeError,
    download_target,
    partial_path,
)
from edge_node.updater.store import DiskFullError, DiskUsage, ModelStore

pytestmark = pytest.mark.anyio

DATA = bytes(range(256)) * 40
TARGET = TargetInfo("models/det/1.0.0/model.onnx", hashlib.sha256(DATA).hexdigest(), len(DATA))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CuttingLink(MemoryNodeLink):
    """Serves `data` in 1000-byte chunks; stops (as a dropped link) after `cut_after` bytes."""

    def __init__(self, data: bytes, cut_after: int | None = None) -> None:
        super().__init__(MemoryLinkPeer())
        self.data = data
        self.cut_after = cut_after
        self.offsets: list[int] = []
        self.closed_early = False

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        self.offsets.append(offset)
        position = offset
        while position < len(self.data):
            if self.cut_after is not None and position >= self.cut_after:
                self.cut_after = None
                raise LinkUnavailableError("cut")
            chunk = self.data[position : position + 1000]
            position += len(chunk)
            try:
                yield chunk
            except GeneratorExit:
                self.closed_early = True  # closed by the reader, not run to its end
                raise


async def test_resume_after_a_cut_gives_the_signed_file(tmp_path: Path) -> None:
    link = CuttingLink(DATA, cut_after=3000)
    with pytest.raises(LinkUnavailableError):
        await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert partial_path(tmp_path, TARGET.sha256).stat().st_size == 3000
    path = await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert path.read_bytes() == DATA
    assert link.offsets == [0, 3000]


async def test_stream_ending_early_is_incomplete_and_kept(tmp_path: Path) -> None:
    link = CuttingLink(DATA[:5000])
    with pytest.raises(ArtifactIncompleteError):
        await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert partial_path(tmp_path, TARGET.sha256).stat().st_size == 5000


async def test_corrupt_prefix_is_detected_and_downloaded_again(tmp_path: Path) -> None:
    partial_path(tmp_path, TARGET.sha256).write_bytes(b"\xff" * 2000)
    link = CuttingLink(DATA)
    path = await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert path.read_bytes() == DATA
    assert link.offsets == [2000, 0]


async def test_tampered_bytes_are_refused_and_deleted(tmp_path: Path) -> None:
    link = CuttingLink(b"x" * len(DATA))
    with pytest.raises(ArtifactHashError) as caught:
        await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert caught.value.reason == "hash-mismatch"
    assert not partial_path(tmp_path, TARGET.sha256).exists()
    assert link.offsets == [0]  # a whole download that does not verify is not fetched again


async def test_a_bad_result_after_a_resume_is_fetched_once_more_from_zero(
    tmp_path: Path,
) -> None:
    partial_path(tmp_path, TARGET.sha256).write_bytes(b"x" * 2000)
    link = CuttingLink(b"x" * len(DATA))
    with pytest.raises(ArtifactHashError):
        await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert link.offsets == [2000, 0]  # the prefix may have been the bad part: once more


async def test_more_bytes_than_signed_are_refused(tmp_path: Path) -> None:
    link = CuttingLink(DATA + b"extra")
    with pytest.raises(ArtifactTooLargeError) as caught:
        await download_target(link, TARGET, tmp_path, max_bytes=1 << 20)
    assert caught.value.reason == "too-many-bytes"
    assert not partial_path(tmp_path, TARGET.sha256).exists()
    # The stream was closed at once (over HTTPS it holds a connection), not left to GC.
    assert link.closed_early


async def test_target_over_the_limit_is_refused_unfetched(tmp_path: Path) -> None:
    link = CuttingLink(DATA)
    with pytest.raises(ArtifactTooLargeError):
        await download_target(link, TARGET, tmp_path, max_bytes=100)
    assert link.offsets == []


async def test_disk_full_refuses_before_a_byte_is_written(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", disk_usage=lambda _: DiskUsage(10**9, 10**9, 1000))
    link = CuttingLink(DATA)
    with pytest.raises(DiskFullError):
        await download_target(
            link,
            TARGET,
            store.staging_dir,
            max_bytes=1 << 20,
            check_space=lambda n: store.check_space(n, 0),
        )
    assert link.offsets == []
    assert store.disk_full_refusals == 1


async def test_memory_link_download(tmp_path: Path) -> None:
    peer = MemoryLinkPeer()
    peer.artifacts[TARGET.sha256] = DATA
    path = await download_target(MemoryNodeLink(peer), TARGET, tmp_path, max_bytes=1 << 20)
    assert path == partial_path(tmp_path, TARGET.sha256)
    assert path.read_bytes() == DATA
