from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import DelegatedRole, Delegations, Metadata, TargetFile, Targets

from control_plane.errors import (
    ArtifactIntegrityError,
    ConflictError,
    InvalidInputError,
    PayloadTooLargeError,
    PolicyError,
    RollbackError,
    SignatureError,
)
from control_plane.trust import repository as repo
from control_plane.trust.custom import floor_target_path, parse_model_custom
from tests.control_plane.trust.helpers import MONTH, NOW, YEAR, Fleet, model_custom, sha256

MODEL = "models/detector/1.0.0/model.onnx"
REFERENCE = "models/detector/1.0.0/reference.npz"


@pytest.fixture
def fleet() -> Fleet:
    return Fleet.create()


def push(fleet: Fleet, md: Metadata[Any] | bytes) -> repo.TargetsChange:
    data = md if isinstance(md, bytes) else repo.to_bytes(md)
    return repo.verify_targets_update(
        root=fleet.root,
        current=fleet.targets,
        new_bytes=data,
        now=NOW,
        artifact_length=fleet.artifact_length,
    )


def signed(fleet: Fleet, md: Metadata[Targets], *signers: CryptoSigner) -> Metadata[Targets]:
    md.signatures.clear()
    for signer in signers or (fleet.release,):
        md.sign(signer, append=True)
    return md


def raise_floor(fleet: Fleet, model: str, floor: int) -> Metadata[Targets]:
    md, content = repo.raise_floor(fleet.targets, model, floor, NOW + MONTH)
    fleet.artifacts[sha256(content)] = content
    return signed(fleet, md)


# ---------------------------------------------------------------- first targets


def test_initial_targets_accepted(fleet: Fleet) -> None:
    md = repo.verify_initial_targets(
        root=fleet.root, targets_bytes=repo.to_bytes(fleet.targets), now=NOW
    )
    assert md.signed.version == 1
    assert md.signed.targets == {}


def test_initial_targets_must_be_version_1_empty_and_signed(fleet: Fleet) -> None:
    def check(md: Metadata[Targets]) -> None:
        repo.verify_initial_targets(root=fleet.root, targets_bytes=repo.to_bytes(md), now=NOW)

    two = repo.initial_targets(NOW + MONTH)
    two.signed.version = 2
    with pytest.raises(InvalidInputError, match="version 1"):
        check(signed(fleet, two))
    full = repo.initial_targets(NOW + MONTH)
    full.signed.targets["floors/x.json"] = TargetFile.from_data("floors/x.json", b"{}")
    with pytest.raises(InvalidInputError, match="no targets"):
        check(signed(fleet, full))
    with pytest.raises(SignatureError):
        check(repo.initial_targets(NOW + MONTH))
    with pytest.raises(SignatureError):
        check(signed(fleet, repo.initial_targets(NOW + MONTH), fleet.root_signers[0]))
    with pytest.raises(PolicyError, match="expired"):
        check(signed(fleet, repo.initial_targets(NOW)))


# ---------------------------------------------------------------------- accepted


def test_push_accepted(fleet: Fleet) -> None:
    md = fleet.model_targets("detector", "1.0.0")
    change = push(fleet, md)
    assert change.version == 2
    assert change.metadata.signed == md.signed
    assert sorted(change.new_targets) == [MODEL, REFERENCE]
    assert change.floors == {}
    [release] = change.new_models
    assert release.path == MODEL
    assert release.sha256 == sha256(b"onnx detector 1.0.0")
    assert release.length == len(b"onnx detector 1.0.0")
    assert release.custom.release_counter == 1
    assert release.custom.reference.sha256 == sha256(b"npz detector 1.0.0")


def test_successive_pushes(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0")
    fleet.release_model("tracker", "0.1.0")
    change = fleet.release_model("detector", "1.1.0")
    assert change.version == 4
    assert [m.custom.release_counter for m in change.new_models] == [2]
    assert sorted(change.new_targets) == [
        "models/detector/1.1.0/model.onnx",
        "models/detector/1.1.0/reference.npz",
    ]
    assert len(fleet.targets.signed.targets) == 6


def test_two_versions_in_one_push(fleet: Fleet) -> None:
    first = fleet.model_targets("detector", "1.0.0", 1)
    fleet.targets = first  # the operator builds on its own unpublished metadata
    second = fleet.model_targets("detector", "1.1.0", 2)
    second.signed.version = 2
    fleet.targets = repo.verify_initial_targets(
        root=fleet.root,
        targets_bytes=repo.to_bytes(signed(fleet, repo.initial_targets(NOW + MONTH))),
        now=NOW,
    )
    change = push(fleet, signed(fleet, second))
    assert [m.custom.version for m in change.new_models] == ["1.0.0", "1.1.0"]


def test_same_artifact_under_two_models(fleet: Fleet) -> None:
    fleet.release_model("a", "1", content=b"same", reference=b"ref")
    change = fleet.release_model("b", "1", content=b"same", reference=b"ref")
    assert change.new_models[0].sha256 == sha256(b"same")


def test_extra_signatures_by_other_keys_do_not_hurt(fleet: Fleet) -> None:
    md = signed(fleet, fleet.model_targets(), fleet.release, CryptoSigner.generate_ed25519())
    push(fleet, md)


def test_release_threshold_2() -> None:
    fleet = Fleet.create()
    second = CryptoSigner.generate_ed25519()
    fleet.root.signed.add_key(second.public_key, "targets")
    fleet.root.signed.roles["targets"].threshold = 2
    md = fleet.model_targets()
    with pytest.raises(SignatureError, match=r"1 valid signature.*2 required"):
        push(fleet, md)
    push(fleet, signed(fleet, md, fleet.release, second))


# --------------------------------------------------------------------- signatures


def test_wrong_key_refused(fleet: Fleet) -> None:
    md = signed(fleet, fleet.model_targets(), fleet.root_signers[0])
    with pytest.raises(SignatureError, match="not authorised for targets"):
        push(fleet, md)


def test_online_key_cannot_sign_targets(fleet: Fleet) -> None:
    with pytest.raises(SignatureError):
        push(fleet, signed(fleet, fleet.model_targets(), fleet.snapshot))


def test_unknown_key_refused(fleet: Fleet) -> None:
    stranger = CryptoSigner.generate_ed25519()
    with pytest.raises(SignatureError) as info:
        push(fleet, signed(fleet, fleet.model_targets(), stranger))
    assert info.value.fields["unknown_keyids"] == [stranger.public_key.keyid]


def test_unsigned_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signatures.clear()
    with pytest.raises(SignatureError, match="0 valid"):
        push(fleet, md)


def test_tampered_after_signing_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    evil = fleet.upload(MODEL, b"evil model")
    md.signed.targets[MODEL].hashes = evil.hashes
    md.signed.targets[MODEL].length = evil.length
    with pytest.raises(SignatureError, match="do not verify"):
        push(fleet, md)


def test_signature_from_right_key_over_other_bytes_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    other = fleet.model_targets("detector", "9.9.9")
    md.signatures = dict(other.signatures)
    with pytest.raises(SignatureError):
        push(fleet, md)


# ------------------------------------------------------------------------ versions


def test_stale_version_refused(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0")
    stale = fleet.model_targets("detector", "1.1.0")
    stale.signed.version = fleet.targets.signed.version
    with pytest.raises(ConflictError, match=r"stale.*re-read") as info:
        push(fleet, signed(fleet, stale))
    assert info.value.fields["reason"] == "stale"
    assert info.value.fields["current_version"] == 2
    older = fleet.model_targets("detector", "1.1.0")
    older.signed.version = 1
    with pytest.raises(ConflictError, match="stale"):
        push(fleet, signed(fleet, older))


def test_replay_of_the_current_metadata_is_stale(fleet: Fleet) -> None:
    fleet.release_model()
    with pytest.raises(ConflictError, match="stale"):
        push(fleet, fleet.targets)


def test_skipped_version_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.version = 3
    with pytest.raises(InvalidInputError, match="skips versions"):
        push(fleet, signed(fleet, md))


def test_expired_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.expires = NOW - timedelta(minutes=1)
    with pytest.raises(PolicyError, match="expired"):
        push(fleet, signed(fleet, md))


def test_delegations_refused(fleet: Fleet) -> None:
    md = fleet.next_unchecked()
    md.signed.delegations = Delegations(
        keys={}, roles={"team": DelegatedRole("team", [], 1, True, paths=["models/*"])}
    )
    with pytest.raises(PolicyError, match="delegations"):
        push(fleet, signed(fleet, md))


# ---------------------------------------------------------------------- malformed


@pytest.mark.parametrize("data", [b"", b"not json", b"{}", b'{"signed": [], "signatures": []}'])
def test_malformed_refused(fleet: Fleet, data: bytes) -> None:
    with pytest.raises(InvalidInputError, match="malformed targets"):
        push(fleet, data)


def test_not_targets_refused(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match="expected targets metadata, got root"):
        push(fleet, fleet.root)


def test_oversized_refused(fleet: Fleet) -> None:
    with pytest.raises(PayloadTooLargeError):
        push(fleet, b" " * (repo.MAX_TARGETS_BYTES + 1))


def test_float_in_custom_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.targets[MODEL].unrecognized_fields["custom"]["reference"]["atol"] = 1e-4
    with pytest.raises(InvalidInputError, match="canonical JSON"):
        push(fleet, md)


# -------------------------------------------------------------- existing targets


def test_changed_digest_refused(fleet: Fleet) -> None:
    fleet.release_model()
    md = fleet.next_unchecked()
    evil = fleet.upload(MODEL, b"another model with the same version")
    md.signed.targets[MODEL].hashes = evil.hashes
    md.signed.targets[MODEL].length = evil.length
    with pytest.raises(ConflictError, match="another digest") as info:
        push(fleet, signed(fleet, md))
    assert info.value.fields["path"] == MODEL


def test_changed_custom_of_existing_version_refused(fleet: Fleet) -> None:
    fleet.release_model()
    md = fleet.next_unchecked()
    md.signed.targets[MODEL].unrecognized_fields["custom"]["release_counter"] = 7
    with pytest.raises(ConflictError, match="immutable"):
        push(fleet, signed(fleet, md))


def test_removed_target_refused(fleet: Fleet) -> None:
    fleet.release_model()
    md = fleet.next_unchecked()
    del md.signed.targets[MODEL]
    with pytest.raises(PolicyError, match="removed") as info:
        push(fleet, signed(fleet, md))
    assert info.value.fields["path"] == MODEL


def test_operator_helper_refuses_an_existing_version(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0")
    with pytest.raises(ConflictError):
        fleet.model_targets("detector", "1.0.0", counter=2, content=b"different")


# ----------------------------------------------------------------------- artifacts


def test_missing_artifact_refused(fleet: Fleet) -> None:
    md = fleet.model_targets(upload=False)
    with pytest.raises(InvalidInputError, match="no artifact with sha256") as info:
        push(fleet, md)
    assert info.value.fields["path"] in {MODEL, REFERENCE}


def test_missing_reference_artifact_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    del fleet.artifacts[sha256(b"npz detector 1.0.0")]
    with pytest.raises(InvalidInputError, match=f"{REFERENCE}: no artifact"):
        push(fleet, md)


def test_wrong_length_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    digest = sha256(b"onnx detector 1.0.0")
    fleet.artifacts[digest] = fleet.artifacts[digest] + b"!"
    with pytest.raises(ArtifactIntegrityError) as info:
        push(fleet, md)
    assert info.value.fields["stored_length"] == info.value.fields["length"] + 1


@pytest.mark.parametrize(
    "hashes",
    [
        {"sha512": "ab" * 64},
        {"sha256": "AB" * 32},
        {"sha256": "ab" * 32, "sha512": "ab" * 64},
    ],
)
def test_only_sha256_hashes(fleet: Fleet, hashes: dict[str, str]) -> None:
    md = fleet.next_unchecked()
    md.signed.targets["floors/x.json"] = TargetFile(2, hashes, "floors/x.json")
    with pytest.raises(InvalidInputError, match="sha256"):
        push(fleet, signed(fleet, md))


@pytest.mark.parametrize(
    "path",
    ["readme.txt", "models/detector/1.0.0/weights.bin", "models/../x/model.onnx", "floors/x"],
)
def test_unknown_path_layout_refused(fleet: Fleet, path: str) -> None:
    md = fleet.next_unchecked()
    md.signed.targets[path] = fleet.upload(path, b"data")
    with pytest.raises(InvalidInputError, match="is not one of"):
        push(fleet, signed(fleet, md))


# ------------------------------------------------------------------ custom fields


def test_model_without_custom_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    del md.signed.targets[MODEL].unrecognized_fields["custom"]
    with pytest.raises(InvalidInputError, match="no custom field"):
        push(fleet, signed(fleet, md))


def test_model_with_bad_custom_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.targets[MODEL].unrecognized_fields["custom"]["opset"] = {}
    with pytest.raises(InvalidInputError, match=r"custom.opset") as info:
        push(fleet, signed(fleet, md))
    assert info.value.fields["path"] == MODEL
    assert info.value.fields["field"] == "custom.opset"


def test_custom_naming_another_version_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    custom = md.signed.targets[MODEL].unrecognized_fields["custom"]
    custom["version"] = "2.0.0"
    custom["reference"]["path"] = "models/detector/2.0.0/reference.npz"
    with pytest.raises(InvalidInputError, match=r"custom names detector 2.0.0"):
        push(fleet, signed(fleet, md))


def test_unknown_custom_fields_are_kept_and_accepted(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.targets[MODEL].unrecognized_fields["custom"]["future"] = {"x": 1}
    change = push(fleet, signed(fleet, md))
    assert change.metadata.signed.targets[MODEL].custom["future"] == {"x": 1}


# ------------------------------------------------------------------- references


def test_missing_reference_target_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    del md.signed.targets[REFERENCE]
    with pytest.raises(InvalidInputError, match=f"reference target {REFERENCE} is not listed"):
        push(fleet, signed(fleet, md))


def test_reference_digest_mismatch_refused(fleet: Fleet) -> None:
    md = fleet.model_targets()
    md.signed.targets[REFERENCE] = fleet.upload(REFERENCE, b"another reference")
    with pytest.raises(InvalidInputError, match="does not match the listed"):
        push(fleet, signed(fleet, md))


def test_reference_without_model_refused(fleet: Fleet) -> None:
    md = fleet.next_unchecked()
    md.signed.targets[REFERENCE] = fleet.upload(REFERENCE, b"npz")
    with pytest.raises(InvalidInputError, match="without its model"):
        push(fleet, signed(fleet, md))


def test_operator_helper_checks_paths(fleet: Fleet) -> None:
    custom = model_custom("detector", "1.0.0", 1, b"ref")
    good_model = TargetFile.from_data(MODEL, b"m")
    good_ref = TargetFile.from_data(REFERENCE, b"ref")
    with pytest.raises(InvalidInputError, match="model file path"):
        repo.add_model_to_targets(
            fleet.targets,
            model_file=TargetFile.from_data("models/detector/2/model.onnx", b"m"),
            reference_file=good_ref,
            custom=custom,
            expires=NOW + MONTH,
        )
    with pytest.raises(InvalidInputError, match="reference file path"):
        repo.add_model_to_targets(
            fleet.targets,
            model_file=good_model,
            reference_file=TargetFile.from_data("models/detector/2/reference.npz", b"ref"),
            custom=custom,
            expires=NOW + MONTH,
        )
    with pytest.raises(InvalidInputError, match="does not match"):
        repo.add_model_to_targets(
            fleet.targets,
            model_file=good_model,
            reference_file=TargetFile.from_data(REFERENCE, b"other"),
            custom=custom,
            expires=NOW + MONTH,
        )


def test_operator_helper_validates_custom(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError, match=r"custom.opset"):
        fleet.model_targets(opset={})


def test_operator_helper_copies(fleet: Fleet) -> None:
    before = repo.to_bytes(fleet.targets)
    md = fleet.model_targets()
    assert repo.to_bytes(fleet.targets) == before
    assert md.signed.version == 2
    assert md.signed.expires == NOW + MONTH
    unsigned = repo.add_model_to_targets(
        md,
        model_file=TargetFile.from_data("models/detector/2/model.onnx", b"m"),
        reference_file=TargetFile.from_data("models/detector/2/reference.npz", b"r"),
        custom=model_custom("detector", "2", 2, b"r"),
        expires=NOW + YEAR,
    )
    assert unsigned.signatures == {}
    assert unsigned.signed.version == 3
    assert parse_model_custom(unsigned.signed.targets["models/detector/2/model.onnx"].custom)


# --------------------------------------------------------------- release counters


def test_counter_equal_refused(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 3)
    with pytest.raises(RollbackError, match="must be above 3"):
        push(fleet, signed(fleet, _unchecked_model(fleet, "1.1.0", 3)))


def test_counter_lower_refused(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 3)
    with pytest.raises(RollbackError, match="release counter 2 must be above 3"):
        push(fleet, signed(fleet, _unchecked_model(fleet, "0.9.0", 2)))


def test_operator_helper_refuses_a_low_counter(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 3)
    with pytest.raises(RollbackError):
        fleet.model_targets("detector", "1.1.0", 3)


def test_counters_are_per_model(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 5)
    change = fleet.release_model("tracker", "1.0.0", 1)
    assert change.new_models[0].custom.release_counter == 1


def test_duplicate_counter_in_one_push_refused(fleet: Fleet) -> None:
    md = _unchecked_model(fleet, "1.0.0", 1)
    fleet_copy = Fleet(**{**fleet.__dict__, "targets": md})
    both = _unchecked_model(fleet_copy, "1.1.0", 1)
    both.signed.version = 2
    with pytest.raises(RollbackError, match="share release counter 1"):
        push(fleet, signed(fleet, both))


def test_next_release_counter(fleet: Fleet) -> None:
    assert repo.next_release_counter(fleet.targets, "detector") == 1
    fleet.release_model("detector", "1.0.0", 4)
    assert repo.next_release_counter(fleet.targets, "detector") == 5
    assert repo.next_release_counter(fleet.targets, "tracker") == 1
    fleet.accept(raise_floor(fleet, "detector", 9))
    assert repo.next_release_counter(fleet.targets, "detector") == 9
    fleet.accept(raise_floor(fleet, "tracker", 3))
    assert repo.next_release_counter(fleet.targets, "tracker") == 3


def _unchecked_model(fleet: Fleet, version: str, counter: int) -> Metadata[Targets]:
    """A next targets with a model version added without the operator-side checks."""
    md = fleet.next_unchecked()
    ref = fleet.upload(f"models/detector/{version}/reference.npz", f"r{version}".encode())
    model = fleet.upload(f"models/detector/{version}/model.onnx", f"m{version}".encode())
    custom = model_custom("detector", version, counter, f"r{version}".encode())
    model.unrecognized_fields["custom"] = custom.to_dict()
    md.signed.targets[ref.path] = ref
    md.signed.targets[model.path] = model
    return md


# ------------------------------------------------------------------------- floors


def test_floor_raised(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 1)
    fleet.release_model("detector", "1.1.0", 2)
    change = fleet.accept(raise_floor(fleet, "detector", 2))
    assert change.floors == {"detector": 2}
    assert change.new_models == []
    assert list(change.new_targets) == ["floors/detector.json"]
    assert repo.current_floors(fleet.targets.signed) == {"detector": 2}
    change = fleet.accept(raise_floor(fleet, "detector", 5))
    assert change.floors == {"detector": 5}
    # Unrelated pushes do not report floors again.
    assert fleet.release_model("detector", "2.0.0").floors == {}


def test_floor_file_content_is_the_canonical_custom(fleet: Fleet) -> None:
    md, content = repo.raise_floor(fleet.targets, "detector", 4, NOW + MONTH)
    target = md.signed.targets[floor_target_path("detector")]
    assert json.loads(content) == {"edgefleet": 1, "kind": "floor", "model": "detector", "floor": 4}
    assert content == str(encode_canonical(target.custom)).encode()
    target.verify_length_and_hashes(content)


@pytest.mark.parametrize("lower", [1, 3])
def test_operator_helper_refuses_a_floor_that_does_not_rise(fleet: Fleet, lower: int) -> None:
    fleet.accept(raise_floor(fleet, "detector", 3))
    with pytest.raises(RollbackError, match="may only rise"):
        repo.raise_floor(fleet.targets, "detector", lower, NOW + MONTH)


def _floor_target(fleet: Fleet, model: str, floor: int) -> TargetFile:
    content = str(
        encode_canonical({"edgefleet": 1, "kind": "floor", "model": model, "floor": floor})
    ).encode()
    target = fleet.upload(f"floors/{model}.json", content)
    target.unrecognized_fields["custom"] = json.loads(content)
    return target


def test_floor_lowering_refused(fleet: Fleet) -> None:
    fleet.accept(raise_floor(fleet, "detector", 3))
    md = fleet.next_unchecked()
    md.signed.targets["floors/detector.json"] = _floor_target(fleet, "detector", 2)
    with pytest.raises(RollbackError, match="may only rise: it is 3, the push sets 2"):
        push(fleet, signed(fleet, md))


def test_same_floor_with_other_bytes_refused(fleet: Fleet) -> None:
    fleet.accept(raise_floor(fleet, "detector", 3))
    md = fleet.next_unchecked()
    target = _floor_target(fleet, "detector", 3)
    target.unrecognized_fields["custom"]["reason"] = "same floor, new bytes"
    md.signed.targets["floors/detector.json"] = target
    with pytest.raises(RollbackError, match="may only rise"):
        push(fleet, signed(fleet, md))


def test_unchanged_floor_is_no_change(fleet: Fleet) -> None:
    fleet.accept(raise_floor(fleet, "detector", 3))
    change = fleet.accept(signed(fleet, fleet.next_unchecked()))
    assert change.floors == {}
    assert change.new_targets == {}


def test_floor_removal_refused(fleet: Fleet) -> None:
    fleet.accept(raise_floor(fleet, "detector", 3))
    md = fleet.next_unchecked()
    del md.signed.targets["floors/detector.json"]
    with pytest.raises(PolicyError, match="removed"):
        push(fleet, signed(fleet, md))


def test_floor_for_another_model_refused(fleet: Fleet) -> None:
    md, content = repo.raise_floor(fleet.targets, "detector", 3, NOW + MONTH)
    fleet.artifacts[sha256(content)] = content
    md.signed.targets["floors/tracker.json"] = md.signed.targets.pop("floors/detector.json")
    md.signed.targets["floors/tracker.json"].path = "floors/tracker.json"
    with pytest.raises(InvalidInputError, match="custom names model 'detector'"):
        push(fleet, signed(fleet, md))


def test_floor_artifact_must_be_uploaded(fleet: Fleet) -> None:
    md, _ = repo.raise_floor(fleet.targets, "detector", 3, NOW + MONTH)
    with pytest.raises(InvalidInputError, match="no artifact with sha256"):
        push(fleet, signed(fleet, md))


def test_release_below_floor_refused(fleet: Fleet) -> None:
    fleet.accept(raise_floor(fleet, "detector", 5))
    with pytest.raises(RollbackError, match="below the floor 5"):
        push(fleet, signed(fleet, _unchecked_model(fleet, "1.0.0", 4)))
    fleet.accept(signed(fleet, _unchecked_model(fleet, "1.0.0", 5)))


def test_floor_raised_with_a_release_in_one_push(fleet: Fleet) -> None:
    fleet.release_model("detector", "1.0.0", 1)
    floored, content = repo.raise_floor(fleet.targets, "detector", 2, NOW + MONTH)
    fleet.artifacts[sha256(content)] = content
    fleet_view = Fleet(**{**fleet.__dict__, "targets": floored})
    both = fleet_view.model_targets("detector", "1.1.0", 2)
    both.signed.version = floored.signed.version
    change = push(fleet, signed(fleet, both))
    assert change.floors == {"detector": 2}
    assert [m.custom.version for m in change.new_models] == ["1.1.0"]
