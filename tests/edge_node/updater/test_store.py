"""The content-addressed model store: install (re-hashed), gc, and the free-space check."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_node.errors import CapacityError, InvalidInputError, StorageError
from edge_node.updater.store import (
    DiskFullError,
    DiskUsage,
    ModelStore,
    StoreIntegrityError,
)


def download(store: ModelStore, data: bytes, name: str = "dl.part") -> tuple[Path, str]:
    path = store.staging_dir / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def test_install_moves_the_file_into_its_hash_directory(store: ModelStore) -> None:
    temp, sha = download(store, b"onnx bytes")
    installed = store.install(temp, sha, 10)
    assert installed == store.root / "sha256" / sha / "model.onnx"
    assert installed == store.path_of(sha)
    assert installed.read_bytes() == b"onnx bytes"
    assert not temp.exists()
    assert store.exists(sha)
    assert store.installed() == {sha}
    assert store.verify(sha)
    assert installed.stat().st_mode & 0o222 == 0  # read-only: nothing edits a model in place


def test_installing_twice_is_harmless(store: ModelStore) -> None:
    temp, sha = download(store, b"same")
    store.install(temp, sha, 4)
    again, _ = download(store, b"same")
    assert store.install(again, sha, 4).read_bytes() == b"same"
    assert not again.exists()


def test_a_file_that_changed_on_disk_is_refused(store: ModelStore) -> None:
    temp, sha = download(store, b"verified while downloading")
    temp.write_bytes(b"verified while downloadinG")  # same length, other bytes
    with pytest.raises(StoreIntegrityError) as info:
        store.install(temp, sha, 26)
    assert isinstance(info.value, StorageError)
    assert temp.exists()  # the caller deletes it
    assert not store.exists(sha)


def test_a_failed_rename_installs_nothing(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp, sha = download(store, b"model")

    def crash(src: object, dst: object) -> None:
        raise OSError("power lost")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StorageError, match="power lost"):
        store.install(temp, sha, 5)
    monkeypatch.undo()
    assert not store.exists(sha)
    assert temp.exists()
    assert store.install(temp, sha, 5).read_bytes() == b"model"


def test_a_missing_temp_file_is_a_caller_error(store: ModelStore) -> None:
    with pytest.raises(InvalidInputError):
        store.install(store.staging_dir / "nope", "0" * 64, 1)


def test_a_wrong_length_is_refused(store: ModelStore) -> None:
    temp, sha = download(store, b"abc")
    with pytest.raises(StoreIntegrityError):
        store.install(temp, sha, 4)


def test_a_damaged_installed_copy_is_replaced(store: ModelStore) -> None:
    temp, sha = download(store, b"good")
    path = store.install(temp, sha, 4)
    path.chmod(0o644)
    path.write_bytes(b"evil")
    assert not store.verify(sha)
    again, _ = download(store, b"good")
    store.install(again, sha, 4)
    assert store.verify(sha)


TARGET = "models/det/1.0.0/model.onnx"
OTHER_TARGET = "models/det/1.0.1/model.onnx"  # another version signing the same bytes


def test_the_reference_pair_sits_beside_its_model_once_per_target(store: ModelStore) -> None:
    model, model_sha = download(store, b"model")
    ref, ref_sha = download(store, b"npz", "ref.part")
    with pytest.raises(InvalidInputError):
        store.install_reference(model_sha, ref, ref_sha, 3, target_path=TARGET)
    store.install(model, model_sha, 5)
    path = store.install_reference(model_sha, ref, ref_sha, 3, target_path=TARGET)
    assert path == store.reference_path_of(model_sha, TARGET)
    assert path.parent.parent.parent == store.path_of(model_sha).parent
    assert path.read_bytes() == b"npz"
    other, other_sha = download(store, b"npz2", "ref2.part")
    second = store.install_reference(model_sha, other, other_sha, 4, target_path=OTHER_TARGET)
    assert second != path and second.read_bytes() == b"npz2" and path.read_bytes() == b"npz"


def test_bad_hashes_are_refused(store: ModelStore) -> None:
    with pytest.raises(InvalidInputError):
        store.path_of("../../etc")
    with pytest.raises(InvalidInputError):
        store.gc({"not-a-hash"})


def test_gc_keeps_only_what_the_journal_references(store: ModelStore) -> None:
    shas = []
    for i in range(4):
        temp, sha = download(store, f"model {i}".encode())
        store.install(temp, sha, len(f"model {i}"))
        shas.append(sha)
    stray = store.root / "sha256" / "half-installed"
    stray.mkdir()
    in_flight, _ = download(store, b"downloading")

    removed = store.gc({shas[1], shas[3]})

    assert sorted(removed) == sorted([shas[0], shas[2], "half-installed"])
    assert store.installed() == {shas[1], shas[3]}
    assert in_flight.exists()  # staging is left alone
    assert store.gc({shas[1], shas[3]}) == []


def test_clear_staging_keeps_only_the_named_partial_downloads(store: ModelStore) -> None:
    keep_sha = hashlib.sha256(b"wanted").hexdigest()
    other_sha = hashlib.sha256(b"stale").hexdigest()
    (store.staging_dir / f"{keep_sha}.part").write_bytes(b"want")
    (store.staging_dir / f"{other_sha}.part").write_bytes(b"stale")
    (store.staging_dir / "junk").mkdir()

    removed = store.clear_staging({keep_sha})

    assert removed == sorted([f"{other_sha}.part", "junk"])
    assert [p.name for p in store.staging_dir.iterdir()] == [f"{keep_sha}.part"]
    assert store.clear_staging(()) == [f"{keep_sha}.part"]
    assert list(store.staging_dir.iterdir()) == []


class FakeDisk:
    def __init__(self, free: int) -> None:
        self.free = free
        self.asked: list[Path] = []

    def __call__(self, path: Path) -> DiskUsage:
        self.asked.append(path)
        return DiskUsage(total=1000, used=1000 - self.free, free=self.free)


def test_check_space_refuses_before_download(tmp_path: Path) -> None:
    disk = FakeDisk(free=500)
    store = ModelStore(tmp_path / "models", disk_usage=disk)
    assert store.free_bytes() == 500
    store.check_space(300, margin=200)  # exactly fits
    with pytest.raises(DiskFullError) as info:
        store.check_space(301, margin=200)
    assert isinstance(info.value, CapacityError)
    assert info.value.fields == {"needed": 301, "free": 500, "margin": 200}
    assert store.disk_full_refusals == 1
    assert disk.asked[-1] == store.root
    with pytest.raises(InvalidInputError):
        store.check_space(-1, margin=0)


def test_the_real_disk_usage_is_used_by_default(store: ModelStore) -> None:
    assert store.free_bytes() > 0


# ------------------------------------------------------------------- bundles


def test_a_bundle_record_is_kept_beside_its_model_and_read_back(store: ModelStore) -> None:
    temp, sha = download(store, b"onnx bytes")
    store.install(temp, sha, 10)
    assert store.read_bundle(sha, TARGET) is None  # installed before bundles
    record = {
        "format": 1,
        "target_path": TARGET,
        "sha256": sha,
        "model": "det",
        "version": "1.0.0",
        "runtime": None,
    }
    path = store.write_bundle(sha, record)
    assert path == store.bundle_path_of(sha, TARGET)
    assert path == store.target_dir(sha, TARGET) / "bundle.json"
    assert store.read_bundle(sha, TARGET) == record
    # Another version of the same bytes keeps its own record beside it.
    assert store.read_bundle(sha, OTHER_TARGET) is None
    other = record | {"target_path": OTHER_TARGET, "version": "1.0.1"}
    assert store.write_bundle(sha, other) != path
    assert store.read_bundle(sha, OTHER_TARGET) == other
    assert store.read_bundle(sha, TARGET) == record
    assert path.stat().st_mode & 0o777 == 0o444
    # The same record again writes nothing (a rollback needs no free disk).
    inode = path.stat().st_ino
    store.write_bundle(sha, dict(record))
    assert path.stat().st_ino == inode
    store.write_bundle(sha, record | {"runtime": {"format": 1}})
    assert path.stat().st_ino != inode
    assert store.read_bundle(sha, TARGET) == record | {"runtime": {"format": 1}}
    store.gc(())
    assert not path.exists()


def test_a_bundle_needs_its_model_installed(store: ModelStore) -> None:
    with pytest.raises(InvalidInputError, match="install it before its bundle"):
        store.write_bundle("a" * 64, {"sha256": "a" * 64, "target_path": TARGET})


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut short by a crash of the disk, not of us
        lambda text: text.replace('"1.0.0"', '"6.6.6"'),  # content changed, digest not
        lambda text: "not json",
    ],
)
def test_a_damaged_bundle_record_is_refused_when_read(
    store: ModelStore, damage: Callable[[str], str]
) -> None:
    temp, sha = download(store, b"onnx bytes")
    store.install(temp, sha, 10)
    record = {"sha256": sha, "target_path": TARGET, "model": "det", "version": "1.0.0"}
    path = store.write_bundle(sha, record)
    text = path.read_text()
    path.unlink()
    path.write_text(damage(text))
    with pytest.raises(StoreIntegrityError, match="is damaged"):
        store.read_bundle(sha, TARGET)


def test_a_bundle_record_that_names_another_model_is_refused(store: ModelStore) -> None:
    temp, sha = download(store, b"onnx bytes")
    other_temp, other = download(store, b"other bytes", "other.part")
    store.install(temp, sha, 10)
    store.install(other_temp, other, 11)
    store.write_bundle(other, {"sha256": other, "target_path": TARGET, "model": "det"})
    store.write_bundle(sha, {"sha256": sha, "target_path": OTHER_TARGET, "model": "det"})
    store.write_bundle(sha, {"sha256": sha, "target_path": TARGET, "model": "det"})
    store.bundle_path_of(sha, TARGET).unlink()
    store.bundle_path_of(sha, TARGET).write_bytes(store.bundle_path_of(other, TARGET).read_bytes())
    with pytest.raises(StoreIntegrityError, match="names model"):
        store.read_bundle(sha, TARGET)
    store.bundle_path_of(sha, TARGET).unlink()
    store.bundle_path_of(sha, TARGET).write_bytes(
        store.bundle_path_of(sha, OTHER_TARGET).read_bytes()
    )
    with pytest.raises(StoreIntegrityError, match="names target"):
        store.read_bundle(sha, TARGET)
