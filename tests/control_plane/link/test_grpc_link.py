"""The gRPC node link against a real server, real TLS and a real database (both backends).

Enrollment, Sync, identity binding, revocation, bad input. Downloads are in
test_grpc_downloads.py, the restart of a whole control plane in test_grpc_e2e.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from control_plane.clock import ManualClock
from control_plane.identity.ca import CertificateAuthority
from control_plane.link.grpc_server import SERVICE_NAME
from control_plane.services import ServiceConfig, Services, build_services
from edge_node.enroll import (
    CA_FILE,
    CERT_FILE,
    DIRECTOR_KEY_FILE,
    IDENTITY_FILE,
    KEY_FILE,
    EnrollmentFiles,
    generate_node_key,
    make_csr,
    private_key_pem,
)
from edge_node.errors import InvalidInputError
from edge_node.link.base import (
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    node_message,
)
from edge_node.link.grpc_link import GrpcNodeLink, NodeCredentials
from protos.edgefleet.fleet.v1 import link_pb2, link_pb2_grpc
from tests.control_plane.link.grpc_support import (
    ADMIN,
    GrpcPlane,
    batch,
    hello,
    next_message,
    node_settings,
    running_link,
    until,
    wire_record,
)

pytestmark = pytest.mark.anyio

SYNC = f"/{SERVICE_NAME}/Sync"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def plane_clock() -> ManualClock:
    # Real "now": TLS checks certificate validity against the wall clock.
    return ManualClock(datetime.now(UTC))


@pytest.fixture
def link_services(service_config: ServiceConfig, plane_clock: ManualClock) -> Iterator[Services]:
    built = build_services(service_config, clock=plane_clock)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
async def plane(link_services: Services) -> AsyncIterator[GrpcPlane]:
    async with running_link(link_services) as running:
        yield running


@pytest.fixture
async def node(plane: GrpcPlane, tmp_path: Path) -> EnrollmentFiles:
    return await plane.enroll(tmp_path / "node-a")


async def connected(plane: GrpcPlane, files: EnrollmentFiles) -> GrpcNodeLink:
    link = plane.link(files)
    await link.connect(hello(labels={"camera": "3"}, installed_targets=["models/d/1/model.onnx"]))
    return link


# ----------------------------------------------------------------- enrollment


async def test_enroll_over_grpc_then_sync_with_the_issued_certificate(
    plane: GrpcPlane, tmp_path: Path
) -> None:
    files = await plane.enroll(tmp_path / "node", plane.token(labels={"site": "north"}))
    assert (files.fleet, files.labels) == ("gates", {"site": "north"})
    for name in (KEY_FILE, CERT_FILE, CA_FILE, DIRECTOR_KEY_FILE, IDENTITY_FILE):
        assert (files.directory / name).is_file()
    assert files.director_key().keyid == plane.services.director.director_public_key()["keyid"]
    assert stat.S_IMODE(files.key_path.stat().st_mode) == 0o600
    assert files.ca_path.read_bytes() == plane.services.ca.ca_pem
    assert EnrollmentFiles.load(files.directory) == files
    # The fleet has no trust root yet: no TUF root to write.
    assert not files.tuf_root_path.exists()

    link = await connected(plane, files)
    assert link.node_id == files.node_id
    shown = plane.services.nodes.inventory.get_node(files.node_id)
    assert shown.online and shown.transport == "grpc" and shown.agent_version == "0.1.0"
    assert shown.reported_state["labels"] == {"camera": "3"}
    assert shown.reported_state["installed_targets"] == ["models/d/1/model.onnx"]

    records = [wire_record(seq) for seq in (1, 2, 3)]
    await link.send(batch(records))
    reply = await next_message(link)
    assert list(reply.ack.record_ids) == [r.id for r in records]
    assert plane.services.records.record_ids(files.node_id) == {r.id for r in records}

    await link.close()
    await until(lambda: not plane.services.nodes.inventory.get_node(files.node_id).online)


async def test_enrolling_twice_into_one_directory_is_refused(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    with pytest.raises(InvalidInputError):
        await plane.enroll(node.directory)


async def test_a_reused_or_expired_bootstrap_token_is_unauthenticated(
    plane: GrpcPlane, plane_clock: ManualClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    used = plane.token()
    await plane.enroll(tmp_path / "first", used)
    with pytest.raises(LinkRefusedError) as reused:
        await plane.enroll(tmp_path / "second", used)
    assert reused.value.fields == {"code": "UNAUTHENTICATED", "reason": "token-used"}
    assert used not in reused.value.message

    expiring = plane.token(ttl=timedelta(minutes=1))
    plane_clock.advance(timedelta(minutes=2))
    with caplog.at_level(logging.WARNING), pytest.raises(LinkRefusedError) as expired:
        await plane.enroll(tmp_path / "third", expiring)
    assert expired.value.fields["reason"] == "token-expired"
    assert plane.server.refusals["token-used"] == 1
    assert plane.server.refusals["token-expired"] == 1
    assert "token-expired" in caplog.text
    assert expiring not in caplog.text
    # Nothing was written for the refused enrollments.
    assert not (tmp_path / "second" / IDENTITY_FILE).exists()


async def test_a_node_may_enroll_over_grpc_for_the_mqtt_transport(plane: GrpcPlane) -> None:
    async with plane.channel(port=plane.server.enroll_port) as channel:
        enrolled = await link_pb2_grpc.NodeLinkStub(channel).Enroll(
            link_pb2.EnrollRequest(
                bootstrap_token=plane.token(),
                csr_pem=make_csr(generate_node_key()),
                transport="mqtt",
            )
        )
    assert enrolled.mqtt_username == enrolled.node_id
    assert enrolled.mqtt_password
    assert plane.services.nodes.inventory.get_node(enrolled.node_id).transport == "mqtt"


async def test_a_malformed_csr_is_invalid_argument(plane: GrpcPlane) -> None:
    async with plane.channel(port=plane.server.enroll_port) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await link_pb2_grpc.NodeLinkStub(channel).Enroll(
                link_pb2.EnrollRequest(bootstrap_token=plane.token(), csr_pem=b"not a csr")
            )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())["edgefleet-reason"] == "csr-malformed"


# ------------------------------------------------------------------- identity


async def test_a_client_without_a_certificate_gets_only_enroll(plane: GrpcPlane) -> None:
    request = link_pb2.FetchMetadataRequest(filename="timestamp.json")
    # The node port: the TLS handshake itself fails.
    async with plane.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as handshake:
            await link_pb2_grpc.NodeLinkStub(channel).FetchMetadata(request, timeout=10)
    assert handshake.value.code() == grpc.StatusCode.UNAVAILABLE
    # The enrollment port lets it in, for Enroll only.
    async with plane.channel(port=plane.server.enroll_port) as channel:
        stub = link_pb2_grpc.NodeLinkStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.FetchMetadata(request, timeout=10)
        call = stub.Sync()
        # The server may refuse the stream before the first message is written.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.write(node_message(hello=hello()))
        sync_code = await call.code()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "node port" in (refused.value.details() or "")
    assert sync_code == grpc.StatusCode.UNAUTHENTICATED
    assert plane.server.refusals["no-client-certificate"] == 2


async def test_a_certificate_from_another_ca_fails_the_handshake(
    plane: GrpcPlane, node: EnrollmentFiles, tmp_path: Path
) -> None:
    other = CertificateAuthority.load_or_create(tmp_path / "other-ca", now=datetime.now(UTC))
    key = generate_node_key()
    forged = other.issue_node_certificate(
        make_csr(key), node_id=node.node_id, fleet="gates", now=datetime.now(UTC)
    )
    credentials = NodeCredentials(private_key_pem(key), forged.pem, plane.services.ca.ca_pem)
    link = GrpcNodeLink(node_settings(plane.node_target), credentials)
    with pytest.raises(LinkUnavailableError):
        await link.connect(hello())
    await link.close()
    assert not plane.services.nodes.inventory.get_node(node.node_id).online


async def test_another_nodes_certificate_is_useless_without_its_key(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    stolen = NodeCredentials(
        private_key_pem(generate_node_key()), node.cert_path.read_bytes(), node.ca_path.read_bytes()
    )
    link = GrpcNodeLink(node_settings(plane.node_target), stolen)
    with pytest.raises(LinkUnavailableError):
        await link.connect(hello())
    await link.close()


async def test_a_node_speaks_only_as_itself(plane: GrpcPlane, tmp_path: Path) -> None:
    a = await plane.enroll(tmp_path / "a")
    b = await plane.enroll(tmp_path / "b")
    link_b = await connected(plane, b)
    link_a = await connected(plane, a)
    # There is no node id in any message: A's records can only be A's.
    records = [wire_record(1), wire_record(2)]
    await link_a.send(batch(records))
    await next_message(link_a)
    assert plane.services.records.record_ids(a.node_id) == {r.id for r in records}
    assert plane.services.records.record_ids(b.node_id) == set()
    await link_a.close()
    await link_b.close()


async def test_an_unknown_node_is_unauthenticated(plane: GrpcPlane, tmp_path: Path) -> None:
    # A certificate of the right CA for a node id the inventory never had.
    key = generate_node_key()
    issued = plane.services.ca.issue_node_certificate(
        make_csr(key), node_id="n-ffffffffffff", fleet="gates", now=datetime.now(UTC)
    )
    credentials = NodeCredentials(private_key_pem(key), issued.pem, plane.services.ca.ca_pem)
    link = GrpcNodeLink(node_settings(plane.node_target), credentials)
    with pytest.raises(LinkRefusedError) as info:
        await link.connect(hello())
    await link.close()
    assert info.value.fields == {"code": "UNAUTHENTICATED", "reason": "node-unknown"}
    assert plane.server.refusals["node-unknown"] == 1


async def test_a_revoked_node_is_cut_off_at_its_next_message(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = await connected(plane, node)
    plane.services.nodes.inventory.revoke(ADMIN, node.node_id)
    late = wire_record(1)
    await link.send(batch([late]))
    with pytest.raises(LinkRefusedError) as info:
        await next_message(link)
    assert info.value.fields == {"code": "PERMISSION_DENIED", "reason": "node-revoked"}
    assert plane.services.records.count(node.node_id) == 0
    # And it cannot come back; the refusal of its Hello keeps its reason every time
    # (the guard reads the Hello before refusing: a refusal meeting the write in
    # flight reached the node as a local INTERNAL with no reason).
    for _ in range(10):
        with pytest.raises(LinkRefusedError) as again:
            await link.connect(hello())
        assert again.value.fields == {"code": "PERMISSION_DENIED", "reason": "node-revoked"}
    await link.close()
    assert plane.server.refusals["node-revoked"] == 11
    assert not plane.services.nodes.inventory.get_node(node.node_id).online


async def test_a_stream_is_cut_once_its_certificate_expires(
    plane: GrpcPlane, node: EnrollmentFiles, plane_clock: ManualClock
) -> None:
    # The certificate is verified once, when the stream binds; the re-check reads the
    # expiry the inventory holds for that serial.
    link = await connected(plane, node)
    plane_clock.advance(timedelta(days=8))  # certificates live 7 days
    await link.send(batch([wire_record(1)]))
    with pytest.raises(LinkRefusedError) as info:
        await next_message(link)
    await link.close()
    assert info.value.fields == {"code": "UNAUTHENTICATED", "reason": "cert-expired"}
    assert plane.services.records.count(node.node_id) == 0


async def test_a_stream_is_cut_once_its_certificate_is_no_longer_the_nodes(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    # Renewed twice elsewhere: the stream's certificate is neither current nor previous.
    link = await connected(plane, node)
    for _ in range(2):
        plane.services.nodes.enrollment.renew(node.node_id, make_csr(generate_node_key()))
    await link.send(batch([wire_record(1)]))
    with pytest.raises(LinkRefusedError) as info:
        await next_message(link)
    await link.close()
    assert info.value.fields == {"code": "UNAUTHENTICATED", "reason": "cert-not-current"}
    assert plane.services.records.count(node.node_id) == 0


# ------------------------------------------------------------------------ Sync


async def test_a_resent_batch_is_acked_again_and_stored_once(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = await connected(plane, node)
    records = [wire_record(seq, kind=link_pb2.RECORD_KIND_HEALTH) for seq in range(1, 6)]
    for _ in range(2):  # the first ack was "lost": the node sends the batch again
        await link.send(batch(records))
        assert list((await next_message(link)).ack.record_ids) == [r.id for r in records]
    overlapping = [*records[3:], wire_record(6)]
    await link.send(batch(overlapping))
    assert list((await next_message(link)).ack.record_ids) == [r.id for r in overlapping]
    assert plane.services.records.count(node.node_id) == 6
    assert plane.services.records.count(node.node_id, "health") == 5
    await link.close()


async def test_a_malformed_batch_gets_no_ack_and_the_stream_stays(
    plane: GrpcPlane, node: EnrollmentFiles, caplog: pytest.LogCaptureFixture
) -> None:
    link = await connected(plane, node)
    bad = wire_record(1)
    bad.id = "not-a-uuid"
    with caplog.at_level(logging.WARNING):
        await link.send(batch([wire_record(2), bad]))
        good = wire_record(3)
        await link.send(batch([good]))
        # The first answer is the ack of the good batch: the bad one got none.
        assert list((await next_message(link)).ack.record_ids) == [good.id]
    assert plane.services.records.record_ids(node.node_id) == {good.id}
    assert plane.server.refusals["bad-batch"] == 1
    assert "not a lowercase UUID" in caplog.text
    await link.close()


async def test_heartbeat_and_update_status_are_recorded(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = await connected(plane, node)
    plane.services.nodes.presence.set_online(node.node_id, False)
    await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    await until(lambda: plane.services.nodes.inventory.get_node(node.node_id).online)
    status = link_pb2.UpdateStatus(
        target_path="models/d/2/model.onnx", phase="verifying", director_sequence=4
    )
    await link.send(node_message(update_status=status))
    await until(
        lambda: "update" in plane.services.nodes.inventory.get_node(node.node_id).reported_state
    )
    update = plane.services.nodes.inventory.get_node(node.node_id).reported_state["update"]
    assert update == {
        "target_path": "models/d/2/model.onnx",
        "phase": "verifying",
        "detail": "",
        "director_sequence": 4,
        "at": None,
        "reason": "",
        "facts": {},
    }
    await link.close()


async def test_the_first_message_must_be_a_hello(plane: GrpcPlane, node: EnrollmentFiles) -> None:
    async with plane.channel(credentials=_channel_credentials(node)) as channel:
        call = link_pb2_grpc.NodeLinkStub(channel).Sync()
        await call.write(node_message(heartbeat=link_pb2.Heartbeat()))
        assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(await call.trailing_metadata())["edgefleet-reason"] == "no-hello"


async def test_only_an_unsupported_protocol_version_is_refused(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    # The one version rule of the node inbox, as over MQTT: 0 (unset) is refused, a
    # newer version is read as the current one.
    async with plane.channel(credentials=_channel_credentials(node)) as channel:
        unset = link_pb2_grpc.NodeLinkStub(channel).Sync()
        await unset.write(link_pb2.NodeMessage(protocol_version=0, hello=hello()))
        assert await unset.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(await unset.trailing_metadata())["edgefleet-reason"] == "protocol-version"
        newer = link_pb2_grpc.NodeLinkStub(channel).Sync()
        await newer.write(link_pb2.NodeMessage(protocol_version=7, hello=hello("9.0.0")))
        assert dict(await newer.initial_metadata())["edgefleet-node-id"] == node.node_id
        newer.cancel()
    assert plane.server.refusals["protocol-version"] == 1
    assert plane.services.nodes.inventory.get_node(node.node_id).agent_version == "9.0.0"


async def test_malformed_protobuf_is_invalid_argument_and_the_server_keeps_serving(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    garbage = b"\xff\xff\xff\xff\x0f"  # an invalid tag: not a message
    async with plane.channel(credentials=_channel_credentials(node)) as channel:
        raw_sync = channel.stream_stream(
            SYNC, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        first = raw_sync()
        await first.write(garbage)
        assert await first.code() == grpc.StatusCode.INVALID_ARGUMENT
        # After a valid Hello, too.
        later = raw_sync()
        await later.write(node_message(hello=hello()).SerializeToString())
        await later.initial_metadata()
        await later.write(garbage)
        assert await later.code() == grpc.StatusCode.INVALID_ARGUMENT
        raw_fetch = channel.unary_unary(
            f"/{SERVICE_NAME}/FetchMetadata", request_serializer=lambda b: b
        )
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await raw_fetch(garbage, timeout=10)
        assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert plane.server.refusals["malformed-message"] == 3
    link = await connected(plane, node)  # still serving
    await link.close()


async def test_an_oversized_message_is_resource_exhausted(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    huge = batch([wire_record(1, payload=b"x" * (5 << 20))])
    link = await connected(plane, node)
    with pytest.raises(LinkRequestError):  # the node's own link refuses to send it
        await link.send(huge)
    await link.close()
    # A client without that check: the server refuses it.
    unbounded = plane.link(node, max_message_bytes=16 << 20)
    await unbounded.connect(hello())
    await unbounded.send(huge)
    with pytest.raises(LinkUnavailableError) as info:
        await next_message(unbounded)
    assert info.value.fields["code"] == "RESOURCE_EXHAUSTED"
    await unbounded.close()
    again = await connected(plane, node)  # the server is fine
    await again.close()


async def test_health_answers_on_both_ports_and_reflection_on_the_node_port_only(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    for port, credentials in (
        (plane.server.enroll_port, None),
        (plane.server.node_port, _channel_credentials(node)),
    ):
        async with plane.channel(port=port, credentials=credentials) as channel:
            checks = health_pb2_grpc.HealthStub(channel)
            for service in ("", SERVICE_NAME):
                answer = await checks.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            if port == plane.server.enroll_port:
                # No client certificate there: nothing is listed to an unknown caller. The
                # server refuses at once, so the refusal may already meet the write.
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await reflect.write(request)
                    await reflect.read()
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
                continue
            await reflect.write(request)
            listed = await reflect.read()
            await reflect.done_writing()
            names = {s.name for s in listed.list_services_response.service}
            assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


# --------------------------------------------------------------------- downlink


async def test_the_hub_pushes_commands_to_a_connected_node(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    hub = plane.server.hub
    command = link_pb2.ControlMessage(
        protocol_version=1, command=link_pb2.Command(name="resync", args={"why": "test"})
    )
    assert hub.send(node.node_id, command) is False  # not connected yet
    link = await connected(plane, node)
    assert hub.connected() == [node.node_id]
    assert hub.send(node.node_id, command) is True
    assert (await next_message(link)).command.name == "resync"
    # From a worker thread (where rollouts run their database work), too.
    sent: list[bool] = []
    worker = threading.Thread(target=lambda: sent.append(hub.send(node.node_id, command)))
    worker.start()
    while worker.is_alive():
        await asyncio.sleep(0.01)
    assert sent == [True]
    assert (await next_message(link)).command.args["why"] == "test"
    await link.close()
    await until(lambda: hub.connected() == [])
    assert hub.send(node.node_id, command) is False


async def test_a_newer_stream_of_the_same_node_supersedes_the_older(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    old = await connected(plane, node)
    new = await connected(plane, node)
    with pytest.raises(LinkUnavailableError) as info:
        await next_message(old)
    assert info.value.fields["reason"] == "superseded"
    # The older stream's end does not mark the node offline: the newer one holds it.
    await asyncio.sleep(0.2)
    assert plane.services.nodes.inventory.get_node(node.node_id).online
    assert plane.server.hub.connected() == [node.node_id]
    await old.close()
    await new.close()


async def test_renewal_over_the_link_gives_a_certificate_the_next_connect_uses(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = await connected(plane, node)
    key = generate_node_key()
    renewed = await link.renew_certificate(make_csr(key))
    identity = plane.services.ca.node_identity_from_certificate(
        renewed.certificate_pem, now=datetime.now(UTC)
    )
    assert identity.node_id == node.node_id
    node.key_path.write_bytes(private_key_pem(key))
    node.cert_path.write_bytes(renewed.certificate_pem)
    await link.connect(hello())  # reads the new files
    assert plane.services.nodes.inventory.get_node(node.node_id).cert_serial == identity.serial
    await link.close()


async def test_stopping_the_server_ends_streams_as_unavailable(
    link_services: Services, tmp_path: Path
) -> None:
    async with running_link(link_services) as plane:
        files = await plane.enroll(tmp_path / "node")
        link = await connected(plane, files)
        await plane.server.stop()
        await plane.server.stop()  # idempotent
        with pytest.raises(LinkUnavailableError):
            await next_message(link)
        with pytest.raises(LinkUnavailableError):
            await link.connect(hello())
        await link.close()


def _channel_credentials(files: EnrollmentFiles) -> grpc.ChannelCredentials:
    credentials = files.credentials()
    return grpc.ssl_channel_credentials(
        root_certificates=credentials.ca_pem,
        private_key=credentials.key_pem,
        certificate_chain=credentials.certificate_pem,
    )
