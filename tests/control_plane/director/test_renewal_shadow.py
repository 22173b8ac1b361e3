"""Renewals (ADR 0032) and shadow candidates (ADR 0031) on both databases: what is signed,
when, for whom, audited, and what the node makes of it."""

from __future__ import annotations

import threading
from datetime import timedelta

import anyio
import pytest
from securesystemslib.signer import CryptoSigner
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.api.app import _renewal_loop
from control_plane.clock import ManualClock
from control_plane.director.delivery import FanOutDelivery
from control_plane.director.service import DirectorService
from control_plane.errors import (
    ConflictError,
    InvalidInputError,
    PermissionDeniedError,
    PolicyError,
)
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import RegistryService
from control_plane.storage.models import AuditRow, DirectorAssignmentRow
from edge_node.updater.director import TargetInfo, verify_shadow
from tests.control_plane.director.conftest import TTL, Version, add_version, enroll, set_floor
from tests.control_plane.director.test_pin_many import Recorder
from tests.control_plane.director.test_service import node_verifies
from tests.control_plane.nodes.conftest import OPERATOR, VIEWER


def audited(sessions: sessionmaker[Session], action: str) -> list[tuple[str, str, str]]:
    with sessions() as session:
        rows = session.scalars(select(AuditRow).where(AuditRow.action == action))
        return [(r.actor, r.target, r.outcome) for r in rows]


def rows_of(sessions: sessionmaker[Session], node_id: str) -> int:
    with sessions() as session:
        return (
            session.scalar(select(func.count()).where(DirectorAssignmentRow.node_id == node_id))
            or 0
        )


def test_assignments_due_within_a_third_of_their_lifetime_are_renewed(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    early, late, none = enroll(nodes), enroll(nodes), enroll(nodes)
    first = director.pin(OPERATOR, early, "det", "1.0.0")
    clock.advance(timedelta(hours=12))
    director.pin(OPERATOR, late, "det", "1.1.0")
    clock.advance(timedelta(hours=5))  # early expires in 7 h (< 8 h), late in 19 h
    assert director.renew_expiring() == 1
    renewed = director.latest(early)
    assert renewed is not None
    assert (renewed.sequence, renewed.renewal, renewed.target_path) == (
        2,
        True,
        first.target_path,
    )
    assert renewed.expires_at == clock.now().replace(microsecond=0) + TTL
    assert renewed.created_by == "system"
    # What the node makes of it: the next sequence, marked as a renewal.
    verified = node_verifies(
        renewed.signed_message(),
        director_signer,
        versions,
        node_id=early,
        last_sequence=1,
        clock=clock,
    )
    assert (verified.sequence, verified.renewal, verified.shadow) == (2, True, None)
    assert director.latest(none) is None and director.latest(late) is not None
    assert director.renew_expiring() == 0  # nothing due any more
    assert audited(sessions, "node.renew") == [("system", "director", "ok")]


def test_expired_assignments_are_renewed_revoked_nodes_are_not(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    clock: ManualClock,
) -> None:
    lapsed, revoked = enroll(nodes), enroll(nodes)
    director.pin(OPERATOR, lapsed, "det", "1.0.0")
    director.pin(OPERATOR, revoked, "det", "1.0.0")
    nodes.inventory.revoke(OPERATOR, revoked)
    clock.advance(TTL * 2)  # the control plane was down past the expiry
    assert director.current(lapsed) is None
    assert director.renew_expiring() == 1
    assert director.current(lapsed) is not None
    latest = director.latest(revoked)
    assert latest is not None and latest.sequence == 1


def test_renewals_go_in_chunks_each_delivered_and_audited(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeServices,
    versions: dict[str, Version],
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    director, fan_out = with_delivery
    ids = sorted(enroll(nodes) for _ in range(3))
    for node_id in ids:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    grpc = Recorder("grpc")
    fan_out.attach(grpc)
    clock.advance(TTL)
    assert director.renew_expiring(chunk_size=2) == 3
    assert [[to for to, _ in chunk] for _, chunk in grpc.calls] == [ids[:2], ids[2:]]
    assert len(audited(sessions, "node.renew")) == 2
    with pytest.raises(InvalidInputError):
        director.renew_expiring(chunk_size=0)


def test_two_replicas_renewing_at_once_renew_each_node_once(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
    registry: RegistryService,
    director_signer: CryptoSigner,
    clock: ManualClock,
) -> None:
    ids = [enroll(nodes) for _ in range(4)]
    for node_id in ids:
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    clock.advance(TTL)
    other = DirectorService(sessions, registry, nodes.inventory, director_signer, clock, TTL)
    counts: list[int] = []
    errors: list[BaseException] = []

    def renew(service: DirectorService) -> None:
        try:
            counts.append(service.renew_expiring(chunk_size=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=renew, args=(s,)) for s in (director, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sum(counts) == 4
    assert [rows_of(sessions, node_id) for node_id in ids] == [2, 2, 2, 2]


def test_a_shadow_candidate_rides_on_the_current_target(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    director_signer: CryptoSigner,
    clock: ManualClock,
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    pinned = director.pin(OPERATOR, node_id, "det", "1.0.0")
    shadowed = director.assign_shadow(
        OPERATOR, node_id, "det", "1.1.0", sample_per_mille=50, max_cpu_percent=15
    )
    candidate = versions["1.1.0"]
    assert (shadowed.sequence, shadowed.renewal, shadowed.target_path) == (
        2,
        True,
        pinned.target_path,
    )
    assert shadowed.shadow is not None
    assert shadowed.shadow.to_dict() == {
        "target_path": candidate.target_path,
        "sha256": candidate.sha256,
        "length": candidate.length,
        "sample_per_mille": 50,
        "max_cpu_percent": 15,
    }
    verified = node_verifies(
        shadowed.signed_message(),
        director_signer,
        versions,
        node_id=node_id,
        last_sequence=1,
        clock=clock,
    )
    assert verified.shadow is not None
    target = TargetInfo(
        candidate.target_path, candidate.sha256, candidate.length, {"release_counter": 2}
    )
    checked = verify_shadow(
        verified.shadow,
        model="det",
        target_lookup={candidate.target_path: target}.get,
        floor_lookup=lambda model: 0,
    )
    assert (checked.sample_per_mille, checked.max_cpu_percent) == (50, 15)
    # A renewal keeps the candidate; clearing it signs the target alone.
    clock.advance(TTL)
    assert director.renew_expiring() == 1
    renewed = director.latest(node_id)
    assert renewed is not None and renewed.shadow == shadowed.shadow
    cleared = director.clear_shadow(OPERATOR, node_id)
    assert (cleared.sequence, cleared.renewal, cleared.shadow) == (4, True, None)
    assert director.clear_shadow(OPERATOR, node_id).sequence == 4  # nothing left to clear
    assert audited(sessions, "node.shadow") == [("alice", f"node:{node_id}", "ok")]


def test_shadow_candidates_that_are_refused(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    sessions: sessionmaker[Session],
) -> None:
    node_id = enroll(nodes)
    with pytest.raises(ConflictError) as no_pin:
        director.assign_shadow(
            OPERATOR, node_id, "det", "1.1.0", sample_per_mille=5, max_cpu_percent=5
        )
    assert no_pin.value.fields["reason"] == "no-assignment"
    director.pin(OPERATOR, node_id, "det", "1.0.0")
    add_version(sessions, "gates", "cls", "3.0.0", 1)
    cases = [
        ("cls", "3.0.0", 5, 5, "model"),
        ("det", "1.0.0", 5, 5, "version"),
        ("det", "1.1.0", 0, 5, "sample_per_mille"),
        ("det", "1.1.0", 5, 101, "max_cpu_percent"),
    ]
    for model, version, sample, cpu, field in cases:
        with pytest.raises(InvalidInputError) as bad:
            director.assign_shadow(
                OPERATOR, node_id, model, version, sample_per_mille=sample, max_cpu_percent=cpu
            )
        assert bad.value.fields["field"] == field
    set_floor(sessions, "gates", "det", 3)
    with pytest.raises(PolicyError):
        director.assign_shadow(
            OPERATOR, node_id, "det", "1.1.0", sample_per_mille=5, max_cpu_percent=5
        )
    with pytest.raises(PermissionDeniedError):
        director.assign_shadow(
            VIEWER, node_id, "det", "1.1.0", sample_per_mille=5, max_cpu_percent=5
        )
    assert rows_of(sessions, node_id) == 1
    assert {outcome for _, _, outcome in audited(sessions, "node.shadow")} == {"refused"}


class _Renewing:
    """Stands in for the director in the server's renewal loop."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.ttl = timedelta(0)  # the loop's interval is a sixth of the window: no wait
        self.calls = 0
        self._scope = scope

    def renew_expiring(self) -> int:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("database gone")
        if self.calls == 3:
            self._scope.cancel()
        return 0


def test_the_servers_renewal_loop_goes_on_after_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> int:
        with anyio.CancelScope() as scope:
            director = _Renewing(scope)
            await _renewal_loop(director, 600.0)  # type: ignore[arg-type]
        return director.calls

    assert anyio.run(main) == 3
    assert "renewing director assignments failed" in caplog.text
