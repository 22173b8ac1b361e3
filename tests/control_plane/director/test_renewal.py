"""`DirectorService.renew_expiring` on both databases: a node's newest assignment is
re-signed (same target, next sequence) before it expires; fresh, superseded, revoked and
no-longer-runnable ones are left alone; every chunk is audited and delivered."""

from __future__ import annotations

from datetime import timedelta

from securesystemslib.signer import CryptoSigner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.director.delivery import FanOutDelivery
from control_plane.director.service import DirectorService, SkippedNode
from control_plane.nodes.service import NodeService
from control_plane.storage.models import AuditRow
from edge_node.updater.director import TargetInfo, verify_assignment
from tests.control_plane.director.conftest import TTL, Version, enroll, set_floor
from tests.control_plane.director.test_pin_many import Recorder, stored
from tests.control_plane.nodes.conftest import OPERATOR


def renewal_audit(sessions: sessionmaker[Session]) -> list[AuditRow]:
    with sessions() as session:
        return list(
            session.scalars(
                select(AuditRow)
                .where(AuditRow.action == "node.renew_assignments")
                .order_by(AuditRow.id)
            )
        )


def test_an_assignment_is_renewed_at_half_its_lifetime_and_the_node_accepts_it(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeService,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    director, fan_out = with_delivery
    node = enroll(nodes)
    first = director.pin(OPERATOR, node, "det", "1.1.0")
    recorder = Recorder()  # takes bulk deliveries only
    fan_out.attach(recorder)

    clock.advance(TTL / 2 - timedelta(minutes=1))
    assert director.renew_expiring().renewed == 0  # more than half its lifetime left
    assert stored(sessions) == {node: [1]}

    clock.advance(timedelta(minutes=2))
    result = director.renew_expiring()
    assert (result.renewed, result.skipped) == (1, ())
    renewed = director.latest(node)
    assert renewed is not None
    assert (renewed.sequence, renewed.target_path, renewed.sha256) == (
        2,
        first.target_path,
        first.sha256,
    )
    assert renewed.expires_at == renewed.issued_at + TTL > first.expires_at
    assert renewed.created_by == "system"
    # Delivered after its commit, and what the node verifies as the next sequence.
    assert [[n for n, _ in call] for _, call in recorder.calls] == [[node]]
    v = versions["1.1.0"]
    verified = verify_assignment(
        renewed.signed_message(),
        director_key=director_signer.public_key,
        node_id=node,
        fleet="gates",
        last_sequence=1,
        now=clock.now(),
        target_lookup={
            v.target_path: TargetInfo(v.target_path, v.sha256, v.length, {"release_counter": 2})
        }.get,
        floor_lookup=lambda model: 0,
    )
    assert verified.sequence == 2
    (entry,) = renewal_audit(sessions)
    assert (entry.actor, entry.outcome, entry.target) == ("system", "ok", "fleet:gates")
    assert entry.details["node_ids"] == [node]

    # Renewed once: a second look (another replica) finds nothing due.
    assert director.renew_expiring().renewed == 0
    assert stored(sessions) == {node: [1, 2]}


def test_an_expired_assignment_is_renewed_too(
    director: DirectorService,
    nodes: NodeService,
    versions: dict[str, Version],
    clock: ManualClock,
) -> None:
    # The control plane was down past the expiry: the operator's pin still stands.
    node = enroll(nodes)
    director.pin(OPERATOR, node, "det", "1.0.0")
    clock.advance(TTL * 3)
    assert director.current(node) is None  # expired: a Hello would get nothing
    assert director.renew_expiring().renewed == 1
    current = director.current(node)
    assert current is not None
    latest = director.latest(node)
    assert latest is not None and latest.version == "1.0.0"


def test_only_the_newest_assignment_of_each_node_is_renewed(
    director: DirectorService,
    nodes: NodeService,
    versions: dict[str, Version],
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    repinned, steady = enroll(nodes), enroll(nodes)
    director.pin(OPERATOR, repinned, "det", "1.0.0")
    director.pin(OPERATOR, steady, "det", "1.0.0")
    clock.advance(TTL * 3 / 4)
    director.pin(OPERATOR, repinned, "det", "1.1.0")  # fresh: its old one is history
    assert director.renew_expiring().renewed == 1
    assert stored(sessions) == {repinned: [1, 2], steady: [1, 2]}
    latest = director.latest(repinned)
    assert latest is not None and latest.version == "1.1.0"


def test_a_pin_between_selection_and_renewal_wins(
    director: DirectorService,
    nodes: NodeService,
    versions: dict[str, Version],
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    node = enroll(nodes)
    director.pin(OPERATOR, node, "det", "1.0.0")
    clock.advance(TTL)
    due = director._expiring(clock.now() + TTL)
    assert list(due.values()) == [{node: 1}]
    director.pin(OPERATOR, node, "det", "1.1.0")  # lands after the selection
    # The renewal of what was selected finds a newer assignment under the row lock.
    original = director._expiring
    director._expiring = lambda cutoff: due  # type: ignore[method-assign]
    try:
        result = director.renew_expiring()
    finally:
        director._expiring = original  # type: ignore[method-assign]
    assert (result.renewed, result.skipped) == (0, (SkippedNode(node, "superseded"),))
    latest = director.latest(node)
    assert latest is not None and (latest.sequence, latest.version) == (2, "1.1.0")


def test_revoked_nodes_and_targets_below_the_floor_are_not_renewed(
    director: DirectorService,
    nodes: NodeService,
    versions: dict[str, Version],
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    revoked, old, current = enroll(nodes), enroll(nodes), enroll(nodes)
    for node, version in ((revoked, "1.1.0"), (old, "1.0.0"), (current, "1.1.0")):
        director.pin(OPERATOR, node, "det", version)
    nodes.revoke(OPERATOR, revoked)
    set_floor(sessions, "gates", "det", 2)  # 1.0.0 may no longer run
    clock.advance(TTL)
    result = director.renew_expiring()
    assert result.renewed == 1
    assert result.skipped == (SkippedNode(old, "not-runnable"),)
    assert stored(sessions) == {revoked: [1], old: [1], current: [1, 2]}
