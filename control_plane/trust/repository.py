"""The rules of a fleet's TUF image repository (DESIGN §3), as a pure core.

Takes bytes, metadata objects and `now`; returns metadata objects or decisions, and
raises `control_plane.errors` for refusals. No I/O, no keys held: the operator side
signs with its offline keys (see `keys`), the control plane with its online keys
(see `signer`). Stored and served bytes always come from `to_bytes`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from securesystemslib.formats import encode_canonical
from securesystemslib.signer import (
    ED25519,
    KEY_TYPE_ED25519,
    Key,
    SSlibKey,
)
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError, SerializationError
from tuf.api.serialization.json import JSONSerializer

from control_plane.errors import (
    ArtifactIntegrityError,
    ConflictError,
    EdgefleetError,
    InvalidInputError,
    PayloadTooLargeError,
    PolicyError,
    RollbackError,
    SignatureError,
)
from control_plane.trust.custom import (
    SHA256_PATTERN,
    FloorCustom,
    ModelCustom,
    TargetPath,
    floor_target_path,
    parse_floor_custom,
    parse_model_custom,
    parse_target_path,
    reference_target_path,
    validate_model_name,
)

ROOT: Final = "root"
TARGETS: Final = "targets"
SNAPSHOT: Final = "snapshot"
TIMESTAMP: Final = "timestamp"
ONLINE_ROLES: Final = (SNAPSHOT, TIMESTAMP)

DIRECTOR_KEYS_FIELD: Final = "x-edgefleet-director-keys"
"""A field of root's `signed`: the director's public keys (keyid → TUF key dict), so nodes
learn a rotated director key through TUF, signed by the root keys (ADR 0045). The node
reads it as `edge_node.updater.director.ROOT_DIRECTOR_KEYS_FIELD`."""

# The default download limits of tuf.ngclient.UpdaterConfig: metadata larger than this
# would be refused by every node, so the control plane refuses it first.
MAX_ROOT_BYTES: Final = 512_000
MAX_TARGETS_BYTES: Final = 5_000_000

ArtifactLength = Callable[[str], int | None]
"""`sha256 -> stored length`, or None when no artifact with that digest is stored."""

_S = TypeVar("_S", Root, Snapshot, Targets, Timestamp)


# ---------------------------------------------------------------------------- bytes


def to_bytes(md: Metadata[Any]) -> bytes:
    """The one serialisation of metadata that is stored, hashed and served (compact JSON)."""
    try:
        return JSONSerializer(compact=True).serialize(md)
    except SerializationError as exc:
        raise InvalidInputError(f"{md.signed.type} metadata cannot be serialised") from exc


def parse_metadata(data: bytes, kind: type[_S], *, max_bytes: int | None = None) -> Metadata[_S]:
    """Parse metadata bytes and check their type; InvalidInputError when malformed."""
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadTooLargeError(
            f"{kind.type} metadata is {len(data)} bytes; the limit is {max_bytes}",
            length=len(data),
            limit=max_bytes,
        )
    try:
        md = Metadata[_S].from_bytes(data)
    except DeserializationError as exc:
        cause = exc.__cause__ or exc
        raise InvalidInputError(f"malformed {kind.type} metadata: {cause}", role=kind.type) from exc
    if not isinstance(md.signed, kind):
        raise InvalidInputError(
            f"expected {kind.type} metadata, got {md.signed.type}",
            role=kind.type,
            got=md.signed.type,
        )
    return md


def canonical_keyid(key: Key) -> str:
    """The keyid TUF tooling derives from a key: sha256 of its canonical JSON.

    Requiring keyids to be this hash binds each keyid to one key, so "is this the
    control plane's key" can be answered by comparing keyids.
    """
    canonical = encode_canonical(
        {"keytype": key.keytype, "scheme": key.scheme, "keyval": key.keyval}
    )
    assert canonical is not None  # encode_canonical returns a str without output_function
    return hashlib.sha256(canonical.encode()).hexdigest()


def _utc(value: datetime, name: str) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware")
    return value.astimezone(UTC)


def _signed_bytes(md: Metadata[Any]) -> bytes:
    try:
        return md.signed_bytes
    except SerializationError as exc:
        # Most often a float in `custom`: canonical JSON has no floating-point numbers.
        raise InvalidInputError(
            f"{md.signed.type} metadata has no canonical JSON form "
            "(floating-point numbers are not allowed)",
            role=md.signed.type,
        ) from exc


def _check_threshold(
    delegator: Root, role: str, md: Metadata[Any], *, signer: str | None = None
) -> None:
    """`signer` names the delegating root in messages when more than one is in play."""
    result = delegator.get_verification_result(role, _signed_bytes(md), md.signatures)
    if result.verified:
        return
    authorised = set(delegator.roles[role].keyids)
    unknown = sorted(k for k in md.signatures if k not in authorised)
    invalid = sorted(k for k in md.signatures if k in authorised and k not in result.signed)
    detail = ""
    if unknown:
        detail += f"; signed by keys not authorised for {role}: {', '.join(unknown)}"
    if invalid:
        detail += f"; signatures that do not verify: {', '.join(invalid)}"
    by = f" by {signer}" if signer else ""
    raise SignatureError(
        f"{role} metadata has {len(result.signed)} valid signature(s), "
        f"{result.threshold} required{by}{detail}",
        role=role,
        valid=len(result.signed),
        threshold=result.threshold,
        unknown_keyids=unknown,
        invalid_keyids=invalid,
    )


def _check_not_expired(md: Metadata[Any], now: datetime) -> None:
    if md.signed.is_expired(_utc(now, "now")):
        raise PolicyError(
            f"{md.signed.type} metadata version {md.signed.version} expired at "
            f"{md.signed.expires.isoformat()}",
            role=md.signed.type,
            expires=md.signed.expires.isoformat(),
        )


def _check_key(key: Key, keyid: str) -> None:
    if key.keytype != KEY_TYPE_ED25519 or key.scheme != ED25519:
        raise InvalidInputError(
            f"key {keyid} is {key.keytype}/{key.scheme}; edgefleet uses Ed25519 keys only",
            keyid=keyid,
        )
    if canonical_keyid(key) != keyid:
        raise InvalidInputError(
            f"keyid {keyid} is not the sha256 of the key's canonical JSON", keyid=keyid
        )


# ------------------------------------------------------------------- root (operator)


def build_root(
    *,
    root_keys: list[Key],
    root_threshold: int,
    release_keys: list[Key],
    snapshot_key: Key,
    timestamp_key: Key,
    expires: datetime,
    version: int = 1,
    consistent_snapshot: bool = True,
    release_threshold: int = 1,
) -> Metadata[Root]:
    """Unsigned root: the caller signs with `md.sign(signer, append=True)` per root key."""
    if not 1 <= root_threshold <= len(root_keys):
        raise InvalidInputError(
            f"root threshold must be between 1 and {len(root_keys)}, got {root_threshold}"
        )
    if not 1 <= release_threshold <= len(release_keys):
        raise InvalidInputError(
            f"release threshold must be between 1 and {len(release_keys)}, got {release_threshold}"
        )
    for key in [*root_keys, *release_keys, snapshot_key, timestamp_key]:
        _check_key(key, key.keyid)
    root = Root(
        version=version,
        expires=_utc(expires, "expires"),
        consistent_snapshot=consistent_snapshot,
    )
    for key in root_keys:
        root.add_key(key, ROOT)
    for key in release_keys:
        root.add_key(key, TARGETS)
    root.add_key(snapshot_key, SNAPSHOT)
    root.add_key(timestamp_key, TIMESTAMP)
    root.roles[ROOT].threshold = root_threshold
    root.roles[TARGETS].threshold = release_threshold
    return Metadata(root)


def initial_targets(expires: datetime) -> Metadata[Targets]:
    """Empty targets, version 1, unsigned: the operator signs it with the release key."""
    return Metadata(Targets(version=1, expires=_utc(expires, "expires")))


def build_next_root(
    current: Metadata[Root],
    *,
    release_keys: list[Key],
    expires: datetime,
    root_keys: list[Key] | None = None,
    root_threshold: int | None = None,
    release_threshold: int = 1,
    online_keys: Mapping[str, Key] | None = None,
    director_keys: list[Key] | None = None,
) -> Metadata[Root]:
    """Root version N+1 with `release_keys` as the only targets keys; unsigned.

    Revokes every other release key. With `root_keys` the root role is replaced too
    (`root_threshold` defaults to the current one). The snapshot and timestamp roles,
    the control plane's online keys, are carried over unchanged unless `online_keys`
    (role → the control plane's new key, from `POST /v1/fleets/{fleet}/online-keys`)
    replaces them: the recovery from a stolen online key (TUF §5.3.11; a client drops
    its trusted timestamp/snapshot once they no longer verify). The caller signs with
    the current root keys AND, when they change, the new ones (TUF §5.3.4).
    `director_keys` replaces the director keys root lists (`DIRECTOR_KEYS_FIELD`).
    """
    if not release_keys:
        raise InvalidInputError("the next root needs at least one release key")
    if not 1 <= release_threshold <= len(release_keys):
        raise InvalidInputError(
            f"release threshold must be between 1 and {len(release_keys)}, got {release_threshold}"
        )
    # A copy through the wire form: the result shares nothing with `current`.
    new = Metadata[Root].from_bytes(to_bytes(current))
    new.signatures.clear()
    root = new.signed
    root.version = current.signed.version + 1
    root.expires = _utc(expires, "expires")

    snapshot_keyid, timestamp_keyid = _online_keyids(current.signed)
    replaced = {TARGETS: release_keys}
    if root_keys is not None:
        replaced[ROOT] = root_keys
    if online_keys is not None:
        if set(online_keys) != set(ONLINE_ROLES):
            raise InvalidInputError(
                f"online keys must name exactly {', '.join(ONLINE_ROLES)}, "
                f"got {sorted(online_keys)}"
            )
        for role in ONLINE_ROLES:
            replaced[role] = [online_keys[role]]
        snapshot_keyid = online_keys[SNAPSHOT].keyid
        timestamp_keyid = online_keys[TIMESTAMP].keyid
    threshold = root.roles[ROOT].threshold if root_threshold is None else root_threshold
    size = len(root_keys) if root_keys is not None else len(root.roles[ROOT].keyids)
    if not 1 <= threshold <= size:
        raise InvalidInputError(f"root threshold must be between 1 and {size}, got {threshold}")
    for role, keys in replaced.items():
        for key in keys:
            _check_key(key, key.keyid)
        for keyid in list(root.roles[role].keyids):
            root.revoke_key(keyid, role)
        for key in keys:
            root.add_key(key, role)
    root.roles[ROOT].threshold = threshold
    root.roles[TARGETS].threshold = release_threshold
    if director_keys is not None:
        if not director_keys:
            raise InvalidInputError("the next root needs at least one director key")
        for key in director_keys:
            _check_key(key, key.keyid)
        root.unrecognized_fields[DIRECTOR_KEYS_FIELD] = {
            key.keyid: key.to_dict() for key in director_keys
        }
    listed_director_keys(root)

    _check_root_content(
        root,
        snapshot_keyid=snapshot_keyid,
        timestamp_keyid=timestamp_keyid,
        refusal=InvalidInputError,
    )
    return new


# --------------------------------------------------------------------- root (server)


def verify_new_root(
    root_bytes: bytes,
    *,
    snapshot_keyid: str,
    timestamp_keyid: str,
    now: datetime,
) -> Metadata[Root]:
    """Accept a fleet's first root, which must delegate snapshot/timestamp to our keys.

    Later roots go through `verify_root_update` (signed by the previous root too).
    """
    md = parse_metadata(root_bytes, Root, max_bytes=MAX_ROOT_BYTES)
    root = md.signed
    if root.version != 1:
        raise InvalidInputError(
            f"a fleet's first root must be version 1, got {root.version}", version=root.version
        )
    _check_root_content(
        root,
        snapshot_keyid=snapshot_keyid,
        timestamp_keyid=timestamp_keyid,
        refusal=InvalidInputError,
    )
    _check_threshold(root, ROOT, md)
    _check_not_expired(md, now)
    return md


def listed_director_keys(root: Root) -> list[Key]:
    """The director keys `root` lists ([] for none); InvalidInputError when malformed."""
    value = root.unrecognized_fields.get(DIRECTOR_KEYS_FIELD)
    if value is None:
        return []
    if not isinstance(value, Mapping) or not value:
        raise InvalidInputError(f"root field {DIRECTOR_KEYS_FIELD} must be a map of keys")
    keys: list[Key] = []
    for keyid, data in sorted(value.items()):
        try:
            key = SSlibKey.from_dict(str(keyid), dict(data))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"root field {DIRECTOR_KEYS_FIELD}: malformed key {keyid!r}"
            ) from exc
        _check_key(key, key.keyid)
        keys.append(key)
    return keys


OnlineKeyHeld = Callable[[str, str], bool]
"""`(role, keyid) -> does the control plane hold that online key's private half`."""


def verify_root_update(
    *,
    current: Metadata[Root],
    new_bytes: bytes,
    now: datetime,
    online_key_held: OnlineKeyHeld | None = None,
    director_key_held: Callable[[str], bool] | None = None,
) -> Metadata[Root]:
    """Accept root version N+1 of a fleet whose trusted root is `current` (version N).

    The rules of a TUF client's root update (spec §5.3.4-5.3.5), checked before any
    node sees the new root: signed to threshold by the current root's root role AND
    by the new root's own root role, version exactly N+1, not expired. The new root
    may change the root and targets roles (rotating or revoking offline keys). The
    snapshot and timestamp roles must stay the control plane's online keys: the current
    ones, or — an online-key rotation — keys for which `online_key_held(role, keyid)`
    is true (None: no rotation possible). A root cannot hand the online roles to keys
    the control plane does not hold: the repository would go dark. Likewise the
    director keys it lists (`DIRECTOR_KEYS_FIELD`): unchanged, or keys for which
    `director_key_held(keyid)` is true, or nodes would refuse every assignment.

    Refusals: malformed, skipped version, bad keys or roles → InvalidInputError; a
    version not above N → ConflictError(reason="stale"); a threshold not met →
    SignatureError; expired, or online roles changed → PolicyError.
    """
    md = parse_metadata(new_bytes, Root, max_bytes=MAX_ROOT_BYTES)
    trusted, new = current.signed, md.signed
    # Signed by the keys we already trust first: nothing else in it means anything yet.
    _check_threshold(trusted, ROOT, md, signer=f"the current root (version {trusted.version})")
    have, got = trusted.version, new.version
    if got <= have:
        raise ConflictError(
            f"stale: root version {got} is not newer than the current version {have}; "
            "re-read root and retry",
            reason="stale",
            current_version=have,
            version=got,
        )
    if got != have + 1:
        raise InvalidInputError(
            f"root version {got} skips versions: the next version is {have + 1}",
            current_version=have,
            version=got,
        )
    _check_threshold(new, ROOT, md, signer=f"the new root (version {got})")
    snapshot_keyid, timestamp_keyid = _online_keyids(trusted)
    proposed = {name: new.roles[name].keyids for name in ONLINE_ROLES}
    if proposed != {SNAPSHOT: [snapshot_keyid], TIMESTAMP: [timestamp_keyid]}:
        # An online-key rotation: every role to one key this control plane holds.
        for name, keyids in proposed.items():
            if len(keyids) != 1 or online_key_held is None or not online_key_held(name, keyids[0]):
                raise PolicyError(
                    f"root version {got} delegates {name} to {keyids}, not to one key the "
                    f"control plane's key store holds; get new online keys with "
                    "`POST /v1/fleets/{fleet}/online-keys` (`edgefleet keys rotate-online`)",
                    role=name,
                    keyids=list(keyids),
                )
        snapshot_keyid, timestamp_keyid = proposed[SNAPSHOT][0], proposed[TIMESTAMP][0]
    listed = listed_director_keys(new)
    if listed != listed_director_keys(trusted):
        for key in listed:
            if director_key_held is None or not director_key_held(key.keyid):
                raise PolicyError(
                    f"root version {got} lists director key {key.keyid}, which the "
                    "control plane's director does not hold; get a new one with "
                    "`POST /v1/director/keys` (`edgefleet keys rotate-director`)",
                    keyid=key.keyid,
                )
    online_ids = set(proposed[SNAPSHOT]) | set(proposed[TIMESTAMP])
    for key in listed:
        if key.keyid in new.roles[ROOT].keyids or key.keyid in new.roles[TARGETS].keyids:
            raise PolicyError(
                f"director key {key.keyid} is also a root or targets key", keyid=key.keyid
            )
        if key.keyid in online_ids:
            raise PolicyError(f"director key {key.keyid} is also an online key", keyid=key.keyid)
    _check_root_content(
        new,
        snapshot_keyid=snapshot_keyid,
        timestamp_keyid=timestamp_keyid,
        refusal=PolicyError,
    )
    _check_not_expired(md, now)
    return md


def _online_keyids(root: Root) -> tuple[str, str]:
    """The keyids of a trusted root's snapshot and timestamp roles (one key each)."""
    found: list[str] = []
    for name in ONLINE_ROLES:
        keyids = root.roles[name].keyids
        if len(keyids) != 1:
            raise InvalidInputError(
                f"trusted root delegates {name} to {len(keyids)} keys, expected one", role=name
            )
        found.append(keyids[0])
    return found[0], found[1]


def _check_root_content(
    root: Root,
    *,
    snapshot_keyid: str,
    timestamp_keyid: str,
    refusal: type[EdgefleetError],
) -> None:
    """The rules every root of a fleet obeys, first or later; signatures aside.

    `refusal` is raised when the online roles are not exactly the control plane's
    keys: bad input in a first root, a refused attempt to take them over in a later one.
    """
    if root.consistent_snapshot is not True:
        raise InvalidInputError("root must set consistent_snapshot: true")
    for keyid, key in root.keys.items():
        _check_key(key, keyid)
    if not root.roles[TARGETS].keyids:
        raise InvalidInputError("root delegates targets to no key: nobody could release")
    for name, role in root.roles.items():
        missing = [k for k in role.keyids if k not in root.keys]
        if missing:
            raise InvalidInputError(
                f"root role {name} names keys absent from root.keys: {', '.join(missing)}",
                role=name,
            )
        if role.threshold > len(role.keyids):
            raise InvalidInputError(
                f"root role {name} has threshold {role.threshold} but only "
                f"{len(role.keyids)} key(s): it could never be signed",
                role=name,
            )
    for name, keyid in ((SNAPSHOT, snapshot_keyid), (TIMESTAMP, timestamp_keyid)):
        role = root.roles[name]
        if role.keyids != [keyid] or role.threshold != 1:
            raise refusal(
                f"root must delegate {name} to exactly the control plane's {name} key "
                f"{keyid} with threshold 1; it names {role.keyids} with threshold "
                f"{role.threshold}",
                role=name,
                expected_keyid=keyid,
            )
    # The control plane must never be able to sign root or targets on its own.
    online = {snapshot_keyid, timestamp_keyid}
    for name in (ROOT, TARGETS):
        shared = online.intersection(root.roles[name].keyids)
        if shared:
            raise refusal(
                f"root gives the control plane's online key(s) {sorted(shared)} the "
                f"{name} role; {name} keys must be offline",
                role=name,
            )


# ------------------------------------------------------------------ targets (server)


@dataclass(frozen=True, slots=True)
class ModelRelease:
    """A model version added by a push: its target and its parsed custom field."""

    path: str
    sha256: str
    length: int
    custom: ModelCustom


@dataclass(frozen=True, slots=True)
class TargetsChange:
    """What an accepted push changes.

    `new_targets`: targets added, or (floors only) changed; `new_models`: the model
    versions among them; `floors`: floors set or raised by this push.
    """

    new_targets: dict[str, TargetFile]
    new_models: list[ModelRelease]
    floors: dict[str, int]
    metadata: Metadata[Targets]

    @property
    def version(self) -> int:
        return self.metadata.signed.version


def _parse_targets(data: bytes, root: Metadata[Root]) -> Metadata[Targets]:
    md = parse_metadata(data, Targets, max_bytes=MAX_TARGETS_BYTES)
    _check_threshold(root.signed, TARGETS, md)
    return md


def _check_targets_shape(md: Metadata[Targets], now: datetime) -> None:
    _check_not_expired(md, now)
    if md.signed.delegations is not None:
        raise PolicyError("targets delegations are not supported; list every target directly")


def verify_initial_targets(
    *, root: Metadata[Root], targets_bytes: bytes, now: datetime
) -> Metadata[Targets]:
    """Accept a fleet's first targets: version 1, empty, signed by the release key(s)."""
    md = _parse_targets(targets_bytes, root)
    if md.signed.version != 1:
        raise InvalidInputError(
            f"a fleet's first targets must be version 1, got {md.signed.version}",
            version=md.signed.version,
        )
    _check_targets_shape(md, now)
    if md.signed.targets:
        raise InvalidInputError(
            "a fleet's first targets must list no targets; push models once the fleet is active"
        )
    return md


def verify_targets_update(
    *,
    root: Metadata[Root],
    current: Metadata[Targets],
    new_bytes: bytes,
    now: datetime,
    artifact_length: ArtifactLength,
) -> TargetsChange:
    """The control plane's check of an operator's push (DESIGN §3, "A push, step by step").

    Refusals: malformed or wrong type → InvalidInputError; threshold not met →
    SignatureError; version not above current → ConflictError (stale: re-read, retry);
    version skipped → InvalidInputError; expired or delegating → PolicyError; an
    existing target removed → PolicyError, changed → ConflictError; an artifact
    missing → InvalidInputError, of another length → ArtifactIntegrityError; a release
    counter or floor going backwards → RollbackError.
    """
    md = _verify_next_targets(root=root, current=current, new_bytes=new_bytes, now=now)
    return _check_transition(current.signed, md, artifact_length)


def verify_resigned_targets(
    *,
    root: Metadata[Root],
    current: Metadata[Targets],
    new_bytes: bytes,
    now: datetime,
) -> Metadata[Targets]:
    """The targets that come with a root rotation: `current` re-signed, nothing else.

    Signed to threshold by `root` (the new root, so by the new release keys), version
    N+1, and listing exactly what `current` lists: only version, expiry and signatures
    may differ. A rotation must not smuggle in a release (PolicyError); releases are
    pushed, and checked, on their own.
    """
    md = _verify_next_targets(root=root, current=current, new_bytes=new_bytes, now=now)
    probe = Metadata[Targets].from_bytes(to_bytes(md)).signed
    probe.version, probe.expires = current.signed.version, current.signed.expires
    if probe != current.signed:
        added = sorted(set(md.signed.targets) - set(current.signed.targets))
        removed = sorted(set(current.signed.targets) - set(md.signed.targets))
        changed = sorted(
            p
            for p, t in md.signed.targets.items()
            if p in current.signed.targets and current.signed.targets[p] != t
        )
        raise PolicyError(
            "the targets that come with a root rotation must be the current targets "
            "re-signed, with only version and expiry changed; push releases separately",
            added=added,
            removed=removed,
            changed=changed,
        )
    return md


def _verify_next_targets(
    *, root: Metadata[Root], current: Metadata[Targets], new_bytes: bytes, now: datetime
) -> Metadata[Targets]:
    """Signed by `root`'s targets keys, version current + 1, expiry and shape."""
    md = _parse_targets(new_bytes, root)
    have, got = current.signed.version, md.signed.version
    if got <= have:
        raise ConflictError(
            f"stale: targets version {got} is not newer than the current version {have}; "
            "re-read targets and retry",
            reason="stale",
            current_version=have,
            version=got,
        )
    if got != have + 1:
        raise InvalidInputError(
            f"targets version {got} skips versions: the next version is {have + 1}",
            current_version=have,
            version=got,
        )
    _check_targets_shape(md, now)
    return md


def _sha256_of(target: TargetFile) -> str:
    hashes = target.hashes
    if set(hashes) != {"sha256"} or not SHA256_PATTERN.fullmatch(hashes["sha256"]):
        # One hash only: the consistent-snapshot URL uses the first hash listed, and the
        # artifact store is addressed by sha256.
        raise InvalidInputError(
            f"target {target.path}: hashes must be exactly {{'sha256': <64 lowercase hex>}}, "
            f"got {sorted(hashes)}",
            path=target.path,
        )
    return hashes["sha256"]


def _counter_of(target: TargetFile) -> int | None:
    """The release counter of an already accepted model target (validated at its push)."""
    custom = target.custom
    if isinstance(custom, Mapping):
        counter = custom.get("release_counter")
        if isinstance(counter, int) and not isinstance(counter, bool):
            return counter
    return None


def _floor_of(target: TargetFile) -> int | None:
    custom = target.custom
    if isinstance(custom, Mapping):
        floor = custom.get("floor")
        if isinstance(floor, int) and not isinstance(floor, bool):
            return floor
    return None


def current_floors(targets: Targets) -> dict[str, int]:
    """Model → floor, from the floor targets of `targets`."""
    floors: dict[str, int] = {}
    for path, target in targets.targets.items():
        parsed = parse_target_path(path)
        floor = _floor_of(target)
        if parsed is not None and parsed.kind == "floor" and floor is not None:
            floors[parsed.model] = floor
    return floors


def release_counters(targets: Targets, model: str) -> dict[str, int]:
    """Version → release counter of every listed version of `model`."""
    counters: dict[str, int] = {}
    for path, target in targets.targets.items():
        parsed = parse_target_path(path)
        counter = _counter_of(target)
        if parsed is None or parsed.kind != "model" or parsed.model != model:
            continue
        if counter is not None and parsed.version is not None:
            counters[parsed.version] = counter
    return counters


def _check_transition(
    old: Targets, new: Metadata[Targets], artifact_length: ArtifactLength | None
) -> TargetsChange:
    """Every rule between two consecutive targets; `artifact_length=None` skips the store."""
    old_targets, new_targets = old.targets, new.signed.targets

    changed: dict[str, TargetFile] = {}
    for path, before in old_targets.items():
        after = new_targets.get(path)
        if after is None:
            raise PolicyError(
                f"target {path} was removed; published targets are never removed "
                "(raise the model's floor to forbid a version)",
                path=path,
            )
        if after == before:
            continue
        parsed = parse_target_path(path)
        if parsed is None or parsed.kind != "floor":
            raise ConflictError(
                f"target {path} already exists with another digest or custom field; "
                "a published version is immutable: release a new version instead",
                path=path,
                reason="immutable",
            )
        changed[path] = after
    for path, target in new_targets.items():
        if path not in old_targets:
            changed[path] = target

    parsed_paths: dict[str, TargetPath] = {}
    for path, target in sorted(changed.items()):
        parsed = parse_target_path(path)
        if parsed is None:
            raise InvalidInputError(
                f"target path {path!r} is not one of models/<model>/<version>/model.onnx, "
                "models/<model>/<version>/reference.npz or floors/<model>.json",
                path=path,
            )
        parsed_paths[path] = parsed
        digest = _sha256_of(target)
        if artifact_length is not None:
            stored = artifact_length(digest)
            if stored is None:
                raise InvalidInputError(
                    f"target {path}: no artifact with sha256 {digest} has been uploaded",
                    path=path,
                    sha256=digest,
                )
            if stored != target.length:
                raise ArtifactIntegrityError(
                    f"target {path}: the metadata says {target.length} bytes but the stored "
                    f"artifact {digest} has {stored}",
                    path=path,
                    sha256=digest,
                    length=target.length,
                    stored_length=stored,
                )

    # Floors first: a release in the same push is judged against the new floor.
    old_floors = current_floors(old)
    floors: dict[str, int] = {}
    for path, parsed in parsed_paths.items():
        if parsed.kind != "floor":
            continue
        floor_custom = _parse_custom(path, changed[path], parse_floor_custom)
        if floor_custom.model != parsed.model:
            raise InvalidInputError(
                f"target {path}: custom names model {floor_custom.model!r}", path=path
            )
        previous = old_floors.get(parsed.model)
        if previous is not None and floor_custom.floor <= previous:
            raise RollbackError(
                f"floor of model {parsed.model!r} may only rise: it is {previous}, "
                f"the push sets {floor_custom.floor}",
                model=parsed.model,
                floor=previous,
                requested=floor_custom.floor,
            )
        floors[parsed.model] = floor_custom.floor
    all_floors = {**old_floors, **floors}

    releases: list[ModelRelease] = []
    referenced: set[str] = set()
    new_counters: dict[str, dict[int, str]] = {}
    for path, parsed in sorted(parsed_paths.items()):
        if parsed.kind != "model":
            continue
        target = changed[path]
        custom = _parse_custom(path, target, parse_model_custom)
        if (custom.model, custom.version) != (parsed.model, parsed.version):
            raise InvalidInputError(
                f"target {path}: custom names {custom.model} {custom.version}", path=path
            )
        existing = release_counters(old, custom.model)
        highest = max(existing.values(), default=0)
        if custom.release_counter <= highest:
            raise RollbackError(
                f"target {path}: release counter {custom.release_counter} must be above "
                f"{highest}, the highest counter of model {custom.model!r}",
                path=path,
                release_counter=custom.release_counter,
                highest=highest,
            )
        floor = all_floors.get(custom.model)
        if floor is not None and custom.release_counter < floor:
            raise RollbackError(
                f"target {path}: release counter {custom.release_counter} is below the "
                f"floor {floor} of model {custom.model!r}",
                path=path,
                release_counter=custom.release_counter,
                floor=floor,
            )
        same = new_counters.setdefault(custom.model, {})
        if custom.release_counter in same:
            raise RollbackError(
                f"targets {same[custom.release_counter]} and {path} share release counter "
                f"{custom.release_counter}",
                path=path,
                release_counter=custom.release_counter,
            )
        same[custom.release_counter] = path
        _check_reference(path, custom, new_targets)
        referenced.add(custom.reference.path)
        releases.append(
            ModelRelease(path=path, sha256=_sha256_of(target), length=target.length, custom=custom)
        )

    for path, parsed in parsed_paths.items():
        if parsed.kind == "reference" and path not in referenced:
            raise InvalidInputError(
                f"reference target {path} is added without its model "
                f"{parsed.model} {parsed.version}",
                path=path,
            )

    return TargetsChange(new_targets=changed, new_models=releases, floors=floors, metadata=new)


_C = TypeVar("_C", ModelCustom, FloorCustom)


def _parse_custom(path: str, target: TargetFile, parse: Callable[[object], _C]) -> _C:
    if target.custom is None:
        raise InvalidInputError(f"target {path} has no custom field", path=path)
    try:
        return parse(target.custom)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"target {path}: {exc.message}", **{**exc.fields, "path": path}
        ) from exc


def _check_reference(path: str, custom: ModelCustom, targets: Mapping[str, TargetFile]) -> None:
    expected = reference_target_path(custom.model, custom.version)
    ref = custom.reference
    if ref.path != expected:
        raise InvalidInputError(
            f"target {path}: custom.reference.path must be {expected}, got {ref.path}",
            path=path,
        )
    target = targets.get(expected)
    if target is None:
        raise InvalidInputError(
            f"target {path}: its reference target {expected} is not listed", path=path
        )
    if target.length != ref.length or target.hashes.get("sha256") != ref.sha256:
        raise InvalidInputError(
            f"target {path}: custom.reference does not match the listed {expected} (sha256/length)",
            path=path,
        )


# ---------------------------------------------------------------- targets (operator)


def _next_targets(current: Metadata[Targets], expires: datetime) -> Metadata[Targets]:
    # A copy through the wire form: the result shares nothing with `current`.
    new = Metadata[Targets].from_bytes(to_bytes(current))
    new.signatures.clear()
    new.signed.version = current.signed.version + 1
    new.signed.expires = _utc(expires, "expires")
    return new


def resigned_targets(current: Metadata[Targets], expires: datetime) -> Metadata[Targets]:
    """The next targets with the same content and a new expiry; unsigned.

    What a release-key rotation re-signs with the new key (`verify_resigned_targets`).
    """
    return _next_targets(current, expires)


def next_release_counter(current: Metadata[Targets], model: str) -> int:
    """One above the model's highest counter, and at least its floor."""
    validate_model_name(model)
    highest = max(release_counters(current.signed, model).values(), default=0)
    return max(highest + 1, current_floors(current.signed).get(model, 1))


def add_model_to_targets(
    current: Metadata[Targets],
    *,
    model_file: TargetFile,
    reference_file: TargetFile,
    custom: ModelCustom,
    expires: datetime,
) -> Metadata[Targets]:
    """The next targets with a model version and its reference pair; unsigned.

    Runs the server's rules (minus the artifact store) so a push that would be refused
    is refused here first.
    """
    custom = parse_model_custom(custom.to_dict())
    expected_model = custom.target_path
    if model_file.path != expected_model:
        raise InvalidInputError(f"model file path must be {expected_model}, got {model_file.path}")
    if reference_file.path != custom.reference.path:
        raise InvalidInputError(
            f"reference file path must be {custom.reference.path}, got {reference_file.path}"
        )
    new = _next_targets(current, expires)
    new.signed.targets[reference_file.path] = TargetFile(
        reference_file.length, dict(reference_file.hashes), reference_file.path
    )
    new.signed.targets[model_file.path] = TargetFile(
        model_file.length,
        dict(model_file.hashes),
        model_file.path,
        {"custom": custom.to_dict()},
    )
    _check_transition(current.signed, new, None)
    return new


def floor_file_bytes(floor: FloorCustom) -> bytes:
    """Content of `floors/<model>.json`: the canonical JSON of its custom dict."""
    text = encode_canonical(floor.to_dict())
    assert text is not None
    return text.encode()


def raise_floor(
    current: Metadata[Targets], model: str, floor: int, expires: datetime
) -> tuple[Metadata[Targets], bytes]:
    """The next targets with the model's floor raised to `floor`; unsigned.

    Returns the floor file's bytes too: upload them as an artifact before pushing.
    """
    custom = parse_floor_custom(FloorCustom(model=model, floor=floor).to_dict())
    previous = current_floors(current.signed).get(model)
    if previous is not None and floor <= previous:
        raise RollbackError(
            f"floor of model {model!r} may only rise: it is {previous}, asked for {floor}",
            model=model,
            floor=previous,
            requested=floor,
        )
    content = floor_file_bytes(custom)
    new = _next_targets(current, expires)
    target = TargetFile.from_data(floor_target_path(model), content)
    target.unrecognized_fields["custom"] = custom.to_dict()
    new.signed.targets[target.path] = target
    _check_transition(current.signed, new, None)
    return new, content


# ------------------------------------------------------- snapshot / timestamp (server)


def make_snapshot(
    targets: Metadata[Targets],
    *,
    previous: Metadata[Snapshot] | None,
    expires: datetime,
) -> Metadata[Snapshot]:
    """The next snapshot, naming `targets`' version; unsigned (the online key signs)."""
    version = 1 if previous is None else previous.signed.version + 1
    if previous is not None:
        before = previous.signed.meta.get("targets.json")
        if before is not None and targets.signed.version < before.version:
            raise RollbackError(
                f"snapshot would take targets back from version {before.version} to "
                f"{targets.signed.version}",
                previous=before.version,
                version=targets.signed.version,
            )
    snapshot = Snapshot(
        version=version,
        expires=_utc(expires, "expires"),
        meta={"targets.json": MetaFile(version=targets.signed.version)},
    )
    return Metadata(snapshot)


def make_timestamp(
    snapshot_version: int,
    /,
    *,
    previous: Metadata[Timestamp] | None,
    expires: datetime,
) -> Metadata[Timestamp]:
    """The next timestamp, naming snapshot `snapshot_version`; unsigned."""
    version = 1 if previous is None else previous.signed.version + 1
    if previous is not None and snapshot_version < previous.signed.snapshot_meta.version:
        raise RollbackError(
            f"timestamp would take snapshot back from version "
            f"{previous.signed.snapshot_meta.version} to {snapshot_version}",
            previous=previous.signed.snapshot_meta.version,
            version=snapshot_version,
        )
    timestamp = Timestamp(
        version=version,
        expires=_utc(expires, "expires"),
        snapshot_meta=MetaFile(version=snapshot_version),
    )
    return Metadata(timestamp)


def needs_refresh(md: Metadata[Any], now: datetime, margin: timedelta) -> bool:
    """True once `md` expires within `margin` of `now`: time to re-sign it."""
    expires: datetime = md.signed.expires
    return _utc(now, "now") + margin >= expires
