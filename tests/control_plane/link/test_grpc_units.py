"""The pure parts of the gRPC link: wire conversion, status mapping, the downlink hub."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane import errors
from control_plane.identity.bootstrap import BootstrapTokenError
from control_plane.link import wire
from control_plane.link.grpc_status import status_for
from control_plane.link.hub import LinkHub
from control_plane.link.records import IncomingRecord, IngestLimits, validate_batch
from control_plane.nodes.wiring import NodeServices
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import OPERATOR


def stamp(value: datetime) -> Timestamp:
    result = Timestamp()
    result.FromDatetime(value)
    return result


# ---------------------------------------------------------------------- wire


def test_records_convert_with_kinds_and_aware_times() -> None:
    at = datetime(2026, 11, 30, 12, 0, 1, 500000, tzinfo=UTC)
    batch = link_pb2.RecordBatch(
        records=[
            link_pb2.Record(
                id="a", seq=1, kind=link_pb2.RECORD_KIND_EVENT, created_at=stamp(at), payload=b"x"
            ),
            link_pb2.Record(id="b", seq=2, kind=link_pb2.RECORD_KIND_HEALTH, created_at=stamp(at)),
        ]
    )
    converted = wire.incoming_records(batch)
    assert [(r.id, r.seq, r.kind, r.payload) for r in converted] == [
        ("a", 1, "event", b"x"),
        ("b", 2, "health", b""),
    ]
    assert converted[0].created_at == at


def test_an_unknown_kind_is_refused_by_the_batch_rules() -> None:
    record = link_pb2.Record(
        id="0190a2b4-0000-7000-8000-000000000001",
        seq=1,
        kind=link_pb2.RECORD_KIND_UNSPECIFIED,
        created_at=stamp(datetime.now(UTC)),
        content_type="application/json",
    )
    converted = wire.incoming_records(link_pb2.RecordBatch(records=[record]))
    with pytest.raises(errors.InvalidInputError, match="unknown kind"):
        validate_batch(converted, IngestLimits())


@settings(max_examples=300, deadline=None)
@given(
    seconds=st.integers(min_value=-62_135_596_800, max_value=253_402_300_799),
    nanos=st.integers(min_value=0, max_value=999_999_999),
)
def test_record_times_convert_as_protobuf_does(seconds: int, nanos: int) -> None:
    # wire does its own arithmetic (Timestamp.ToDatetime costs twice as much per record).
    created = Timestamp(seconds=seconds, nanos=nanos)
    batch = link_pb2.RecordBatch(records=[link_pb2.Record(id="a", seq=1, created_at=created)])
    [converted] = wire.incoming_records(batch)
    assert converted.created_at == created.ToDatetime(tzinfo=UTC)
    assert converted.created_at.tzinfo is not None


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        (0, -1),
        (0, 1_000_000_000),
        (-62_135_596_801, 0),
        (253_402_300_800, 0),
        (2**62, 0),
        (-(2**62), 0),
    ],
)
def test_a_record_time_out_of_range_is_invalid(seconds: int, nanos: int) -> None:
    created = Timestamp(seconds=seconds, nanos=nanos)
    batch = link_pb2.RecordBatch(
        records=[
            link_pb2.Record(id="a", seq=1, created_at=stamp(datetime.now(UTC))),
            link_pb2.Record(id="b", seq=2, created_at=created),
        ]
    )
    with pytest.raises(errors.InvalidInputError, match="record 1: created_at is out of range"):
        wire.incoming_records(batch)


def test_a_record_without_a_time_is_invalid() -> None:
    batch = link_pb2.RecordBatch(records=[link_pb2.Record(id="a", seq=1)])
    with pytest.raises(errors.InvalidInputError, match="record 0: created_at is missing"):
        wire.incoming_records(batch)


def test_a_time_set_to_the_epoch_is_a_time_not_a_missing_one() -> None:
    # An unset stamp reads as the epoch too; only presence tells them apart.
    batch = link_pb2.RecordBatch(
        records=[link_pb2.Record(id="a", seq=1, created_at=Timestamp(seconds=0, nanos=0))]
    )
    [converted] = wire.incoming_records(batch)
    assert isinstance(converted, IncomingRecord)
    # Built with tuple.__new__, which does not check the field count.
    assert len(converted) == len(IncomingRecord._fields) == 6
    assert converted.created_at == datetime(1970, 1, 1, tzinfo=UTC)
    assert converted._replace(seq=2).seq == 2


def test_hello_state_is_plain_json() -> None:
    message = link_pb2.NodeMessage(
        protocol_version=1,
        hello=link_pb2.Hello(
            agent_version="0.2.0",
            labels={"cam": "1"},
            installed_targets=["models/a/1/model.onnx"],
            active_target="models/a/1/model.onnx",
            capabilities=["onnx-cpu"],
            director_sequence=7,
        ),
    )
    assert wire.hello_state(message) == {
        "protocol_version": 1,
        "labels": {"cam": "1"},
        "installed_targets": ["models/a/1/model.onnx"],
        "active_target": "models/a/1/model.onnx",
        "capabilities": ["onnx-cpu"],
        "director_sequence": 7,
    }


def test_update_status_keeps_its_time() -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    status = link_pb2.UpdateStatus(target_path="t", phase="downloading", at=stamp(at))
    assert wire.update_status(status)["at"] == at.isoformat()


# ------------------------------------------------------------------- status


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.PayloadTooLargeError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.RangeNotSatisfiableError("x"), grpc.StatusCode.OUT_OF_RANGE),
        (errors.InvalidInputError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (errors.ConflictError("x"), grpc.StatusCode.ABORTED),
        (errors.SignatureError("x"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.PolicyError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (BootstrapTokenError("x", reason="token-used"), grpc.StatusCode.UNAUTHENTICATED),
        (errors.PermissionDeniedError("x"), grpc.StatusCode.PERMISSION_DENIED),
        (errors.StorageError("x"), grpc.StatusCode.UNAVAILABLE),
        (errors.EdgefleetError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_domain_errors_map_to_one_status(error: errors.EdgefleetError, code: object) -> None:
    assert status_for(error) == code


def test_reasons_come_from_the_error_or_its_class() -> None:
    assert (
        errors.reason_of(errors.AuthenticationError("x", reason="node-unknown")) == "node-unknown"
    )
    assert errors.reason_of(errors.RangeNotSatisfiableError("x")) == "range-not-satisfiable"


# ---------------------------------------------------------------------- hub


def test_the_hub_delivers_only_to_connected_nodes_and_bounds_each_queue() -> None:
    async def scenario() -> None:
        hub = LinkHub(max_pending=2)
        message = wire.control_message(command=link_pb2.Command(name="resync"))
        assert hub.send("n-1", message) is False  # nobody attached yet
        session = hub.attach("n-1")
        assert hub.send("n-1", message) and hub.send("n-1", message)
        assert hub.send("n-1", message) is False  # full: dropped and counted
        assert hub.dropped == 1
        assert hub.send("n-2", message) is False

        newer = hub.attach("n-1")
        superseded = await session.ended
        assert isinstance(superseded, errors.ConflictError)
        assert hub.detach(session) is False  # the newer one stays
        assert hub.connected() == ["n-1"]
        assert hub.close_all() == 1
        assert isinstance(await newer.ended, errors.UnavailableError)
        assert hub.send("n-1", message) is False  # ended: nothing more is queued
        assert hub.detach(newer) is True
        assert hub.connected() == []

    asyncio.run(scenario())


# ------------------------------------------------------------- node service


def test_update_status_is_kept_until_the_next_hello(nodes: NodeServices) -> None:
    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, timedelta(hours=1))
    node_id = nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id
    nodes.presence.record_hello(node_id, "0.1.0", "grpc", {"active_target": "a"})
    shown = nodes.presence.record_update_status(node_id, {"phase": "verifying"})
    assert shown.reported_state == {"active_target": "a", "update": {"phase": "verifying"}}
    nodes.presence.record_hello(node_id, "0.1.0", "grpc", {"active_target": "b"})
    assert nodes.inventory.get_node(node_id).reported_state == {"active_target": "b"}
    with pytest.raises(errors.InvalidInputError):
        nodes.presence.record_update_status(node_id, {"detail": "x" * 70_000})
    nodes.inventory.revoke(OPERATOR, node_id)
    with pytest.raises(errors.PermissionDeniedError):
        nodes.presence.record_update_status(node_id, {"phase": "done"})
    assert nodes.refusals.snapshot() == {"state-too-large": 1, "node-revoked": 1}
