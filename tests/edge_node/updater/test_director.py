"""verify_assignment: one accepted assignment, and each refusal with its own class and reason.

Assignments are built and signed here with protobuf and a securesystemslib signer, the
way the director does, so the node-side rules are tested without the control plane.
"""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner

from edge_node.errors import InvalidInputError
from edge_node.updater.director import (
    MAX_ASSIGNMENT_BYTES,
    AssignmentExpiredError,
    AssignmentFormatError,
    AssignmentMalformedError,
    AssignmentNotYetValidError,
    AssignmentRejectedError,
    AssignmentReplayError,
    AssignmentSignatureError,
    AssignmentWrongNodeError,
    BelowFloorError,
    TargetInfo,
    TargetMismatchError,
    UnknownTargetError,
    VerifiedAssignment,
    verify_assignment,
)
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment, SignedDirectorAssignment

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
NODE = "n-0123456789ab"
FLEET = "gates"
PATH = "models/det/1.1.0/model.onnx"
SHA = hashlib.sha256(b"model bytes").hexdigest()
LENGTH = 11
TARGET = TargetInfo(PATH, SHA, LENGTH, {"release_counter": 3, "model": "det", "edgefleet": 1})


@pytest.fixture(scope="module")
def director() -> CryptoSigner:
    return CryptoSigner.generate_ed25519()


def build(**overrides: Any) -> DirectorAssignment:
    fields: dict[str, Any] = {
        "fleet": FLEET,
        "node_id": NODE,
        "sequence": 5,
        "target_path": PATH,
        "sha256": SHA,
        "length": LENGTH,
        "format_version": 1,
    }
    issued = overrides.pop("issued_at", NOW - timedelta(minutes=1))
    expires = overrides.pop("expires_at", NOW + timedelta(days=1))
    fields.update(overrides)
    assignment = DirectorAssignment(**fields)
    if issued is not None:
        assignment.issued_at.FromDatetime(issued)
    if expires is not None:
        assignment.expires_at.FromDatetime(expires)
    return assignment


def sign(signer: CryptoSigner, payload: bytes | DirectorAssignment) -> SignedDirectorAssignment:
    data = payload if isinstance(payload, bytes) else payload.SerializeToString()
    signature = bytes.fromhex(signer.sign(data).signature)
    return SignedDirectorAssignment(
        assignment=data, keyid=signer.public_key.keyid, signature=signature
    )


def verify(
    signed: SignedDirectorAssignment,
    signer: CryptoSigner,
    *,
    targets: dict[str, TargetInfo] | None = None,
    floors: dict[str, int] | None = None,
    **overrides: Any,
) -> VerifiedAssignment:
    known = {PATH: TARGET} if targets is None else targets
    kwargs: dict[str, Any] = {
        "director_key": signer.public_key,
        "node_id": NODE,
        "fleet": FLEET,
        "last_sequence": 4,
        "now": NOW,
        "target_lookup": known.get,
        "floor_lookup": lambda model: (floors or {}).get(model, 0),
    }
    kwargs.update(overrides)
    return verify_assignment(signed, **kwargs)


def refused(
    kind: type[AssignmentRejectedError], reason: str, signed: SignedDirectorAssignment, **kw: Any
) -> AssignmentRejectedError:
    signer = kw.pop("signer")
    with pytest.raises(kind) as info:
        verify(signed, signer, **kw)
    assert info.value.reason == reason
    assert info.value.fields["reason"] == reason
    return info.value


def test_a_good_assignment_is_accepted(director: CryptoSigner) -> None:
    verified = verify(sign(director, build()), director, floors={"det": 3})
    assert verified.sequence == 5
    assert (verified.target_path, verified.sha256, verified.length) == (PATH, SHA, LENGTH)
    assert (verified.model, verified.release_counter) == ("det", 3)
    assert verified.keyid == director.public_key.keyid
    assert verified.expires_at == NOW + timedelta(days=1)
    assert verified.target == TARGET


def test_unknown_fields_are_ignored(director: CryptoSigner) -> None:
    # field 15, varint 1: a newer director's extra field
    payload = build().SerializeToString() + bytes([15 << 3, 1])
    assert verify(sign(director, payload), director).sequence == 5


def test_one_of_several_director_keys_may_sign(director: CryptoSigner) -> None:
    other = CryptoSigner.generate_ed25519()
    signed = sign(other, build())
    assert verify(signed, other, director_key=[director.public_key, other.public_key])


# ------------------------------------------------------------------ signature


def test_unknown_keyid_is_refused(director: CryptoSigner) -> None:
    stranger = CryptoSigner.generate_ed25519()
    refused(AssignmentSignatureError, "unknown-key", sign(stranger, build()), signer=director)


def test_a_signature_by_another_key_under_the_right_keyid_is_refused(
    director: CryptoSigner,
) -> None:
    forged = sign(CryptoSigner.generate_ed25519(), build())
    forged.keyid = director.public_key.keyid
    refused(AssignmentSignatureError, "bad-signature", forged, signer=director)


def test_tampered_bytes_are_refused(director: CryptoSigner) -> None:
    signed = sign(director, build())
    signed.assignment = build(node_id="n-ffffffffffff").SerializeToString()
    refused(AssignmentSignatureError, "bad-signature", signed, signer=director)


def test_a_truncated_signature_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build())
    signed.signature = signed.signature[:32]
    refused(AssignmentSignatureError, "bad-signature", signed, signer=director)


def test_an_oversized_assignment_is_refused_before_verification(director: CryptoSigner) -> None:
    signed = sign(director, build(target_path="x" * MAX_ASSIGNMENT_BYTES))
    refused(AssignmentMalformedError, "too-large", signed, signer=director)


def test_signed_garbage_is_refused(director: CryptoSigner) -> None:
    refused(AssignmentMalformedError, "malformed", sign(director, b"\xff\xff\xff"), signer=director)


def test_a_non_ed25519_director_key_is_a_configuration_error(director: CryptoSigner) -> None:
    ecdsa = CryptoSigner.generate_ecdsa()
    with pytest.raises(InvalidInputError):
        verify(sign(director, build()), director, director_key=ecdsa.public_key)


# --------------------------------------------------------------- node, format


def test_an_unknown_format_version_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(format_version=2))
    refused(AssignmentFormatError, "unknown-format", signed, signer=director)


def test_an_assignment_for_another_node_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(node_id="n-ffffffffffff"))
    refused(AssignmentWrongNodeError, "wrong-node", signed, signer=director)


def test_an_assignment_for_another_fleet_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(fleet="yards"))
    refused(AssignmentWrongNodeError, "wrong-fleet", signed, signer=director)


# ------------------------------------------------------------- sequence, time


def test_a_replayed_assignment_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(sequence=5))
    error = refused(AssignmentReplayError, "replayed", signed, signer=director, last_sequence=5)
    assert error.fields["last_sequence"] == 5


def test_a_stale_assignment_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(sequence=3))
    refused(AssignmentReplayError, "stale", signed, signer=director, last_sequence=4)


def test_sequence_zero_is_malformed(director: CryptoSigner) -> None:
    signed = sign(director, build(sequence=0))
    refused(AssignmentMalformedError, "malformed", signed, signer=director, last_sequence=0)


def test_an_expired_assignment_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(expires_at=NOW))  # expires_at <= now
    refused(AssignmentExpiredError, "expired", signed, signer=director)


def test_an_assignment_from_the_future_is_refused_beyond_the_skew(director: CryptoSigner) -> None:
    within = sign(director, build(issued_at=NOW + timedelta(minutes=4)))
    assert verify(within, director).sequence == 5
    beyond = sign(director, build(issued_at=NOW + timedelta(minutes=6)))
    refused(AssignmentNotYetValidError, "issued-in-future", beyond, signer=director)
    assert verify(beyond, director, max_clock_skew=timedelta(minutes=10))


def test_missing_times_are_malformed(director: CryptoSigner) -> None:
    signed = sign(director, build(expires_at=None))
    refused(AssignmentMalformedError, "malformed", signed, signer=director)


def test_expiry_before_issue_is_malformed(director: CryptoSigner) -> None:
    signed = sign(
        director, build(issued_at=NOW - timedelta(hours=1), expires_at=NOW - timedelta(hours=2))
    )
    refused(AssignmentMalformedError, "malformed", signed, signer=director)


def test_now_must_be_aware(director: CryptoSigner) -> None:
    with pytest.raises(InvalidInputError):
        verify(sign(director, build()), director, now=NOW.replace(tzinfo=None))


# -------------------------------------------------------------------- targets


def test_a_target_absent_from_tuf_is_refused(director: CryptoSigner) -> None:
    error = refused(
        UnknownTargetError, "unknown-target", sign(director, build()), signer=director, targets={}
    )
    assert error.fields["target_path"] == PATH


def test_a_path_that_is_not_a_model_target_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(target_path="floors/det.json"))
    refused(AssignmentMalformedError, "not-a-model", signed, signer=director)


def test_a_sha256_other_than_tufs_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(sha256=hashlib.sha256(b"other").hexdigest()))
    refused(TargetMismatchError, "sha256-mismatch", signed, signer=director)


def test_a_length_other_than_tufs_is_refused(director: CryptoSigner) -> None:
    signed = sign(director, build(length=LENGTH + 1))
    refused(TargetMismatchError, "length-mismatch", signed, signer=director)


@pytest.mark.parametrize(
    "custom",
    [{}, {"release_counter": "3"}, {"release_counter": True}, {"release_counter": 3, "model": "x"}],
)
def test_a_target_without_a_usable_custom_is_refused(
    director: CryptoSigner, custom: dict[str, Any]
) -> None:
    target = dataclasses.replace(TARGET, custom=custom)
    signed = sign(director, build())
    refused(TargetMismatchError, "bad-custom", signed, signer=director, targets={PATH: target})


def test_a_release_counter_below_the_floor_is_refused(director: CryptoSigner) -> None:
    error = refused(
        BelowFloorError, "below-floor", sign(director, build()), signer=director, floors={"det": 4}
    )
    assert (error.fields["release_counter"], error.fields["floor"]) == (3, 4)


def test_target_info_is_frozen() -> None:
    with pytest.raises(TypeError):
        TARGET.custom["release_counter"] = 1  # type: ignore[index]


def test_a_shadow_candidate_is_checked_against_tuf_like_a_target() -> None:
    from edge_node.updater.director import (
        AssignmentMalformedError,
        BelowFloorError,
        ShadowRequest,
        TargetMismatchError,
        UnknownTargetError,
        verify_shadow,
    )

    path, sha = "models/det/2.0.0/model.onnx", hashlib.sha256(b"two").hexdigest()
    tuf = {path: TargetInfo(path, sha, 3, {"release_counter": 4})}

    def check(request: ShadowRequest, floor: int = 0) -> object:
        return verify_shadow(
            request, model="det", target_lookup=tuf.get, floor_lookup=lambda model: floor
        )

    good = ShadowRequest(path, sha, 3, 1000, 100)
    assert check(good) is not None
    refusals: list[tuple[ShadowRequest, int, type[AssignmentRejectedError], str]] = [
        (dataclasses.replace(good, sample_per_mille=0), 0, AssignmentMalformedError, "bad-shadow"),
        (dataclasses.replace(good, max_cpu_percent=0), 0, AssignmentMalformedError, "bad-shadow"),
        (
            dataclasses.replace(good, target_path="models/cls/2.0.0/model.onnx"),
            0,
            AssignmentMalformedError,
            "bad-shadow",
        ),
        (
            dataclasses.replace(good, target_path="models/det/9.0.0/model.onnx"),
            0,
            UnknownTargetError,
            "unknown-target",
        ),
        (dataclasses.replace(good, length=4), 0, TargetMismatchError, "length-mismatch"),
        (good, 5, BelowFloorError, "below-floor"),
    ]
    for request, floor, error, reason in refusals:
        with pytest.raises(error) as refused:
            check(request, floor)
        assert refused.value.reason == reason
