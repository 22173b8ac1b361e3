from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import Metadata, Role, Root

from control_plane.errors import (
    InvalidInputError,
    PayloadTooLargeError,
    PolicyError,
    SignatureError,
)
from control_plane.trust import repository as repo
from tests.control_plane.trust.helpers import NOW, YEAR, Fleet


@pytest.fixture
def fleet() -> Fleet:
    return Fleet.create()


def verify(fleet: Fleet, md: Metadata[Root] | bytes) -> Metadata[Root]:
    data = md if isinstance(md, bytes) else repo.to_bytes(md)
    return repo.verify_new_root(
        data,
        snapshot_keyid=fleet.snapshot.public_key.keyid,
        timestamp_keyid=fleet.timestamp.public_key.keyid,
        now=NOW,
    )


def resign(fleet: Fleet, md: Metadata[Root], signers: list[CryptoSigner] | None = None) -> None:
    md.signatures.clear()
    for signer in signers if signers is not None else fleet.root_signers[:2]:
        md.sign(signer, append=True)


def test_valid_root_accepted(fleet: Fleet) -> None:
    accepted = verify(fleet, fleet.root)
    assert accepted.signed == fleet.root.signed
    roles = accepted.signed.roles
    assert roles["root"].threshold == 2
    assert len(roles["root"].keyids) == 3
    assert roles["targets"].keyids == [fleet.release.public_key.keyid]
    assert roles["snapshot"].keyids == [fleet.snapshot.public_key.keyid]
    assert accepted.signed.consistent_snapshot is True


def test_all_root_signatures_accepted(fleet: Fleet) -> None:
    resign(fleet, fleet.root, fleet.root_signers)
    verify(fleet, fleet.root)


def test_under_threshold_root_refused(fleet: Fleet) -> None:
    resign(fleet, fleet.root, fleet.root_signers[:1])
    with pytest.raises(SignatureError, match="1 valid signature"):
        verify(fleet, fleet.root)


def test_unsigned_root_refused(fleet: Fleet) -> None:
    resign(fleet, fleet.root, [])
    with pytest.raises(SignatureError, match="0 valid"):
        verify(fleet, fleet.root)


def test_root_signed_by_unknown_keys_refused(fleet: Fleet) -> None:
    strangers = [CryptoSigner.generate_ed25519() for _ in range(2)]
    resign(fleet, fleet.root, strangers)
    with pytest.raises(SignatureError, match="not authorised for root") as info:
        verify(fleet, fleet.root)
    assert set(info.value.fields["unknown_keyids"]) == {s.public_key.keyid for s in strangers}


def test_root_signed_by_release_key_refused(fleet: Fleet) -> None:
    resign(fleet, fleet.root, [fleet.root_signers[0], fleet.release])
    with pytest.raises(SignatureError):
        verify(fleet, fleet.root)


def test_tampered_root_refused(fleet: Fleet) -> None:
    fleet.root.signed.expires = fleet.root.signed.expires + timedelta(days=1)
    with pytest.raises(SignatureError, match="do not verify"):
        verify(fleet, fleet.root)


def _mutations() -> dict[str, tuple[Callable[[Fleet, Root], None], str]]:
    def other_snapshot_key(fleet: Fleet, root: Root) -> None:
        root.revoke_key(fleet.snapshot.public_key.keyid, "snapshot")
        root.add_key(CryptoSigner.generate_ed25519().public_key, "snapshot")

    def extra_timestamp_key(fleet: Fleet, root: Root) -> None:
        root.add_key(CryptoSigner.generate_ed25519().public_key, "timestamp")

    def timestamp_threshold_2(fleet: Fleet, root: Root) -> None:
        root.add_key(CryptoSigner.generate_ed25519().public_key, "timestamp")
        root.roles["timestamp"].threshold = 2

    def swapped_online_keys(fleet: Fleet, root: Root) -> None:
        root.roles["snapshot"], root.roles["timestamp"] = (
            root.roles["timestamp"],
            root.roles["snapshot"],
        )

    def online_key_signs_targets(fleet: Fleet, root: Root) -> None:
        root.add_key(fleet.snapshot.public_key, "targets")

    def online_key_in_root_role(fleet: Fleet, root: Root) -> None:
        root.add_key(fleet.timestamp.public_key, "root")

    def no_targets_key(fleet: Fleet, root: Root) -> None:
        root.revoke_key(fleet.release.public_key.keyid, "targets")

    def targets_threshold_unreachable(fleet: Fleet, root: Root) -> None:
        root.roles["targets"].threshold = 2

    def not_consistent(fleet: Fleet, root: Root) -> None:
        root.consistent_snapshot = False

    def version_2(fleet: Fleet, root: Root) -> None:
        root.version = 2

    def foreign_keyid(fleet: Fleet, root: Root) -> None:
        key = CryptoSigner.generate_ed25519().public_key
        renamed = SSlibKey("my-release-key", key.keytype, key.scheme, key.keyval)
        root.add_key(renamed, "targets")

    def ecdsa_key(fleet: Fleet, root: Root) -> None:
        root.add_key(CryptoSigner.generate_ecdsa().public_key, "targets")

    def dangling_keyid(fleet: Fleet, root: Root) -> None:
        root.roles["targets"] = Role([fleet.release.public_key.keyid, "ff" * 32], 1)

    return {
        "other snapshot key": (other_snapshot_key, "exactly the control plane's snapshot key"),
        "extra timestamp key": (extra_timestamp_key, "exactly the control plane's timestamp"),
        "timestamp threshold 2": (timestamp_threshold_2, "control plane's timestamp key"),
        "swapped online keys": (swapped_online_keys, "control plane's snapshot key"),
        "online key signs targets": (online_key_signs_targets, "targets keys must be offline"),
        "online key in root role": (online_key_in_root_role, "root keys must be offline"),
        "no targets key": (no_targets_key, "nobody could release"),
        "targets threshold unreachable": (targets_threshold_unreachable, "could never be signed"),
        "not consistent": (not_consistent, "consistent_snapshot"),
        "version 2": (version_2, "must be version 1"),
        "foreign keyid": (foreign_keyid, "is not the sha256"),
        "ecdsa key": (ecdsa_key, "Ed25519 keys only"),
        "dangling keyid": (dangling_keyid, "absent from root.keys"),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_bad_root_refused_even_when_properly_signed(fleet: Fleet, name: str) -> None:
    mutate, message = _mutations()[name]
    mutate(fleet, fleet.root.signed)
    resign(fleet, fleet.root)
    with pytest.raises(InvalidInputError, match=message):
        verify(fleet, fleet.root)


def test_expired_root_refused(fleet: Fleet) -> None:
    fleet.root.signed.expires = NOW - timedelta(seconds=1)
    resign(fleet, fleet.root)
    with pytest.raises(PolicyError, match="expired"):
        verify(fleet, fleet.root)
    fleet.root.signed.expires = NOW
    resign(fleet, fleet.root)
    with pytest.raises(PolicyError, match="expired"):
        verify(fleet, fleet.root)


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b'{"signed": {}}', b"\xff\xfe", b'{"signatures": [], "signed": 1}'],
)
def test_malformed_root_refused(fleet: Fleet, data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="malformed root"):
        verify(fleet, data)


def test_targets_bytes_are_not_a_root(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match="expected root metadata, got targets"):
        verify(fleet, repo.to_bytes(fleet.targets))


def test_oversized_root_refused(fleet: Fleet) -> None:
    fleet.root.signed.unrecognized_fields["padding"] = "x" * repo.MAX_ROOT_BYTES
    resign(fleet, fleet.root)
    with pytest.raises(PayloadTooLargeError):
        verify(fleet, fleet.root)


def test_build_root_validates_thresholds(fleet: Fleet) -> None:
    keys = [s.public_key for s in fleet.root_signers]
    common = {
        "release_keys": [fleet.release.public_key],
        "snapshot_key": fleet.snapshot.public_key,
        "timestamp_key": fleet.timestamp.public_key,
        "expires": NOW + YEAR,
    }
    for threshold in (0, 4):
        with pytest.raises(InvalidInputError):
            repo.build_root(root_keys=keys, root_threshold=threshold, **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        repo.build_root(root_keys=keys, root_threshold=2, release_threshold=2, **common)  # type: ignore[arg-type]


def test_build_root_refuses_naive_datetimes(fleet: Fleet) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        repo.initial_targets(NOW.replace(tzinfo=None))
