"""DirectorService on both databases: pin, sequences, refusals, audit, and the node's view."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from securesystemslib.signer import CryptoSigner, SSlibKey
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.clock import ManualClock
from control_plane.director.service import DirectorService
from control_plane.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
)
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import RegistryService
from control_plane.storage.models import AuditRow, DirectorAssignmentRow
from edge_node.updater.director import (
    AssignmentExpiredError,
    AssignmentReplayError,
    TargetInfo,
    VerifiedAssignment,
    verify_assignment,
)
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.director.conftest import TTL, Version, enroll, set_floor
from tests.control_plane.nodes.conftest import OPERATOR, START, VIEWER


def node_verifies(
    signed: SignedDirectorAssignment,
    key: CryptoSigner,
    versions: dict[str, Version],
    *,
    node_id: str,
    last_sequence: int = 0,
    clock: ManualClock,
) -> VerifiedAssignment:
    """The node's side, with a TUF view built from the same versions."""
    targets = {
        v.target_path: TargetInfo(
            v.target_path, v.sha256, v.length, {"release_counter": v.release_counter}
        )
        for v in versions.values()
    }
    return verify_assignment(
        signed,
        director_key=key.public_key,
        node_id=node_id,
        fleet="gates",
        last_sequence=last_sequence,
        now=clock.now(),
        target_lookup=targets.get,
        floor_lookup=lambda model: 0,
    )


def audit(sessions: sessionmaker[Session]) -> list[tuple[str, str, str, str]]:
    with sessions() as session:
        rows = session.scalars(
            select(AuditRow).where(AuditRow.action == "node.pin").order_by(AuditRow.id)
        )
        return [(r.actor, r.target, r.outcome, r.details.get("error", "")) for r in rows]


def test_pin_signs_an_assignment_the_node_accepts(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    assert director.latest(node_id) is None
    assert director.current(node_id) is None

    pinned = director.pin(OPERATOR, node_id, "det", "1.0.0")

    v = versions["1.0.0"]
    assert (pinned.node_id, pinned.fleet, pinned.sequence) == (node_id, "gates", 1)
    assert (pinned.model, pinned.version) == ("det", "1.0.0")
    assert (pinned.target_path, pinned.sha256, pinned.length) == (v.target_path, v.sha256, v.length)
    assert (pinned.issued_at, pinned.expires_at) == (START, START + TTL)
    assert pinned.created_by == "alice"
    assert pinned.keyid == director_signer.public_key.keyid
    assert director.latest(node_id) == pinned

    current = director.current(node_id)
    assert current is not None
    verified = node_verifies(current, director_signer, versions, node_id=node_id, clock=clock)
    assert (verified.sequence, verified.target_path) == (1, v.target_path)
    assert audit(sessions) == [("alice", f"node:{node_id}", "ok", "")]


def test_every_pin_takes_the_nodes_next_sequence(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> None:
    first_node, other_node = enroll(nodes), enroll(nodes)
    first = director.pin(OPERATOR, first_node, "det", "1.1.0")
    clock.advance(timedelta(minutes=5))
    # a rollback is a fresh decision with a higher sequence, never a replay
    second = director.pin(OPERATOR, first_node, "det", "1.0.0")
    assert (first.sequence, second.sequence) == (1, 2)
    assert director.pin(OPERATOR, other_node, "det", "1.0.0").sequence == 1

    latest = director.current(first_node)
    assert latest is not None
    assert (
        node_verifies(
            latest, director_signer, versions, node_id=first_node, last_sequence=1, clock=clock
        ).target_path
        == versions["1.0.0"].target_path
    )
    with pytest.raises(AssignmentReplayError):
        node_verifies(
            first.signed_message(),
            director_signer,
            versions,
            node_id=first_node,
            last_sequence=2,
            clock=clock,
        )


def test_concurrent_pins_never_share_a_sequence(
    director: DirectorService, nodes: NodeServices, versions: dict[str, Version]
) -> None:
    node_id = enroll(nodes)
    sequences: list[int] = []
    errors: list[BaseException] = []

    def pin() -> None:
        try:
            sequences.append(director.pin(OPERATOR, node_id, "det", "1.1.0").sequence)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pin) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(sequences) == [1, 2, 3, 4, 5, 6]


def test_a_version_below_the_floor_is_refused_and_audited(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    set_floor(sessions, "gates", "det", 2)
    with pytest.raises(PolicyError, match="below the fleet's floor") as info:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    assert info.value.fields["release_counter"] == 1
    assert director.latest(node_id) is None
    assert audit(sessions) == [("alice", f"node:{node_id}", "refused", "PolicyError")]
    assert director.pin(OPERATOR, node_id, "det", "1.1.0").sequence == 1


def test_unknown_nodes_and_versions_are_not_found(
    director: DirectorService, nodes: NodeServices, versions: dict[str, Version]
) -> None:
    node_id = enroll(nodes)
    with pytest.raises(NotFoundError):
        director.pin(OPERATOR, "n-000000000000", "det", "1.0.0")
    with pytest.raises(NotFoundError):
        director.pin(OPERATOR, "x" * 500, "det", "1.0.0")
    with pytest.raises(NotFoundError):
        director.pin(OPERATOR, node_id, "det", "9.9.9")
    with pytest.raises(NotFoundError):  # a model of another fleet
        director.pin(OPERATOR, node_id, "cls", "2.0.0")
    with pytest.raises(InvalidInputError):
        director.pin(OPERATOR, node_id, "Det!", "1.0.0")
    with pytest.raises(NotFoundError):
        director.latest("n-000000000000")


def test_a_revoked_node_gets_no_assignment(
    director: DirectorService, nodes: NodeServices, versions: dict[str, Version]
) -> None:
    node_id = enroll(nodes)
    nodes.inventory.revoke(OPERATOR, node_id)
    with pytest.raises(PolicyError, match="revoked"):
        director.pin(OPERATOR, node_id, "det", "1.1.0")


def test_pinning_needs_the_operator_role(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    with pytest.raises(PermissionDeniedError):
        director.pin(VIEWER, node_id, "det", "1.1.0")
    manager = RequestContext(Principal("rm", "rita", Role.RELEASE_MANAGER), "req-rm")
    assert director.pin(manager, node_id, "det", "1.1.0").created_by == "rita"
    assert [a[2] for a in audit(sessions)] == ["refused", "ok"]


def test_an_assignment_expires_for_the_node(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> None:
    node_id = enroll(nodes)
    pinned = director.pin(OPERATOR, node_id, "det", "1.1.0")
    clock.advance(TTL)
    assert pinned.expired(clock.now())
    with pytest.raises(AssignmentExpiredError):
        node_verifies(
            pinned.signed_message(), director_signer, versions, node_id=node_id, clock=clock
        )


def test_rows_keep_the_signed_bytes(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    pinned = director.pin(OPERATOR, node_id, "det", "1.1.0")
    with sessions() as session:
        row = session.get_one(DirectorAssignmentRow, (node_id, 1))
    assert row.signed == pinned.signed
    assert row.created_by == "alice"


def test_the_director_public_key_is_a_tuf_key(
    director: DirectorService, director_signer: CryptoSigner
) -> None:
    published = director.director_public_key()
    keyid = published.pop("keyid")
    key = SSlibKey.from_dict(keyid, published)
    assert key == director_signer.public_key


def test_an_unreasonable_lifetime_is_refused(
    sessions: sessionmaker[Session],
    registry: RegistryService,
    nodes: NodeServices,
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> None:
    with pytest.raises(InvalidInputError):
        DirectorService(
            sessions, registry, nodes.inventory, director_signer, clock, timedelta(seconds=1)
        )
