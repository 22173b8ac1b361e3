"""The on-disk half of a release key rotation: pending, committed, and crashes between."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from control_plane.errors import ConflictError, InvalidInputError, NotFoundError
from control_plane.trust import keys

PASS = b"correct horse battery staple"


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    directory = tmp_path / "keys"
    keys.init_operator_keys(directory, root_keys=2, root_threshold=1, passphrase=PASS)
    return directory


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def keyset_json(directory: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((directory / keys.KEYSET_FILE).read_text())
    return data


def test_rotate_writes_the_new_key_beside_the_old_one(keydir: Path) -> None:
    before = {p.name: p.read_bytes() for p in keydir.iterdir()}
    old_id, signer = keys.rotate_release_key(keydir, PASS)

    assert old_id == keys.load_operator_keyset(keydir, PASS).release_public_key.keyid
    assert signer.public_key.keyid != old_id
    assert mode(keydir / "release.key.new") == 0o600
    assert (keydir / "release.key.new").read_bytes().startswith(b"-----BEGIN ENCRYPTED")
    assert keys.load_public_key(keydir / "release.pub.new") == signer.public_key
    # Nothing that signs today has changed: the server does not know the new key yet.
    assert {p.name: p.read_bytes() for p in keydir.iterdir() if p.name in before} == before
    assert keys.keyset_release_keyid(keydir) == old_id


def test_a_second_rotation_while_one_is_pending_is_refused(keydir: Path) -> None:
    _, signer = keys.rotate_release_key(keydir, PASS)
    with pytest.raises(ConflictError, match="already pending"):
        keys.rotate_release_key(keydir, PASS)
    assert keys.load_public_key(keydir / "release.pub.new") == signer.public_key


def test_pending_rotation_is_found_again(keydir: Path) -> None:
    assert keys.pending_release_rotation(keydir, PASS) is None
    _, signer = keys.rotate_release_key(keydir, PASS)
    found = keys.pending_release_rotation(keydir, PASS)
    assert found is not None
    assert found.public_key == signer.public_key


def test_pending_rotation_rewrites_a_lost_public_key(keydir: Path) -> None:
    _, signer = keys.rotate_release_key(keydir, PASS)
    (keydir / "release.pub.new").unlink()  # a crash between the two writes
    found = keys.pending_release_rotation(keydir, PASS)
    assert found is not None
    assert keys.load_public_key(keydir / "release.pub.new") == signer.public_key


def test_commit_archives_the_old_key_and_installs_the_new_one(keydir: Path) -> None:
    old_key_bytes = (keydir / "release.key").read_bytes()
    old_id, signer = keys.rotate_release_key(keydir, PASS)

    assert keys.commit_release_rotation(keydir) == (old_id, signer.public_key.keyid)

    stem = keys.revoked_key_stem(old_id)
    assert stem == f"release-{old_id[:12]}.revoked"
    archived = keydir / f"{stem}.key"
    assert archived.read_bytes() == old_key_bytes
    assert mode(archived) == 0o600
    assert keys.load_public_key(keydir / f"{stem}.pub").keyid == old_id
    assert mode(keydir / "release.key") == 0o600
    assert not (keydir / "release.key.new").exists()
    assert not (keydir / "release.pub.new").exists()
    data = keyset_json(keydir)
    assert data["release"] == [signer.public_key.keyid]
    assert data["revoked_release"] == [old_id]
    keyset = keys.load_operator_keyset(keydir, PASS)
    assert keyset.release_public_key == signer.public_key
    assert keys.pending_release_rotation(keydir, PASS) is None
    assert not list(keydir.glob(".*.tmp"))


def test_two_rotations_keep_both_revoked_keys(keydir: Path) -> None:
    first, _ = keys.rotate_release_key(keydir, PASS)
    keys.commit_release_rotation(keydir)
    second, signer = keys.rotate_release_key(keydir, PASS)
    keys.commit_release_rotation(keydir)
    assert keyset_json(keydir)["revoked_release"] == [first, second]
    assert keys.load_operator_keyset(keydir, PASS).release_public_key == signer.public_key
    for keyid in (first, second):
        assert (keydir / f"{keys.revoked_key_stem(keyid)}.key").exists()


def test_commit_without_a_pending_rotation_refused(keydir: Path) -> None:
    with pytest.raises(NotFoundError, match="no pending"):
        keys.commit_release_rotation(keydir)


def _crash_on_replace(monkeypatch: pytest.MonkeyPatch, survive: int) -> None:
    """Let `survive` Path.replace calls through, then crash like a power cut."""
    real = Path.replace
    calls = {"n": 0}

    def replace(self: Path, target: str | Path) -> Path:
        calls["n"] += 1
        if calls["n"] > survive:
            raise KeyboardInterrupt("power cut")
        return real(self, target)

    monkeypatch.setattr(Path, "replace", replace)


@pytest.mark.parametrize("survive", [0, 1, 2, 3, 4])
def test_an_interrupted_commit_is_finished_by_running_it_again(
    keydir: Path, monkeypatch: pytest.MonkeyPatch, survive: int
) -> None:
    """Whatever step a crash stops the commit at, the pending key is found and the
    commit completes; the keyset never loses the key the fleet trusts."""
    old_id, signer = keys.rotate_release_key(keydir, PASS)
    new_id = signer.public_key.keyid
    with monkeypatch.context() as patch:
        # atomic_write also moves files into place: the archive pair, keyset.json,
        # then the two moves of the commit itself.
        _crash_on_replace(patch, survive)
        with pytest.raises(KeyboardInterrupt):
            keys.commit_release_rotation(keydir)

    pending = keys.pending_release_rotation(keydir, PASS)
    assert pending is not None
    assert pending.public_key == signer.public_key
    named = keys.keyset_release_keyid(keydir)
    if named == new_id and (keydir / "release.key.new").exists():
        # keyset.json already names the new key, release.key is still the old one.
        with pytest.raises(InvalidInputError, match=r"keyset\.json names"):
            keys.load_operator_keyset(keydir, PASS)
    else:
        assert keys.load_operator_keyset(keydir, PASS).release_public_key.keyid == named

    assert keys.commit_release_rotation(keydir) == (old_id, new_id)
    assert keys.load_operator_keyset(keydir, PASS).release_public_key == signer.public_key
    assert keyset_json(keydir)["revoked_release"] == [old_id]
    assert keys.pending_release_rotation(keydir, PASS) is None


def test_commit_after_the_key_moved_but_not_its_public_file(
    keydir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_id, signer = keys.rotate_release_key(keydir, PASS)
    with monkeypatch.context() as patch:
        _crash_on_replace(patch, 4)  # archive .key, archive .pub, keyset.json, release.key
        with pytest.raises(KeyboardInterrupt):
            keys.commit_release_rotation(keydir)
    assert not (keydir / "release.key.new").exists()
    assert (keydir / "release.pub.new").exists()
    # The keyset loads (keyset.json and release.key agree); the rotation is still pending.
    assert keys.load_operator_keyset(keydir, PASS).release_public_key == signer.public_key
    pending = keys.pending_release_rotation(keydir, PASS)
    assert pending is not None
    assert pending.public_key == signer.public_key
    with pytest.raises(ConflictError, match="already pending"):
        keys.rotate_release_key(keydir, PASS)
    assert keys.commit_release_rotation(keydir) == (old_id, signer.public_key.keyid)
    assert keys.load_public_key(keydir / "release.pub") == signer.public_key
