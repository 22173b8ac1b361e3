"""Fuzzing the node's reading of a signed director assignment (hypothesis, bounded).

What arrives is bytes: a `SignedDirectorAssignment` (protobuf's `DecodeError`), then
`verify_assignment`, which accepts or raises one `AssignmentRejectedError` subclass with
a reason. Two attackers: one without the director key (any bytes, mutated envelopes),
and one holding it (a stolen key signs whatever payload it likes: the parser behind the
signature must still refuse cleanly).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from securesystemslib.signer import CryptoSigner

from edge_node.updater.director import (
    AssignmentRejectedError,
    AssignmentSignatureError,
    VerifiedAssignment,
    verify_assignment,
)
from protos.edgefleet.fleet.v1.director_pb2 import DirectorAssignment, SignedDirectorAssignment
from tests.edge_node.updater.test_director import FLEET, NODE, NOW, PATH, TARGET, build, sign
from tests.fuzz_support import FUZZ, mutated, wire_bytes

# Made once (hypothesis would call a function-scoped fixture's value stale).
DIRECTOR = CryptoSigner.generate_ed25519()
VALID_PAYLOAD = build().SerializeToString()
VALID = sign(DIRECTOR, VALID_PAYLOAD).SerializeToString()


def decide(wire: bytes) -> VerifiedAssignment | AssignmentRejectedError | DecodeError:
    """The node's answer to `wire`: accepted, or the refusal it raised."""
    try:
        signed = SignedDirectorAssignment.FromString(wire)
        return verify_assignment(
            signed,
            director_key=DIRECTOR.public_key,
            node_id=NODE,
            fleet=FLEET,
            last_sequence=4,
            now=NOW,
            target_lookup={PATH: TARGET}.get,
            floor_lookup=lambda model: 0,
        )
    except (DecodeError, AssignmentRejectedError) as refusal:
        return refusal


def test_the_valid_assignment_is_accepted() -> None:
    accepted = decide(VALID)
    assert isinstance(accepted, VerifiedAssignment)
    assert accepted.sequence == 5


@FUZZ
@given(wire=wire_bytes(VALID))
def test_without_the_key_any_bytes_are_refused_unless_they_are_the_signed_ones(
    wire: bytes,
) -> None:
    answer = decide(wire)
    if isinstance(answer, VerifiedAssignment):
        # Only the exact signed payload verifies (fields after it may be anything).
        assert SignedDirectorAssignment.FromString(wire).assignment == VALID_PAYLOAD
    else:
        assert isinstance(answer, DecodeError | AssignmentRejectedError)
        if isinstance(answer, AssignmentRejectedError):
            assert answer.reason


@FUZZ
@given(payload=st.one_of(st.binary(max_size=512), mutated(VALID_PAYLOAD)))
def test_with_the_key_any_signed_payload_is_read_or_refused_with_a_reason(
    payload: bytes,
) -> None:
    answer = decide(sign(DIRECTOR, payload).SerializeToString())
    assert not isinstance(answer, DecodeError | AssignmentSignatureError)
    if isinstance(answer, VerifiedAssignment):
        assert DirectorAssignment.FromString(payload).target_path == PATH == answer.target_path
    else:
        assert answer.reason and answer.fields["reason"] == answer.reason


# Near now (so the later checks run too), or anywhere a Timestamp's int64 reaches.
_NOW_S = int(NOW.timestamp())
_SECONDS = st.one_of(st.integers(_NOW_S - 10**6, _NOW_S + 10**6), st.integers(-(2**63), 2**63 - 1))


@FUZZ
@given(
    sequence=st.one_of(st.integers(0, 12), st.integers(0, 2**64 - 1)),
    seconds=st.tuples(_SECONDS, _SECONDS),
    nanos=st.one_of(st.just(0), st.integers(-(2**31), 2**31 - 1)),
    text=st.text(max_size=200),
    length=st.sampled_from((11, 11, 11, 0, 12, 2**64 - 1)),
    format_version=st.sampled_from((1, 1, 1, 1, 0, 2, 2**32 - 1)),
)
def test_with_the_key_hostile_field_values_are_refused_with_a_reason(
    sequence: int,
    seconds: tuple[int, int],
    nanos: int,
    text: str,
    length: int,
    format_version: int,
) -> None:
    assignment = build(sequence=sequence, length=length, format_version=format_version)
    assignment.issued_at.seconds, assignment.expires_at.seconds = seconds
    assignment.expires_at.nanos = nanos
    assignment.target_path = text if sequence % 2 else assignment.target_path
    answer = decide(sign(DIRECTOR, assignment).SerializeToString())
    if not isinstance(answer, VerifiedAssignment):
        assert isinstance(answer, AssignmentRejectedError)
        assert answer.reason
