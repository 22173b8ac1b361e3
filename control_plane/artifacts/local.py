"""``LocalArtifactStore``: the artifact store on a local (or mounted) directory.

Used by the embedded single-machine setup; it serves no URLs (the API streams the files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

from control_plane.artifacts.base import DEFAULT_MAX_LENGTH, ArtifactStore, check_sha256
from control_plane.errors import NotFoundError, StorageError
from control_plane.fsutil import fsync_dir, make_private_dirs

__all__ = ["LocalArtifactStore"]

logger = logging.getLogger(__name__)

# Stored files are immutable (their name is their content's hash): read-only for everyone
# turns an accidental in-place write into an EACCES instead of a silently corrupt artifact.
# Deleting and os.replace depend on the directory's permissions, not the file's.
FILE_MODE = 0o444

_TEMP_PREFIX = "upload-"
_TEMP_SUFFIX = ".part"


@contextlib.contextmanager
def _os_errors_as_storage_errors(action: str, sha256: str | None = None) -> Iterator[None]:
    """Translate OSError from our own filesystem calls; paths stay in the chained cause only."""
    try:
        yield
    except OSError as exc:
        subject = f"artifact {sha256}" if sha256 else "the artifact directory"
        raise StorageError(
            f"local artifact store could not {action} {subject}",
            sha256=sha256,
            operation=action,
        ) from exc


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while len(view):
        written = os.write(fd, view)
        view = view[written:]


class LocalArtifactStore(ArtifactStore):
    """Artifacts as read-only files ``root/sha256/ab/cd/<hex>``; uploads staged in ``root/tmp/``.

    An upload is written to a uniquely named temp file on the same filesystem, fsynced,
    then moved into place with ``os.replace`` and the directory fsynced, so a crash leaves
    either the complete artifact or nothing but a temp file. Temp files nobody has written
    to for ``stale_after_s`` seconds are removed when the store is constructed (and by
    ``remove_stale_temp_files``).
    """

    def __init__(
        self,
        root: Path | str,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        stale_after_s: float = 3600.0,
    ) -> None:
        super().__init__(max_length=max_length)
        if stale_after_s <= 0:
            raise ValueError(f"stale_after_s must be positive, got {stale_after_s!r}")
        self._root = Path(root)
        self._objects = self._root / "sha256"
        self._tmp = self._root / "tmp"
        self._stale_after_s = float(stale_after_s)
        with _os_errors_as_storage_errors("create"):
            make_private_dirs(self._objects)
            make_private_dirs(self._tmp)
        self.remove_stale_temp_files()

    @property
    def root(self) -> Path:
        return self._root

    def path_of(self, sha256: str) -> Path:
        """Where the artifact lives (or would live); for diagnostics and tests."""
        check_sha256(sha256)
        return self._objects / sha256[:2] / sha256[2:4] / sha256

    def remove_stale_temp_files(self) -> int:
        """Delete our temp files not written to for ``stale_after_s``; return how many.

        One non-recursive pass over ``root/tmp`` touching only names this class creates.
        "Now" is the mtime of a probe file written there, i.e. the same (file server's)
        clock that stamped the temp files, so host clock skew cannot make a live upload
        look stale. An upload in progress keeps its mtime fresh with every write.
        """
        with _os_errors_as_storage_errors("clean up temporary files in"):
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=self._tmp)
            try:
                now = os.fstat(fd).st_mtime
            finally:
                os.close(fd)
                Path(probe).unlink()
            removed = 0
            with os.scandir(self._tmp) as entries:
                for entry in entries:
                    if not (
                        entry.name.startswith(_TEMP_PREFIX) and entry.name.endswith(_TEMP_SUFFIX)
                    ):
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                        if not stat.S_ISREG(info.st_mode):
                            continue
                        if now - info.st_mtime > self._stale_after_s:
                            Path(entry.path).unlink()
                            removed += 1
                    except FileNotFoundError:
                        continue  # another process cleaned it or finished the upload
        if removed:
            logger.info("removed %d stale temporary upload file(s) from %s", removed, self._tmp)
        return removed

    # -- adapter hooks --------------------------------------------------------------------------

    def _put(self, sha256: str, length: int, chunks: Iterator[bytes]) -> None:
        final = self.path_of(sha256)
        with _os_errors_as_storage_errors("stage", sha256):
            fd, temp_name = tempfile.mkstemp(
                prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=self._tmp
            )
        temp = Path(temp_name)
        fd_open = True
        try:
            # Only our own filesystem calls are translated: an exception from ``chunks``
            # (a client cut off mid-upload, an integrity error) must reach the caller as is.
            for chunk in chunks:
                with _os_errors_as_storage_errors("write", sha256):
                    _write_all(fd, chunk)
            with _os_errors_as_storage_errors("write", sha256):
                os.fchmod(fd, FILE_MODE)
                os.fsync(fd)
                fd_open = False
                os.close(fd)
            with _os_errors_as_storage_errors("store", sha256):
                self._make_dirs_durably(final.parent)
                temp.replace(final)
                fsync_dir(final.parent)
        except BaseException:
            if fd_open:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
            raise

    def _open_range(
        self, sha256: str, start: int, end: int, chunk_size: int
    ) -> Generator[bytes, None, None]:
        try:
            # Unbuffered: we already read in caller-sized chunks; a buffer would copy twice.
            file = self.path_of(sha256).open("rb", buffering=0)
        except FileNotFoundError as exc:
            raise NotFoundError("artifact not found", sha256=sha256) from exc
        except OSError as exc:
            raise StorageError(
                "local artifact store could not open artifact", sha256=sha256, operation="open"
            ) from exc
        with file:
            with _os_errors_as_storage_errors("read", sha256):
                file.seek(start)
            remaining = end - start
            while remaining:
                with _os_errors_as_storage_errors("read", sha256):
                    data = file.read(min(chunk_size, remaining))
                if not data:
                    return  # truncated on disk; the port reports the short read
                remaining -= len(data)
                yield data

    def _size(self, sha256: str) -> int | None:
        try:
            info = self.path_of(sha256).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(
                "local artifact store could not stat artifact", sha256=sha256, operation="stat"
            ) from exc
        return info.st_size

    def _delete(self, sha256: str) -> None:
        path = self.path_of(sha256)
        with _os_errors_as_storage_errors("delete", sha256):
            try:
                path.unlink()
            except FileNotFoundError:
                return
            fsync_dir(path.parent)

    def _download_url(self, sha256: str, expires_s: int) -> str | None:
        return None

    def _make_dirs_durably(self, directory: Path) -> None:
        """``mkdir -p`` that also fsyncs the parent of every directory it creates."""
        for created in make_private_dirs(directory):
            fsync_dir(created.parent)

    def __repr__(self) -> str:
        return f"LocalArtifactStore(root={str(self._root)!r}, max_length={self.max_length})"
