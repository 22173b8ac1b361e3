"""Download one TUF target (over the node link or HTTPS) into the store, resumably.

The file grows as `staging/<sha256>.part` (same filesystem as the store, so `install`
is a rename). After a cut the next call resumes from the file's current size; the
prefix on disk is hashed first so the digest covers every byte. The stream is capped at
the target's signed length, and the file is trusted only when sha256 and length match
TUF's. Not here: deciding what to download (the reconciler) or installing it (the store).

    ArtifactRejectedError (refused; the .part file is deleted)
    ├── ArtifactTooLargeError   over `max_bytes`, or the server sent more than the length
    └── ArtifactHashError       the bytes do not hash to the signed sha256
    ArtifactIncompleteError     the stream ended early: a LinkUnavailableError, retry resumes
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from edge_node.errors import EdgeNodeError
from edge_node.fsutil import fsync_dir, fsync_file
from edge_node.link.base import LinkUnavailableError
from edge_node.updater.director import TargetInfo
from edge_node.updater.source import RepositorySource

__all__ = [
    "ArtifactHashError",
    "ArtifactIncompleteError",
    "ArtifactRejectedError",
    "ArtifactTooLargeError",
    "download_target",
    "partial_path",
]

_CHUNK: Final = 1 << 20


class ArtifactRejectedError(EdgeNodeError):
    """The downloaded artifact is not the signed one; it was deleted."""

    title = "artifact rejected"

    def __init__(self, message: str, *, reason: str, **fields: object) -> None:
        super().__init__(message, reason=reason, **fields)
        self.reason = reason


class ArtifactTooLargeError(ArtifactRejectedError):
    title = "artifact too large"


class ArtifactHashError(ArtifactRejectedError):
    title = "artifact hash mismatch"


class ArtifactIncompleteError(LinkUnavailableError):
    """The stream ended before `length` bytes; the part file is kept for a resume."""

    title = "artifact download incomplete"


def partial_path(staging_dir: Path, sha256: str) -> Path:
    return Path(staging_dir) / f"{sha256}.part"


async def download_target(
    link: RepositorySource,
    target: TargetInfo,
    staging_dir: Path,
    *,
    max_bytes: int,
    check_space: Callable[[int], None] | None = None,
) -> Path:
    """Fetch `target` (resuming a part file), verify it, fsync it and return its path.

    `check_space(bytes_still_needed)` is called before any byte is written (pass
    `lambda n: store.check_space(n, margin)`); it raises to refuse. A link failure
    propagates with the part file kept; a hash or length failure deletes it. A resumed
    download whose result does not verify is retried once from byte zero (the prefix on
    disk may be what was corrupt).
    """
    if target.length > max_bytes:
        raise ArtifactTooLargeError(
            f"{target.path} is {target.length} bytes, over the {max_bytes} byte limit",
            reason="too-large",
            length=target.length,
            max_bytes=max_bytes,
        )
    part = partial_path(staging_dir, target.sha256)
    part.parent.mkdir(parents=True, exist_ok=True)
    # Hashing and fsyncing a model of gigabytes take seconds: off the event loop, which
    # meanwhile serves the uplink, heartbeats and camera capture.
    resumed = await _fetch_into(link, target, part, check_space)
    if await anyio.to_thread.run_sync(_finish, target, part, resumed):
        return part
    # The resumed prefix was bad: start over once, from nothing.
    await _fetch_into(link, target, part, check_space)
    if await anyio.to_thread.run_sync(_finish, target, part, False):
        return part
    raise AssertionError("unreachable: _finish raises when not resumed")  # pragma: no cover


async def _fetch_into(
    link: RepositorySource,
    target: TargetInfo,
    part: Path,
    check_space: Callable[[int], None] | None,
) -> bool:
    """Append the missing bytes to `part`; True when an existing prefix was kept."""
    digest = hashlib.sha256()
    size = await anyio.to_thread.run_sync(_hash_prefix, part, digest, target.length)
    if check_space is not None:
        check_space(target.length - size)
    if size == target.length:
        return size > 0
    stream = link.fetch_artifact(target.path, target.sha256, size)
    try:
        await _append(stream, part, target, size)
    finally:
        # A stream left early (too many bytes, an error) is closed now, not at garbage
        # collection: over HTTPS it holds a connection.
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    # Only a kept prefix makes a bad result worth one more try from zero: a download
    # that started at byte zero and does not verify is what the server sends.
    return size > 0


async def _append(stream: AsyncIterator[bytes], part: Path, target: TargetInfo, size: int) -> None:
    with part.open("ab") as f:
        async for chunk in stream:
            if size + len(chunk) > target.length:
                f.close()
                part.unlink(missing_ok=True)
                raise ArtifactTooLargeError(
                    f"{target.path}: the server sent more than the signed {target.length} bytes",
                    reason="too-many-bytes",
                    length=target.length,
                )
            f.write(chunk)
            size += len(chunk)
    if size < target.length:
        raise ArtifactIncompleteError(
            f"{target.path}: stream ended at {size} of {target.length} bytes",
            offset=size,
            length=target.length,
        )


def _hash_prefix(part: Path, digest: hashlib._Hash, length: int) -> int:
    """Hash what is already on disk; a file longer than the target is dropped."""
    try:
        size = part.stat().st_size
    except FileNotFoundError:
        return 0
    if size > length:
        part.unlink()
        return 0
    with part.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return size


def _finish(target: TargetInfo, part: Path, resumed: bool) -> bool:
    """Verify the complete part file; fsync and True if good. A bad one is deleted; then
    False after a resume (try again from zero), else ArtifactHashError."""
    digest = hashlib.sha256()
    size = _hash_prefix(part, digest, target.length)
    if size == target.length and digest.hexdigest() == target.sha256:
        fsync_file(part)
        fsync_dir(part.parent)
        return True
    part.unlink(missing_ok=True)
    if resumed:
        return False
    raise ArtifactHashError(
        f"{target.path}: downloaded bytes have sha256 {digest.hexdigest()}, "
        f"the signed one is {target.sha256}",
        reason="hash-mismatch",
        expected_sha256=target.sha256,
        sha256=digest.hexdigest(),
    )
