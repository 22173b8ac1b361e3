"""Local-only behaviour: layout, read-only files, atomic staging, stale temp file cleanup."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from control_plane.artifacts import LocalArtifactStore
from control_plane.artifacts import local as local_module
from control_plane.errors import StorageError
from tests.control_plane.artifacts._support import chunked, random_bytes, read_all, sha

DATA = random_bytes(100_000)
DATA_SHA = sha(DATA)
HOUR = 3600


def test_layout_and_read_only_file(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    path = tmp_path / "sha256" / DATA_SHA[:2] / DATA_SHA[2:4] / DATA_SHA
    assert store.path_of(DATA_SHA) == path
    assert path.read_bytes() == DATA
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert list((tmp_path / "tmp").iterdir()) == []


def test_download_url_is_none(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    assert store.download_url(DATA_SHA) is None


def test_reopening_keeps_artifacts(tmp_path: Path) -> None:
    LocalArtifactStore(tmp_path).put(DATA_SHA, len(DATA), chunked(DATA))
    assert read_all(LocalArtifactStore(tmp_path).open_range(DATA_SHA)) == DATA


def _temp_file(tmp_dir: Path, name: str, age_s: float) -> Path:
    path = tmp_dir / name
    path.write_bytes(b"partial upload")
    mtime = path.stat().st_mtime - age_s
    os.utime(path, (mtime, mtime))
    return path


def test_stale_temp_files_are_removed_at_startup(tmp_path: Path) -> None:
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    stale = _temp_file(tmp_dir, "upload-dead.part", age_s=2 * HOUR)
    live = _temp_file(tmp_dir, "upload-live.part", age_s=10)
    foreign = _temp_file(tmp_dir, "operator-notes.txt", age_s=2 * HOUR)

    LocalArtifactStore(tmp_path)

    assert not stale.exists()
    assert live.exists()  # an upload still being written keeps its mtime fresh
    assert foreign.exists()  # only names this store creates are touched


def test_stale_threshold_is_configurable(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path, stale_after_s=60)
    old = _temp_file(tmp_path / "tmp", "upload-a.part", age_s=120)
    young = _temp_file(tmp_path / "tmp", "upload-b.part", age_s=5)
    assert store.remove_stale_temp_files() == 1
    assert not old.exists()
    assert young.exists()


def test_backend_write_failure_is_a_storage_error_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalArtifactStore(tmp_path)

    def disk_full(fd: int, chunk: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_module, "_write_all", disk_full)
    with pytest.raises(StorageError) as caught:
        store.put(DATA_SHA, len(DATA), chunked(DATA))
    assert isinstance(caught.value.__cause__, OSError)
    assert str(tmp_path) not in caught.value.message  # no server paths in client-facing text
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not store.exists(DATA_SHA)


def test_file_truncated_on_disk_is_reported_not_served_short(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    store.put(DATA_SHA, len(DATA), chunked(DATA))
    stream = store.open_range(DATA_SHA)  # size known: 100_000
    path = store.path_of(DATA_SHA)
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.truncate(10)
    with pytest.raises(StorageError):
        read_all(stream)


def test_concurrent_puts_of_one_artifact(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    results: list[bool] = []
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            results.append(store.put(DATA_SHA, len(DATA), chunked(DATA, 1000)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upload) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert True in results
    assert read_all(store.open_range(DATA_SHA)) == DATA
    assert list((tmp_path / "tmp").iterdir()) == []


def test_constructor_refuses_nonsense(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LocalArtifactStore(tmp_path, stale_after_s=0)
    with pytest.raises(ValueError):
        LocalArtifactStore(tmp_path, max_length=-1)
