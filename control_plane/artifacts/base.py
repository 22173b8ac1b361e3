"""The ``ArtifactStore`` port: content-addressed, streamed storage of artifacts by sha256.

It validates arguments, enforces limits and verifies uploads; adapters only move bytes.
It knows nothing of HTTP, models or TUF metadata.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Generator, Iterable, Iterator

from control_plane.errors import (
    ArtifactIntegrityError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    StorageError,
)

DEFAULT_MAX_LENGTH = 4 << 30
"""Default hard cap on one artifact: 4 GiB."""

MAX_BUFFER_SIZE = 8 << 20
"""The most an adapter may hold in memory for one stream (read chunk or upload part)."""

DEFAULT_READ_CHUNK_SIZE = 1 << 20

MAX_URL_EXPIRY_S = 7 * 24 * 3600
"""S3 refuses presigned URLs valid for longer than a week; the port holds every adapter to it."""

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def check_sha256(sha256: str) -> str:
    """Return ``sha256`` if it is 64 lowercase hex digits, else raise ``InvalidInputError``."""
    if not isinstance(sha256, str) or _SHA256_HEX.fullmatch(sha256) is None:
        raise InvalidInputError(
            "sha256 must be 64 lowercase hexadecimal digits", sha256=repr(sha256)[:80]
        )
    return sha256


class ArtifactStore(abc.ABC):
    """Port. Public methods validate arguments and enforce limits, then call the _abstract ones.

    Adapters implement ``_put``, ``_open_range``, ``_size``, ``_delete`` and ``_download_url``.
    ``_put`` receives an iterator that raises ``ArtifactIntegrityError`` *instead of ending*
    when the stream is wrong, so an adapter that makes the object visible only after the
    iterator is exhausted never publishes unverified bytes. Adapters translate their own
    backend failures into ``StorageError`` / ``NotFoundError`` and let every other
    exception (notably one raised by the caller's chunk iterator) propagate unchanged.
    Instances are safe to share between threads.
    """

    def __init__(self, *, max_length: int = DEFAULT_MAX_LENGTH) -> None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise ValueError(f"max_length must be a non-negative int, got {max_length!r}")
        self.max_length = max_length

    # -- public API ---------------------------------------------------------------------------

    def put(self, sha256: str, length: int, chunks: Iterable[bytes]) -> bool:
        """Store the stream ``chunks`` under ``sha256``; True if new, False if already stored.

        The stream is hashed and counted while it flows; reading stops as soon as more
        than ``length`` bytes arrived. On a mismatch ``ArtifactIntegrityError`` is raised
        and nothing is left behind. An existing artifact is not rewritten, but the stream
        is still read and verified, so a caller can prove it holds the bytes. ``chunks``
        is not closed: the caller owns it.
        """
        check_sha256(sha256)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise InvalidInputError("length must be a non-negative integer", length=repr(length))
        if length > self.max_length:
            raise PayloadTooLargeError(
                f"artifact of {length} bytes exceeds the limit of {self.max_length} bytes",
                sha256=sha256,
                length=length,
                max_length=self.max_length,
            )
        verified = _verified_stream(sha256, length, chunks)
        try:
            if self._size(sha256) is not None:
                for _ in verified:
                    pass
                return False
            self._put(sha256, length, verified)
        finally:
            verified.close()
        return True

    def open_range(
        self,
        sha256: str,
        start: int = 0,
        end: int | None = None,
        chunk_size: int = DEFAULT_READ_CHUNK_SIZE,
    ) -> Generator[bytes, None, None]:
        """Stream bytes ``[start, end)`` (``end=None``: to the end) in chunks of ``chunk_size``.

        Arguments and existence are checked now, not at the first ``next()``. The result
        is a generator: ``close()`` it when stopping early to release the backend handle.
        A backend that returns a different number of bytes raises ``StorageError``.
        """
        check_sha256(sha256)
        if (
            isinstance(chunk_size, bool)
            or not isinstance(chunk_size, int)
            or not 0 < chunk_size <= MAX_BUFFER_SIZE
        ):
            raise InvalidInputError(
                f"chunk_size must be between 1 and {MAX_BUFFER_SIZE}", chunk_size=repr(chunk_size)
            )
        size = self.size(sha256)
        if size is None:
            raise NotFoundError("artifact not found", sha256=sha256)
        stop = size if end is None else end
        if not (_is_int(start) and _is_int(stop) and 0 <= start <= stop <= size):
            raise InvalidInputError(
                "range must satisfy 0 <= start <= end <= size",
                sha256=sha256,
                start=repr(start),
                end=repr(end),
                size=size,
            )
        if start == stop:
            return _empty()
        return _exact_length(
            sha256, stop - start, self._open_range(sha256, start, stop, chunk_size)
        )

    def size(self, sha256: str) -> int | None:
        """The artifact's length in bytes, or None when it is absent."""
        return self._size(check_sha256(sha256))

    def exists(self, sha256: str) -> bool:
        return self.size(sha256) is not None

    def delete(self, sha256: str) -> None:
        """Remove the artifact; deleting an absent one is not an error."""
        self._delete(check_sha256(sha256))

    def download_url(self, sha256: str, expires_s: int = 3600) -> str | None:
        """A URL a client may GET the whole artifact from, or None if the caller must stream it.

        Does not check that the artifact exists (call ``size`` for that).
        """
        check_sha256(sha256)
        if not _is_int(expires_s) or not 0 < expires_s <= MAX_URL_EXPIRY_S:
            raise InvalidInputError(
                f"expires_s must be between 1 and {MAX_URL_EXPIRY_S}", expires_s=repr(expires_s)
            )
        return self._download_url(sha256, expires_s)

    # -- adapter hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    def _put(self, sha256: str, length: int, chunks: Iterator[bytes]) -> None:
        """Store the verified stream; publish it only once ``chunks`` is exhausted.

        On any exception, remove whatever was written and re-raise.
        """

    @abc.abstractmethod
    def _open_range(
        self, sha256: str, start: int, end: int, chunk_size: int
    ) -> Generator[bytes, None, None]:
        """Yield bytes ``[start, end)``, ``0 <= start < end <= size``, at most chunk_size each."""

    @abc.abstractmethod
    def _size(self, sha256: str) -> int | None: ...

    @abc.abstractmethod
    def _delete(self, sha256: str) -> None: ...

    @abc.abstractmethod
    def _download_url(self, sha256: str, expires_s: int) -> str | None: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _verified_stream(
    sha256: str, length: int, chunks: Iterable[bytes]
) -> Generator[bytes, None, None]:
    """Pass ``chunks`` through, raising ``ArtifactIntegrityError`` rather than ending if wrong.

    The final checks run before the generator ends, so a consumer's ``for`` loop can only
    complete normally for a stream of exactly ``length`` bytes hashing to ``sha256``.
    """
    digest = hashlib.sha256()
    received = 0
    for chunk in chunks:
        if not chunk:
            continue
        received += len(chunk)
        if received > length:
            raise ArtifactIntegrityError(
                f"artifact is longer than the declared {length} bytes",
                expected_sha256=sha256,
                actual_sha256=None,
                expected_length=length,
                actual_length=received,
            )
        digest.update(chunk)
        yield chunk
    actual = digest.hexdigest()
    if received != length:
        raise ArtifactIntegrityError(
            f"artifact is {received} bytes, {length} were declared",
            expected_sha256=sha256,
            actual_sha256=actual,
            expected_length=length,
            actual_length=received,
        )
    if actual != sha256:
        raise ArtifactIntegrityError(
            "artifact sha256 differs from the declared one",
            expected_sha256=sha256,
            actual_sha256=actual,
            expected_length=length,
            actual_length=received,
        )


def _exact_length(
    sha256: str, expected: int, chunks: Generator[bytes, None, None]
) -> Generator[bytes, None, None]:
    """Pass ``chunks`` through, turning a short or long read by the backend into StorageError."""
    sent = 0
    try:
        for chunk in chunks:
            sent += len(chunk)
            if sent > expected:
                raise StorageError(
                    "artifact store returned more bytes than requested",
                    sha256=sha256,
                    expected=expected,
                )
            yield chunk
    finally:
        chunks.close()
    if sent != expected:
        raise StorageError(
            "artifact store returned fewer bytes than requested (truncated object?)",
            sha256=sha256,
            expected=expected,
            actual=sent,
        )


def _empty() -> Generator[bytes, None, None]:
    yield from ()
