from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, Snapshot, Targets

from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.trust import repository as repo
from control_plane.trust.signer import FileOnlineKeyStore, OnlineSigner
from tests.control_plane.trust.helpers import MONTH, NOW, YEAR, Fleet


def test_keys_are_created_once_with_mode_0600(tmp_path: Path) -> None:
    store = FileOnlineKeyStore(tmp_path)
    first = store.ensure_keys("plant-a")
    assert set(first) == {"snapshot", "timestamp"}
    assert first["snapshot"].keyid != first["timestamp"].keyid
    for role in ("snapshot", "timestamp"):
        path = tmp_path / "plant-a" / f"{role}.key"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "plant-a").stat().st_mode) == 0o700
    assert store.ensure_keys("plant-a") == first
    # A restarted process (or another replica) reads the same keys.
    assert FileOnlineKeyStore(tmp_path).ensure_keys("plant-a") == first
    assert FileOnlineKeyStore(tmp_path).ensure_keys("plant-b") != first


def test_replicas_racing_to_create_agree(tmp_path: Path) -> None:
    stores = [FileOnlineKeyStore(tmp_path) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    results: list[dict[str, str]] = []
    lock = threading.Lock()

    def run(store: FileOnlineKeyStore) -> None:
        barrier.wait(timeout=10)
        keys = {role: key.keyid for role, key in store.ensure_keys("race").items()}
        with lock:
            results.append(keys)

    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(results) == len(stores)
    assert all(r == results[0] for r in results)
    assert sorted(p.name for p in (tmp_path / "race").iterdir()) == [
        "snapshot.key",
        "timestamp.key",
    ]


@pytest.mark.parametrize("fleet", ["../evil", "", "UPPER", "a/b", ".hidden", "x" * 65])
def test_bad_fleet_names_refused(tmp_path: Path, fleet: str) -> None:
    with pytest.raises(InvalidInputError):
        FileOnlineKeyStore(tmp_path).ensure_keys(fleet)
    assert list(tmp_path.iterdir()) == []


def test_signatures_verify_against_the_fleet_root(tmp_path: Path) -> None:
    store = FileOnlineKeyStore(tmp_path)
    online = store.ensure_keys("plant-a")
    fleet = Fleet.create()
    root = repo.build_root(
        root_keys=[s.public_key for s in fleet.root_signers],
        root_threshold=2,
        release_keys=[fleet.release.public_key],
        snapshot_key=online["snapshot"],
        timestamp_key=online["timestamp"],
        expires=NOW + YEAR,
    )
    signer: OnlineSigner = store.signer_for("plant-a")
    assert signer.public_key("snapshot") == online["snapshot"]
    snapshot = repo.make_snapshot(fleet.targets, previous=None, expires=NOW + MONTH)
    signer.sign("snapshot", snapshot)
    root.signed.verify_delegate("snapshot", snapshot.signed_bytes, snapshot.signatures)
    timestamp = repo.make_timestamp(1, previous=None, expires=NOW + MONTH)
    signer.sign("timestamp", timestamp)
    root.signed.verify_delegate("timestamp", timestamp.signed_bytes, timestamp.signatures)
    # Re-signing replaces, never accumulates.
    signer.sign("timestamp", timestamp)
    assert len(timestamp.signatures) == 1


def test_only_online_roles_are_signed(tmp_path: Path) -> None:
    store = FileOnlineKeyStore(tmp_path)
    store.ensure_keys("plant-a")
    signer = store.signer_for("plant-a")
    targets: Metadata[Targets] = repo.initial_targets(NOW + MONTH)
    with pytest.raises(ValueError, match="not an online role"):
        signer.sign("targets", targets)
    with pytest.raises(ValueError, match="not an online role"):
        signer.public_key("root")
    snapshot: Metadata[Snapshot] = repo.make_snapshot(targets, previous=None, expires=NOW)
    with pytest.raises(ValueError, match="as timestamp"):
        signer.sign("timestamp", snapshot)


def test_signer_for_never_creates_missing_keys(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="restore"):
        FileOnlineKeyStore(tmp_path).signer_for("plant-a")
    assert not (tmp_path / "plant-a" / "snapshot.key").exists()


def test_rotated_keys_sign_by_keyid_and_survive_a_restart(tmp_path: Path) -> None:
    store = FileOnlineKeyStore(tmp_path)
    first = store.ensure_keys("plant-a")
    new = store.new_keys("plant-a")
    assert {r: k.keyid for r, k in new.items()} != {r: k.keyid for r, k in first.items()}
    for role, key in new.items():
        assert store.holds("plant-a", role, key.keyid)
        assert store.holds("plant-a", role, first[role].keyid)
        assert not store.holds("plant-a", role, "0" * 64)
    assert not store.holds("plant-a", "snapshot", new["timestamp"].keyid)  # wrong role
    keyids = {r: k.keyid for r, k in new.items()}
    # Another replica (or a restart) picks the key the root names, from the same files.
    signer = FileOnlineKeyStore(tmp_path).signer_for("plant-a", keyids)
    for role in repo.ONLINE_ROLES:
        assert signer.public_key(role) == new[role]
    assert store.signer_for("plant-a").public_key("timestamp") == first["timestamp"]
    with pytest.raises(UnavailableError, match="missing"):
        store.signer_for("plant-a", {"snapshot": "a" * 64, "timestamp": keyids["timestamp"]})
