"""The node's content-addressed model store: `root/sha256/<hex>/model.onnx`, and per target
that names those bytes `root/sha256/<hex>/targets/<key>/{reference.npz,bundle.json}`.

Two versions may sign the same bytes with different runtime specs (a corrected
normalisation needs no new model): the bytes are stored once, the reference pair and the
bundle record once per target path (`<key>`: the first 32 hex digits of its sha256).

A file enters only through `install`, which re-hashes it (never trust a file on disk,
even one verified while it downloaded), fsyncs it and renames it into place, then
fsyncs the directory. `write_bundle` keeps the model's verified bundle record (what was
signed with it: name, version, runtime spec) beside it, written atomically with its own
digest, so a restarted node serves the model as it was signed without refreshing TUF;
`read_bundle` checks the digest and the model hash it names. Downloads go to
`staging_dir` (same filesystem, so the rename is atomic). `gc(keep)` removes every entry
not in `keep` — the journal's active, previous and trial. `check_space` refuses a
download that would leave less than a margin free.
Not here: downloading, TUF verification, deciding what to keep.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, NamedTuple

from edge_node.errors import CapacityError, InvalidInputError, StorageError
from edge_node.fsutil import atomic_write, fsync_dir, fsync_file

__all__ = [
    "BUNDLE_FILE",
    "MODEL_FILE",
    "REFERENCE_FILE",
    "DiskFullError",
    "DiskUsage",
    "ModelStore",
    "StoreIntegrityError",
]

MODEL_FILE: Final = "model.onnx"
REFERENCE_FILE: Final = "reference.npz"
BUNDLE_FILE: Final = "bundle.json"
_TARGETS: Final = "targets"
_MAX_BUNDLE_BYTES: Final = 4 << 20  # a runtime spec with 4096 labels is well under this
_CHUNK: Final = 1 << 20
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_READ_ONLY: Final = 0o444


class DiskUsage(NamedTuple):
    """What `shutil.disk_usage` returns (injected so tests fake a full disk)."""

    total: int
    used: int
    free: int


class DiskFullError(CapacityError):
    """Not enough free space for the download plus the safety margin; nothing was written."""

    title = "disk full"


class StoreIntegrityError(StorageError):
    """A file about to be installed does not have the expected hash or length."""

    title = "model file integrity check failed"


class ModelStore:
    def __init__(
        self,
        root: Path,
        *,
        disk_usage: Callable[[Path], DiskUsage] | None = None,
    ) -> None:
        self._root = Path(root)
        self._objects = self._root / "sha256"
        self._staging = self._root / "staging"
        self._disk_usage = disk_usage or _disk_usage
        self._lock = threading.Lock()
        self.disk_full_refusals = 0
        """How often `check_space` refused: the bound is counted where it is hit."""
        for directory in (self._root, self._objects, self._staging):
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root

    @property
    def staging_dir(self) -> Path:
        """Where downloads go before `install`: on the store's filesystem."""
        return self._staging

    # ------------------------------------------------------------------ paths

    def entry_dir(self, sha256: str) -> Path:
        return self._objects / _checked_sha256(sha256)

    def path_of(self, sha256: str) -> Path:
        """Where the model with this hash lives (whether or not it is installed)."""
        return self.entry_dir(sha256) / MODEL_FILE

    def target_dir(self, sha256: str, target_path: str) -> Path:
        """Where what one target (a signed version of these bytes) keeps beside them."""
        key = hashlib.sha256(target_path.encode()).hexdigest()[:32]
        return self.entry_dir(sha256) / _TARGETS / key

    def reference_path_of(self, sha256: str, target_path: str) -> Path:
        """Where a target's self-test reference pair lives (whether or not installed)."""
        return self.target_dir(sha256, target_path) / REFERENCE_FILE

    def bundle_path_of(self, sha256: str, target_path: str) -> Path:
        """Where a target's verified bundle record lives (whether or not written)."""
        return self.target_dir(sha256, target_path) / BUNDLE_FILE

    def exists(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def installed(self) -> set[str]:
        """The hashes of every installed model."""
        return {
            entry.name
            for entry in self._objects.iterdir()
            if _SHA256.fullmatch(entry.name) and (entry / MODEL_FILE).is_file()
        }

    # ---------------------------------------------------------------- install

    def install(self, temp_file: Path, sha256: str, length: int) -> Path:
        """Move a downloaded model into the store after hashing it once more.

        The temp file must be on the store's filesystem (use `staging_dir`). A mismatch
        raises `StoreIntegrityError` and leaves the temp file for the caller to delete.
        Installing a hash that is already there only deletes the temp file.
        """
        return self._install(temp_file, sha256, length, self.path_of(sha256))

    def install_reference(
        self, model_sha256: str, temp_file: Path, sha256: str, length: int, *, target_path: str
    ) -> Path:
        """Install a target's self-test reference pair beside its installed model."""
        if not self.exists(model_sha256):
            raise InvalidInputError(
                f"model {model_sha256} is not installed; install it before its reference",
                sha256=model_sha256,
            )
        dest = self.reference_path_of(model_sha256, target_path)
        self._make_target_dir(dest.parent)
        return self._install(temp_file, sha256, length, dest)

    def _make_target_dir(self, directory: Path) -> None:
        with self._lock, _storage_errors(f"creating {directory.name}"):
            if not directory.is_dir():
                directory.mkdir(mode=0o755, parents=True)
                fsync_dir(directory.parent)
                fsync_dir(directory.parent.parent)

    def _install(self, temp_file: Path, sha256: str, length: int, dest: Path) -> Path:
        _checked_sha256(sha256)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise InvalidInputError(f"length must be an integer >= 0, got {length!r}")
        temp_file = Path(temp_file)
        with _storage_errors(f"reading {temp_file.name}"):
            _verify_file(temp_file, sha256, length)
        with self._lock, _storage_errors(f"installing {sha256}"):
            if dest.is_file() and _matches(dest, sha256, length):
                temp_file.unlink()
                return dest
            entry = dest.parent
            if not entry.is_dir():
                entry.mkdir(mode=0o755)
                fsync_dir(self._objects)
            temp_file.chmod(_READ_ONLY)
            fsync_file(temp_file)
            temp_file.replace(dest)  # os.replace: atomic within one filesystem
            fsync_dir(entry)
            if temp_file.parent != entry:
                fsync_dir(temp_file.parent)
        return dest

    def write_bundle(self, model_sha256: str, record: Mapping[str, Any]) -> Path:
        """Keep `record` (JSON-ready, from verified metadata; its `target_path` says which
        target it is) beside an installed model.

        Written atomically (temp file, fsync, rename, fsync the directory) as
        `{"bundle": record, "sha256": <digest of its canonical JSON>}`; nothing is
        written when the same record is there already (a rollback needs no free disk).
        """
        if not self.exists(model_sha256):
            raise InvalidInputError(
                f"model {model_sha256} is not installed; install it before its bundle",
                sha256=model_sha256,
            )
        target_path = record.get("target_path")
        if not isinstance(target_path, str) or not target_path:
            raise InvalidInputError("a bundle record names its target_path", field="target_path")
        body = _canonical(record)
        data = _canonical({"bundle": record, "sha256": hashlib.sha256(body).hexdigest()})
        path = self.bundle_path_of(model_sha256, target_path)
        self._make_target_dir(path.parent)
        with self._lock, _storage_errors(f"writing the bundle of {target_path}"):
            if path.is_file() and path.read_bytes() == data:
                return path
            atomic_write(path, data, mode=_READ_ONLY)
        return path

    def read_bundle(self, model_sha256: str, target_path: str) -> dict[str, Any] | None:
        """The bundle record `write_bundle` kept for `target_path`, or None when there is
        none (a model installed before bundles). `StoreIntegrityError` when it is damaged:
        not JSON, its digest wrong, or it names another model or target."""
        path = self.bundle_path_of(model_sha256, target_path)
        with _storage_errors(f"reading the bundle of {target_path}"):
            try:
                with path.open("rb") as f:
                    data = f.read(_MAX_BUNDLE_BYTES + 1)
            except FileNotFoundError:
                return None
        try:
            if len(data) > _MAX_BUNDLE_BYTES:
                raise ValueError(f"over {_MAX_BUNDLE_BYTES} bytes")
            document = json.loads(data)
            record = document["bundle"]
            if not isinstance(record, dict):
                raise ValueError("no bundle object")
            if hashlib.sha256(_canonical(record)).hexdigest() != document["sha256"]:
                raise ValueError("its digest does not match its content")
            if record.get("sha256") != model_sha256:
                raise ValueError(f"it names model {record.get('sha256')!r}")
            if record.get("target_path") != target_path:
                raise ValueError(f"it names target {record.get('target_path')!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreIntegrityError(
                f"the bundle record {path} is damaged: {exc}", path=str(path)
            ) from exc
        return record

    def verify(self, sha256: str) -> bool:
        """Re-hash an installed model (e.g. at start-up); False if missing or altered."""
        path = self.path_of(sha256)
        return path.is_file() and _matches(path, sha256, None)

    # --------------------------------------------------------------------- gc

    def gc(self, keep: Iterable[str]) -> list[str]:
        """Delete every entry not in `keep` (the journal's active, previous and trial).

        Returns the removed hashes (and names of stray entries), sorted. The staging
        directory is not touched: a download may be in progress there.
        """
        kept = {_checked_sha256(sha) for sha in keep}
        removed: list[str] = []
        with self._lock, _storage_errors("garbage-collecting the model store"):
            for entry in sorted(self._objects.iterdir()):
                if entry.name in kept:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry.name)
            if removed:
                fsync_dir(self._objects)
        return removed

    def clear_staging(self, keep: Iterable[str]) -> list[str]:
        """Delete every file in the staging directory but the partial downloads of the
        hashes in `keep` (`<sha256>.part`); returns the names removed, sorted.

        Call it only while no download runs (the reconciler holds its lock then).
        """
        kept = {f"{_checked_sha256(sha)}.part" for sha in keep}
        removed: list[str] = []
        with self._lock, _storage_errors("clearing the staging directory"):
            for entry in sorted(self._staging.iterdir()):
                if entry.name in kept:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry.name)
            if removed:
                fsync_dir(self._staging)
        return removed

    # ------------------------------------------------------------------ space

    def free_bytes(self) -> int:
        return int(self._disk_usage(self._root).free)

    def check_space(self, needed: int, margin: int) -> None:
        """Refuse (DiskFullError) unless `needed` bytes fit with `margin` bytes left free."""
        if needed < 0 or margin < 0:
            raise InvalidInputError("needed and margin must be >= 0", needed=needed, margin=margin)
        free = self.free_bytes()
        if free - needed < margin:
            self.disk_full_refusals += 1
            raise DiskFullError(
                f"{needed} bytes needed, {free} free, {margin} must stay free",
                needed=needed,
                free=free,
                margin=margin,
            )


@contextmanager
def _storage_errors(action: str) -> Iterator[None]:
    """OS errors leave the store as StorageError, with the cause chained."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"model store: {action} failed: {exc}", action=action) from exc


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _disk_usage(path: Path) -> DiskUsage:
    usage = shutil.disk_usage(path)
    return DiskUsage(usage.total, usage.used, usage.free)


def _checked_sha256(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise InvalidInputError("sha256 must be 64 lowercase hex digits")
    return sha256


def _hash(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _matches(path: Path, sha256: str, length: int | None) -> bool:
    digest, size = _hash(path)
    return digest == sha256 and (length is None or size == length)


def _verify_file(path: Path, sha256: str, length: int) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise InvalidInputError(f"{path} does not exist", path=str(path)) from exc
    # The size first: cheap, and a wrong length is never hashed.
    if size != length:
        raise StoreIntegrityError(
            f"{path.name} is {size} bytes, expected {length}",
            path=str(path),
            expected_length=length,
            length=size,
        )
    digest, hashed = _hash(path)
    if digest != sha256 or hashed != length:
        raise StoreIntegrityError(
            f"{path.name} has sha256 {digest}, expected {sha256}",
            path=str(path),
            expected_sha256=sha256,
            sha256=digest,
        )
