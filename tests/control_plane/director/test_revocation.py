"""Revocation as a rollout (ADR 0035) on both databases: after a floor rises, the nodes
assigned a version below it move to the newest version at or above it, and only they; with
none allowed they are left and named until a good version is pushed; a retry, a second
replica or the periodic pass never pins a node twice."""

from __future__ import annotations

from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.director.revocation import Release, plan_revocation, replacement
from control_plane.director.service import DirectorService
from control_plane.errors import InvalidInputError
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import PushResult, RegistryService
from control_plane.storage.models import AuditRow
from tests.control_plane.director.conftest import TTL, add_version, enroll, set_floor
from tests.control_plane.director.test_pin_many import stored
from tests.control_plane.nodes.conftest import OPERATOR


def current_versions(director: DirectorService, node_ids: list[str]) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    for node_id in node_ids:
        latest = director.latest(node_id)
        result[node_id] = None if latest is None else latest.version
    return result


def revoked_pins(sessions: sessionmaker[Session]) -> list[dict[str, Any]]:
    with sessions() as session:
        rows = session.scalars(
            select(AuditRow).where(AuditRow.action == "node.pin").order_by(AuditRow.id)
        )
        return [
            dict(r.details or {}) | {"actor": r.actor} for r in rows if r.target == "fleet:gates"
        ]


def push(
    fleet: str, *, added: list[str] | None = None, floors: dict[str, int] | None = None
) -> PushResult:
    return PushResult(fleet, 9, 9, 9, added or [], floors or {})


# ---------------------------------------------------------------- the pure plan


def test_the_plan_moves_nodes_below_the_floor_to_the_newest_release_at_or_above_it() -> None:
    releases = [Release("1.0", 1), Release("1.1", 2), Release("1.3", 4), Release("1.2", 3)]
    plan = plan_revocation("det", 2, releases, {"b": 1, "a": 1, "c": 2, "d": 4})
    assert plan.affected == ("a", "b")
    assert plan.to == Release("1.3", 4)
    assert plan.left == ()
    stranded = plan_revocation("det", 5, releases, {"a": 1, "d": 4})
    assert (stranded.to, stranded.left) == (None, ("a", "d"))
    assert replacement([], 0) is None
    with pytest.raises(InvalidInputError, match="floor"):
        plan_revocation("det", -1, releases, {})


# ------------------------------------------------------------------- the service


@pytest.fixture
def det(sessions: sessionmaker[Session], fleets: list[str]) -> dict[str, Any]:
    return {
        "1.0.0": add_version(sessions, "gates", "det", "1.0.0", 1),
        "1.1.0": add_version(sessions, "gates", "det", "1.1.0", 2),
        "1.2.0": add_version(sessions, "gates", "det", "1.2.0", 3),
        "cls": add_version(sessions, "gates", "cls", "2.0.0", 1),
    }


def test_revoke_moves_every_node_on_a_revoked_version_and_only_those(
    director: DirectorService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    det: dict[str, Any],
) -> None:
    on_old = [enroll(nodes) for _ in range(3)]
    on_mid, on_new, other_model, unassigned = (enroll(nodes) for _ in range(4))
    for node_id in on_old:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    director.pin(OPERATOR, on_mid, "det", "1.1.0")
    director.pin(OPERATOR, on_new, "det", "1.2.0")
    director.pin(OPERATOR, other_model, "cls", "2.0.0")
    revoked_node = enroll(nodes)
    director.pin(OPERATOR, revoked_node, "det", "1.0.0")
    nodes.inventory.revoke(OPERATOR, revoked_node)
    before = stored(sessions)

    set_floor(sessions, "gates", "det", 2)  # `model revoke det 1.0.0`
    moves = director.after_push(push("gates", floors={"det": 2}))

    assert len(moves) == 1
    move = moves[0]
    assert (move.model, move.floor, move.to_version, move.left) == ("det", 2, "1.2.0", ())
    assert sorted(a.node_id for a in move.moved) == sorted(on_old)
    everyone = [*on_old, on_mid, on_new, other_model, unassigned]
    assert current_versions(director, everyone) == {
        **dict.fromkeys(on_old, "1.2.0"),
        on_mid: "1.1.0",  # allowed: not moved
        on_new: "1.2.0",
        other_model: "2.0.0",
        unassigned: None,
    }
    after = stored(sessions)
    assert {n for n in after if after[n] != before.get(n)} == set(on_old)
    assert all(after[n] == [*before[n], before[n][-1] + 1] for n in on_old)
    assert after[revoked_node] == before[revoked_node]  # a revoked node gets nothing
    audit = revoked_pins(sessions)
    assert len(audit) == 1
    assert audit[0]["reason"] == "revoked"
    assert audit[0]["actor"] == "system"
    assert audit[0]["version"] == "1.2.0"
    assert audit[0]["nodes"] == 3
    assert director.left_on_revoked("gates", "det") == {}


def test_moves_go_in_chunks_with_one_audit_entry_each(
    director: DirectorService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    det: dict[str, Any],
) -> None:
    on_old = [enroll(nodes) for _ in range(5)]
    for node_id in on_old:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    set_floor(sessions, "gates", "det", 3)
    move = director.move_off_revoked("gates", "det", chunk_size=2)
    assert len(move.moved) == 5
    assert move.to_version == "1.2.0"
    assert [(e["chunk"], e["chunks"], e["nodes"]) for e in revoked_pins(sessions)] == [
        (1, 3, 2),
        (2, 3, 2),
        (3, 3, 1),
    ]


def test_with_no_version_left_the_nodes_stay_named_until_a_good_version_is_pushed(
    director: DirectorService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    det: dict[str, Any],
) -> None:
    on_old, on_new = enroll(nodes), enroll(nodes)
    director.pin(OPERATOR, on_old, "det", "1.0.0")
    director.pin(OPERATOR, on_new, "det", "1.2.0")
    before = stored(sessions)

    set_floor(sessions, "gates", "det", 4)  # `model revoke det 1.2.0`: nothing allowed
    [move] = director.after_push(push("gates", floors={"det": 4}))

    assert (move.to_version, move.moved) == (None, ())
    assert move.left == tuple(sorted([on_old, on_new]))
    assert stored(sessions) == before  # nothing signed
    assert director.left_on_revoked("gates", "det") == {"1.0.0": [on_old], "1.2.0": [on_new]}
    assert director.move_all_off_revoked() == 0  # the periodic pass has nowhere to go either

    good = add_version(sessions, "gates", "det", "1.3.0", 4)
    [moved] = director.after_push(push("gates", added=[good.target_path]))
    assert moved.to_version == "1.3.0"
    assert sorted(a.node_id for a in moved.moved) == sorted([on_old, on_new])
    assert current_versions(director, [on_old, on_new]) == dict.fromkeys([on_old, on_new], "1.3.0")
    assert director.left_on_revoked("gates", "det") == {}


def test_a_retry_or_a_second_replica_does_not_pin_twice(
    director: DirectorService,
    registry: RegistryService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    director_signer: CryptoSigner,
    clock: ManualClock,
    det: dict[str, Any],
) -> None:
    on_old = [enroll(nodes) for _ in range(3)]
    for node_id in on_old:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    set_floor(sessions, "gates", "det", 2)
    replica = DirectorService(sessions, registry, nodes.inventory, director_signer, clock, TTL)

    assert len(director.move_off_revoked("gates", "det").moved) == 3
    once = stored(sessions)
    assert director.move_off_revoked("gates", "det").moved == ()  # a retry
    assert replica.move_off_revoked("gates", "det").moved == ()  # another replica
    assert replica.move_all_off_revoked() == 0
    assert stored(sessions) == once
    assert len(revoked_pins(sessions)) == 1


def test_a_node_moved_meanwhile_is_seen_under_the_lock_and_not_pinned_again(
    director: DirectorService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    det: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica that read the nodes before another moved them (or an operator pinned
    one) re-reads each node's assignment with its row locked, and pins only the rest."""
    moved_by_other, still_old = enroll(nodes), enroll(nodes)
    for node_id in (moved_by_other, still_old):
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    set_floor(sessions, "gates", "det", 2)
    with sessions() as session:
        stale = director._on_revoked(session, "gates", "det")  # read before the other move
    director.pin(OPERATOR, moved_by_other, "det", "1.1.0")
    before = stored(sessions)
    monkeypatch.setattr(director, "_on_revoked", lambda *_: stale)

    move = director.move_off_revoked("gates", "det")

    assert [a.node_id for a in move.moved] == [still_old]
    assert stored(sessions)[moved_by_other] == before[moved_by_other]
    assert current_versions(director, [moved_by_other, still_old]) == {
        moved_by_other: "1.1.0",
        still_old: "1.2.0",
    }


def test_the_periodic_pass_moves_nodes_a_push_did_not(
    director: DirectorService,
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    det: dict[str, Any],
) -> None:
    """A replica that crashed between storing the push and moving the nodes: the pass in
    the renewal loop finds them (the push itself never failed for it)."""
    on_old, on_cls = enroll(nodes), enroll(nodes)
    director.pin(OPERATOR, on_old, "det", "1.1.0")
    director.pin(OPERATOR, on_cls, "cls", "2.0.0")
    set_floor(sessions, "gates", "det", 3)
    set_floor(sessions, "gates", "cls", 1)  # a floor that forbids nothing assigned
    assert director.move_all_off_revoked() == 1
    assert current_versions(director, [on_old, on_cls]) == {on_old: "1.2.0", on_cls: "2.0.0"}
    assert director.move_all_off_revoked() == 0
