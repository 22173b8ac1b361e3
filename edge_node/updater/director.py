"""The node's checks of a signed director assignment (DESIGN §3): pure, no I/O.

`verify_assignment` takes the signed bytes, the director key the node got at enrollment,
what the node knows (its id and fleet, the last sequence it accepted, `now`) and two
lookups into its *verified* TUF metadata, and returns a `VerifiedAssignment` or raises
one `AssignmentRejectedError` subclass with a short `reason` (for counters and logs).
It does not fetch, refresh TUF or remember the sequence: the updater does that and
persists the accepted sequence in its journal.

Order of the checks, cheapest trust decision first: size, key id, signature over the
exact bytes (nothing is parsed before it is authenticated), format version, node and
fleet, sequence, time window, target in TUF, hash and length, floor. The assignment's
`renewal` mark and its `shadow` candidate come back as signed (`ShadowRequest`): the
candidate is checked against TUF apart, by `verify_shadow`, because a candidate the node
refuses fails the shadow stage, not the assignment (ADR 0031).

    AssignmentRejectedError              refused; `reason` says why
    ├── AssignmentMalformedError         too large, not a DirectorAssignment, missing field
    ├── AssignmentSignatureError         unknown key id, bad signature
    ├── AssignmentFormatError            a format_version this build does not know
    ├── AssignmentWrongNodeError         for another node or another fleet
    ├── AssignmentReplayError            sequence not above the last accepted one
    ├── AssignmentExpiredError           expires_at <= now
    ├── AssignmentNotYetValidError       issued_at beyond now + the allowed clock skew
    ├── UnknownTargetError               target absent from the verified TUF metadata
    ├── TargetMismatchError              sha256 / length / custom differ from TUF's
    └── BelowFloorError                  release counter below the model's signed floor
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final

from google.protobuf.message import DecodeError
from securesystemslib.exceptions import UnverifiedSignatureError, VerificationError
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import Key, Signature, SSlibKey

from edge_node.errors import EdgeNodeError, InvalidInputError
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment, SignedDirectorAssignment

__all__ = [
    "DEFAULT_MAX_CLOCK_SKEW",
    "DEFAULT_MAX_SEQUENCE_JUMP",
    "MAX_ASSIGNMENT_BYTES",
    "ROOT_DIRECTOR_KEYS_FIELD",
    "SUPPORTED_FORMAT_VERSIONS",
    "AssignmentExpiredError",
    "AssignmentFormatError",
    "AssignmentMalformedError",
    "AssignmentNotYetValidError",
    "AssignmentRejectedError",
    "AssignmentReplayError",
    "AssignmentSequenceJumpError",
    "AssignmentSignatureError",
    "AssignmentWrongNodeError",
    "BelowFloorError",
    "ShadowRequest",
    "TargetInfo",
    "TargetMismatchError",
    "UnknownTargetError",
    "VerifiedAssignment",
    "VerifiedShadow",
    "director_keys_of_root",
    "sequence_floor",
    "verify_assignment",
    "verify_shadow",
]

SUPPORTED_FORMAT_VERSIONS: Final = frozenset({1})
MAX_ASSIGNMENT_BYTES: Final = 4096
"""A real assignment is a few hundred bytes; anything larger is refused unread."""
DEFAULT_MAX_CLOCK_SKEW: Final = timedelta(minutes=5)
DEFAULT_MAX_SEQUENCE_JUMP: Final = 2**32
"""How far above the last accepted sequence an assignment may be: a director issues one
sequence per decision, so a jump of 2^32 is never honest, and a forged 2^64-1 (signed
with a stolen key) must not pin the node's floor out of the honest director's reach."""
ROOT_DIRECTOR_KEYS_FIELD: Final = "x-edgefleet-director-keys"
"""The field of the fleet's TUF root that lists the director's keys (keyid → TUF key
dict), signed by the root keys: how a node learns a rotated director key (ADR 0045)."""
_ED25519: Final = "ed25519"
_ED25519_SIGNATURE_BYTES: Final = 64
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
# models/<model>/<version>/model.onnx, as the control plane lays out model targets.
_MODEL_TARGET: Final = re.compile(
    r"models/(?P<model>[a-z0-9][a-z0-9._-]{0,127})/[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}/model\.onnx"
)


# ----------------------------------------------------------------------- errors


class AssignmentRejectedError(EdgeNodeError):
    """The node refuses this assignment and keeps running what it runs."""

    title = "director assignment rejected"

    def __init__(self, message: str, *, reason: str, **fields: Any) -> None:
        super().__init__(message, reason=reason, **fields)
        self.reason = reason


class AssignmentMalformedError(AssignmentRejectedError):
    title = "director assignment malformed"


class AssignmentSignatureError(AssignmentRejectedError):
    title = "director assignment signature invalid"


class AssignmentFormatError(AssignmentRejectedError):
    title = "director assignment format unknown"


class AssignmentWrongNodeError(AssignmentRejectedError):
    title = "director assignment for another node"


class AssignmentReplayError(AssignmentRejectedError):
    title = "director assignment replayed or stale"


class AssignmentSequenceJumpError(AssignmentRejectedError):
    title = "director assignment sequence jumps too far"


class AssignmentExpiredError(AssignmentRejectedError):
    title = "director assignment expired"


class AssignmentNotYetValidError(AssignmentRejectedError):
    title = "director assignment issued in the future"


class UnknownTargetError(AssignmentRejectedError):
    title = "assigned target not in verified TUF metadata"


class TargetMismatchError(AssignmentRejectedError):
    title = "assigned target differs from TUF metadata"


class BelowFloorError(AssignmentRejectedError):
    title = "assigned target below the model's floor"


# ------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """A target as the node's verified TUF metadata lists it (no python-tuf types here).

    The TUF adapter builds it from a `tuf.api.metadata.TargetFile`: path, its sha256
    hash, length and `custom` (which carries `release_counter` and `model`).
    """

    path: str
    sha256: str
    length: int
    custom: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "custom", MappingProxyType(dict(self.custom)))


@dataclass(frozen=True, slots=True)
class ShadowRequest:
    """The `shadow` of an authenticated assignment as signed; not yet checked against TUF
    or the ranges (`verify_shadow` does both)."""

    target_path: str
    sha256: str
    length: int
    sample_per_mille: int
    max_cpu_percent: int


@dataclass(frozen=True, slots=True)
class VerifiedShadow:
    """A shadow candidate that passed `verify_shadow`; `target` is TUF's view of it."""

    target_path: str
    sha256: str
    length: int
    sample_per_mille: int
    max_cpu_percent: int
    model: str
    release_counter: int
    target: TargetInfo


@dataclass(frozen=True, slots=True)
class VerifiedAssignment:
    """An assignment that passed every check; `target` is TUF's view of the target.

    `renewal`: the director only renewed the assignment before it (same target, later
    expiry). `shadow`: the candidate to run in shadow, as signed (see `verify_shadow`)."""

    fleet: str
    node_id: str
    sequence: int
    target_path: str
    sha256: str
    length: int
    issued_at: datetime
    expires_at: datetime
    model: str
    release_counter: int
    keyid: str
    target: TargetInfo
    renewal: bool = False
    shadow: ShadowRequest | None = None


# ------------------------------------------------------------------------ rules


def verify_assignment(
    signed: SignedDirectorAssignment,
    *,
    director_key: Key | Collection[Key],
    node_id: str,
    fleet: str,
    last_sequence: int,
    now: datetime,
    target_lookup: Callable[[str], TargetInfo | None],
    floor_lookup: Callable[[str], int],
    max_clock_skew: timedelta = DEFAULT_MAX_CLOCK_SKEW,
    max_sequence_jump: int = DEFAULT_MAX_SEQUENCE_JUMP,
) -> VerifiedAssignment:
    """Accept `signed` for this node, or raise an `AssignmentRejectedError`.

    `director_key` is the director's securesystemslib public key (or several, while the
    director rotates its key); `last_sequence` the highest sequence this node accepted
    (0 for none; see `sequence_floor` after a director key rotation), and a sequence more
    than `max_sequence_jump` above it is refused too; `target_lookup(path)` answers
    from the verified TUF targets metadata;
    `floor_lookup(model)` is the model's signed floor (0 when it has none).
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInputError("now must be timezone-aware")
    keys = _keys_by_id(director_key)
    payload = _authenticated_payload(signed, keys)
    assignment = _parse(payload)

    if assignment.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise AssignmentFormatError(
            f"assignment format version {assignment.format_version} is unknown to this agent "
            f"(it reads {sorted(SUPPORTED_FORMAT_VERSIONS)})",
            reason="unknown-format",
            format_version=assignment.format_version,
        )
    if assignment.fleet != fleet:
        raise AssignmentWrongNodeError(
            f"assignment is for fleet {assignment.fleet!r}, this node is in {fleet!r}",
            reason="wrong-fleet",
            fleet=assignment.fleet[:64],
        )
    if assignment.node_id != node_id:
        raise AssignmentWrongNodeError(
            f"assignment is for node {assignment.node_id!r}, this is {node_id!r}",
            reason="wrong-node",
            node_id=assignment.node_id[:64],
        )
    if assignment.sequence < 1:
        raise AssignmentMalformedError("assignment has no sequence", reason="malformed")
    if assignment.sequence <= last_sequence:
        replayed = assignment.sequence == last_sequence
        raise AssignmentReplayError(
            f"assignment sequence {assignment.sequence} is "
            f"{'the one' if replayed else 'below the last one'} already accepted "
            f"({last_sequence})",
            reason="replayed" if replayed else "stale",
            sequence=assignment.sequence,
            last_sequence=last_sequence,
        )
    if assignment.sequence - last_sequence > max_sequence_jump:
        raise AssignmentSequenceJumpError(
            f"assignment sequence {assignment.sequence} is more than {max_sequence_jump} "
            f"above the last one accepted ({last_sequence}); refused so that a forged "
            "sequence cannot lock out the director",
            reason="sequence-jump",
            sequence=assignment.sequence,
            last_sequence=last_sequence,
            max_sequence_jump=max_sequence_jump,
        )

    issued_at, expires_at = _window(assignment)
    if expires_at <= now:
        raise AssignmentExpiredError(
            f"assignment expired at {expires_at.isoformat()}",
            reason="expired",
            expires_at=expires_at.isoformat(),
        )
    if issued_at > now + max_clock_skew:
        raise AssignmentNotYetValidError(
            f"assignment issued at {issued_at.isoformat()}, after now ({now.isoformat()}) "
            f"plus the allowed clock skew of {max_clock_skew}",
            reason="issued-in-future",
            issued_at=issued_at.isoformat(),
        )

    model = _model_of(assignment.target_path)
    target = target_lookup(assignment.target_path)
    if target is None:
        raise UnknownTargetError(
            f"target {assignment.target_path!r} is not in the verified TUF metadata",
            reason="unknown-target",
            target_path=assignment.target_path,
        )
    release_counter = _check_target(
        assignment.target_path, assignment.sha256, assignment.length, target, model
    )
    _check_floor(assignment.target_path, release_counter, floor_lookup(model), model)
    shadow = None
    if assignment.HasField("shadow"):
        signed_shadow = assignment.shadow
        shadow = ShadowRequest(
            signed_shadow.target_path,
            signed_shadow.sha256,
            signed_shadow.length,
            signed_shadow.sample_per_mille,
            signed_shadow.max_cpu_percent,
        )
    return VerifiedAssignment(
        fleet=assignment.fleet,
        node_id=assignment.node_id,
        sequence=assignment.sequence,
        target_path=assignment.target_path,
        sha256=assignment.sha256,
        length=assignment.length,
        issued_at=issued_at,
        expires_at=expires_at,
        model=model,
        release_counter=release_counter,
        keyid=signed.keyid,
        target=target,
        renewal=assignment.renewal,
        shadow=shadow,
    )


def verify_shadow(
    shadow: ShadowRequest,
    *,
    model: str,
    target_lookup: Callable[[str], TargetInfo | None],
    floor_lookup: Callable[[str], int],
) -> VerifiedShadow:
    """Accept the shadow candidate of an assignment of `model`, or raise an
    `AssignmentRejectedError` (its reason is the shadow's failure): the ranges (1-1000 per
    mille, 1-100 % CPU), a model target of the same model, present in the verified TUF
    metadata with the same sha256 and length, its release counter not below the floor."""
    if not 1 <= shadow.sample_per_mille <= 1000:
        raise AssignmentMalformedError(
            f"shadow.sample_per_mille must be 1-1000, got {shadow.sample_per_mille}",
            reason="bad-shadow",
            field="shadow.sample_per_mille",
        )
    if not 1 <= shadow.max_cpu_percent <= 100:
        raise AssignmentMalformedError(
            f"shadow.max_cpu_percent must be 1-100, got {shadow.max_cpu_percent}",
            reason="bad-shadow",
            field="shadow.max_cpu_percent",
        )
    candidate = _model_of(shadow.target_path)
    if candidate != model:
        raise AssignmentMalformedError(
            f"shadow candidate {shadow.target_path!r} is of model {candidate!r}, the "
            f"assignment of {model!r}",
            reason="bad-shadow",
            field="shadow.target_path",
        )
    target = target_lookup(shadow.target_path)
    if target is None:
        raise UnknownTargetError(
            f"shadow target {shadow.target_path!r} is not in the verified TUF metadata",
            reason="unknown-target",
            target_path=shadow.target_path,
        )
    counter = _check_target(shadow.target_path, shadow.sha256, shadow.length, target, model)
    _check_floor(shadow.target_path, counter, floor_lookup(model), model)
    return VerifiedShadow(
        shadow.target_path,
        shadow.sha256,
        shadow.length,
        shadow.sample_per_mille,
        shadow.max_cpu_percent,
        model,
        counter,
        target,
    )


def _check_floor(path: str, release_counter: int, floor: int, model: str) -> None:
    if release_counter < floor:
        raise BelowFloorError(
            f"target {path!r} has release counter {release_counter}, "
            f"below the floor {floor} of model {model!r}",
            reason="below-floor",
            release_counter=release_counter,
            floor=floor,
            model=model,
        )


def _keys_by_id(director_key: Key | Collection[Key]) -> dict[str, Key]:
    keys = [director_key] if isinstance(director_key, Key) else list(director_key)
    if not keys:
        raise InvalidInputError("no director key configured")
    for key in keys:
        if key.keytype != _ED25519 or key.scheme != _ED25519:
            raise InvalidInputError(
                f"director key {key.keyid} is {key.keytype}/{key.scheme}; only Ed25519 is used",
                keyid=key.keyid,
            )
    return {key.keyid: key for key in keys}


def _authenticated_payload(signed: SignedDirectorAssignment, keys: Mapping[str, Key]) -> bytes:
    payload = signed.assignment
    if len(payload) > MAX_ASSIGNMENT_BYTES:
        raise AssignmentMalformedError(
            f"assignment is {len(payload)} bytes, over the {MAX_ASSIGNMENT_BYTES} byte limit",
            reason="too-large",
            size=len(payload),
        )
    key = keys.get(signed.keyid)
    if key is None:
        raise AssignmentSignatureError(
            f"assignment is signed by unknown key {signed.keyid[:64]!r}",
            reason="unknown-key",
            keyid=signed.keyid[:64],
        )
    bad = AssignmentSignatureError(
        f"assignment signature does not verify with director key {key.keyid}",
        reason="bad-signature",
        keyid=key.keyid,
    )
    if len(signed.signature) != _ED25519_SIGNATURE_BYTES:
        raise bad
    try:
        key.verify_signature(Signature(key.keyid, signed.signature.hex()), payload)
    except (UnverifiedSignatureError, VerificationError) as exc:
        raise bad from exc
    return payload


def _parse(payload: bytes) -> DirectorAssignment:
    try:
        assignment = DirectorAssignment.FromString(payload)
    except DecodeError as exc:
        raise AssignmentMalformedError(
            "signed bytes are not a DirectorAssignment", reason="malformed"
        ) from exc
    return assignment


def _window(assignment: DirectorAssignment) -> tuple[datetime, datetime]:
    if not assignment.HasField("issued_at") or not assignment.HasField("expires_at"):
        raise AssignmentMalformedError(
            "assignment lacks issued_at or expires_at", reason="malformed"
        )
    try:
        issued_at = assignment.issued_at.ToDatetime(tzinfo=UTC)
        expires_at = assignment.expires_at.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:
        raise AssignmentMalformedError("assignment time out of range", reason="malformed") from exc
    if expires_at <= issued_at:
        raise AssignmentMalformedError(
            "assignment expires before it was issued", reason="malformed"
        )
    return issued_at, expires_at


def _model_of(target_path: str) -> str:
    match = _MODEL_TARGET.fullmatch(target_path)
    if match is None:
        raise AssignmentMalformedError(
            f"{target_path[:200]!r} is not a model target (models/<model>/<version>/model.onnx)",
            reason="not-a-model",
        )
    return match["model"]


def _check_target(path: str, sha256: str, length: int, target: TargetInfo, model: str) -> int:
    """Hash, length and custom of TUF's target against the signed ones; its release counter."""
    if target.path != path:
        raise UnknownTargetError(
            f"TUF lookup of {path!r} answered {target.path!r}",
            reason="unknown-target",
            target_path=path,
        )
    if not _SHA256.fullmatch(sha256) or sha256 != target.sha256:
        raise TargetMismatchError(
            f"assignment names sha256 {sha256[:64]!r}, TUF lists {target.sha256!r} for {path!r}",
            reason="sha256-mismatch",
            target_path=path,
        )
    if length != target.length:
        raise TargetMismatchError(
            f"assignment names length {length}, TUF lists {target.length} for {path!r}",
            reason="length-mismatch",
            target_path=path,
        )
    counter = target.custom.get("release_counter")
    if not isinstance(counter, int) or isinstance(counter, bool) or counter < 1:
        raise TargetMismatchError(
            f"TUF target {path!r} carries no valid release counter",
            reason="bad-custom",
            target_path=path,
        )
    named = target.custom.get("model", model)
    if named != model:
        raise TargetMismatchError(
            f"TUF target {path!r} names model {named!r} in its custom field",
            reason="bad-custom",
            target_path=path,
        )
    return counter


def director_keys_of_root(signed_root: Mapping[str, Any]) -> list[Key]:
    """The director keys a verified TUF root lists under `ROOT_DIRECTOR_KEYS_FIELD`
    (`signed_root` is root's `signed` dict); [] when it lists none. A listed key that is
    not Ed25519 or whose keyid is not its canonical hash is refused (InvalidInputError):
    the root keys signed it, so it is a mistake to report, not to skip."""
    field_value = signed_root.get(ROOT_DIRECTOR_KEYS_FIELD)
    if field_value is None:
        return []
    if not isinstance(field_value, Mapping) or not field_value:
        raise InvalidInputError(f"root field {ROOT_DIRECTOR_KEYS_FIELD} is not a map of keys")
    keys: list[Key] = []
    for keyid, data in sorted(field_value.items()):
        try:
            key = SSlibKey.from_dict(str(keyid), dict(data))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"root lists a malformed director key {keyid!r}") from exc
        if key.keytype != _ED25519 or key.scheme != _ED25519 or _keyid_of(key) != key.keyid:
            raise InvalidInputError(
                f"root lists director key {keyid!r} that is not an Ed25519 key under its "
                "canonical keyid",
                keyid=str(keyid)[:64],
            )
        keys.append(key)
    return keys


def sequence_floor(
    *,
    last_sequence: int,
    last_keyid: str,
    enrollment_keyid: str,
    listed_keyids: Collection[str],
    keyid: str,
) -> int:
    """The sequence an assignment signed by `keyid` must exceed.

    `last_sequence` and `last_keyid` are the node's last accepted assignment ("" for a
    journal written before keyids were kept: the enrollment key then). Normally the
    floor is `last_sequence`. It resets to 0 only for a key the root lists when the key
    of the last accepted assignment is no longer listed: the root keys rotated the
    director key, so whatever the old (maybe stolen) key pinned the floor to is void. A
    compromised key cannot trigger this itself: only root metadata lists keys.
    """
    previous = last_keyid or enrollment_keyid
    if keyid in listed_keyids and previous != keyid and previous not in listed_keyids:
        return 0
    return last_sequence


def _keyid_of(key: Key) -> str:
    canonical = encode_canonical(
        {"keytype": key.keytype, "scheme": key.scheme, "keyval": key.keyval}
    )
    assert canonical is not None
    return hashlib.sha256(canonical.encode()).hexdigest()
