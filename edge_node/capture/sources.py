"""Adapters that fetch one snapshot per call: an HTTP(S) snapshot URL and a drop directory.

What it is for: the I/O of capture behind one small port, :class:`SnapshotSource`
(``grab() -> Snapshot | None``). Every failure is translated at this boundary into a
:class:`CaptureError` whose ``reason`` is the counter label (``timeout``, ``connect``,
``http_503``, ``auth``, ``not_image``, ``too_large``, ``empty``, ``read_error``, …);
the bytes are not decoded here (the pipeline decodes, and counts corrupt JPEGs as bad).

What it is not for: pacing, retrying and counting (``edge_node.capture.service`` and
``edge_node.capture.schedule``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread
import httpx

from edge_node.capture.config import DirectorySourceConfig, HttpSourceConfig
from edge_node.capture.schedule import CaptureCounters, FileEntry, FilePicker
from edge_node.clock import Clock
from edge_node.errors import EdgeNodeError

__all__ = [
    "CaptureError",
    "DirectorySource",
    "HttpSnapshotSource",
    "Snapshot",
    "SnapshotSource",
]

_log = logging.getLogger(__name__)


class CaptureError(EdgeNodeError):
    """One snapshot could not be had; ``reason`` is what the failure is counted as."""

    title = "camera capture failed"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, reason=reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Snapshot:
    data: bytes
    captured_at: datetime


class SnapshotSource(Protocol):
    async def grab(self) -> Snapshot | None:
        """The next frame's encoded bytes, None when there is nothing new; raises
        :class:`CaptureError`."""
        ...

    async def aclose(self) -> None: ...


class HttpSnapshotSource:
    """GET a JPEG snapshot URL; ``transport`` is the test seam (httpx's own)."""

    def __init__(
        self,
        config: HttpSourceConfig,
        clock: Clock,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        auth = (
            None
            if config.credentials is None
            else httpx.BasicAuth(config.credentials.username, config.credentials.password)
        )
        self._client = httpx.AsyncClient(
            auth=auth,
            timeout=httpx.Timeout(config.timeout_s),
            verify=config.verify_tls,
            follow_redirects=False,
            transport=transport,
        )

    async def grab(self) -> Snapshot:
        config = self._config
        # httpx's timeout is per phase; a camera dripping bytes is bounded here as a whole.
        with anyio.move_on_after(config.timeout_s) as scope:
            data = await self._fetch()
        if scope.cancelled_caught:
            raise CaptureError(f"no snapshot within {config.timeout_s}s", reason="timeout")
        return Snapshot(data, self._clock.now())

    async def _fetch(self) -> bytes:
        config = self._config
        try:
            async with self._client.stream("GET", config.url) as response:
                status = response.status_code
                if status in (401, 403):
                    raise CaptureError(
                        f"the camera refused the credentials (HTTP {status})", reason="auth"
                    )
                if status != 200:
                    raise CaptureError(f"HTTP {status} from the camera", reason=f"http_{status}")
                kind = response.headers.get("content-type", "").lower()
                if kind.startswith("text/"):
                    raise CaptureError(
                        f"the camera answered {kind}, not an image", reason="not_image"
                    )
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > config.max_bytes:
                    raise CaptureError(
                        f"snapshot of {declared} bytes, over {config.max_bytes}", reason="too_large"
                    )
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > config.max_bytes:
                        raise CaptureError(
                            f"snapshot over {config.max_bytes} bytes", reason="too_large"
                        )
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise CaptureError(f"camera timed out: {exc!r}", reason="timeout") from exc
        except httpx.ConnectError as exc:
            raise CaptureError(f"cannot connect to the camera: {exc}", reason="connect") from exc
        except httpx.HTTPError as exc:
            raise CaptureError(
                f"HTTP error from the camera: {type(exc).__name__}: {exc}", reason="transport"
            ) from exc
        if not size:
            raise CaptureError("the camera sent an empty snapshot", reason="empty")
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self._client.aclose()


class DirectorySource:
    """The newest finished file of a drop directory per grab (see ``FilePicker``).

    Files passed over for a newer one are counted as ``superseded``, files older than a
    frame already taken as discarded ``stale``, and files left at 0 bytes as discarded
    ``empty``; all of them, like the file read, are kept, deleted or moved as configured.
    Scanning and reading run in a worker thread.
    """

    def __init__(self, config: DirectorySourceConfig, counters: CaptureCounters) -> None:
        self._config = config
        self._counters = counters
        self._picker = FilePicker(config.settle_s, config.empty_after_s)

    async def grab(self) -> Snapshot | None:
        # Abandoned on cancel: a hung network mount must not hold up the agent's stop.
        return await anyio.to_thread.run_sync(self._grab, abandon_on_cancel=True)

    async def aclose(self) -> None:
        return None

    def _grab(self) -> Snapshot | None:
        config = self._config
        pick = self._picker.pick(self._scan(), time.time_ns())
        if pick.superseded:
            self._counters.count_superseded(len(pick.superseded))
        for reason, entries in (("stale", pick.stale), ("empty", pick.empty)):
            if entries:
                self._counters.count_discarded(reason, len(entries))
        try:
            if pick.take is None:
                return None
            path = config.directory / pick.take.name
            if pick.take.size > config.max_bytes:
                raise CaptureError(
                    f"{path} is {pick.take.size} bytes, over {config.max_bytes}",
                    reason="too_large",
                )
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise CaptureError(f"cannot read {path}: {exc}", reason="read_error") from exc
            return Snapshot(data, datetime.fromtimestamp(pick.take.mtime_ns / 1e9, UTC))
        finally:
            for entry in pick.done:
                self._dispose(config.directory / entry.name)

    def _scan(self) -> list[FileEntry]:
        config = self._config
        entries: list[FileEntry] = []
        try:
            with os.scandir(config.directory) as listing:
                for item in listing:
                    if not item.name.lower().endswith(config.suffixes) or item.name.startswith("."):
                        continue
                    try:
                        if not item.is_file(follow_symlinks=False):
                            continue
                        stat = item.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed between the listing and the stat
                    entries.append(FileEntry(item.name, stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError as exc:
            raise CaptureError(
                f"the drop directory {config.directory} does not exist", reason="missing_directory"
            ) from exc
        except OSError as exc:
            raise CaptureError(
                f"cannot list {config.directory}: {exc}", reason="read_error"
            ) from exc
        return entries

    def _dispose(self, path: Path) -> None:
        config = self._config
        try:
            if config.after_read == "delete":
                path.unlink(missing_ok=True)
            elif config.after_read == "move" and config.move_to is not None:
                config.move_to.mkdir(parents=True, exist_ok=True)
                # shutil.move copies across filesystems (a tmpfs drop, an archive on disk),
                # where a rename fails with EXDEV.
                shutil.move(path, config.move_to / path.name)
        except OSError as exc:  # the frame was had; the file stays and is not read again
            self._counters.count_failure("dispose_error")
            _log.warning("cannot %s %s: %s", config.after_read, path, exc)
