"""Atomic writes for state on disk: temp file in the same directory, fsync, rename, fsync dir.

Shared by every part of the control plane that writes a file a crash must not tear.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int,
    exclusive: bool = False,
    owner: tuple[int, int] | None = None,
) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the new one.

    The temp file is created with `mode` (never wider), fsynced, moved into place and
    the directory fsynced. With `exclusive`, an existing `path` is never replaced:
    FileExistsError is raised instead (used when two processes may race to create).
    """
    directory = path.parent
    tmp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            # umask may have narrowed the mode; it never widens it, so this only restores it.
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            # link() fails if the name exists, unlike rename(): first writer wins.
            os.link(tmp, path)
            tmp.unlink()
        else:
            tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(directory)


# What the control plane's own state gets, whatever the umask (docs/operator-guide.md,
# "What the data dir holds"): directories only the server's user can enter, files only it
# can read. Artifacts stay 0444 (immutable) inside 0700 directories.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dirs(directory: Path, mode: int = PRIVATE_DIR_MODE) -> list[Path]:
    """`mkdir -p` whose every directory it creates gets exactly `mode`, whatever the umask.

    `Path.mkdir(mode=..., parents=True)` gives the parents it creates `0o777 & ~umask`
    (world-writable under umask 000); directories that already exist are left as they are.
    Returns the directories created, outermost first.
    """
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            continue  # another process (replica) made it first; it sets the mode
        path.chmod(mode)  # mkdir's mode is narrowed by the umask, never widened
        created.append(path)
    return created


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
