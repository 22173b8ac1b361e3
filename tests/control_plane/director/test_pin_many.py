"""`DirectorService.pin_many` on both databases: selection by ids and labels, sequences per
node, all-or-nothing refusals, revoked nodes skipped, chunks (one transaction, one audit
entry and one delivery each), and concurrency with single pins."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.director.delivery import Delivered, FanOutDelivery
from control_plane.director.service import DirectorService, SkippedNode, _insert_assignments
from control_plane.errors import (
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
)
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import RegistryService
from control_plane.storage.models import AuditRow, DirectorAssignmentRow
from edge_node.updater.director import TargetInfo, verify_assignment
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.director.conftest import TTL, Version, enroll, set_floor
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import OPERATOR, START, VIEWER


def enroll_labeled(nodes: NodeServices, labels: dict[str, str], fleet: str = "gates") -> str:
    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, fleet, labels, timedelta(hours=1))
    return nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id


def stored(sessions: sessionmaker[Session]) -> dict[str, list[int]]:
    """Every node's stored sequences, ascending."""
    with sessions() as session:
        rows = session.execute(
            select(DirectorAssignmentRow.node_id, DirectorAssignmentRow.sequence).order_by(
                DirectorAssignmentRow.node_id, DirectorAssignmentRow.sequence
            )
        )
        result: dict[str, list[int]] = {}
        for node_id, sequence in rows:
            result.setdefault(node_id, []).append(sequence)
        return result


def pin_many_audit(sessions: sessionmaker[Session]) -> list[AuditRow]:
    with sessions() as session:
        return list(
            session.scalars(
                select(AuditRow).where(AuditRow.action == "node.pin_many").order_by(AuditRow.id)
            )
        )


class Recorder:
    """A transport that takes every node it is given and remembers each call."""

    def __init__(self, name: str = "grpc") -> None:
        self.name = name
        self.calls: list[tuple[str, list[tuple[str, SignedDirectorAssignment]]]] = []

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        raise AssertionError("a bulk pin delivers in bulk")

    def deliver_many(self, fleet: str, assignments: Any) -> Delivered:
        self.calls.append((fleet, list(assignments)))
        return {node_id: (self.name,) for node_id, _ in assignments}


class Broken:
    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        raise RuntimeError("transport bug")

    def deliver_many(self, fleet: str, assignments: Any) -> Delivered:
        raise RuntimeError("transport bug")


def test_pin_many_by_ids_signs_what_each_node_accepts(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    ids = [enroll(nodes) for _ in range(3)]
    bystander = enroll(nodes)

    result = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids)

    v = versions["1.1.0"]
    assert (result.fleet, result.model, result.version, result.target_path) == (
        "gates",
        "det",
        "1.1.0",
        v.target_path,
    )
    assert (result.pinned, result.selected, result.skipped, result.chunks) == (3, 3, (), 1)
    assert [a.node_id for a in result.assignments] == sorted(ids)
    assert stored(sessions) == {node_id: [1] for node_id in ids}
    assert director.latest(bystander) is None
    targets = {v.target_path: TargetInfo(v.target_path, v.sha256, v.length, {"release_counter": 2})}
    for assignment in result.assignments:
        assert (assignment.issued_at, assignment.expires_at) == (START, START + TTL)
        assert assignment.created_by == "alice"
        # Stored as returned; the node verifies its own and no other.
        latest = director.latest(assignment.node_id)
        assert latest == assignment
        verified = verify_assignment(
            assignment.signed_message(),
            director_key=director_signer.public_key,
            node_id=assignment.node_id,
            fleet="gates",
            last_sequence=0,
            now=clock.now(),
            target_lookup=targets.get,
            floor_lookup=lambda model: 0,
        )
        assert (verified.sequence, verified.target_path) == (1, v.target_path)


def test_pin_many_by_labels_selects_within_the_fleet(
    director: DirectorService, nodes: NodeServices, versions: dict[str, Version]
) -> None:
    gate_a = enroll_labeled(nodes, {"site": "a", "role": "gate"})
    gate_b = enroll_labeled(nodes, {"site": "b", "role": "gate"})
    cam_a = enroll_labeled(nodes, {"site": "a", "role": "cam"})
    plain = enroll(nodes)
    enroll_labeled(nodes, {"site": "a", "role": "gate"}, fleet="yards")  # other fleet

    site_a = director.pin_many(OPERATOR, "det", "1.0.0", fleet="gates", labels={"site": "a"})
    assert [a.node_id for a in site_a.assignments] == sorted([gate_a, cam_a])

    both = director.pin_many(
        OPERATOR, "det", "1.0.0", fleet="gates", labels={"site": "a", "role": "gate"}
    )
    assert [a.node_id for a in both.assignments] == [gate_a]
    assert both.assignments[0].sequence == 2

    nobody = director.pin_many(OPERATOR, "det", "1.0.0", fleet="gates", labels={"site": "z"})
    assert (nobody.pinned, nobody.chunks) == (0, 0)

    everyone = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", labels={})
    assert {a.node_id: a.sequence for a in everyone.assignments} == {
        gate_a: 3,
        gate_b: 1,
        cam_a: 2,
        plain: 1,
    }


def test_sequences_continue_across_single_pins_and_chunks(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
    clock: ManualClock,
) -> None:
    ids = sorted(enroll(nodes) for _ in range(5))
    director.pin(OPERATOR, ids[1], "det", "1.0.0")
    director.pin(OPERATOR, ids[1], "det", "1.1.0")
    director.pin(OPERATOR, ids[3], "det", "1.0.0")

    clock.advance(timedelta(minutes=1))
    result = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids, chunk_size=2)
    assert result.chunks == 3
    assert [a.sequence for a in result.assignments] == [1, 3, 1, 2, 1]
    assert director.pin(OPERATOR, ids[1], "det", "1.0.0").sequence == 4
    assert stored(sessions) == {
        ids[0]: [1],
        ids[1]: [1, 2, 3, 4],
        ids[2]: [1],
        ids[3]: [1, 2],
        ids[4]: [1],
    }

    # One audit entry per chunk, on the fleet, with what it did.
    entries = pin_many_audit(sessions)
    assert [(e.actor, e.target, e.outcome) for e in entries] == [("alice", "fleet:gates", "ok")] * 3
    assert [e.details["chunk"] for e in entries] == [1, 2, 3]
    assert [e.details["nodes"] for e in entries] == [2, 2, 1]
    assert entries[0].details["sequences"] == [1, 3]
    assert {(e.details["model"], e.details["version"]) for e in entries} == {("det", "1.1.0")}
    assert all(e.request_id == "req-op" for e in entries)


def test_an_unknown_id_refuses_the_whole_request_and_writes_nothing(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    ids = [enroll(nodes) for _ in range(3)]
    elsewhere = enroll(nodes, fleet="yards")
    with pytest.raises(NotFoundError) as info:
        director.pin_many(
            OPERATOR,
            "det",
            "1.1.0",
            fleet="gates",
            node_ids=[*ids, "n-000000000000", elsewhere],
            chunk_size=1,
        )
    assert "n-000000000000" in info.value.message
    assert elsewhere in info.value.message
    assert "nothing was pinned" in info.value.message
    assert sorted(info.value.fields["node_ids"]) == sorted(["n-000000000000", elsewhere])
    assert stored(sessions) == {}
    [entry] = pin_many_audit(sessions)
    assert (entry.outcome, entry.details["error"]) == ("refused", "NotFoundError")

    with pytest.raises(NotFoundError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="nowhere", labels={})
    with pytest.raises(NotFoundError):
        director.pin_many(OPERATOR, "det", "9.9.9", fleet="gates", node_ids=ids)
    with pytest.raises(NotFoundError, match="no model"):
        director.pin_many(OPERATOR, "cls", "2.0.0", fleet="gates", node_ids=ids)
    assert stored(sessions) == {}


def test_revoked_nodes_are_skipped_and_reported(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    live = enroll_labeled(nodes, {"site": "a"})
    revoked = enroll_labeled(nodes, {"site": "a"})
    nodes.inventory.revoke(OPERATOR, revoked)

    by_labels = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", labels={"site": "a"})
    assert [a.node_id for a in by_labels.assignments] == [live]
    assert by_labels.skipped == (SkippedNode(revoked, "revoked"),)
    assert by_labels.selected == 2

    by_ids = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[revoked, live])
    assert [(a.node_id, a.sequence) for a in by_ids.assignments] == [(live, 2)]
    assert by_ids.skipped == (SkippedNode(revoked, "revoked"),)
    assert stored(sessions) == {live: [1, 2]}
    assert pin_many_audit(sessions)[-1].details["skipped"] == [f"{revoked} (revoked)"]

    only_revoked = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[revoked])
    assert (only_revoked.pinned, len(only_revoked.skipped)) == (0, 1)


def test_a_version_below_the_floor_is_refused_for_every_node(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    ids = [enroll(nodes) for _ in range(2)]
    set_floor(sessions, "gates", "det", 2)
    with pytest.raises(PolicyError, match="below the fleet's floor"):
        director.pin_many(OPERATOR, "det", "1.0.0", fleet="gates", node_ids=ids)
    assert stored(sessions) == {}
    assert [e.outcome for e in pin_many_audit(sessions)] == ["refused"]
    assert director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids).pinned == 2


def test_bad_requests_and_roles_are_refused(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates")
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[node_id], labels={})
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[])
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", labels={"bad key!": "x"})
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "Det!", "1.1.0", fleet="gates", node_ids=[node_id])
    with pytest.raises(InvalidInputError):
        director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[node_id], chunk_size=0)
    with pytest.raises(PermissionDeniedError):
        director.pin_many(VIEWER, "det", "1.1.0", fleet="gates", node_ids=[node_id])
    assert stored(sessions) == {}
    entries = pin_many_audit(sessions)
    assert len(entries) == 7
    assert entries[-1].actor == "victor"
    assert {e.outcome for e in entries} == {"refused"}


def test_concurrent_single_pins_and_pin_many_never_share_a_sequence(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    ids = sorted(enroll(nodes) for _ in range(4))
    errors: list[BaseException] = []

    def bulk() -> None:
        try:
            for _ in range(3):
                director.pin_many(
                    OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids, chunk_size=2
                )
        except BaseException as exc:
            errors.append(exc)

    def single(node_id: str) -> None:
        try:
            for _ in range(3):
                director.pin(OPERATOR, node_id, "det", "1.0.0")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=bulk) for _ in range(2)]
    threads += [threading.Thread(target=single, args=(node_id,)) for node_id in ids[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    # Two bulk pins of every node (6 each) plus three single pins of two of them: every
    # node's sequences are exactly 1..n, so none was taken twice or skipped.
    assert stored(sessions) == {
        node_id: list(range(1, (9 if node_id in ids[:2] else 6) + 1)) for node_id in ids
    }


def test_each_chunk_is_delivered_in_one_call_after_its_commit(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeServices,
    versions: dict[str, Version],
) -> None:
    director, fan_out = with_delivery
    grpc, mqtt = Recorder("grpc"), Recorder("mqtt")
    fan_out.attach(grpc)
    fan_out.attach(mqtt)
    ids = sorted(enroll(nodes) for _ in range(5))

    result = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids, chunk_size=2)

    assert result.delivered == 5
    assert [len(batch) for _, batch in grpc.calls] == [2, 2, 1]
    assert {fleet for fleet, _ in grpc.calls} == {"gates"}
    delivered = [(node_id, signed) for _, batch in grpc.calls for node_id, signed in batch]
    # Exactly the stored bytes, in node order, so what a node gets is what `current` says.
    assert [
        (node_id, signed.SerializeToString(deterministic=True)) for node_id, signed in delivered
    ] == [(a.node_id, a.signed) for a in result.assignments]
    for node_id, signed in delivered:
        assert director.current(node_id) == signed
    assert mqtt.calls == grpc.calls


def test_a_failing_delivery_leaves_the_pins_committed(
    sessions: sessionmaker[Session],
    registry: RegistryService,
    nodes: NodeServices,
    director_signer: CryptoSigner,
    clock: ManualClock,
    versions: dict[str, Version],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The port itself raising (not a transport inside the fan-out): the director logs it.
    director = DirectorService(
        sessions, registry, nodes.inventory, director_signer, clock, TTL, delivery=Broken()
    )
    ids = sorted(enroll(nodes) for _ in range(3))
    result = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=ids, chunk_size=2)
    assert (result.pinned, result.delivered) == (3, 0)
    assert "transport bug" in caplog.text
    assert stored(sessions) == {node_id: [1] for node_id in ids}
    assert all(director.current(node_id) is not None for node_id in ids)


def test_the_fan_out_merges_transports_and_survives_a_broken_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fan_out = FanOutDelivery()
    grpc = Recorder("grpc")
    fan_out.attach(Broken())
    fan_out.attach(grpc)
    fan_out.attach(Recorder("mqtt"))
    signed = SignedDirectorAssignment(assignment=b"x", keyid="k", signature=b"s")
    got = fan_out.deliver_many("gates", [("n-1", signed), ("n-2", signed)])
    assert got == {"n-1": ("grpc", "mqtt"), "n-2": ("grpc", "mqtt")}
    assert "transport bug" in caplog.text
    assert FanOutDelivery().deliver_many("gates", [("n-1", signed)]) == {}


def test_the_registry_reads_one_version_with_its_floor(
    registry: RegistryService, versions: dict[str, Version], sessions: sessionmaker[Session]
) -> None:
    info = registry.get_version("gates", "det", "1.0.0")
    assert (info.release_counter, info.revoked) == (1, False)
    set_floor(sessions, "gates", "det", 2)
    assert registry.get_version("gates", "det", "1.0.0").revoked is True
    assert registry.get_version("gates", "det", "1.1.0").revoked is False
    with pytest.raises(NotFoundError, match="no version"):
        registry.get_version("gates", "det", "7.0.0")
    with pytest.raises(NotFoundError, match="no model"):
        registry.get_version("gates", "cls", "2.0.0")
    with pytest.raises(NotFoundError, match="no fleet"):
        registry.get_version("nowhere", "det", "1.0.0")
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(DirectorAssignmentRow)) == 0


def test_a_duplicate_sequence_is_an_integrity_error_on_both_backends(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    """The primary key backs up the row locks, whichever way the chunk is stored (binary
    COPY on PostgreSQL, executemany elsewhere)."""
    node_id = enroll(nodes)
    pinned = director.pin_many(OPERATOR, "det", "1.1.0", fleet="gates", node_ids=[node_id])
    a = pinned.assignments[0]
    row = (
        node_id,
        a.sequence,
        a.target_path,
        a.sha256,
        a.length,
        a.issued_at,
        a.expires_at,
        a.signed,
        "mallory",
    )
    with sessions() as session, pytest.raises(IntegrityError):
        _insert_assignments(session, [row])
    assert stored(sessions) == {node_id: [1]}


class FloorRaiser:
    """Delivers, and raises the model's floor after the first chunk, as a release manager
    revoking the version during a long pin would."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.calls = 0

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        raise AssertionError("a bulk pin delivers in bulk")

    def deliver_many(self, fleet: str, assignments: Any) -> Delivered:
        self.calls += 1
        if self.calls == 1:
            set_floor(self.sessions, "gates", "det", 2)
        return {node_id: ("grpc",) for node_id, _ in assignments}


def test_a_floor_raised_during_a_pin_stops_its_later_chunks(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    director, fan_out = with_delivery
    fan_out.attach(FloorRaiser(sessions))
    ids = sorted(enroll(nodes) for _ in range(3))
    with pytest.raises(PolicyError, match="below the fleet's floor"):
        director.pin_many(OPERATOR, "det", "1.0.0", fleet="gates", node_ids=ids, chunk_size=1)
    assert list(stored(sessions)) == [ids[0]]  # the first chunk stands, nothing after it
