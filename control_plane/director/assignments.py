"""Signing director assignments, and the control plane's one director key on disk.

`sign_assignment` turns plain values into a `SignedDirectorAssignment`: it serializes
the protobuf once and signs those exact bytes (protobuf serialization is not canonical,
so the node verifies the bytes before it parses them). It takes data and a signer and
returns bytes; it decides nothing about which node runs what (that is `DirectorService`).
`renewal` marks an assignment that only renews the one before it (ADR 0032); `shadow` a
candidate to run beside the target (`ShadowSpec`, ADR 0031).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from securesystemslib.signer import ED25519, KEY_TYPE_ED25519, CryptoSigner, Key, Signer

from control_plane.errors import InvalidInputError, UnavailableError
from control_plane.fsutil import make_private_dirs
from control_plane.trust.custom import SHA256_PATTERN, parse_target_path
from control_plane.trust.keys import generate_signer, load_signer, save_private_key
from control_plane.trust.repository import canonical_keyid
from protos.edgefleet.fleet.v1.director_pb2 import (
    DirectorAssignment,
    ShadowTarget,
    SignedDirectorAssignment,
)

__all__ = [
    "DIRECTOR_KEY_FILE",
    "FORMAT_VERSION",
    "MAX_ASSIGNMENT_BYTES",
    "DirectorKeyring",
    "ShadowSpec",
    "check_shadow_settings",
    "load_or_create_director_key",
    "shadow_of",
    "sign_assignment",
    "sign_assignments",
]

FORMAT_VERSION: Final = 1
"""`DirectorAssignment.format_version` this build writes."""

DIRECTOR_KEY_FILE: Final = "director.key"

MAX_ASSIGNMENT_BYTES: Final = 4096
"""An assignment is a few hundred bytes; the node refuses anything above this bound."""

_MAX_UINT64: Final = 2**64 - 1
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True, slots=True)
class ShadowSpec:
    """A candidate to run in shadow beside the assigned target: a model target (hashes as
    TUF lists them), frames per mille of those served (1-1000), a CPU cap (1-100 %)."""

    target_path: str
    sha256: str
    length: int
    sample_per_mille: int
    max_cpu_percent: int

    def to_dict(self) -> dict[str, object]:
        return {
            "target_path": self.target_path,
            "sha256": self.sha256,
            "length": self.length,
            "sample_per_mille": self.sample_per_mille,
            "max_cpu_percent": self.max_cpu_percent,
        }


def shadow_of(assignment: DirectorAssignment) -> ShadowSpec | None:
    """The `ShadowSpec` a signed assignment carries, or None."""
    if not assignment.HasField("shadow"):
        return None
    shadow = assignment.shadow
    return ShadowSpec(
        shadow.target_path,
        shadow.sha256,
        shadow.length,
        shadow.sample_per_mille,
        shadow.max_cpu_percent,
    )


def sign_assignment(
    signer: Signer,
    *,
    fleet: str,
    node_id: str,
    sequence: int,
    target_path: str,
    sha256: str,
    length: int,
    issued_at: datetime,
    expires_at: datetime,
    renewal: bool = False,
    shadow: ShadowSpec | None = None,
) -> SignedDirectorAssignment:
    """Build and sign "node `node_id` of `fleet` shall run `target_path`".

    The signer must hold an Ed25519 key; `keyid` is the canonical TUF keyid of its
    public key. Values are checked here (InvalidInputError) so that nothing a node
    would refuse for its shape is ever signed.
    """
    [signed] = sign_assignments(
        signer,
        fleet=fleet,
        nodes=[(node_id, sequence)],
        target_path=target_path,
        sha256=sha256,
        length=length,
        issued_at=issued_at,
        expires_at=expires_at,
        renewal=renewal,
        shadow=shadow,
    )
    return signed


def sign_assignments(
    signer: Signer,
    *,
    fleet: str,
    nodes: Iterable[tuple[str, int]],
    target_path: str,
    sha256: str,
    length: int,
    issued_at: datetime,
    expires_at: datetime,
    renewal: bool = False,
    shadow: ShadowSpec | None = None,
) -> list[SignedDirectorAssignment]:
    """`sign_assignment` for many (node id, sequence) pairs of one fleet and target, in
    order: what they share is checked, and the keyid derived, once."""
    key = signer.public_key
    _require_ed25519(key)
    if not _NAME.fullmatch(fleet):
        raise InvalidInputError(f"{fleet!r} is not a fleet name", field="fleet")
    parsed = parse_target_path(target_path)
    if parsed is None or parsed.kind != "model":
        raise InvalidInputError(
            f"{target_path!r} is not a model target (models/<model>/<version>/model.onnx)",
            field="target_path",
        )
    if not SHA256_PATTERN.fullmatch(sha256):
        raise InvalidInputError("sha256 must be 64 lowercase hex digits", field="sha256")
    if isinstance(length, bool) or not 0 <= length <= _MAX_UINT64:
        raise InvalidInputError(f"length must be 0..2^64-1, got {length}", field="length")
    issued = _utc(issued_at, "issued_at")
    expires = _utc(expires_at, "expires_at")
    if expires <= issued:
        raise InvalidInputError("expires_at must be after issued_at", field="expires_at")
    if not isinstance(renewal, bool):
        raise InvalidInputError("renewal must be true or false", field="renewal")

    keyid = canonical_keyid(key)
    shared = DirectorAssignment(
        fleet=fleet,
        target_path=target_path,
        sha256=sha256,
        length=length,
        format_version=FORMAT_VERSION,
        renewal=renewal,
    )
    if shadow is not None:
        shared.shadow.CopyFrom(_shadow_target(shadow, parsed.model))
    shared.issued_at.FromDatetime(issued)
    shared.expires_at.FromDatetime(expires)
    signed: list[SignedDirectorAssignment] = []
    for node_id, sequence in nodes:
        if not _NAME.fullmatch(node_id):
            raise InvalidInputError(f"{node_id!r} is not a node id", field="node_id")
        if isinstance(sequence, bool) or not 1 <= sequence <= _MAX_UINT64:
            raise InvalidInputError(f"sequence must be 1..2^64-1, got {sequence}", field="sequence")
        assignment = DirectorAssignment()
        assignment.CopyFrom(shared)
        assignment.node_id = node_id
        assignment.sequence = sequence
        payload = assignment.SerializeToString(deterministic=True)
        signature = signer.sign(payload)
        signed.append(
            SignedDirectorAssignment(
                assignment=payload, keyid=keyid, signature=bytes.fromhex(signature.signature)
            )
        )
    return signed


def check_shadow_settings(sample_per_mille: int, max_cpu_percent: int, *, prefix: str = "") -> None:
    """1-1000 frames per mille, 1-100 % of a core: InvalidInputError naming the field."""
    for name, value, high in (
        ("sample_per_mille", sample_per_mille, 1000),
        ("max_cpu_percent", max_cpu_percent, 100),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise InvalidInputError(f"{name} must be 1-{high}, got {value!r}", field=prefix + name)


def _shadow_target(shadow: ShadowSpec, model: str) -> ShadowTarget:
    """The signed form of `shadow`, checked as the node checks it."""
    parsed = parse_target_path(shadow.target_path)
    if parsed is None or parsed.kind != "model":
        raise InvalidInputError(
            f"{shadow.target_path!r} is not a model target", field="shadow.target_path"
        )
    if parsed.model != model:
        raise InvalidInputError(
            f"the shadow candidate is of model {parsed.model!r}, the target of {model!r}",
            field="shadow.target_path",
        )
    if not SHA256_PATTERN.fullmatch(shadow.sha256):
        raise InvalidInputError("sha256 must be 64 lowercase hex digits", field="shadow.sha256")
    if isinstance(shadow.length, bool) or not 0 <= shadow.length <= _MAX_UINT64:
        raise InvalidInputError(
            f"length must be 0..2^64-1, got {shadow.length}", field="shadow.length"
        )
    check_shadow_settings(shadow.sample_per_mille, shadow.max_cpu_percent, prefix="shadow.")
    return ShadowTarget(
        target_path=shadow.target_path,
        sha256=shadow.sha256,
        length=shadow.length,
        sample_per_mille=shadow.sample_per_mille,
        max_cpu_percent=shadow.max_cpu_percent,
    )


def load_or_create_director_key(directory: Path, *, create: bool = True) -> CryptoSigner:
    """The control plane's director key in `directory/director.key`, created on first use
    when `create` (a fresh control plane, or an explicit `--init-keys`).

    One key per control plane (all replicas share the keys directory), stored
    unencrypted with mode 0600 because the server signs unattended; a KMS/HSM-backed
    securesystemslib signer can replace it (`director_signer_uri`). Creation is
    race-safe: the file is linked into place exclusively, and a replica that loses the
    race loads the winner's key. Without `create` a missing key is UnavailableError: a
    replica or a restored data dir must not sign with a key no node knows.
    """
    directory = Path(directory)
    path = directory / DIRECTOR_KEY_FILE
    if path.exists():
        return load_signer(path, None)
    if not create:
        raise UnavailableError(
            f"the director key {path} is missing, and this control plane already has fleets "
            "or nodes: a new key would sign assignments every node refuses. Restore it (every "
            "replica must share the keys directory, --keys-dir), or start once with "
            "--init-keys to make a new one and then run `edgefleet keys rotate-director` "
            "for each fleet",
            path=str(path),
        )
    make_private_dirs(directory)
    signer = generate_signer()
    try:
        save_private_key(path, signer, None, exclusive=True)
    except FileExistsError:
        return load_signer(path, None)
    return signer


class DirectorKeyring:
    """The director's keys in one directory: the first (`director.key`, signs for every
    fleet whose root lists no director key) and rotated ones (`director.<keyid>.key`,
    made by `new_key`), which sign for the fleets whose root lists them (ADR 0045).

    Nothing signs with a new key until a fleet's root names it; a key root names that is
    missing here is an error at signing time (`get` answers None), never a new key.
    """

    def __init__(self, directory: Path, default: Signer) -> None:
        self._dir = Path(directory)
        self._default = default
        self._lock = threading.Lock()
        self._cache: dict[str, Signer] = {default.public_key.keyid: default}

    @property
    def default(self) -> Signer:
        return self._default

    def new_key(self) -> Key:
        """A fresh director key on disk; its public half for the operator's next root."""
        make_private_dirs(self._dir)
        signer = generate_signer()
        keyid = signer.public_key.keyid
        save_private_key(self._dir / f"director.{keyid}.key", signer, None, exclusive=True)
        return signer.public_key

    def get(self, keyid: str) -> Signer | None:
        """The signer of `keyid`, or None when this control plane does not hold it."""
        if not SHA256_PATTERN.fullmatch(keyid):
            return None
        with self._lock:
            cached = self._cache.get(keyid)
            if cached is not None:
                return cached
            path = self._dir / f"director.{keyid}.key"
            if not path.exists():
                return None
            signer = load_signer(path, None)
            if signer.public_key.keyid != keyid:
                return None
            self._cache[keyid] = signer
            return signer

    def holds(self, keyid: str) -> bool:
        return self.get(keyid) is not None


def _require_ed25519(key: Key) -> None:
    if key.keytype != KEY_TYPE_ED25519 or key.scheme != ED25519:
        raise InvalidInputError(
            f"the director key is {key.keytype}/{key.scheme}; assignments are signed with "
            "Ed25519 only"
        )


def _utc(value: datetime, name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(f"{name} must be timezone-aware", field=name)
    return value.astimezone(UTC)
