"""A stolen director key, on the node: a forged sequence 2^64-1 cannot pin the floor,
and a director key listed in (and rotated by) the fleet's root resets it (ADR 0045)."""

from __future__ import annotations

from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from edge_node.errors import InvalidInputError
from edge_node.updater.director import (
    DEFAULT_MAX_SEQUENCE_JUMP,
    ROOT_DIRECTOR_KEYS_FIELD,
    director_keys_of_root,
    sequence_floor,
)
from edge_node.updater.reconciler import OutcomeKind
from tests.edge_node.updater._world import install_first, make_world

pytestmark = pytest.mark.anyio

FORGED = 2**64 - 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_forged_huge_sequence_is_refused_and_the_director_still_reaches_the_node(
    tmp_path: Path,
) -> None:
    w = make_world(tmp_path)
    await install_first(w)
    rec = w.reconciler()
    # Signed with the real director key (stolen): refused, the floor does not move.
    forged = await rec.apply(w.assign(w.releases["1.1.0"], sequence=FORGED))
    assert (forged.kind, forged.reason) == (OutcomeKind.REJECTED, "sequence-jump")
    assert w.reports[-1].reason == "sequence-jump"
    assert w.journal.load().director_sequence == 1
    # The honest director's next decision is accepted.
    honest = await rec.apply(w.assign(w.releases["1.1.0"]))
    assert honest.kind is OutcomeKind.APPLIED, honest
    # Within the bound, a jump is fine (a director that skipped sequences).
    jump = w.assign(w.releases["1.0.0"], sequence=2 + DEFAULT_MAX_SEQUENCE_JUMP)
    assert (await rec.apply(jump)).kind is OutcomeKind.APPLIED


async def test_a_root_rotated_director_key_resets_the_floor_a_stolen_key_pinned(
    tmp_path: Path,
) -> None:
    w = make_world(tmp_path)
    await install_first(w)
    rec = w.reconciler()
    stolen = w.director
    # The attacker walks the floor up within the bound (as far as they like, in steps).
    high = 1 + DEFAULT_MAX_SEQUENCE_JUMP
    assert (await rec.apply(w.assign(w.releases["1.1.0"], sequence=high))).kind is (
        OutcomeKind.APPLIED
    )
    # The honest director (sequence 3) is now refused as stale: locked out.
    w.sequence = 2
    stale = await rec.apply(w.assign(w.releases["1.0.0"]))
    assert (stale.kind, stale.reason) == (OutcomeKind.REJECTED, "stale")

    # A new key that the root does NOT list is refused: only root can rotate the key.
    new = CryptoSigner.generate_ed25519()
    unlisted = await rec.apply(w.assign(w.releases["1.0.0"], signer=new))
    assert (unlisted.kind, unlisted.reason) == (OutcomeKind.REJECTED, "unknown-key")

    # Root N+1 lists the new key: its assignments are accepted from sequence 1 up again...
    w.list_director_keys([new.public_key])
    w.sequence = 4
    back = await rec.apply(w.assign(w.releases["1.0.0"], signer=new))
    assert back.kind is OutcomeKind.APPLIED, back
    state = w.journal.load()
    assert (state.director_sequence, state.director_keyid) == (5, new.public_key.keyid)
    # ...and the stolen key, no longer listed, is refused whatever its sequence.
    refused = await rec.apply(w.assign(w.releases["1.1.0"], signer=stolen, sequence=high + 1))
    assert (refused.kind, refused.reason) == (OutcomeKind.REJECTED, "unknown-key")
    # The reset happens once: the new key's own sequences are monotonic from here.
    replay = await rec.apply(w.assign(w.releases["1.1.0"], signer=new, sequence=4))
    assert (replay.kind, replay.reason) == (OutcomeKind.REJECTED, "stale")


async def test_a_node_keeps_its_enrollment_key_until_the_root_lists_one(tmp_path: Path) -> None:
    w = make_world(tmp_path)
    await install_first(w)
    rec = w.reconciler()
    # The root lists the enrollment key itself (a fleet adopting root-listed keys): the
    # floor does not reset, so an old assignment stays a replay.
    w.list_director_keys([w.director.public_key])
    assert (await rec.apply(w.assign(w.releases["1.1.0"]))).kind is OutcomeKind.APPLIED
    old = await rec.apply(w.assign(w.releases["1.0.0"], sequence=1))
    assert (old.kind, old.reason) == (OutcomeKind.REJECTED, "stale")


def test_sequence_floor_resets_only_for_a_listed_key_replacing_an_unlisted_one() -> None:
    def floor(last_keyid: str, listed: set[str], keyid: str) -> int:
        return sequence_floor(
            last_sequence=FORGED,
            last_keyid=last_keyid,
            enrollment_keyid="enrolled",
            listed_keyids=listed,
            keyid=keyid,
        )

    assert floor("", set(), "enrolled") == FORGED  # nothing listed: the old rules
    assert floor("", {"new"}, "new") == 0  # old journal, enrollment key replaced
    assert floor("old", {"new"}, "new") == 0
    assert floor("old", {"old", "new"}, "new") == FORGED  # both listed: no reset
    assert floor("new", {"new"}, "new") == FORGED  # already on the new key
    assert floor("old", {"new"}, "other") == FORGED  # an unlisted key resets nothing


def test_director_keys_of_root_reads_only_well_formed_ed25519_keys() -> None:
    key = CryptoSigner.generate_ed25519().public_key
    assert director_keys_of_root({}) == []
    signed = {ROOT_DIRECTOR_KEYS_FIELD: {key.keyid: key.to_dict()}}
    assert director_keys_of_root(signed) == [key]
    with pytest.raises(InvalidInputError, match="canonical keyid"):
        director_keys_of_root({ROOT_DIRECTOR_KEYS_FIELD: {"0" * 64: key.to_dict()}})
    with pytest.raises(InvalidInputError):
        director_keys_of_root({ROOT_DIRECTOR_KEYS_FIELD: []})
