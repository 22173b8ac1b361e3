from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Root

from control_plane import fsutil
from control_plane.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
    SignatureError,
)
from control_plane.trust import keys
from control_plane.trust import repository as repo
from tests.control_plane.trust.helpers import NOW, YEAR

PASS = b"correct horse battery staple"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def signs_like(a: CryptoSigner, b: CryptoSigner) -> bool:
    sig = a.sign(b"payload")
    b.public_key.verify_signature(sig, b"payload")
    return a.public_key == b.public_key


def test_unencrypted_round_trip(tmp_path: Path) -> None:
    signer = keys.generate_signer()
    path = tmp_path / "k.key"
    keys.save_private_key(path, signer, None)
    assert mode(path) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = keys.load_signer(path, None)
    assert signs_like(loaded, signer)
    assert loaded.public_key.keyid == repo.canonical_keyid(signer.public_key)


def test_passphrase_round_trip(tmp_path: Path) -> None:
    signer = keys.generate_signer()
    path = tmp_path / "k.key"
    keys.save_private_key(path, signer, PASS)
    assert mode(path) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert signs_like(keys.load_signer(path, PASS), signer)


def test_mode_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    import os

    old = os.umask(0)
    try:
        path = tmp_path / "k.key"
        keys.save_private_key(path, keys.generate_signer(), None)
    finally:
        os.umask(old)
    assert mode(path) == 0o600


def test_wrong_passphrase(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    keys.save_private_key(path, keys.generate_signer(), PASS)
    with pytest.raises(InvalidInputError, match="wrong passphrase"):
        keys.load_signer(path, b"wrong")


def test_missing_passphrase(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    keys.save_private_key(path, keys.generate_signer(), PASS)
    with pytest.raises(InvalidInputError, match="passphrase is needed"):
        keys.load_signer(path, None)


def test_passphrase_for_unencrypted_key(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    keys.save_private_key(path, keys.generate_signer(), None)
    with pytest.raises(InvalidInputError, match="not encrypted"):
        keys.load_signer(path, PASS)


def test_empty_passphrase_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="empty passphrase"):
        keys.save_private_key(tmp_path / "k.key", keys.generate_signer(), b"")


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o660, 0o644, 0o700])
def test_loose_permissions_refused(tmp_path: Path, loose: int) -> None:
    path = tmp_path / "k.key"
    keys.save_private_key(path, keys.generate_signer(), None)
    path.chmod(loose)
    if not loose & 0o077:
        keys.load_signer(path, None)  # owner-only bits are fine
        return
    with pytest.raises(PolicyError, match=f"chmod 600 {path}"):
        keys.load_signer(path, None)


def test_not_a_key(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    path.write_bytes(b"hello, world\n")
    path.chmod(0o600)
    with pytest.raises(InvalidInputError, match="not a PEM private key"):
        keys.load_signer(path, None)


def test_not_an_ed25519_key(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    path.write_bytes(pem)
    path.chmod(0o600)
    with pytest.raises(InvalidInputError, match="Ed25519 keys only"):
        keys.load_signer(path, None)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        keys.load_signer(tmp_path / "absent.key", None)


def test_public_key_round_trip(tmp_path: Path) -> None:
    signer = keys.generate_signer()
    path = tmp_path / "k.pub"
    keys.save_public_key(path, signer.public_key)
    data = json.loads(path.read_text())
    assert data["keyid"] == signer.public_key.keyid
    assert data["keytype"] == "ed25519"
    assert keys.load_public_key(path) == signer.public_key


def test_public_key_with_foreign_keyid_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pub"
    keys.save_public_key(path, keys.generate_signer().public_key)
    data = json.loads(path.read_text())
    data["keyid"] = "0" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="not the hash"):
        keys.load_public_key(path)


def test_public_key_garbage_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pub"
    path.write_text("[1, 2]")
    with pytest.raises(InvalidInputError, match="not a public key file"):
        keys.load_public_key(path)


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "f"
    fsutil.atomic_write(target, b"one", mode=0o600)
    fsutil.atomic_write(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_exclusive_write_never_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f"
    fsutil.atomic_write(target, b"first", mode=0o600, exclusive=True)
    with pytest.raises(FileExistsError):
        fsutil.atomic_write(target, b"second", mode=0o600, exclusive=True)
    assert target.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


# ----------------------------------------------------------------- operator keyset


def test_init_operator_keys_writes_the_set(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    keyset = keys.init_operator_keys(out, passphrase=PASS, now=NOW)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [f"root-{i}.{ext}" for i in (1, 2, 3) for ext in ("key", "pub")]
        + ["release.key", "release.pub", "keyset.json"]
    )
    for key_file in out.glob("*.key"):
        assert mode(key_file) == 0o600
        assert key_file.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    meta = json.loads((out / "keyset.json").read_text())
    assert meta["root"] == [s.public_key.keyid for s in keyset.root_signers]
    assert meta["root_threshold"] == 2
    assert meta["release"] == [keyset.release_public_key.keyid]
    assert meta["created_at"] == "2025-06-01T12:00:00Z"
    assert len(set(meta["root"] + meta["release"])) == 4


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    keys.init_operator_keys(tmp_path, passphrase=None)
    before = (tmp_path / "release.key").read_bytes()
    with pytest.raises(ConflictError, match="refusing to overwrite"):
        keys.init_operator_keys(tmp_path, passphrase=None)
    assert (tmp_path / "release.key").read_bytes() == before


def test_init_refuses_over_a_partial_set(tmp_path: Path) -> None:
    (tmp_path / "root-2.key").write_bytes(b"x")
    with pytest.raises(ConflictError):
        keys.init_operator_keys(tmp_path, passphrase=None)


@pytest.mark.parametrize(("n", "threshold"), [(3, 0), (3, 4), (0, 1), (2, -1)])
def test_init_validates_threshold(tmp_path: Path, n: int, threshold: int) -> None:
    with pytest.raises(InvalidInputError):
        keys.init_operator_keys(tmp_path, root_keys=n, root_threshold=threshold, passphrase=None)
    assert list(tmp_path.iterdir()) == []


def test_load_operator_keyset_round_trip(tmp_path: Path) -> None:
    created = keys.init_operator_keys(tmp_path, passphrase=PASS)
    loaded = keys.load_operator_keyset(tmp_path, PASS)
    assert [s.public_key for s in loaded.root_signers] == created.root_public_keys
    assert loaded.root_public_keys == created.root_public_keys
    assert loaded.root_threshold == 2
    assert loaded.release_public_key == created.release_public_key


def test_load_operator_keyset_wrong_passphrase(tmp_path: Path) -> None:
    keys.init_operator_keys(tmp_path, passphrase=PASS)
    with pytest.raises(InvalidInputError, match="wrong passphrase"):
        keys.load_operator_keyset(tmp_path, b"nope")


def _root_for(keyset: keys.OperatorKeyset) -> Metadata[Root]:
    online = [keys.generate_signer() for _ in range(2)]
    return repo.build_root(
        root_keys=keyset.root_public_keys,
        root_threshold=keyset.root_threshold,
        release_keys=[keyset.release_public_key],
        snapshot_key=online[0].public_key,
        timestamp_key=online[1].public_key,
        expires=NOW + YEAR,
    )


def test_missing_root_key_is_checked_at_signing_time(tmp_path: Path) -> None:
    keys.init_operator_keys(tmp_path, passphrase=None)
    (tmp_path / "root-3.key").unlink()
    keyset = keys.load_operator_keyset(tmp_path, None)
    assert len(keyset.root_signers) == 2
    assert len(keyset.root_public_keys) == 3
    root = _root_for(keyset)
    keyset.sign_root(root)
    assert len(root.signatures) == 2
    root.signed.verify_delegate("root", root.signed_bytes, root.signatures)

    (tmp_path / "root-1.key").unlink()
    short = keys.load_operator_keyset(tmp_path, None)
    with pytest.raises(SignatureError, match="needs 2 root keys but only 1"):
        short.sign_root(_root_for(short))


def test_keyset_signed_root_is_accepted_by_the_server(tmp_path: Path) -> None:
    keyset = keys.init_operator_keys(tmp_path, passphrase=None)
    snapshot, timestamp = keys.generate_signer(), keys.generate_signer()
    root = repo.build_root(
        root_keys=keyset.root_public_keys,
        root_threshold=keyset.root_threshold,
        release_keys=[keyset.release_public_key],
        snapshot_key=snapshot.public_key,
        timestamp_key=timestamp.public_key,
        expires=NOW + YEAR,
    )
    keyset.sign_root(root)
    accepted = repo.verify_new_root(
        repo.to_bytes(root),
        snapshot_keyid=snapshot.public_key.keyid,
        timestamp_keyid=timestamp.public_key.keyid,
        now=NOW,
    )
    targets = repo.initial_targets(NOW + YEAR)
    keyset.sign_targets(targets)
    repo.verify_initial_targets(root=accepted, targets_bytes=repo.to_bytes(targets), now=NOW)


def test_keyset_with_swapped_pub_file_refused(tmp_path: Path) -> None:
    keys.init_operator_keys(tmp_path, passphrase=None)
    (tmp_path / "root-1.pub").write_bytes((tmp_path / "root-2.pub").read_bytes())
    with pytest.raises(InvalidInputError, match=r"keyset\.json names"):
        keys.load_operator_keyset(tmp_path, None)
