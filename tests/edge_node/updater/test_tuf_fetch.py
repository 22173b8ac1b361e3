"""LinkFetcher: ngclient URLs onto NodeLink, errors as ngclient expects them."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from tuf.api.exceptions import DownloadError, DownloadHTTPError, DownloadLengthMismatchError

from edge_node.link.base import LinkUnavailableError
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from edge_node.updater.tuf_fetch import METADATA_BASE_URL, TARGETS_BASE_URL, LinkFetcher

pytestmark = pytest.mark.anyio

DATA = b"model bytes" * 100
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class DownLink(MemoryNodeLink):
    async def fetch_metadata(self, filename: str) -> bytes:
        raise LinkUnavailableError("down")


def fetcher(link: MemoryNodeLink) -> LinkFetcher:
    return LinkFetcher(link, asyncio.get_running_loop(), call_timeout_s=5)


async def test_metadata_and_targets_map_onto_the_link() -> None:
    peer = MemoryLinkPeer()
    peer.metadata["timestamp.json"] = b"{}"
    peer.artifacts[SHA] = DATA
    f = fetcher(MemoryNodeLink(peer))
    assert await asyncio.to_thread(f.download_bytes, METADATA_BASE_URL + "timestamp.json", 10) == (
        b"{}"
    )
    url = f"{TARGETS_BASE_URL}models/det/1.0.0/{SHA}.model.onnx"
    assert await asyncio.to_thread(f.download_bytes, url, len(DATA)) == DATA
    with pytest.raises(DownloadLengthMismatchError):
        await asyncio.to_thread(f.download_bytes, url, len(DATA) - 1)


async def test_not_found_is_404_and_unavailable_is_download_error() -> None:
    f = fetcher(MemoryNodeLink(MemoryLinkPeer()))
    with pytest.raises(DownloadHTTPError) as caught:
        await asyncio.to_thread(f.download_bytes, METADATA_BASE_URL + "2.root.json", 100)
    assert caught.value.status_code == 404
    down = fetcher(DownLink(MemoryLinkPeer()))
    with pytest.raises(DownloadError) as failed:
        await asyncio.to_thread(down.download_bytes, METADATA_BASE_URL + "timestamp.json", 100)
    assert not isinstance(failed.value, DownloadHTTPError)


async def test_calling_from_the_loop_thread_is_refused_not_deadlocked() -> None:
    f = fetcher(MemoryNodeLink(MemoryLinkPeer()))
    with pytest.raises(DownloadError):
        f.download_bytes(METADATA_BASE_URL + "timestamp.json", 100)
