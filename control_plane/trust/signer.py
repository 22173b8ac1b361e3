"""The control plane's online keys (snapshot, timestamp) behind one port.

`OnlineSigner` is the port the registry uses; `FileOnlineKeyStore` keeps one Ed25519
key per fleet and role in files, or opens it behind a securesystemslib signer URI for the
fleets and roles an `OnlineKeyUris` mapping lists. It never holds root or release keys.
"""

from __future__ import annotations

import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from securesystemslib.exceptions import (
    KeyMismatchError,
    UnsupportedAlgorithmError,
    UnsupportedLibraryError,
)
from securesystemslib.signer import (
    SIGNER_FOR_URI_SCHEME,
    CryptoSigner,
    Key,
    Signer,
)
from tuf.api.metadata import Metadata

from control_plane.errors import EdgefleetError, InvalidInputError, UnavailableError
from control_plane.fsutil import make_private_dirs
from control_plane.trust.keys import (
    generate_signer,
    load_public_key,
    load_signer,
    save_private_key,
)
from control_plane.trust.repository import ONLINE_ROLES

FLEET_DIR_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
KEYID_PATTERN: Final = re.compile(r"[0-9a-f]{64}")
MAX_URI_FILE_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OnlineKeyUri:
    """An online key held behind a securesystemslib signer URI, and its public key."""

    uri: str
    public_key: Key


# fleet -> role -> the key behind a URI
OnlineKeyUris = Mapping[str, Mapping[str, OnlineKeyUri]]


def load_online_key_uris(path: Path) -> dict[str, dict[str, OnlineKeyUri]]:
    """Parse `{fleet: {role: {"uri": ..., "public_key": <.pub file>}}}` (JSON).

    A relative `public_key` is resolved against the file's directory. Every error is
    InvalidInputError naming the file and the entry, so a bad mapping stops the server
    at startup; the signers themselves are opened when first used.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if len(raw) > MAX_URI_FILE_BYTES:
            raise ValueError(f"larger than {MAX_URI_FILE_BYTES} bytes")
        doc = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            f"online signer URIs {path}: cannot read it: {exc}", path=str(path)
        ) from exc
    if not isinstance(doc, dict):
        raise InvalidInputError(
            f"online signer URIs {path}: expected {{fleet: {{role: {{uri, public_key}}}}}}",
            path=str(path),
        )
    found: dict[str, dict[str, OnlineKeyUri]] = {}
    for fleet, roles in doc.items():
        if not isinstance(fleet, str) or not FLEET_DIR_PATTERN.fullmatch(fleet):
            raise InvalidInputError(
                f"online signer URIs {path}: {fleet!r} is not a fleet name", path=str(path)
            )
        if not isinstance(roles, dict) or not roles:
            raise InvalidInputError(
                f"online signer URIs {path}: fleet {fleet!r}: expected {{role: {{uri, "
                "public_key}}}",
                path=str(path),
            )
        for role, entry in roles.items():
            found.setdefault(fleet, {})[role] = _uri_entry(path, fleet, role, entry)
    return found


def _uri_entry(path: Path, fleet: str, role: str, entry: Any) -> OnlineKeyUri:
    where = f"online signer URIs {path}: {fleet}/{role}"
    if role not in ONLINE_ROLES:
        raise InvalidInputError(
            f"{where}: {role!r} is not an online role ({', '.join(ONLINE_ROLES)})",
            path=str(path),
        )
    if (
        not isinstance(entry, dict)
        or set(entry) != {"uri", "public_key"}
        or not all(isinstance(v, str) and v for v in entry.values())
    ):
        raise InvalidInputError(
            f'{where}: expected {{"uri": "<scheme>:...", "public_key": "<.pub file>"}}',
            path=str(path),
        )
    scheme = entry["uri"].partition(":")[0]
    if scheme not in SIGNER_FOR_URI_SCHEME:
        raise InvalidInputError(
            f"{where}: unknown scheme {scheme!r}; securesystemslib signs with "
            f"{', '.join(sorted(SIGNER_FOR_URI_SCHEME))}",
            path=str(path),
        )
    try:
        public = load_public_key(path.parent / entry["public_key"])
    except (OSError, EdgefleetError) as exc:
        raise InvalidInputError(f"{where}: {exc}", path=str(path)) from exc
    return OnlineKeyUri(entry["uri"], public)


class OnlineSigner(ABC):
    """Signs a fleet's snapshot and timestamp metadata with the control plane's keys."""

    @abstractmethod
    def public_key(self, role: str) -> Key:
        """The public key of `role` ("snapshot" or "timestamp")."""

    @abstractmethod
    def _signer(self, role: str) -> Signer:
        """The securesystemslib signer of `role`; the role is already checked."""

    def sign(self, role: str, metadata: Metadata[Any]) -> None:
        """Replace `metadata`'s signatures with one by the online key of `role`."""
        _check_role(role)
        if metadata.signed.type != role:
            raise ValueError(f"asked to sign {metadata.signed.type} metadata as {role}")
        metadata.sign(self._signer(role), append=False)


def _check_role(role: str) -> None:
    if role not in ONLINE_ROLES:
        raise ValueError(f"{role!r} is not an online role; online roles are {ONLINE_ROLES}")


class _KeyFileSigner(OnlineSigner):
    def __init__(self, signers: Mapping[str, Signer]) -> None:
        self._signers = signers

    def public_key(self, role: str) -> Key:
        _check_role(role)
        return self._signers[role].public_key

    def _signer(self, role: str) -> Signer:
        return self._signers[role]


class FileOnlineKeyStore:
    """Per-fleet online keys in `<dir>/<fleet>/`, one file per key.

    A fleet's first keys are `<role>.key`, made by `ensure_keys` (fleet creation). An
    online-key rotation (`new_keys`) adds `<role>.<keyid>.key`; which key signs is the
    keyid the fleet's root names (passed to `signer_for`), so a rotation needs no file
    moved and a crash between the database commit and anything on disk changes nothing.
    Old keys stay on disk until the operator deletes them (docs/operator-guide.md).

    The keys are stored unencrypted with mode 0600: the process must be able to sign
    unattended. A fleet and role listed in `uris` is signed instead by the key behind its
    securesystemslib signer URI (KMS, Vault, HSM; ADR 0045) whenever the fleet's root
    names that key (or names none yet: a new fleet starts with it); the key files serve
    everything else, so a fleet moves to a URI key with an online-key rotation.
    """

    def __init__(self, directory: Path, uris: OnlineKeyUris | None = None) -> None:
        self._dir = Path(directory)
        self._uris = uris or {}
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str | None], CryptoSigner] = {}
        self._uri_cache: dict[tuple[str, str], Signer] = {}

    def ensure_keys(self, fleet: str) -> dict[str, Key]:
        """The public keys of the fleet's first online keys, creating them if absent."""
        _check_fleet(fleet)
        keys: dict[str, Key] = {}
        for role in ONLINE_ROLES:
            held = self._uris.get(fleet, {}).get(role)
            if held is not None:
                keys[role] = self._uri_signer(fleet, role, held).public_key
                continue
            signer = self._first(fleet, role, create=True)
            if signer is None:
                raise AssertionError("unreachable: a created key is never None")
            keys[role] = signer.public_key
        return keys

    def signer_for(self, fleet: str, keyids: Mapping[str, str] | None = None) -> OnlineSigner:
        """The signer of an existing fleet; never creates keys.

        `keyids` (role → keyid, what the fleet's root names) picks the key of each role;
        without it the fleet's first keys. A live repository whose keys vanished must
        fail loudly: fresh keys would sign metadata that every node rejects.
        """
        _check_fleet(fleet)
        signers: dict[str, Signer] = {}
        for role in ONLINE_ROLES:
            keyid = None if keyids is None else keyids.get(role)
            held = self._uris.get(fleet, {}).get(role)
            if held is not None and keyid in (None, held.public_key.keyid):
                signers[role] = self._uri_signer(fleet, role, held)
                continue
            first = self._first(fleet, role, create=False, required=keyid is None)
            if first is not None and (keyid is None or first.public_key.keyid == keyid):
                signers[role] = first
            elif keyid is None:
                raise AssertionError("unreachable: a required first key is loaded or raises")
            else:
                signers[role] = self._rotated(fleet, role, keyid)
        return _KeyFileSigner(signers)

    def new_keys(self, fleet: str) -> dict[str, Key]:
        """Fresh online keys for a rotation (`<role>.<keyid>.key`); nothing signs with
        them until a root naming them is accepted (see `holds`). A role listed behind a
        signer URI gets that key instead: `keys rotate-online` moves a fleet onto it."""
        _check_fleet(fleet)
        fleet_dir = self._dir / fleet
        make_private_dirs(fleet_dir)
        made: dict[str, Key] = {}
        for role in ONLINE_ROLES:
            held = self._uris.get(fleet, {}).get(role)
            if held is not None:
                made[role] = self._uri_signer(fleet, role, held).public_key
                continue
            signer = generate_signer()
            keyid = signer.public_key.keyid
            save_private_key(fleet_dir / f"{role}.{keyid}.key", signer, None, exclusive=True)
            made[role] = signer.public_key
        return made

    def holds(self, fleet: str, role: str, keyid: str) -> bool:
        """True when this store holds the private key `keyid` for the fleet's `role`."""
        _check_fleet(fleet)
        _check_role(role)
        held = self._uris.get(fleet, {}).get(role)
        try:
            if held is not None and held.public_key.keyid == keyid:
                self._uri_signer(fleet, role, held)  # reachable and the same key
                return True
            first = self._first(fleet, role, create=False, required=False)
            if first is not None and first.public_key.keyid == keyid:
                return True
            self._rotated(fleet, role, keyid)
        except (UnavailableError, InvalidInputError):
            return False
        return True

    def _uri_signer(self, fleet: str, role: str, held: OnlineKeyUri) -> Signer:
        with self._lock:
            cached = self._uri_cache.get((fleet, role))
            if cached is None:
                cached = self._uri_cache[(fleet, role)] = signer_from_uri(held.uri, held.public_key)
            return cached

    def _first(
        self, fleet: str, role: str, *, create: bool, required: bool = True
    ) -> CryptoSigner | None:
        with self._lock:
            cached = self._cache.get((fleet, role, None))
            if cached is None:
                found = self._load_or_create(fleet, role, create, required)
                if found is None:
                    return None
                cached = self._cache[(fleet, role, None)] = found
            return cached

    def _rotated(self, fleet: str, role: str, keyid: str) -> CryptoSigner:
        if not KEYID_PATTERN.fullmatch(keyid):
            raise InvalidInputError(f"{keyid!r} is not a keyid", keyid=keyid)
        with self._lock:
            cached = self._cache.get((fleet, role, keyid))
            if cached is not None:
                return cached
            path = self._dir / fleet / f"{role}.{keyid}.key"
            if not path.exists():
                raise UnavailableError(
                    f"the online {role} key {keyid} of fleet {fleet!r} is missing from "
                    f"{path.parent}; restore the data dir's online-keys from backup",
                    fleet=fleet,
                    role=role,
                    keyid=keyid,
                )
            signer = load_signer(path, None)
            if signer.public_key.keyid != keyid:
                raise UnavailableError(
                    f"{path} holds key {signer.public_key.keyid}, not {keyid}",
                    fleet=fleet,
                    role=role,
                    keyid=keyid,
                )
            self._cache[(fleet, role, keyid)] = signer
            return signer

    def _load_or_create(
        self, fleet: str, role: str, create: bool, required: bool
    ) -> CryptoSigner | None:
        fleet_dir = self._dir / fleet
        path = fleet_dir / f"{role}.key"
        if path.exists():
            return load_signer(path, None)
        if not create:
            if not required:
                return None
            raise UnavailableError(
                f"the online {role} key of fleet {fleet!r} is missing from {fleet_dir}; "
                "restore the data dir's online-keys from backup (new keys would not match "
                "the fleet's root)",
                fleet=fleet,
                role=role,
            )
        make_private_dirs(fleet_dir)
        signer = generate_signer()
        try:
            save_private_key(path, signer, None, exclusive=True)
        except FileExistsError:
            # Another process (replica) created it first: use theirs, never replace it.
            return load_signer(path, None)
        return signer


def _check_fleet(fleet: str) -> None:
    if not isinstance(fleet, str) or not FLEET_DIR_PATTERN.fullmatch(fleet):
        raise InvalidInputError(f"{fleet!r} is not a fleet name", fleet=fleet)


def signer_from_uri(uri: str, public_key: Key) -> Signer:
    """A securesystemslib signer for `uri`, checked against `public_key`.

    The URI picks the signer by its scheme (`Signer.from_priv_key_uri`):
    `file2:<path>` (a PEM file, `CryptoSigner`), `hv:<key name>` (HashiCorp Vault
    transit), `gcpkms:…`, `awskms:…`, `azurekms:…`, `hsm:…` (PKCS#11). Nodes verify
    Ed25519 only, so the key behind the URI must be Ed25519. Refused with
    InvalidInputError for an unknown scheme, UnavailableError when the key cannot be
    reached or is not `public_key`.
    """
    scheme = uri.partition(":")[0]
    if scheme not in SIGNER_FOR_URI_SCHEME:
        raise InvalidInputError(
            f"signer URI {uri!r}: unknown scheme {scheme!r}; securesystemslib signs with "
            f"{', '.join(sorted(SIGNER_FOR_URI_SCHEME))}",
            scheme=scheme,
        )
    try:
        signer = Signer.from_priv_key_uri(uri, public_key)
    except (
        ValueError,
        OSError,
        KeyMismatchError,
        UnsupportedAlgorithmError,
        UnsupportedLibraryError,
    ) as exc:
        raise UnavailableError(
            f"cannot open the signer {uri!r} for key {public_key.keyid}: {exc}",
            scheme=scheme,
            keyid=public_key.keyid,
        ) from exc
    if signer.public_key.keyid != public_key.keyid:
        raise UnavailableError(
            f"the signer {uri!r} holds key {signer.public_key.keyid}, not {public_key.keyid}",
            keyid=public_key.keyid,
        )
    return signer
