"""The node inbox without a transport: the version rule, the authorization cache and its
reasons, the enrollment answer, and message refusals, on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from control_plane.clock import ManualClock
from control_plane.errors import AuthenticationError, InvalidInputError, PermissionDeniedError
from control_plane.link import wire
from control_plane.link.node_inbox import MIN_PROTOCOL_VERSION, NodeClaim, NodeInbox
from control_plane.services import Services
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.link.mqtt_helpers import ADMIN, create_fleet

CACHE = timedelta(seconds=5)


@pytest.fixture
def inbox(services: Services, clock: ManualClock) -> NodeInbox:
    create_fleet(services, "gates")
    create_fleet(services, "yards")
    return services.node_inbox("mqtt", auth_cache_s=CACHE.total_seconds(), clock=clock)


def enrolled(services: Services, inbox: NodeInbox) -> tuple[str, str]:
    token, _ = services.nodes.tokens.create_bootstrap_token(ADMIN, "gates", {}, timedelta(hours=1))
    answer = inbox.enroll(token, make_csr(), agent_version="0.1.0", transport="mqtt")
    return answer.enrollment.node_id, answer.enrollment.cert_serial


def reason(info: pytest.ExceptionInfo[BaseException]) -> object:
    assert isinstance(info.value, AuthenticationError | PermissionDeniedError | InvalidInputError)
    return info.value.fields.get("reason")


def test_the_enrollment_answer_carries_the_director_key_and_the_root(
    services: Services, inbox: NodeInbox
) -> None:
    token, _ = services.nodes.tokens.create_bootstrap_token(ADMIN, "gates", {}, timedelta(hours=1))
    answer = inbox.enroll(token, make_csr(), transport="mqtt")
    assert answer.director_public_key == services.director.director_public_key()
    assert answer.tuf_root is None  # the fleet has no trust root yet
    assert answer.enrollment.mqtt_username == answer.enrollment.node_id
    assert services.nodes.inventory.get_node(answer.enrollment.node_id).transport == "mqtt"


def test_older_supported_and_newer_versions_are_read_only_unset_is_refused(
    services: Services, inbox: NodeInbox
) -> None:
    node_id, _ = enrolled(services, inbox)
    for version in (MIN_PROTOCOL_VERSION, MIN_PROTOCOL_VERSION + 5):
        inbox.check_protocol(version)
    hello = link_pb2.NodeMessage(protocol_version=0, hello=link_pb2.Hello(agent_version="1.0"))
    with pytest.raises(InvalidInputError) as info:
        inbox.hello(node_id, hello)
    assert reason(info) == "protocol-version"
    assert services.nodes.inventory.get_node(node_id).agent_version == "0.1.0"
    hello.protocol_version = MIN_PROTOCOL_VERSION + 1  # a newer node: read as ours
    node = inbox.hello(node_id, hello)
    assert (node.agent_version, node.transport, node.online) == ("1.0", "mqtt", True)


def test_a_check_is_cached_until_it_expires_by_the_injected_clock(
    services: Services, inbox: NodeInbox, clock: ManualClock
) -> None:
    node_id, _ = enrolled(services, inbox)
    claim = NodeClaim(node_id, "gates")
    assert inbox.cached(claim) is None
    assert inbox.authorize(claim).id == node_id
    services.nodes.inventory.revoke(ADMIN, node_id)
    clock.advance(CACHE - timedelta(milliseconds=1))
    assert inbox.cached(claim) is not None
    assert inbox.authorize(claim).id == node_id  # still within the cache: no lookup
    clock.advance(timedelta(milliseconds=1))
    assert inbox.cached(claim) is None
    with pytest.raises(PermissionDeniedError) as info:
        inbox.authorize(claim)
    assert reason(info) == "node-revoked"


def test_a_clock_that_goes_back_expires_the_cache(
    services: Services, inbox: NodeInbox, clock: ManualClock
) -> None:
    node_id, _ = enrolled(services, inbox)
    claim = NodeClaim(node_id, "gates")
    inbox.authorize(claim)
    clock.advance(-timedelta(seconds=1))
    assert inbox.cached(claim) is None


def test_one_set_of_reasons_for_claims_with_and_without_a_certificate(
    services: Services, inbox: NodeInbox
) -> None:
    node_id, serial = enrolled(services, inbox)
    refused = {
        NodeClaim("n-000000000000", "gates"): "node-unknown",
        NodeClaim(node_id, "yards"): "wrong-fleet",
        NodeClaim(node_id, "yards", serial): "wrong-fleet",
        NodeClaim(node_id, "gates", "0" * 40): "cert-not-current",
    }
    for claim, expected in refused.items():
        with pytest.raises(AuthenticationError) as info:
            inbox.authorize(claim)
        assert reason(info) == expected, claim
        assert inbox.cached(claim) is None
    assert inbox.authorize(NodeClaim(node_id, "gates", serial)).id == node_id
    assert services.nodes.refusals.snapshot() == {
        "node-unknown": 1,
        "wrong-fleet": 2,
        "cert-not-current": 1,
    }


def test_malformed_batches_and_update_statuses_carry_one_reason_each(
    services: Services, inbox: NodeInbox
) -> None:
    node_id, _ = enrolled(services, inbox)
    batch = link_pb2.RecordBatch(
        records=[link_pb2.Record(id="x", seq=1, kind=link_pb2.RECORD_KIND_EVENT)]
    )
    with pytest.raises(InvalidInputError) as info:
        inbox.decode_records(batch)
    assert reason(info) == "bad-batch"
    status = link_pb2.UpdateStatus(detail="x" * 70_000)
    with pytest.raises(InvalidInputError) as info:
        inbox.update_status(node_id, status)
    assert reason(info) == "bad-update-status"
    assert inbox.refuse_error(info.value, node_id=node_id) == "bad-update-status"
    assert inbox.refusals.snapshot() == {"bad-update-status": 1}


def test_a_newer_server_still_reads_older_supported_nodes(
    services: Services, inbox: NodeInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The next wire version must not cut off the nodes still on this one (the MQTT bridge
    # used to refuse everything below the version the server speaks).
    monkeypatch.setattr(wire, "PROTOCOL_VERSION", wire.PROTOCOL_VERSION + 1)
    node_id, _ = enrolled(services, inbox)
    hello = link_pb2.NodeMessage(protocol_version=1, hello=link_pb2.Hello(agent_version="0.9"))
    assert inbox.hello(node_id, hello).agent_version == "0.9"


def test_one_dispatch_by_kind_answers_a_hello_and_keeps_the_link_up_on_the_rest(
    services: Services, inbox: NodeInbox
) -> None:
    node_id, _ = enrolled(services, inbox)
    hello = link_pb2.NodeMessage(protocol_version=1, hello=link_pb2.Hello(agent_version="2.0"))
    assert inbox.handle(node_id, hello).desired is None  # nothing pinned yet
    assert services.nodes.inventory.get_node(node_id).agent_version == "2.0"
    beat = link_pb2.NodeMessage(protocol_version=1, heartbeat=link_pb2.Heartbeat())
    assert inbox.handle(node_id, beat).desired is None
    # A malformed status is refused and counted; the caller is answered, not raised at.
    bad = link_pb2.NodeMessage(
        protocol_version=1, update_status=link_pb2.UpdateStatus(detail="x" * 70_000)
    )
    assert inbox.handle(node_id, bad).desired is None
    # A body from a newer protocol (unknown to this server): ignored and counted.
    assert inbox.handle(node_id, link_pb2.NodeMessage(protocol_version=2)).desired is None
    assert inbox.refusals.snapshot() == {"bad-update-status": 1, "unknown-message": 1}
    records = link_pb2.NodeMessage(protocol_version=1, records=link_pb2.RecordBatch())
    with pytest.raises(ValueError, match="store_records"):
        inbox.handle(node_id, records)


def test_results_are_stored_and_an_unreadable_one_is_refused_alone_and_acked(
    services: Services, inbox: NodeInbox, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.control_plane.link.test_ingest import record
    from tests.control_plane.link.test_results_store import document, results_record

    node_id, _ = enrolled(services, inbox)
    good, bad = results_record(2), results_record(3, document(frame_id=None))
    batch = [record(1), good, bad]
    with caplog.at_level("WARNING", logger="control_plane.link.node_inbox"):
        acked = inbox.submit_records(node_id, batch).result(timeout=30)
    assert set(acked) == {r.id for r in batch}  # the node need not send any of them again
    assert inbox.refusals.snapshot() == {"bad-results": 1}
    (logged,) = [r for r in caplog.records if getattr(r, "reason", None) == "bad-results"]
    assert "results.frame_id" in logged.getMessage()
    assert getattr(logged, "error_record_id", None) == bad.id
    shown = services.nodes.results.recent(node_id)
    assert [r.record_id for r in shown] == [good.id]
    assert services.records.count(node_id) == 1
