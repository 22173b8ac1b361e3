"""The node role services on both databases: enrollment, authorization, liveness, labels."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.errors import (
    AuthenticationError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from control_plane.identity.bootstrap import BootstrapTokenError, parse_selector
from control_plane.identity.ca import (
    CertificateAuthority,
    CertificateRejectedError,
    InvalidCsrError,
)
from control_plane.nodes.model import Enrollment
from control_plane.nodes.wiring import NodeServices, build_node_services
from control_plane.storage.models import AuditRow, BootstrapTokenRow, NodeRow
from tests.control_plane.identity.helpers import make_csr, new_key
from tests.control_plane.nodes.conftest import OPERATOR, START, VIEWER

HOUR = timedelta(hours=1)


def token_for(
    nodes: NodeServices, fleet: str = "gates", labels: dict[str, str] | None = None
) -> str:
    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, fleet, labels or {}, HOUR)
    return token


def enroll(
    nodes: NodeServices, fleet: str = "gates", labels: dict[str, str] | None = None
) -> Enrollment:
    return nodes.enrollment.enroll(
        token_for(nodes, fleet, labels), make_csr(), agent_version="0.1.0", transport="grpc"
    )


def audit(sessions: sessionmaker[Session], action: str) -> list[AuditRow]:
    with sessions() as session:
        return list(
            session.scalars(select(AuditRow).where(AuditRow.action == action).order_by(AuditRow.id))
        )


def reason_of(exc: pytest.ExceptionInfo[BaseException]) -> object:
    assert isinstance(exc.value, AuthenticationError | PermissionDeniedError | InvalidInputError)
    return exc.value.fields.get("reason")


# --------------------------------------------------------------- enrollment


def test_enroll_happy_path(
    nodes: NodeServices, ca: CertificateAuthority, sessions: sessionmaker[Session]
) -> None:
    token, info = nodes.tokens.create_bootstrap_token(
        OPERATOR, "gates", {"site": "a", "role": "gate"}, HOUR
    )
    assert info.expires_at == START + HOUR
    assert info.state(START) == "active"
    key = new_key()

    enrollment = nodes.enrollment.enroll(
        token, make_csr(key), agent_version="0.1.0", transport="grpc", request_id="r1"
    )

    assert enrollment.fleet == "gates"
    assert enrollment.labels == {"site": "a", "role": "gate"}
    assert enrollment.ca_pem == ca.ca_pem
    assert enrollment.not_after == START + timedelta(days=7)
    identity = ca.node_identity_from_certificate(enrollment.certificate_pem, now=START)
    assert (identity.fleet, identity.node_id) == ("gates", enrollment.node_id)
    assert identity.serial == enrollment.cert_serial

    node = nodes.inventory.get_node(enrollment.node_id)
    assert node.labels == {"site": "a", "role": "gate"}
    assert (node.agent_version, node.transport) == ("0.1.0", "grpc")
    assert node.cert_serial == enrollment.cert_serial
    assert node.cert_expires_at == enrollment.not_after
    assert not node.revoked
    assert not node.online  # online once it connects and says hello
    assert nodes.authentication.authorize(enrollment.node_id, enrollment.cert_serial) == node

    [token_info] = nodes.tokens.list_bootstrap_tokens(OPERATOR)
    assert (token_info.used_at, token_info.node_id) == (START, enrollment.node_id)
    assert token_info.state(START) == "used"

    [created] = audit(sessions, "node-token.create")
    assert (created.actor, created.role, created.outcome) == ("alice", "operator", "ok")
    assert created.details["labels"] == {"site": "a", "role": "gate"}
    [enrolled] = audit(sessions, "node.enroll")
    assert (enrolled.actor, enrolled.role) == (f"node:{enrollment.node_id}", "node")
    assert enrolled.request_id == "r1"
    assert enrolled.details["token_id"] == info.id
    assert token not in str(created.details) + str(enrolled.details)


def test_an_expired_token_is_refused(nodes: NodeServices, clock: ManualClock) -> None:
    token = token_for(nodes)
    clock.advance(HOUR)
    with pytest.raises(BootstrapTokenError) as info:
        nodes.enrollment.enroll(token, make_csr())
    assert info.value.reason == "token-expired"
    assert nodes.refusals["token-expired"] == 1
    assert nodes.inventory.list_nodes() == []


def test_a_used_token_is_refused(nodes: NodeServices) -> None:
    token = token_for(nodes)
    nodes.enrollment.enroll(token, make_csr())
    with pytest.raises(BootstrapTokenError) as info:
        nodes.enrollment.enroll(token, make_csr())
    assert info.value.reason == "token-used"
    assert nodes.refusals.snapshot() == {"token-used": 1}
    assert len(nodes.inventory.list_nodes()) == 1


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("efb_never-issued", "token-unknown"),
        ("eft_an-api-token", "token-malformed"),
        ("", "token-malformed"),
    ],
)
def test_unknown_and_malformed_tokens_are_refused(
    nodes: NodeServices, token: str, reason: str
) -> None:
    with pytest.raises(BootstrapTokenError) as info:
        nodes.enrollment.enroll(token, make_csr())
    assert info.value.reason == reason
    assert nodes.refusals[reason] == 1


def test_a_revoked_token_is_refused(nodes: NodeServices, sessions: sessionmaker[Session]) -> None:
    token, info = nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, HOUR)
    revoked = nodes.tokens.revoke_bootstrap_token(OPERATOR, info.id)
    assert revoked.state(START) == "revoked"
    assert nodes.tokens.revoke_bootstrap_token(OPERATOR, info.id).revoked_at == revoked.revoked_at
    with pytest.raises(BootstrapTokenError) as refused:
        nodes.enrollment.enroll(token, make_csr())
    assert refused.value.reason == "token-revoked"
    assert len(audit(sessions, "node-token.revoke")) == 2
    with pytest.raises(NotFoundError):
        nodes.tokens.revoke_bootstrap_token(OPERATOR, "nope")


def test_a_bad_csr_does_not_use_up_the_token(nodes: NodeServices) -> None:
    token = token_for(nodes)
    with pytest.raises(InvalidCsrError):
        nodes.enrollment.enroll(token, b"garbage")
    assert nodes.refusals["csr-malformed"] == 1
    nodes.enrollment.enroll(token, make_csr())


def test_protobuf_empty_strings_mean_unset(nodes: NodeServices) -> None:
    enrolled = nodes.enrollment.enroll(token_for(nodes), make_csr(), agent_version="", transport="")
    node = nodes.inventory.get_node(enrolled.node_id)
    assert (node.agent_version, node.transport) == (None, None)


def test_bad_hello_fields_are_refused(nodes: NodeServices) -> None:
    token = token_for(nodes)
    with pytest.raises(InvalidInputError):
        nodes.enrollment.enroll(token, make_csr(), transport="carrier-pigeon")
    with pytest.raises(InvalidInputError):
        nodes.enrollment.enroll(token, make_csr(), agent_version="x" * 65)
    assert nodes.refusals["bad-hello"] == 2


def race(nodes: NodeServices, token: str, attempts: int) -> tuple[list[Enrollment], list[str]]:
    """`attempts` threads enroll with one token at the same moment."""
    csrs = [make_csr() for _ in range(attempts)]
    barrier = threading.Barrier(attempts)
    successes: list[Enrollment] = []
    refusals: list[str] = []
    others: list[BaseException] = []

    def attempt(csr: bytes) -> None:
        barrier.wait()
        try:
            successes.append(nodes.enrollment.enroll(token, csr))
        except BootstrapTokenError as exc:
            refusals.append(exc.reason)
        except BaseException as exc:
            others.append(exc)

    threads = [threading.Thread(target=attempt, args=(csr,)) for csr in csrs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert others == []
    return successes, refusals


def test_concurrent_use_of_one_token_enrolls_exactly_one_node(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    for _ in range(3):
        successes, refusals = race(nodes, token_for(nodes), 4)
        assert len(successes) == 1
        assert refusals == ["token-used"] * 3
    with sessions() as session:
        assert len(session.scalars(select(NodeRow)).all()) == 3
        claimed = session.scalars(select(BootstrapTokenRow.node_id)).all()
        assert len(claimed) == 3 and None not in claimed


# ------------------------------------------------------------ authorization


def test_a_revoked_node_is_refused_from_the_next_message_on(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    enrolled = enroll(nodes)
    nodes.presence.record_hello(enrolled.node_id, "0.1.0", "grpc", {})
    revoked = nodes.inventory.revoke(OPERATOR, enrolled.node_id)
    assert revoked.revoked and not revoked.online
    assert (
        nodes.inventory.revoke(OPERATOR, enrolled.node_id).revoked_at == revoked.revoked_at
    )  # idempotent

    with pytest.raises(PermissionDeniedError) as info:
        nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)
    assert reason_of(info) == "node-revoked"
    with pytest.raises(PermissionDeniedError):
        nodes.authentication.authenticate_peer(enrolled.certificate_pem)[1]
    with pytest.raises(PermissionDeniedError):
        nodes.enrollment.renew(enrolled.node_id, make_csr())
    with pytest.raises(PermissionDeniedError):
        nodes.presence.record_hello(enrolled.node_id, "0.1.0", "grpc", {})
    nodes.presence.touch(enrolled.node_id)
    assert nodes.presence.set_online(enrolled.node_id, True) is False
    assert not nodes.inventory.get_node(enrolled.node_id).online
    assert nodes.refusals["node-revoked"] == 4
    assert [a.outcome for a in audit(sessions, "node.revoke")] == ["ok", "ok"]


def test_revoking_needs_an_operator_and_a_known_node(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    enrolled = enroll(nodes)
    with pytest.raises(PermissionDeniedError):
        nodes.inventory.revoke(VIEWER, enrolled.node_id)
    with pytest.raises(NotFoundError):
        nodes.inventory.revoke(OPERATOR, "n-000000000000")
    assert [a.outcome for a in audit(sessions, "node.revoke")] == ["refused", "refused"]


def test_unknown_nodes_and_wrong_serials_are_refused(nodes: NodeServices) -> None:
    first, second = enroll(nodes), enroll(nodes)
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize("n-000000000000", first.cert_serial)
    assert reason_of(info) == "node-unknown"
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize(first.node_id, "0" * 40)
    assert reason_of(info) == "cert-not-current"
    # A certificate of another node does not speak for this one.
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize(first.node_id, second.cert_serial)
    assert reason_of(info) == "cert-not-current"
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize(first.node_id, first.cert_serial, fleet="yards")
    assert reason_of(info) == "wrong-fleet"
    with pytest.raises(AuthenticationError):
        nodes.authentication.authorize("x" * 1000, first.cert_serial)
    assert nodes.refusals.snapshot() == {
        "node-unknown": 2,
        "cert-not-current": 2,
        "wrong-fleet": 1,
    }


def test_certificates_authenticate_their_own_node_only(nodes: NodeServices) -> None:
    first, second = enroll(nodes), enroll(nodes, "yards")
    assert nodes.authentication.authenticate_peer(first.certificate_pem)[1].id == first.node_id
    assert nodes.authentication.authenticate_peer(second.certificate_pem)[1].fleet == "yards"
    with pytest.raises(CertificateRejectedError):
        nodes.authentication.authenticate_peer(b"garbage")[1]
    assert nodes.refusals["cert-malformed"] == 1


def test_a_certificate_from_another_ca_is_refused(nodes: NodeServices, tmp_path: Path) -> None:
    enrolled = enroll(nodes)
    other = CertificateAuthority.load_or_create(tmp_path / "other-ca", now=START)
    forged = other.issue_node_certificate(
        make_csr(), node_id=enrolled.node_id, fleet="gates", now=START
    )
    with pytest.raises(CertificateRejectedError):
        nodes.authentication.authenticate_peer(forged.pem)[1]
    assert nodes.refusals["cert-unknown-issuer"] == 1


def test_an_expired_certificate_is_refused(nodes: NodeServices, clock: ManualClock) -> None:
    enrolled = enroll(nodes)
    clock.advance(timedelta(days=7, seconds=1))
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)
    assert reason_of(info) == "cert-expired"
    with pytest.raises(CertificateRejectedError):
        nodes.authentication.authenticate_peer(enrolled.certificate_pem)[1]


# ------------------------------------------------------------------- renewal


def test_renewal_issues_a_new_certificate_and_keeps_the_old_one_until_it_expires(
    nodes: NodeServices,
    clock: ManualClock,
    ca: CertificateAuthority,
    sessions: sessionmaker[Session],
) -> None:
    enrolled = enroll(nodes)
    before = nodes.inventory.get_node(enrolled.node_id)
    clock.advance(timedelta(days=5))
    renewed = nodes.enrollment.renew(enrolled.node_id, make_csr(new_key()))  # a new key is fine

    assert renewed.serial != enrolled.cert_serial
    assert renewed.not_after == START + timedelta(days=12)
    identity = ca.node_identity_from_certificate(renewed.pem, now=clock.now())
    assert identity.node_id == enrolled.node_id
    after = nodes.inventory.get_node(enrolled.node_id)
    assert after.cert_serial == renewed.serial
    assert after.cert_expires_at == renewed.not_after
    assert after.public_key_sha256 != before.public_key_sha256

    # Both work until the old one expires; then only the new one.
    nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)
    nodes.authentication.authorize(enrolled.node_id, renewed.serial)
    clock.advance(timedelta(days=2, seconds=1))
    with pytest.raises(AuthenticationError):
        nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)
    nodes.authentication.authorize(enrolled.node_id, renewed.serial)

    again = nodes.enrollment.renew(enrolled.node_id, make_csr())
    with pytest.raises(AuthenticationError) as info:
        nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)
    assert reason_of(info) == "cert-not-current"
    nodes.authentication.authorize(enrolled.node_id, again.serial)
    [first, _] = audit(sessions, "node.renew")
    assert first.actor == f"node:{enrolled.node_id}"
    assert first.details["previous"] == enrolled.cert_serial


def test_renewal_of_an_unknown_node_or_with_a_bad_csr_is_refused(nodes: NodeServices) -> None:
    enrolled = enroll(nodes)
    with pytest.raises(AuthenticationError):
        nodes.enrollment.renew("n-000000000000", make_csr())
    with pytest.raises(InvalidCsrError):
        nodes.enrollment.renew(enrolled.node_id, b"nope")
    nodes.authentication.authorize(enrolled.node_id, enrolled.cert_serial)


# ------------------------------------------------------------------ liveness


def test_hello_heartbeats_and_offline_marking(nodes: NodeServices, clock: ManualClock) -> None:
    first, second = enroll(nodes), enroll(nodes)
    hello = nodes.presence.record_hello(
        first.node_id, "0.2.0", "mqtt", {"models": {"det": "1.0.0"}}, clock.now()
    )
    assert hello.online and hello.last_seen == START
    assert (hello.agent_version, hello.transport) == ("0.2.0", "mqtt")
    assert hello.reported_state == {"models": {"det": "1.0.0"}}
    nodes.presence.set_online(second.node_id, True)

    clock.advance(timedelta(seconds=60))
    nodes.presence.touch(first.node_id)
    clock.advance(timedelta(seconds=60))
    # `second` was last seen 120 s ago, `first` 60 s ago; the timeout is 90 s.
    assert nodes.presence.mark_offline_stale() == [second.node_id]
    assert nodes.presence.mark_offline_stale() == []
    assert nodes.inventory.get_node(first.node_id).online
    assert not nodes.inventory.get_node(second.node_id).online

    clock.advance(timedelta(seconds=31))
    assert nodes.presence.mark_offline_stale() == [first.node_id]

    nodes.presence.touch(first.node_id)
    assert nodes.inventory.get_node(first.node_id).online
    # MQTT Last Will: offline at once.
    assert nodes.presence.set_online(first.node_id, False) is True
    assert not nodes.inventory.get_node(first.node_id).online
    assert nodes.presence.set_online("n-000000000000", False) is False
    assert nodes.presence.mark_offline_stale(clock.now(), timedelta(seconds=1)) == []


def test_heartbeats_write_at_most_every_few_seconds(
    nodes: NodeServices, clock: ManualClock
) -> None:
    enrolled = enroll(nodes)
    nodes.presence.touch(enrolled.node_id)
    clock.advance(timedelta(seconds=2))
    nodes.presence.touch(enrolled.node_id)
    assert nodes.inventory.get_node(enrolled.node_id).last_seen == START
    clock.advance(timedelta(seconds=4))
    nodes.presence.touch(enrolled.node_id)
    assert nodes.inventory.get_node(enrolled.node_id).last_seen == START + timedelta(seconds=6)


class CountingSessions:
    """Counts the transactions a service opens."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self.opened = 0

    def __call__(self) -> Session:
        self.opened += 1
        return self._sessions()


def test_heartbeats_within_the_resolution_cost_no_database_call(
    nodes: NodeServices,
    sessions: sessionmaker[Session],
    clock: ManualClock,
    ca: CertificateAuthority,
) -> None:
    enrolled = enroll(nodes)
    counting = CountingSessions(sessions)
    quiet = build_node_services(counting, ca, clock)  # type: ignore[arg-type]
    quiet.presence.touch(enrolled.node_id)
    for _ in range(10):
        clock.advance(timedelta(milliseconds=400))
        quiet.presence.touch(enrolled.node_id)
    assert counting.opened == 1
    # Marked offline (stream closed, Last Will): the next heartbeat writes again at once.
    quiet.presence.set_online(enrolled.node_id, False)
    clock.advance(timedelta(milliseconds=100))
    quiet.presence.touch(enrolled.node_id)
    assert quiet.inventory.get_node(enrolled.node_id).online
    # Offline by the stale sweep: the same.
    clock.advance(timedelta(minutes=5))
    quiet.presence.touch(enrolled.node_id)
    clock.advance(timedelta(minutes=2))
    assert quiet.presence.mark_offline_stale() == [enrolled.node_id]
    quiet.presence.touch(enrolled.node_id)
    assert quiet.inventory.get_node(enrolled.node_id).online


def test_reported_state_is_bounded_plain_json(nodes: NodeServices) -> None:
    enrolled = enroll(nodes)
    with pytest.raises(InvalidInputError):
        nodes.presence.record_hello(enrolled.node_id, "0.1.0", "grpc", {"blob": "x" * 70_000})
    with pytest.raises(InvalidInputError):
        nodes.presence.record_hello(enrolled.node_id, "0.1.0", "grpc", {"x": float("nan")})
    with pytest.raises(AuthenticationError):
        nodes.presence.record_hello("n-000000000000", "0.1.0", "grpc", {})
    assert nodes.refusals.snapshot() == {"state-too-large": 1, "bad-state": 1, "node-unknown": 1}


# -------------------------------------------------------------------- labels


def test_label_changes_are_audited_with_before_and_after(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    enrolled = enroll(nodes, labels={"site": "a", "role": "gate"})

    merged = nodes.inventory.update_labels(
        OPERATOR, enrolled.node_id, {"site": "b", "role": None, "x": "1"}
    )
    assert merged.labels == {"site": "b", "x": "1"}
    replaced = nodes.inventory.set_labels(OPERATOR, enrolled.node_id, {"zone": "z"})
    assert replaced.labels == {"zone": "z"}

    first, second = audit(sessions, "node.labels")
    assert (first.actor, first.outcome, first.target) == ("alice", "ok", f"node:{enrolled.node_id}")
    assert first.details == {
        "before": {"site": "a", "role": "gate"},
        "after": {"site": "b", "x": "1"},
    }
    assert second.details["after"] == {"zone": "z"}


def test_label_changes_are_refused_for_viewers_and_bad_labels(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    enrolled = enroll(nodes, labels={"site": "a"})
    with pytest.raises(PermissionDeniedError):
        nodes.inventory.set_labels(VIEWER, enrolled.node_id, {"site": "b"})
    with pytest.raises(InvalidInputError):
        nodes.inventory.set_labels(OPERATOR, enrolled.node_id, {"site": "a b"})
    with pytest.raises(NotFoundError):
        nodes.inventory.set_labels(OPERATOR, "n-000000000000", {"site": "b"})
    assert nodes.inventory.get_node(enrolled.node_id).labels == {"site": "a"}
    assert [a.outcome for a in audit(sessions, "node.labels")] == ["refused"] * 3


def test_listing_by_fleet_and_selector(nodes: NodeServices) -> None:
    gate = enroll(nodes, labels={"site": "a", "role": "gate"})
    door = enroll(nodes, labels={"site": "a", "role": "door"})
    yard = enroll(nodes, "yards", labels={"site": "b"})

    def ids(selector: str | None = None, fleet: str | None = None) -> set[str]:
        parsed = parse_selector(selector) if selector is not None else None
        return {n.id for n in nodes.inventory.list_nodes(parsed, fleet)}

    assert ids() == {gate.node_id, door.node_id, yard.node_id}
    assert ids(fleet="gates") == {gate.node_id, door.node_id}
    assert ids("site=a") == {gate.node_id, door.node_id}
    assert ids("site=a,role!=gate") == {door.node_id}
    assert ids("!role") == {yard.node_id}
    assert ids("role", fleet="yards") == set()
    with pytest.raises(NotFoundError):
        nodes.inventory.list_nodes(None, "nowhere")
    with pytest.raises(NotFoundError):
        nodes.inventory.get_node("n-000000000000")


# -------------------------------------------------------------- bootstrap tokens


@pytest.mark.parametrize(
    "ttl", [timedelta(seconds=59), timedelta(days=30, seconds=1), timedelta(0)]
)
def test_token_lifetimes_are_bounded(nodes: NodeServices, ttl: timedelta) -> None:
    with pytest.raises(InvalidInputError):
        nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, ttl)


def test_token_creation_is_for_operators_of_existing_fleets(
    nodes: NodeServices, sessions: sessionmaker[Session]
) -> None:
    with pytest.raises(PermissionDeniedError):
        nodes.tokens.create_bootstrap_token(VIEWER, "gates", {}, HOUR)
    with pytest.raises(NotFoundError):
        nodes.tokens.create_bootstrap_token(OPERATOR, "nowhere", {}, HOUR)
    with pytest.raises(InvalidInputError):
        nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {"bad key": "x"}, HOUR)
    assert [a.outcome for a in audit(sessions, "node-token.create")] == ["refused"] * 3
    with pytest.raises(PermissionDeniedError):
        nodes.tokens.list_bootstrap_tokens(VIEWER)


def test_tokens_are_listed_newest_first_with_their_state(
    nodes: NodeServices, clock: ManualClock
) -> None:
    _, old = nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, timedelta(minutes=5))
    clock.advance(timedelta(minutes=1))
    _, new = nodes.tokens.create_bootstrap_token(OPERATOR, "yards", {}, HOUR)
    assert [t.id for t in nodes.tokens.list_bootstrap_tokens(OPERATOR)] == [new.id, old.id]
    assert [t.id for t in nodes.tokens.list_bootstrap_tokens(OPERATOR, "gates")] == [old.id]
    clock.advance(timedelta(minutes=5))
    assert old.state(clock.now()) == "expired"


def test_refusals_are_logged_with_the_reason_and_never_the_token(
    nodes: NodeServices, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    token = token_for(nodes)
    clock.advance(HOUR)
    with (
        caplog.at_level(logging.WARNING, logger="control_plane.nodes"),
        pytest.raises(BootstrapTokenError),
    ):
        nodes.enrollment.enroll(token, make_csr())
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "token-expired" in record.getMessage()
    assert record.__dict__["reason"] == "token-expired"
    assert token not in caplog.text
