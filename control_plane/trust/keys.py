"""Ed25519 key files: the operator's offline root and release keys, and key-file helpers.

Private keys are PKCS#8 PEM (encrypted when a passphrase is given), written atomically
with mode 0600 from creation. Signing rules live in `repository`; this module only
stores and loads keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    KeySerializationEncryption,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from securesystemslib.signer import (
    ED25519,
    KEY_TYPE_ED25519,
    CryptoSigner,
    Key,
    SSlibKey,
)
from tuf.api.metadata import Metadata, Root, Targets

from control_plane.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PolicyError,
    SignatureError,
)
from control_plane.trust.repository import canonical_keyid

KEYSET_FILE: Final = "keyset.json"
RELEASE_KEY_STEM: Final = "release"
PRIVATE_MODE: Final = 0o600
PUBLIC_MODE: Final = 0o644
_MAX_KEY_FILE = 64 * 1024


def generate_signer() -> CryptoSigner:
    """A fresh Ed25519 signer whose keyid is the canonical hash of its public key."""
    return CryptoSigner.generate_ed25519()


# ------------------------------------------------------------------------ writing


def atomic_write(path: Path, data: bytes, *, mode: int, exclusive: bool = False) -> None:
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
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_key_pem(signer: CryptoSigner, passphrase: bytes | None) -> bytes:
    """PKCS#8 PEM of the signer's private key, encrypted when `passphrase` is given."""
    if passphrase is not None and not passphrase:
        raise InvalidInputError("an empty passphrase is not a passphrase; pass None for none")
    # CryptoSigner exposes only the unencrypted PEM; re-read it to encrypt it.
    private_key = load_pem_private_key(signer.private_bytes, password=None)
    encryption: KeySerializationEncryption = (
        BestAvailableEncryption(passphrase) if passphrase is not None else NoEncryption()
    )
    return private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, encryption)


def save_private_key(
    path: Path,
    signer: CryptoSigner,
    passphrase: bytes | None,
    *,
    exclusive: bool = False,
) -> None:
    """Write the private key atomically with mode 0600 (see `atomic_write`)."""
    _require_ed25519(signer.public_key, str(path))
    atomic_write(
        Path(path), private_key_pem(signer, passphrase), mode=PRIVATE_MODE, exclusive=exclusive
    )


def public_key_dict(key: Key) -> dict[str, Any]:
    """The JSON form of a public key file: TUF's key dict plus its keyid."""
    return {"keyid": key.keyid, **key.to_dict()}


def save_public_key(path: Path, key: Key) -> None:
    data = json.dumps(public_key_dict(key), indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(Path(path), data, mode=PUBLIC_MODE)


# ------------------------------------------------------------------------ reading


def _read_small(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except FileNotFoundError as exc:
        raise NotFoundError(f"{what} {path} does not exist", path=str(path)) from exc
    except IsADirectoryError as exc:
        raise InvalidInputError(f"{what} {path} is a directory", path=str(path)) from exc
    if len(data) > _MAX_KEY_FILE:
        raise InvalidInputError(f"{what} {path} is too large to be a key", path=str(path))
    return data


def check_private_key_mode(path: Path) -> None:
    """Refuse a private key file that group or others may read or write."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise NotFoundError(f"private key {path} does not exist", path=str(path)) from exc
    if stat.S_IMODE(mode) & 0o077:
        raise PolicyError(
            f"private key {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); fix it with: chmod 600 {path}",
            path=str(path),
            mode=f"{stat.S_IMODE(mode):04o}",
        )


def load_signer(path: Path, passphrase: bytes | None) -> CryptoSigner:
    """Load an Ed25519 private key file written by `save_private_key`."""
    path = Path(path)
    check_private_key_mode(path)
    data = _read_small(path, "private key")
    encrypted = b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data
    if encrypted and passphrase is None:
        raise InvalidInputError(
            f"private key {path} is encrypted: a passphrase is needed", path=str(path)
        )
    if not encrypted and passphrase is not None and b"PRIVATE KEY-----" in data:
        raise InvalidInputError(
            f"private key {path} is not encrypted, but a passphrase was given", path=str(path)
        )
    try:
        private_key = load_pem_private_key(data, password=passphrase if encrypted else None)
    except ValueError as exc:
        if encrypted:
            raise InvalidInputError(
                f"cannot decrypt private key {path}: wrong passphrase", path=str(path)
            ) from exc
        raise InvalidInputError(f"{path} is not a PEM private key", path=str(path)) from exc
    except (TypeError, UnsupportedAlgorithm) as exc:
        raise InvalidInputError(
            f"{path} is not a usable private key: {exc}", path=str(path)
        ) from exc
    if not isinstance(private_key, Ed25519PrivateKey):
        raise InvalidInputError(
            f"{path} holds a {type(private_key).__name__}; edgefleet uses Ed25519 keys only",
            path=str(path),
        )
    return CryptoSigner(private_key)


def load_public_key(path: Path) -> Key:
    """Load a public key file written by `save_public_key`; the keyid must match the key."""
    path = Path(path)
    raw = _read_small(path, "public key")
    try:
        obj = json.loads(raw)
        keyid = obj.pop("keyid")
        key = SSlibKey.from_dict(keyid, obj)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"{path} is not a public key file", path=str(path)) from exc
    _require_ed25519(key, str(path))
    if canonical_keyid(key) != key.keyid:
        raise InvalidInputError(
            f"{path}: keyid {key.keyid} is not the hash of the key it names", path=str(path)
        )
    return key


def _require_ed25519(key: Key, where: str) -> None:
    if key.keytype != KEY_TYPE_ED25519 or key.scheme != ED25519:
        raise InvalidInputError(
            f"{where}: {key.keytype}/{key.scheme} key; edgefleet uses Ed25519 keys only",
            path=where,
        )


# ---------------------------------------------------------------- operator keyset


@dataclass(frozen=True)
class OperatorKeyset:
    """The operator's offline keys as found on this machine.

    `root_signers` holds the root keys present here (the others may sit with other key
    holders); `root_public_keys` holds all of them, in keyset order.
    """

    root_signers: list[CryptoSigner]
    root_threshold: int
    release_signer: CryptoSigner
    root_public_keys: list[Key]

    @property
    def release_public_key(self) -> Key:
        return self.release_signer.public_key

    def sign_root(self, md: Metadata[Root]) -> None:
        """Add a signature of every root key present; refuse below the threshold."""
        if len(self.root_signers) < self.root_threshold:
            raise SignatureError(
                f"root needs {self.root_threshold} root keys but only "
                f"{len(self.root_signers)} are present",
                present=len(self.root_signers),
                threshold=self.root_threshold,
            )
        for signer in self.root_signers:
            md.sign(signer, append=True)

    def sign_targets(self, md: Metadata[Targets]) -> None:
        md.sign(self.release_signer, append=False)


def _root_stem(index: int) -> str:
    return f"root-{index}"


def init_operator_keys(
    out_dir: Path,
    *,
    root_keys: int = 3,
    root_threshold: int = 2,
    passphrase: bytes | None,
    now: datetime | None = None,
) -> OperatorKeyset:
    """Create root-1..N and release keys (+ .pub) and keyset.json in `out_dir`."""
    out_dir = Path(out_dir)
    if isinstance(root_keys, bool) or not 1 <= root_keys <= 16:
        raise InvalidInputError(f"root_keys must be 1..16, got {root_keys}", root_keys=root_keys)
    if isinstance(root_threshold, bool) or not 1 <= root_threshold <= root_keys:
        raise InvalidInputError(
            f"root_threshold must be between 1 and {root_keys}, got {root_threshold}",
            root_threshold=root_threshold,
        )
    stems = [_root_stem(i) for i in range(1, root_keys + 1)] + [RELEASE_KEY_STEM]
    files = [out_dir / KEYSET_FILE] + [
        out_dir / f"{stem}{ext}" for stem in stems for ext in (".key", ".pub")
    ]
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise ConflictError(
            f"refusing to overwrite existing keys in {out_dir}: {', '.join(existing)}",
            existing=existing,
        )
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    root_signers = [generate_signer() for _ in range(root_keys)]
    release = generate_signer()
    for stem, signer in zip(stems, [*root_signers, release], strict=True):
        save_private_key(out_dir / f"{stem}.key", signer, passphrase, exclusive=True)
        save_public_key(out_dir / f"{stem}.pub", signer.public_key)

    created = (now or datetime.now(UTC)).astimezone(UTC)
    keyset = {
        "edgefleet": 1,
        "root": [s.public_key.keyid for s in root_signers],
        "root_threshold": root_threshold,
        "release": [release.public_key.keyid],
        "created_at": created.isoformat().replace("+00:00", "Z"),
    }
    # Written last and exclusively: its presence means the set is complete.
    atomic_write(
        out_dir / KEYSET_FILE,
        json.dumps(keyset, indent=2).encode() + b"\n",
        mode=PUBLIC_MODE,
        exclusive=True,
    )
    return OperatorKeyset(
        root_signers=root_signers,
        root_threshold=root_threshold,
        release_signer=release,
        root_public_keys=[s.public_key for s in root_signers],
    )


def _keyset_ids(obj: Any, field: str) -> list[str]:
    value = obj.get(field) if isinstance(obj, dict) else None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"{KEYSET_FILE}: {field} must be a list of keyids", field=field)
    return value


def load_operator_keyset(directory: Path, passphrase: bytes | None) -> OperatorKeyset:
    """Load keyset.json and the keys present; every .pub must be there, a root .key may not."""
    directory = Path(directory)
    raw = _read_small(directory / KEYSET_FILE, "keyset")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"{directory / KEYSET_FILE} is not JSON") from exc
    root_ids = _keyset_ids(obj, "root")
    release_ids = _keyset_ids(obj, "release")
    threshold = obj.get("root_threshold")
    if (
        not isinstance(threshold, int)
        or isinstance(threshold, bool)
        or not 1 <= threshold <= len(root_ids)
    ):
        raise InvalidInputError(f"{KEYSET_FILE}: bad root_threshold {threshold!r}")
    if len(release_ids) != 1:
        raise InvalidInputError(f"{KEYSET_FILE}: expected exactly one release key")

    root_public: list[Key] = []
    root_signers: list[CryptoSigner] = []
    for index, keyid in enumerate(root_ids, start=1):
        stem = _root_stem(index)
        public = load_public_key(directory / f"{stem}.pub")
        if public.keyid != keyid:
            raise InvalidInputError(
                f"{stem}.pub holds key {public.keyid}, keyset.json names {keyid}", file=stem
            )
        root_public.append(public)
        key_path = directory / f"{stem}.key"
        if not key_path.exists():
            continue  # held by another key holder: checked at signing time
        signer = load_signer(key_path, passphrase)
        if signer.public_key.keyid != keyid:
            raise InvalidInputError(
                f"{stem}.key holds key {signer.public_key.keyid}, keyset.json names {keyid}",
                file=stem,
            )
        root_signers.append(signer)

    release = load_signer(directory / f"{RELEASE_KEY_STEM}.key", passphrase)
    if release.public_key.keyid != release_ids[0]:
        raise InvalidInputError(
            f"release.key holds key {release.public_key.keyid}, keyset.json names {release_ids[0]}"
        )
    return OperatorKeyset(
        root_signers=root_signers,
        root_threshold=threshold,
        release_signer=release,
        root_public_keys=root_public,
    )
