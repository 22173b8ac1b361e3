"""`HttpsRepository`: the fleet's TUF repository over the control plane's HTTPS API.

For nodes whose link carries no models (MQTT: the broker is for small messages). It
reads the same files the gRPC `FetchMetadata` / `FetchArtifact` serve, from the REST
routes of docs/protocol.md "The TUF repository":

    metadata  GET {base}/v1/fleets/{fleet}/tuf/metadata/{filename}
    target    GET {base}/v1/fleets/{fleet}/tuf/targets/{dir}/{sha256}.{name}
              with `Range: bytes={offset}-` to resume

These routes are open, like any TUF repository: the node trusts no byte it reads until
python-tuf (metadata) and `download` (hash and length against signed metadata) have
verified it: HTTPS keeps the transfer private, TUF makes it trustworthy (docs/adr/0016). A
`RepositorySource`, so `LinkFetcher` and the reconciler use it as they use the link.

Errors are the link's: 404 is `LinkNotFoundError` (TUF looks for the next root that
way), another 4xx `LinkRequestError`, 5xx and network failures `LinkUnavailableError`
(the reconciler retries and the download resumes). Metadata is capped per role at
python-tuf's own limits (`UpdaterConfig`: 16 KiB for `timestamp.json`, so an endless one
costs what it costs a stock client), and never above `max_metadata_bytes`; artifacts are
capped by `download` at their signed length.
Not here: the node link (`edge_node.link`), verification (`tuf_fetch`, `download`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx

from edge_node.enroll import http_error, http_verify, is_loopback_url
from edge_node.errors import InvalidInputError
from edge_node.link.base import LinkNotFoundError, LinkRequestError, LinkUnavailableError

__all__ = ["HttpsRepository", "HttpsRepositoryConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpsRepositoryConfig:
    base_url: str  # the control plane's REST API, e.g. https://cp.example.com
    fleet: str
    ca_file: Path | None = None  # PEM bundle for the server; None: the system's CAs
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    # Per role, python-tuf's defaults (`tuf.ngclient.UpdaterConfig`), which ngclient
    # enforces again on what it is handed; here they stop the read itself.
    max_root_bytes: int = 512_000
    max_timestamp_bytes: int = 16_384
    max_snapshot_bytes: int = 2_000_000
    max_targets_bytes: int = 5_000_000  # targets and delegated targets roles
    max_metadata_bytes: int = 16 << 20  # any file, whatever its role

    def metadata_limit(self, filename: str) -> int:
        """The most bytes read for `filename` (`timestamp.json`, `3.snapshot.json`, …)."""
        name = filename.removesuffix(".json")
        role = name if name == "timestamp" else name.partition(".")[2]
        per_role = {
            "timestamp": self.max_timestamp_bytes,
            "root": self.max_root_bytes,
            "snapshot": self.max_snapshot_bytes,
        }
        return min(per_role.get(role, self.max_targets_bytes), self.max_metadata_bytes)

    def __post_init__(self) -> None:
        url = httpx.URL(self.base_url)
        if url.scheme not in ("https", "http") or not url.host:
            raise InvalidInputError(f"{self.base_url!r} is not an http(s) URL")
        if url.scheme == "http" and not is_loopback_url(self.base_url):
            raise InvalidInputError(
                f"{self.base_url} is plain http to another machine: use https",
                url=self.base_url,
            )


class HttpsRepository:
    """One HTTP client (connection pool) per node; `close()` is idempotent. Use it from
    one event loop: the one the agent runs in."""

    def __init__(
        self,
        config: HttpsRepositoryConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`transport` replaces the network (tests pass `httpx.MockTransport`)."""
        self._config = config
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        base = config.base_url.rstrip("/")
        fleet = quote(config.fleet, safe="")
        self._metadata_url = f"{base}/v1/fleets/{fleet}/tuf/metadata/"
        self._targets_url = f"{base}/v1/fleets/{fleet}/tuf/targets/"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            config = self._config
            self._client = httpx.AsyncClient(
                verify=http_verify(config.ca_file),
                timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
                follow_redirects=False,
                transport=self._transport,
            )
        return self._client

    async def fetch_metadata(self, filename: str) -> bytes:
        if not filename or "/" in filename or filename in (".", ".."):
            raise LinkNotFoundError(f"{filename[:80]!r} is not a metadata file name")
        url = self._metadata_url + quote(filename, safe="")
        limit = self._config.metadata_limit(filename)
        try:
            async with self._http().stream("GET", url) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _refused(response, url)
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise LinkRequestError(
                        f"{url}: metadata over {limit} bytes ({declared} declared)",
                        limit=limit,
                        url=url,
                    )
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise LinkRequestError(
                            f"{url}: metadata over {limit} bytes", limit=limit, url=url
                        )
        except httpx.TransportError as exc:
            raise LinkUnavailableError(f"{url}: {exc}") from exc
        return bytes(body)

    async def fetch_artifact(
        self, target_path: str, sha256: str, offset: int = 0
    ) -> AsyncIterator[bytes]:
        url = self._targets_url + _hashed_target(target_path, sha256)
        headers = {"Range": f"bytes={offset}-"} if offset > 0 else {}
        try:
            async with self._http().stream("GET", url, headers=headers) as response:
                status = response.status_code
                if status not in (200, 206):
                    await response.aread()
                    raise _refused(response, url)
                skip = offset if status == 200 else 0  # the server ignored the range
                if status == 206:
                    _check_range(response, offset, url)
                # As received, not re-chunked: bytes buffered for a bigger chunk would be
                # lost with a cut connection, and the resume would start before them.
                async for chunk in response.aiter_bytes():
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk = chunk[dropped:]
                        skip -= dropped
                    if chunk:
                        yield chunk
        except httpx.TransportError as exc:
            raise LinkUnavailableError(f"{url}: {exc}") from exc

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _hashed_target(target_path: str, sha256: str) -> str:
    """`dir/<sha256>.<name>`: the consistent-snapshot URL path of a target."""
    parts = target_path.split("/")
    if any(p in ("", ".", "..") for p in parts) or len(sha256) != 64:
        raise LinkNotFoundError(f"{target_path[:200]!r} is not a target path")
    parts[-1] = f"{sha256}.{parts[-1]}"
    return "/".join(quote(p, safe="") for p in parts)


def _check_range(response: httpx.Response, offset: int, url: str) -> None:
    content_range = response.headers.get("content-range", "")
    unit, _, spec = content_range.partition(" ")
    start = spec.partition("-")[0]
    if unit != "bytes" or not start.isdigit() or int(start) != offset:
        raise LinkRequestError(
            f"{url}: asked for bytes from {offset}, got {content_range[:80]!r}", url=url
        )


def _refused(response: httpx.Response, url: str) -> Exception:
    if response.status_code == 404:
        return LinkNotFoundError(f"{url}: not found", url=url)
    return http_error(response, url)
