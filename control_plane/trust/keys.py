"""Ed25519 key files: the operator's offline root and release keys, and key-file helpers.

Also the on-disk half of a release key rotation (new key pending, then committed).

Private keys are PKCS#8 PEM (encrypted when a passphrase is given), written atomically
with mode 0600 from creation. Signing rules live in `repository`; this module only
stores and loads keys.
"""

from __future__ import annotations

import json
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
from control_plane.fsutil import atomic_write, fsync_dir, make_private_dirs
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
    make_private_dirs(out_dir)

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


# ------------------------------------------------------------ release key rotation
#
# A rotation is two steps around the server's decision, so that a crash never leaves
# the operator without the key the fleet trusts:
#
#   rotate_release_key       writes release.key.new / release.pub.new (release.key
#                            untouched: the server does not know the new key yet)
#   (server accepts root N+1 naming the new key, see ReleaseClient.rotate_release_key)
#   commit_release_rotation  archives the old key as release-<id>.revoked.key, updates
#                            keyset.json, moves the new key into place

PENDING_SUFFIX: Final = ".new"
REVOKED_FIELD: Final = "revoked_release"


def _release_paths(directory: Path) -> tuple[Path, Path, Path, Path]:
    key = directory / f"{RELEASE_KEY_STEM}.key"
    pub = directory / f"{RELEASE_KEY_STEM}.pub"
    return key, pub, Path(f"{key}{PENDING_SUFFIX}"), Path(f"{pub}{PENDING_SUFFIX}")


def revoked_key_stem(keyid: str) -> str:
    """File stem under which a revoked release key is archived."""
    return f"{RELEASE_KEY_STEM}-{keyid[:12]}.revoked"


def _read_keyset(directory: Path) -> dict[str, Any]:
    raw = _read_small(directory / KEYSET_FILE, "keyset")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"{directory / KEYSET_FILE} is not JSON") from exc
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{directory / KEYSET_FILE} is not a keyset")
    release = _keyset_ids(obj, "release")
    if len(release) != 1:
        raise InvalidInputError(f"{KEYSET_FILE}: expected exactly one release key")
    return obj


def rotate_release_key(directory: Path, passphrase: bytes | None) -> tuple[str, CryptoSigner]:
    """Step one of a release key rotation: a new key in `release.key.new` (+ `.pub.new`).

    Returns the current (soon revoked) keyid and the new signer. Nothing that signs
    today is touched: until `commit_release_rotation`, `release.key` stays the key the
    fleet trusts. ConflictError when a rotation is already pending — resume it with
    `pending_release_rotation` instead of starting another.
    """
    directory = Path(directory)
    old_keyid = _keyset_ids(_read_keyset(directory), "release")[0]
    _, _, key_new, pub_new = _release_paths(directory)
    pending = ConflictError(
        f"a release key rotation is already pending in {directory}; finish it "
        "(`edgefleet keys rotate-release` resumes it) or abandon it (see "
        "commit_release_rotation)",
        path=str(key_new),
    )
    if pub_new.exists():
        raise pending
    signer = generate_signer()
    try:
        # The private key first and exclusively: two rotations never race to one file.
        save_private_key(key_new, signer, passphrase, exclusive=True)
    except FileExistsError as exc:
        raise pending from exc
    save_public_key(pub_new, signer.public_key)
    return old_keyid, signer


def keyset_release_keyid(directory: Path) -> str:
    """The release keyid keyset.json names (no private key is read)."""
    return _keyset_ids(_read_keyset(Path(directory)), "release")[0]


def pending_release_rotation(directory: Path, passphrase: bytes | None) -> CryptoSigner | None:
    """The new release key of a rotation started but not fully committed, or None.

    Found in `release.key.new`, or already in `release.key` when a commit stopped
    after moving it (then `release.pub.new` is still there). Rewrites
    `release.pub.new` from the private key when a crash lost it.
    """
    directory = Path(directory)
    key, _, key_new, pub_new = _release_paths(directory)
    if key_new.exists():
        signer = load_signer(key_new, passphrase)
        try:
            current: Key | None = load_public_key(pub_new)
        except (NotFoundError, InvalidInputError):
            current = None
        if current != signer.public_key:
            save_public_key(pub_new, signer.public_key)
        return signer
    if pub_new.exists():
        signer = load_signer(key, passphrase)
        if signer.public_key.keyid != load_public_key(pub_new).keyid:
            raise InvalidInputError(
                f"{pub_new.name} is left over but neither {key_new.name} nor {key.name} "
                "holds its key; remove it if no rotation is in progress",
                path=str(pub_new),
            )
        return signer
    return None


def commit_release_rotation(directory: Path) -> tuple[str, str]:
    """Step two, once the server accepted the rotation: the new key becomes `release.key`.

    Archives the old pair as `release-<keyid[:12]>.revoked.key/.pub`, names the new key
    in keyset.json (the old one under "revoked_release"), then moves `release.key.new`
    and, last, `release.pub.new` into place; returns (old keyid, new keyid). Every
    write is atomic and the order makes it idempotent; after a crash:

    - between `rotate_release_key` and the server's answer nothing is committed; run
      the rotation again: `pending_release_rotation` finds the new key and the operator
      side sees whether the server already accepted it (then it only commits). To
      abandon a rotation the server never accepted, delete `release.key.new` and
      `release.pub.new` — never once the fleet's root names the new key.
    - during this function: keyset.json changes only after the server accepted, so
      when it already names the pending key, run this again (`edgefleet keys
      rotate-release` does): it only finishes the moves. Until then loading the
      keyset fails with "release.key holds key X, keyset.json names Y".
    """
    directory = Path(directory)
    key, pub, key_new, pub_new = _release_paths(directory)
    if not pub_new.exists():
        raise NotFoundError(f"no pending release key rotation in {directory}", path=str(pub_new))
    new_keyid = load_public_key(pub_new).keyid
    keyset = _read_keyset(directory)
    named = _keyset_ids(keyset, "release")[0]
    revoked = keyset.get(REVOKED_FIELD, [])
    if not isinstance(revoked, list) or not all(isinstance(v, str) for v in revoked):
        raise InvalidInputError(f"{KEYSET_FILE}: {REVOKED_FIELD} must be a list of keyids")

    if named != new_keyid:
        old_keyid = named
        if not key_new.exists():
            raise NotFoundError(
                f"{key_new.name} is missing: the pending rotation cannot be committed",
                path=str(key_new),
            )
        if load_public_key(pub).keyid != old_keyid:
            raise InvalidInputError(
                f"{pub.name} is not the release key keyset.json names ({old_keyid})",
                path=str(pub),
            )
        check_private_key_mode(key)
        stem = revoked_key_stem(old_keyid)
        atomic_write(directory / f"{stem}.key", _read_small(key, "private key"), mode=PRIVATE_MODE)
        atomic_write(directory / f"{stem}.pub", _read_small(pub, "public key"), mode=PUBLIC_MODE)
        keyset["release"] = [new_keyid]
        keyset[REVOKED_FIELD] = [*revoked, old_keyid]
        # The point of no return: from here on the new key is this keyset's release key.
        atomic_write(
            directory / KEYSET_FILE,
            json.dumps(keyset, indent=2).encode() + b"\n",
            mode=PUBLIC_MODE,
        )
    elif revoked:
        old_keyid = revoked[-1]
    else:
        raise InvalidInputError(
            f"{KEYSET_FILE} already names {new_keyid} but records no revoked key"
        )
    if key_new.exists():
        key_new.replace(key)
    pub_new.replace(pub)  # last: its absence means no rotation is pending
    fsync_dir(directory)
    return old_keyid, new_keyid
