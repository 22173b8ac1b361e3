"""sign_assignment checked against the node's verifier, and the director key file."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner

from control_plane.director import assignments
from control_plane.director.assignments import (
    DIRECTOR_KEY_FILE,
    load_or_create_director_key,
    sign_assignment,
)
from control_plane.errors import InvalidInputError, PolicyError
from control_plane.trust.keys import generate_signer
from control_plane.trust.repository import canonical_keyid
from edge_node.updater.director import (
    AssignmentSignatureError,
    TargetInfo,
    verify_assignment,
)
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
PATH = "models/det/1.0.0/model.onnx"
SHA = hashlib.sha256(b"det").hexdigest()


def values(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "fleet": "gates",
        "node_id": "n-0123456789ab",
        "sequence": 7,
        "target_path": PATH,
        "sha256": SHA,
        "length": 3,
        "issued_at": NOW,
        "expires_at": NOW + timedelta(days=1),
    }
    return base | overrides


def test_a_signed_assignment_passes_the_nodes_checks() -> None:
    signer = generate_signer()
    signed = sign_assignment(signer, **values())

    assert signed.keyid == canonical_keyid(signer.public_key) == signer.public_key.keyid
    parsed = DirectorAssignment.FromString(signed.assignment)
    assert parsed.format_version == 1
    assert parsed.issued_at.ToDatetime(tzinfo=UTC) == NOW

    verified = verify_assignment(
        signed,
        director_key=signer.public_key,
        node_id="n-0123456789ab",
        fleet="gates",
        last_sequence=6,
        now=NOW + timedelta(hours=1),
        target_lookup={PATH: TargetInfo(PATH, SHA, 3, {"release_counter": 1})}.get,
        floor_lookup=lambda model: 1,
    )
    assert (verified.sequence, verified.sha256, verified.model) == (7, SHA, "det")


def test_another_director_key_does_not_verify() -> None:
    signed = sign_assignment(generate_signer(), **values())
    with pytest.raises(AssignmentSignatureError):
        verify_assignment(
            signed,
            director_key=generate_signer().public_key,
            node_id="n-0123456789ab",
            fleet="gates",
            last_sequence=0,
            now=NOW,
            target_lookup=lambda path: None,
            floor_lookup=lambda model: 0,
        )


def test_signing_is_deterministic() -> None:
    signer = generate_signer()
    assert sign_assignment(signer, **values()) == sign_assignment(signer, **values())


@pytest.mark.parametrize(
    "overrides",
    [
        {"fleet": ""},
        {"node_id": "a/b"},
        {"sequence": 0},
        {"sequence": 2**64},
        {"target_path": "floors/det.json"},
        {"target_path": "models/det/1.0.0/reference.npz"},
        {"sha256": SHA.upper()},
        {"length": -1},
        {"issued_at": NOW.replace(tzinfo=None)},
        {"expires_at": NOW},
    ],
    ids=lambda o: next(iter(o)),
)
def test_nothing_a_node_would_refuse_for_its_shape_is_signed(overrides: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        sign_assignment(generate_signer(), **values(**overrides))


def test_only_ed25519_keys_sign() -> None:
    with pytest.raises(InvalidInputError, match="Ed25519"):
        sign_assignment(CryptoSigner.generate_ecdsa(), **values())


# ------------------------------------------------------------------- key file


def test_the_director_key_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    first = load_or_create_director_key(tmp_path / "director")
    path = tmp_path / "director" / DIRECTOR_KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "director").stat().st_mode & 0o777 == 0o700
    again = load_or_create_director_key(tmp_path / "director")
    assert again.public_key == first.public_key


def test_a_replica_that_loses_the_creation_race_uses_the_winners_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = generate_signer()
    real_save = assignments.save_private_key

    def save_after_the_other_replica(path: Path, signer: CryptoSigner, *a: Any, **k: Any) -> None:
        real_save(path, winner, None, exclusive=True)  # the other replica got there first
        real_save(path, signer, *a, **k)

    monkeypatch.setattr(assignments, "save_private_key", save_after_the_other_replica)
    loaded = load_or_create_director_key(tmp_path)
    assert loaded.public_key == winner.public_key


def test_a_key_others_can_read_is_refused(tmp_path: Path) -> None:
    load_or_create_director_key(tmp_path)
    (tmp_path / DIRECTOR_KEY_FILE).chmod(0o644)
    with pytest.raises(PolicyError, match="chmod 600"):
        load_or_create_director_key(tmp_path)


def test_a_shadow_candidate_is_signed_as_the_node_checks_it() -> None:
    from control_plane.director.assignments import ShadowSpec, shadow_of
    from edge_node.updater.director import ShadowRequest, verify_shadow

    signer = generate_signer()
    path, sha = "models/det/1.1.0/model.onnx", hashlib.sha256(b"det 1.1").hexdigest()
    spec = ShadowSpec(path, sha, 7, 25, 10)
    signed = sign_assignment(signer, **values(renewal=True, shadow=spec))
    body = DirectorAssignment.FromString(signed.assignment)
    assert body.renewal and shadow_of(body) == spec
    assert (
        shadow_of(DirectorAssignment.FromString(sign_assignment(signer, **values()).assignment))
        is None
    )
    request = ShadowRequest(path, sha, 7, 25, 10)
    target = TargetInfo(path, sha, 7, {"release_counter": 2})
    checked = verify_shadow(
        request, model="det", target_lookup={path: target}.get, floor_lookup=lambda m: 0
    )
    assert checked.release_counter == 2
    for bad, field in (
        (ShadowSpec("models/cls/1.0.0/model.onnx", sha, 7, 25, 10), "shadow.target_path"),
        (ShadowSpec(path, "ab", 7, 25, 10), "shadow.sha256"),
        (ShadowSpec(path, sha, 7, 0, 10), "shadow.sample_per_mille"),
        (ShadowSpec(path, sha, 7, 25, 101), "shadow.max_cpu_percent"),
    ):
        with pytest.raises(InvalidInputError) as refused:
            sign_assignment(signer, **values(shadow=bad))
        assert refused.value.fields["field"] == field
