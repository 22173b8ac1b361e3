"""The control plane's online keys (snapshot, timestamp) behind one port.

`OnlineSigner` is the port the registry uses; `FileOnlineKeyStore` keeps one Ed25519
key per fleet and role in files. It never holds root or release keys.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Final

from securesystemslib.signer import (
    CryptoSigner,
    Key,
    Signer,
)
from tuf.api.metadata import Metadata

from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.fsutil import make_private_dirs
from control_plane.trust.keys import generate_signer, load_signer, save_private_key
from control_plane.trust.repository import ONLINE_ROLES

FLEET_DIR_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


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
    def __init__(self, signers: dict[str, CryptoSigner]) -> None:
        self._signers = signers

    def public_key(self, role: str) -> Key:
        _check_role(role)
        return self._signers[role].public_key

    def _signer(self, role: str) -> Signer:
        return self._signers[role]


class FileOnlineKeyStore:
    """Per-fleet online keys in `<dir>/<fleet>/<role>.key`, created on first use.

    The keys are stored unencrypted with mode 0600: the process must be able to sign
    unattended. A KMS/HSM-backed `OnlineSigner` (securesystemslib's AWS/GCP/Azure/HSM
    signers) replaces this store in production.
    """

    def __init__(self, directory: Path) -> None:
        self._dir = Path(directory)
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, CryptoSigner]] = {}

    def ensure_keys(self, fleet: str) -> dict[str, Key]:
        """The public keys of the fleet's online roles, creating the keys if absent."""
        return {role: signer.public_key for role, signer in self._signers(fleet).items()}

    def signer_for(self, fleet: str) -> OnlineSigner:
        """The signer of an existing fleet; never creates keys.

        A live repository whose keys vanished must fail loudly: fresh keys would sign
        metadata that every node rejects (their root names the old keys).
        """
        return _KeyFileSigner(self._signers(fleet, create=False))

    def _signers(self, fleet: str, *, create: bool = True) -> dict[str, CryptoSigner]:
        if not isinstance(fleet, str) or not FLEET_DIR_PATTERN.fullmatch(fleet):
            raise InvalidInputError(f"{fleet!r} is not a fleet name", fleet=fleet)
        with self._lock:
            cached = self._cache.get(fleet)
            if cached is None:
                cached = {role: self._load_or_create(fleet, role, create) for role in ONLINE_ROLES}
                self._cache[fleet] = cached
            return dict(cached)

    def _load_or_create(self, fleet: str, role: str, create: bool) -> CryptoSigner:
        fleet_dir = self._dir / fleet
        path = fleet_dir / f"{role}.key"
        if path.exists():
            return load_signer(path, None)
        if not create:
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
