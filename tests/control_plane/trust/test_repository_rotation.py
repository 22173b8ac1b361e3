"""Root rotation: root N+1 revokes a release key (or rotates root keys), TUF's rules."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Root, Targets

from control_plane.errors import (
    ConflictError,
    InvalidInputError,
    PolicyError,
    SignatureError,
)
from control_plane.trust import repository as repo
from tests.control_plane.trust.helpers import MONTH, NOW, YEAR, Fleet


@pytest.fixture
def fleet() -> Fleet:
    fleet = Fleet.create()
    fleet.release_model("detector", "1.0.0")
    return fleet


def signed(md: Metadata[Root], signers: list[CryptoSigner]) -> Metadata[Root]:
    md.signatures.clear()
    for signer in signers:
        md.sign(signer, append=True)
    return md


def next_root(fleet: Fleet, new_release: CryptoSigner) -> Metadata[Root]:
    """Root N+1 naming `new_release` alone, signed by the threshold of root keys."""
    md = repo.build_next_root(fleet.root, release_keys=[new_release.public_key], expires=NOW + YEAR)
    return signed(md, fleet.root_signers[:2])


def verify(fleet: Fleet, md: Metadata[Root] | bytes) -> Metadata[Root]:
    data = md if isinstance(md, bytes) else repo.to_bytes(md)
    return repo.verify_root_update(current=fleet.root, new_bytes=data, now=NOW)


def resigned(fleet: Fleet, signer: CryptoSigner) -> Metadata[Targets]:
    md = repo.resigned_targets(fleet.targets, NOW + MONTH)
    md.sign(signer)
    return md


# ------------------------------------------------------------------ build_next_root


def test_build_next_root_replaces_the_release_key_only(fleet: Fleet) -> None:
    old = fleet.release.public_key.keyid
    new_release = CryptoSigner.generate_ed25519()
    before = repo.to_bytes(fleet.root)
    md = repo.build_next_root(
        fleet.root, release_keys=[new_release.public_key], expires=NOW + 2 * YEAR
    )
    root = md.signed
    assert root.version == 2
    assert root.expires == NOW + 2 * YEAR
    assert md.signatures == {}
    assert root.roles["targets"].keyids == [new_release.public_key.keyid]
    assert root.roles["targets"].threshold == 1
    assert old not in root.keys  # revoked: gone from the root altogether
    current = fleet.root.signed
    for role in ("root", "snapshot", "timestamp"):
        assert root.roles[role] == current.roles[role]
        for keyid in root.roles[role].keyids:
            assert root.keys[keyid] == current.keys[keyid]
    assert root.consistent_snapshot is True
    assert repo.to_bytes(fleet.root) == before  # the current root is not touched


def test_build_next_root_can_rotate_root_keys(fleet: Fleet) -> None:
    new_roots = [CryptoSigner.generate_ed25519() for _ in range(2)]
    md = repo.build_next_root(
        fleet.root,
        release_keys=[fleet.release.public_key],
        expires=NOW + YEAR,
        root_keys=[fleet.root_signers[0].public_key, *(s.public_key for s in new_roots)],
        root_threshold=3,
    )
    role = md.signed.roles["root"]
    assert role.threshold == 3
    assert role.keyids == [
        fleet.root_signers[0].public_key.keyid,
        *(s.public_key.keyid for s in new_roots),
    ]
    for dropped in fleet.root_signers[1:]:
        assert dropped.public_key.keyid not in md.signed.keys
    # Signed by two old keys (current threshold) and all three new ones (new threshold).
    signed(md, [*fleet.root_signers[:2], *new_roots])
    assert verify(fleet, md).signed.version == 2


def test_build_next_root_keeps_the_root_threshold_by_default(fleet: Fleet) -> None:
    md = repo.build_next_root(
        fleet.root, release_keys=[fleet.release.public_key], expires=NOW + YEAR
    )
    assert md.signed.roles["root"].threshold == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"release_keys": []}, "at least one release key"),
        ({"release_threshold": 2}, "release threshold"),
        ({"root_threshold": 4}, "root threshold"),
        ({"root_threshold": 0}, "root threshold"),
        ({"root_keys": []}, "root threshold"),
    ],
)
def test_build_next_root_validates(fleet: Fleet, change: dict[str, object], message: str) -> None:
    kwargs: dict[str, object] = {
        "release_keys": [CryptoSigner.generate_ed25519().public_key],
        "expires": NOW + YEAR,
        **change,
    }
    with pytest.raises(InvalidInputError, match=message):
        repo.build_next_root(fleet.root, **kwargs)  # type: ignore[arg-type]


def test_build_next_root_refuses_an_online_key_as_release_key(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match="targets keys must be offline"):
        repo.build_next_root(
            fleet.root, release_keys=[fleet.snapshot.public_key], expires=NOW + YEAR
        )


def test_build_next_root_refuses_non_ed25519_keys(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match="Ed25519 keys only"):
        repo.build_next_root(
            fleet.root,
            release_keys=[CryptoSigner.generate_ecdsa().public_key],
            expires=NOW + YEAR,
        )


def test_build_next_root_refuses_naive_datetimes(fleet: Fleet) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        repo.build_next_root(
            fleet.root,
            release_keys=[fleet.release.public_key],
            expires=(NOW + YEAR).replace(tzinfo=None),
        )


# -------------------------------------------------------------- verify_root_update


def test_rotation_accepted(fleet: Fleet) -> None:
    new_release = CryptoSigner.generate_ed25519()
    accepted = verify(fleet, next_root(fleet, new_release))
    assert accepted.signed.version == 2
    assert accepted.signed.roles["targets"].keyids == [new_release.public_key.keyid]


def test_rotation_signed_by_every_root_key_accepted(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    verify(fleet, signed(md, fleet.root_signers))


def test_rotation_under_the_current_roots_threshold_refused(fleet: Fleet) -> None:
    """New root keys alone cannot take over: the current root keys must sign too."""
    new_roots = [CryptoSigner.generate_ed25519() for _ in range(2)]
    md = repo.build_next_root(
        fleet.root,
        release_keys=[fleet.release.public_key],
        expires=NOW + YEAR,
        root_keys=[s.public_key for s in new_roots],
    )
    signed(md, [fleet.root_signers[0], *new_roots])
    with pytest.raises(SignatureError, match=r"1 valid signature.*the current root") as info:
        verify(fleet, md)
    assert info.value.fields["valid"] == 1
    assert info.value.fields["threshold"] == 2


def test_rotation_under_the_new_roots_threshold_refused(fleet: Fleet) -> None:
    """The new root must be signed by its own root keys too (TUF §5.3.4)."""
    new_roots = [CryptoSigner.generate_ed25519() for _ in range(2)]
    md = repo.build_next_root(
        fleet.root,
        release_keys=[fleet.release.public_key],
        expires=NOW + YEAR,
        root_keys=[s.public_key for s in new_roots],
    )
    signed(md, [*fleet.root_signers[:2], new_roots[0]])
    with pytest.raises(SignatureError, match=r"1 valid signature.*the new root"):
        verify(fleet, md)


def test_rotation_signed_by_one_root_key_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    with pytest.raises(SignatureError):
        verify(fleet, signed(md, fleet.root_signers[:1]))


def test_rotation_signed_by_the_release_key_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    with pytest.raises(SignatureError, match="not authorised for root"):
        verify(fleet, signed(md, [fleet.root_signers[0], fleet.release]))


def test_tampered_rotation_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.add_key(CryptoSigner.generate_ed25519().public_key, "targets")
    with pytest.raises(SignatureError, match="do not verify"):
        verify(fleet, md)


def test_rotation_to_the_same_version_is_a_conflict(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.version = 1
    signed(md, fleet.root_signers[:2])
    with pytest.raises(ConflictError, match="stale") as info:
        verify(fleet, md)
    assert info.value.fields["reason"] == "stale"
    assert info.value.fields["current_version"] == 1


def test_replaying_an_older_root_is_a_conflict(fleet: Fleet) -> None:
    first = fleet.root
    fleet.root = verify(fleet, next_root(fleet, CryptoSigner.generate_ed25519()))
    with pytest.raises(ConflictError, match="stale") as info:
        verify(fleet, first)
    assert info.value.fields == {"reason": "stale", "current_version": 2, "version": 1}


def test_rotation_skipping_a_version_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.version = 3
    signed(md, fleet.root_signers[:2])
    with pytest.raises(InvalidInputError, match="skips versions"):
        verify(fleet, md)


def _online_takeovers() -> dict[str, Callable[[Fleet, Root], None]]:
    def other_snapshot_key(fleet: Fleet, root: Root) -> None:
        root.revoke_key(fleet.snapshot.public_key.keyid, "snapshot")
        root.add_key(CryptoSigner.generate_ed25519().public_key, "snapshot")

    def other_timestamp_key(fleet: Fleet, root: Root) -> None:
        root.revoke_key(fleet.timestamp.public_key.keyid, "timestamp")
        root.add_key(CryptoSigner.generate_ed25519().public_key, "timestamp")

    def swapped_online_keys(fleet: Fleet, root: Root) -> None:
        root.roles["snapshot"], root.roles["timestamp"] = (
            root.roles["timestamp"],
            root.roles["snapshot"],
        )

    def extra_timestamp_key(fleet: Fleet, root: Root) -> None:
        root.add_key(CryptoSigner.generate_ed25519().public_key, "timestamp")

    def snapshot_threshold_2(fleet: Fleet, root: Root) -> None:
        root.add_key(CryptoSigner.generate_ed25519().public_key, "snapshot")
        root.roles["snapshot"].threshold = 2

    def online_key_signs_targets(fleet: Fleet, root: Root) -> None:
        root.add_key(fleet.timestamp.public_key, "targets")

    def online_key_in_root_role(fleet: Fleet, root: Root) -> None:
        root.add_key(fleet.snapshot.public_key, "root")

    return {
        "other snapshot key": other_snapshot_key,
        "other timestamp key": other_timestamp_key,
        "swapped online keys": swapped_online_keys,
        "extra timestamp key": extra_timestamp_key,
        "snapshot threshold 2": snapshot_threshold_2,
        "online key signs targets": online_key_signs_targets,
        "online key in root role": online_key_in_root_role,
    }


@pytest.mark.parametrize("name", sorted(_online_takeovers()))
def test_rotation_cannot_touch_the_online_keys(fleet: Fleet, name: str) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    _online_takeovers()[name](fleet, md.signed)
    signed(md, fleet.root_signers[:2])
    with pytest.raises(PolicyError, match="control plane's") as info:
        verify(fleet, md)
    assert not isinstance(info.value, SignatureError)


def test_rotation_must_stay_consistent_snapshot(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.consistent_snapshot = False
    signed(md, fleet.root_signers[:2])
    with pytest.raises(InvalidInputError, match="consistent_snapshot"):
        verify(fleet, md)


def test_rotation_to_no_release_key_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.revoke_key(md.signed.roles["targets"].keyids[0], "targets")
    signed(md, fleet.root_signers[:2])
    with pytest.raises(InvalidInputError, match="nobody could release"):
        verify(fleet, md)


def test_expired_rotation_refused(fleet: Fleet) -> None:
    md = next_root(fleet, CryptoSigner.generate_ed25519())
    md.signed.expires = NOW
    signed(md, fleet.root_signers[:2])
    with pytest.raises(PolicyError, match="expired"):
        verify(fleet, md)


def test_targets_bytes_are_not_a_rotation(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match="expected root metadata, got targets"):
        verify(fleet, repo.to_bytes(fleet.targets))


def test_rotation_chains(fleet: Fleet) -> None:
    """Root 3 is checked against root 2, not root 1."""
    second = CryptoSigner.generate_ed25519()
    fleet.root = verify(fleet, next_root(fleet, second))
    third = CryptoSigner.generate_ed25519()
    root3 = next_root(fleet, third)
    assert verify(fleet, root3).signed.version == 3
    assert second.public_key.keyid not in root3.signed.keys


# -------------------------------------------------------- targets after a rotation


def test_resigned_targets_accepted_by_the_new_root(fleet: Fleet) -> None:
    new_release = CryptoSigner.generate_ed25519()
    new_root = verify(fleet, next_root(fleet, new_release))
    md = repo.verify_resigned_targets(
        root=new_root,
        current=fleet.targets,
        new_bytes=repo.to_bytes(resigned(fleet, new_release)),
        now=NOW,
    )
    assert md.signed.version == fleet.targets.signed.version + 1
    assert md.signed.targets == fleet.targets.signed.targets


def test_resigned_targets_signed_by_the_revoked_key_refused(fleet: Fleet) -> None:
    new_root = verify(fleet, next_root(fleet, CryptoSigner.generate_ed25519()))
    with pytest.raises(SignatureError, match="not authorised for targets"):
        repo.verify_resigned_targets(
            root=new_root,
            current=fleet.targets,
            new_bytes=repo.to_bytes(resigned(fleet, fleet.release)),
            now=NOW,
        )


def _smuggles() -> dict[str, Callable[[Fleet, Targets], None]]:
    def adds_a_model(fleet: Fleet, targets: Targets) -> None:
        extra = fleet.model_targets("detector", "2.0.0")
        targets.targets = dict(extra.signed.targets)

    def removes_a_target(fleet: Fleet, targets: Targets) -> None:
        del targets.targets["models/detector/1.0.0/reference.npz"]

    def changes_custom(fleet: Fleet, targets: Targets) -> None:
        target = targets.targets["models/detector/1.0.0/model.onnx"]
        assert target.custom is not None
        target.unrecognized_fields["custom"] = {**target.custom, "min_agent_version": "9.0.0"}

    def adds_a_field(fleet: Fleet, targets: Targets) -> None:
        targets.unrecognized_fields["note"] = "hello"

    return {
        "adds a model": adds_a_model,
        "removes a target": removes_a_target,
        "changes custom": changes_custom,
        "adds a field": adds_a_field,
    }


@pytest.mark.parametrize("name", sorted(_smuggles()))
def test_rotation_cannot_smuggle_in_targets(fleet: Fleet, name: str) -> None:
    new_release = CryptoSigner.generate_ed25519()
    new_root = verify(fleet, next_root(fleet, new_release))
    md = repo.resigned_targets(fleet.targets, NOW + MONTH)
    _smuggles()[name](fleet, md.signed)
    md.sign(new_release)
    with pytest.raises(PolicyError, match="re-signed") as info:
        repo.verify_resigned_targets(
            root=new_root, current=fleet.targets, new_bytes=repo.to_bytes(md), now=NOW
        )
    assert not isinstance(info.value, SignatureError)


def test_resigned_targets_with_a_stale_version_is_a_conflict(fleet: Fleet) -> None:
    new_release = CryptoSigner.generate_ed25519()
    new_root = verify(fleet, next_root(fleet, new_release))
    md = repo.resigned_targets(fleet.targets, NOW + MONTH)
    md.signed.version = fleet.targets.signed.version
    md.sign(new_release)
    with pytest.raises(ConflictError, match="stale"):
        repo.verify_resigned_targets(
            root=new_root, current=fleet.targets, new_bytes=repo.to_bytes(md), now=NOW
        )


def test_resigned_targets_may_only_move_expiry(fleet: Fleet) -> None:
    new_release = CryptoSigner.generate_ed25519()
    new_root = verify(fleet, next_root(fleet, new_release))
    md = repo.resigned_targets(fleet.targets, NOW + timedelta(days=400))
    md.sign(new_release)
    accepted = repo.verify_resigned_targets(
        root=new_root, current=fleet.targets, new_bytes=repo.to_bytes(md), now=NOW
    )
    assert accepted.signed.expires == NOW + timedelta(days=400)


def test_after_rotation_only_the_new_key_can_release(fleet: Fleet) -> None:
    old_release, new_release = fleet.release, CryptoSigner.generate_ed25519()
    new_root = verify(fleet, next_root(fleet, new_release))
    fleet.targets = repo.verify_resigned_targets(
        root=new_root,
        current=fleet.targets,
        new_bytes=repo.to_bytes(resigned(fleet, new_release)),
        now=NOW,
    )
    fleet.root = new_root

    with pytest.raises(SignatureError, match="not authorised for targets") as info:
        fleet.release_model("detector", "2.0.0")  # still signs with the revoked key
    assert info.value.fields["unknown_keyids"] == [old_release.public_key.keyid]

    fleet.release = new_release
    change = fleet.release_model("detector", "2.0.0")
    assert change.version == fleet.targets.signed.version
    assert [m.custom.version for m in change.new_models] == ["2.0.0"]


def test_online_key_rotation_needs_keys_the_control_plane_holds(fleet: Fleet) -> None:
    new = {role: CryptoSigner.generate_ed25519() for role in repo.ONLINE_ROLES}
    md = repo.build_next_root(
        fleet.root,
        release_keys=[fleet.release.public_key],
        online_keys={role: s.public_key for role, s in new.items()},
        expires=NOW + YEAR,
    )
    signed(md, fleet.root_signers[:2])
    data = repo.to_bytes(md)
    held = {(role, s.public_key.keyid) for role, s in new.items()}
    # No key store to ask, or one that lacks either key: refused.
    with pytest.raises(PolicyError, match="key store holds"):
        verify(fleet, data)
    for missing in sorted(held):
        with pytest.raises(PolicyError, match="key store holds"):
            repo.verify_root_update(
                current=fleet.root,
                new_bytes=data,
                now=NOW,
                online_key_held=lambda role, keyid, m=missing: (role, keyid) in held - {m},
            )
    accepted = repo.verify_root_update(
        current=fleet.root,
        new_bytes=data,
        now=NOW,
        online_key_held=lambda role, keyid: (role, keyid) in held,
    )
    for role, signer in new.items():
        assert accepted.signed.roles[role].keyids == [signer.public_key.keyid]
    # The old online keys are gone from root: whatever they sign no longer verifies.
    assert fleet.timestamp.public_key.keyid not in accepted.signed.keys
    assert fleet.snapshot.public_key.keyid not in accepted.signed.keys
