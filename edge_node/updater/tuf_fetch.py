"""TUF over the node's link: `LinkFetcher` feeds `tuf.ngclient.Updater` through a
`RepositorySource` — the `NodeLink` of a gRPC node, or `HttpsRepository` for an MQTT node.

ngclient is synchronous and the link is asyncio: the fetcher runs each link call on the
agent's event loop from ngclient's worker thread (`asyncio.run_coroutine_threadsafe`),
so **`TufClient.refresh()` and every `TufView` lookup must run in a worker thread**
(`asyncio.to_thread`), never on the loop itself (that would deadlock; it is refused).

`TufClient.refresh()` builds a fresh `Updater` each time (DESIGN §3), bootstrapped from
the node's enrolled `tuf-root.json` on first use and from its own verified cache after,
and returns a `TufView`: answers from verified metadata in the node's terms
(`TargetInfo`, floors). `TufClient.cached_view()` answers the same from the metadata the
last refresh kept, offline (start-up: is the model about to be served revoked?). Not
here: downloading model files (see `download`), which uses the link directly so it can
resume.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

from securesystemslib.signer import Key
from tuf.api.exceptions import DownloadError, DownloadHTTPError, RepositoryError
from tuf.api.metadata import Metadata, Root, TargetFile, Targets
from tuf.api.serialization import DeserializationError
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface

from edge_node.errors import InvalidInputError
from edge_node.link.base import LinkNotFoundError, LinkRequestError
from edge_node.updater.director import TargetInfo, director_keys_of_root
from edge_node.updater.source import RepositorySource

__all__ = [
    "METADATA_BASE_URL",
    "TARGETS_BASE_URL",
    "CachedTufView",
    "LinkFetcher",
    "TufClient",
    "TufView",
    "floor_target_path",
]

_BASE: Final = "link://control-plane/"
METADATA_BASE_URL: Final = _BASE + "metadata/"
TARGETS_BASE_URL: Final = _BASE + "targets/"
DEFAULT_CALL_TIMEOUT_S: Final = 60.0
_NOT_FOUND: Final = 404

_T = TypeVar("_T")
_log = logging.getLogger(__name__)


def floor_target_path(model: str) -> str:
    """`floors/<model>.json`: the target whose custom `floor` forbids older releases."""
    return f"floors/{model}.json"


class LinkFetcher(FetcherInterface):
    """ngclient's network port over a `RepositorySource` (the link, or HTTPS).

    URLs are `METADATA_BASE_URL + <file>` (→ `fetch_metadata(file)`) and
    `TARGETS_BASE_URL + <dir>/<sha256>.<name>` (→ `fetch_artifact(<dir>/<name>, sha256)`).
    Not found becomes `DownloadHTTPError(…, 404)` (ngclient relies on it to stop looking
    for the next root); anything else the link raises becomes `DownloadError` (via
    `FetcherInterface.fetch`). ngclient's `download_bytes` enforces its length limits.
    """

    def __init__(
        self,
        link: RepositorySource,
        loop: asyncio.AbstractEventLoop,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self._link = link
        self._loop = loop
        self._timeout = call_timeout_s

    def _fetch(self, url: str) -> Iterator[bytes]:
        if url.startswith(METADATA_BASE_URL):
            filename = url.removeprefix(METADATA_BASE_URL)
            return iter([self._call(self._link.fetch_metadata(filename), url)])
        if url.startswith(TARGETS_BASE_URL):
            target_path, sha256 = _split_hashed(url.removeprefix(TARGETS_BASE_URL), url)
            return self._stream(self._link.fetch_artifact(target_path, sha256), url)
        raise DownloadHTTPError(f"{url} is not served over the link", _NOT_FOUND)

    def _call(self, coro: Coroutine[Any, Any, _T], url: str) -> _T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("LinkFetcher must be used from a worker thread, not the loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise DownloadError(f"{url}: no answer within {self._timeout:g}s") from exc
        except LinkNotFoundError as exc:
            raise DownloadHTTPError(f"{url}: {exc}", _NOT_FOUND) from exc
        except LinkRequestError as exc:
            raise DownloadError(f"{url}: refused: {exc}") from exc

    def _stream(self, chunks: AsyncIterator[bytes], url: str) -> Iterator[bytes]:
        async def next_chunk() -> bytes | None:
            return await anext(chunks, None)

        async def close() -> None:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while (chunk := self._call(next_chunk(), url)) is not None:
                yield chunk
        finally:
            # Stopped early (length limit) or failed: free the stream on the loop.
            with contextlib.suppress(Exception):  # best effort; the cause propagates
                self._call(close(), url)


def _split_hashed(rest: str, url: str) -> tuple[str, str]:
    directory, _, name = rest.rpartition("/")
    sha256, dot, base = name.partition(".")
    if not dot or len(sha256) != 64 or not base:
        raise DownloadHTTPError(f"{url} is not a consistent-snapshot target URL", _NOT_FOUND)
    return (f"{directory}/{base}" if directory else base), sha256


def _root_director_keys(root: Root | None, where: Path) -> list[Key]:
    """The director keys a verified root lists ([] for none, or for a list that is not
    usable: logged, and the node keeps its enrollment-time key)."""
    if root is None:
        return []
    try:
        return director_keys_of_root(root.to_dict())
    except InvalidInputError as exc:
        _log.error("the TUF root in %s lists unusable director keys: %s", where, exc)
        return []


def _verified_root(metadata_dir: Path) -> Root | None:
    """`root.json` as ngclient keeps it: written only after it verified (the newest)."""
    try:
        md = Metadata[Root].from_bytes((metadata_dir / "root.json").read_bytes())
    except (OSError, DeserializationError) as exc:
        _log.error("cannot read the verified TUF root in %s: %s", metadata_dir, exc)
        return None
    return md.signed if isinstance(md.signed, Root) else None


class TufView:
    """Verified TUF metadata after one refresh, in the node's terms. Call from a thread:
    a lookup may fetch delegated metadata over the link."""

    def __init__(self, updater: Updater, director_keys: list[Key] | None = None) -> None:
        self._updater = updater
        self._director_keys = list(director_keys or [])

    def director_keys(self) -> list[Key]:
        """The director keys the verified root lists ([] when it lists none)."""
        return list(self._director_keys)

    def target(self, path: str) -> TargetInfo | None:
        info = self._updater.get_targetinfo(path)
        return None if info is None else _target_info(info)

    def floor(self, model: str) -> int:
        """The model's signed floor: the `floor` in the custom of `floors/<model>.json`; 0
        when the model has none (or the entry carries no valid one)."""
        info = self._updater.get_targetinfo(floor_target_path(model))
        return 0 if info is None else _floor_of(info.custom or {})


def _floor_of(custom: Any) -> int:
    floor = custom.get("floor") if isinstance(custom, dict) else None
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
        return 0
    return floor


class CachedTufView:
    """The top-level targets the last refresh verified and kept (`<metadata dir>/targets.
    json`), checked again offline against the cached root's targets keys and threshold;
    expiry is not checked (the node may be offline for days; floors only rise, so an old
    floor is the least that holds). No cache, or one that does not verify (logged): no
    targets and no floors — nothing is known to be revoked."""

    def __init__(self, metadata_dir: Path) -> None:
        self._targets: dict[str, TargetFile] = {}
        self._director_keys: list[Key] = []
        root_file, targets_file = metadata_dir / "root.json", metadata_dir / "targets.json"
        if not targets_file.is_file():
            return
        try:
            root = Metadata[Root].from_bytes(root_file.read_bytes())
            targets = Metadata[Targets].from_bytes(targets_file.read_bytes())
            root.verify_delegate(Targets.type, targets)
        except (OSError, ValueError, DeserializationError, RepositoryError) as exc:
            _log.error("the cached TUF metadata in %s is unusable: %s", metadata_dir, exc)
            return
        self._targets = dict(targets.signed.targets)
        self._director_keys = _root_director_keys(root.signed, metadata_dir)

    def director_keys(self) -> list[Key]:
        return list(self._director_keys)

    def target(self, path: str) -> TargetInfo | None:
        target = self._targets.get(path)
        return None if target is None else _target_info(target)

    def floor(self, model: str) -> int:
        target = self._targets.get(floor_target_path(model))
        return 0 if target is None else _floor_of(target.custom or {})


class TufClient:
    """A fresh `Updater` per `refresh()` over the link; metadata cached in `metadata_dir`."""

    def __init__(
        self,
        link: RepositorySource,
        loop: asyncio.AbstractEventLoop,
        *,
        metadata_dir: Path,
        trusted_root: Path,
        config: UpdaterConfig | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self._fetcher = LinkFetcher(link, loop, call_timeout_s=call_timeout_s)
        self._metadata_dir = Path(metadata_dir)
        self._trusted_root = Path(trusted_root)
        self._config = config or UpdaterConfig()

    def refresh(self) -> TufView:
        """Refresh root → timestamp → snapshot → targets; blocking, call it in a thread.

        Raises python-tuf's `RepositoryError` (bad metadata) or `DownloadError` (link).
        """
        self._metadata_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        cached_root = self._metadata_dir / "root.json"
        # After the first refresh ngclient keeps the newest verified root in its cache;
        # before it, the root handed over at enrollment is the trust anchor.
        bootstrap = None if cached_root.is_file() else self._trusted_root.read_bytes()
        updater = Updater(
            metadata_dir=str(self._metadata_dir),
            metadata_base_url=METADATA_BASE_URL,
            target_dir=None,
            target_base_url=TARGETS_BASE_URL,
            fetcher=self._fetcher,
            config=self._config,
            bootstrap=bootstrap,
        )
        updater.refresh()
        keys = _root_director_keys(_verified_root(self._metadata_dir), self._metadata_dir)
        return TufView(updater, keys)

    def cached_view(self) -> CachedTufView:
        """What the last refresh verified, offline (blocking: reads two files)."""
        return CachedTufView(self._metadata_dir)


def _target_info(target: TargetFile) -> TargetInfo:
    return TargetInfo(
        path=target.path,
        sha256=str(target.hashes.get("sha256", "")),
        length=target.length,
        custom=dict(target.custom or {}),
    )
