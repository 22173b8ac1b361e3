"""Certificate renewal on the node against the real gRPC link (both database backends):
due and not before, the new pair authenticates the next Sync, crashes at every write
leave a pair the control plane accepts, and a revoked node is refused for good.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from control_plane.clock import ManualClock as PlaneClock
from control_plane.services import ServiceConfig, Services, build_services
from edge_node import identity
from edge_node.clock import ManualClock
from edge_node.enroll import EnrollmentFiles, key_matches_certificate
from edge_node.identity import (
    RenewalConfig,
    RenewalRefusedError,
    recover_pending_renewal,
    renew_if_due,
    renewal_due_at,
    run_renewal,
)
from edge_node.link.base import Backoff, LinkRefusedError, LinkUnavailableError
from edge_node.link.grpc_link import GrpcNodeLink, NodeCredentials
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


class Crash(BaseException):
    """The process dies here: nothing after it runs, no cleanup."""


class CountingClock(ManualClock):
    """The node's clock, counting how often the renewal loop looked at it."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.reads = 0

    def now(self) -> datetime:
        self.reads += 1
        return super().now()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def link_services(service_config: ServiceConfig) -> Iterator[Services]:
    # Real "now": TLS checks certificate validity against the wall clock.
    built = build_services(service_config, clock=PlaneClock(datetime.now(UTC)))
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
    return await plane.enroll(tmp_path / "node")


def due(files: EnrollmentFiles) -> datetime:
    return renewal_due_at(files.cert_path.read_bytes())


def serial_of(plane: GrpcPlane, certificate: bytes) -> str:
    now = plane.services.clock.now()
    return plane.services.ca.node_identity_from_certificate(certificate, now=now).serial


def pair(files: EnrollmentFiles) -> tuple[bytes, bytes]:
    return files.key_path.read_bytes(), files.cert_path.read_bytes()


def no_pending(files: EnrollmentFiles) -> bool:
    return not files.pending_key_path.exists() and not files.pending_cert_path.exists()


async def synced(plane: GrpcPlane, link: GrpcNodeLink) -> None:
    """The link connects and a batch is acked: the control plane took the certificate."""
    await link.connect(hello())
    record = wire_record(1)
    await link.send(batch([record]))
    assert list((await next_message(link)).ack.record_ids) == [record.id]


async def test_renewal_happens_when_due_and_not_before_and_the_new_pair_authenticates(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = plane.link(node)
    await link.connect(hello())
    enrolled = pair(node)
    due_at = due(node)

    assert await renew_if_due(link, node, due_at - timedelta(seconds=1)) is None
    assert pair(node) == enrolled

    renewed = await renew_if_due(link, node, due_at)
    assert renewed is not None
    key, cert = pair(node)
    assert key != enrolled[0] and cert != enrolled[1]  # a new key, not just a new cert
    assert key_matches_certificate(key, cert)
    assert node.key_path.stat().st_mode & 0o777 == 0o600
    assert no_pending(node)
    assert renewed.serial == int(serial_of(plane, cert), 16)
    assert plane.services.nodes.inventory.get_node(node.node_id).cert_serial == serial_of(
        plane, cert
    )

    # The open stream (on the old certificate) was ended; the reconnect uses the new pair.
    with pytest.raises(LinkUnavailableError):
        await next_message(link)
    await synced(plane, link)

    # Once more: now the enrollment certificate is pushed out (current and previous are
    # the two renewed ones), and only the pair on disk still gets in.
    assert await renew_if_due(link, node, due(node)) is not None
    await synced(plane, link)
    old = GrpcNodeLink(
        node_settings(plane.node_target),
        NodeCredentials(enrolled[0], enrolled[1], node.ca_path.read_bytes()),
    )
    with pytest.raises(LinkRefusedError) as refused:
        await old.connect(hello())
    assert refused.value.fields["reason"] == "cert-not-current"
    await old.close()
    await link.close()


async def test_a_crash_between_the_two_renames_leaves_a_pair_that_authenticates(
    plane: GrpcPlane, node: EnrollmentFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = plane.link(node)
    enrolled = pair(node)
    real_replace = Path.replace

    def replace(self: Path, target: Any) -> Path:
        if self == node.pending_cert_path and Path(target) == node.cert_path:
            raise Crash  # node.key is new already, node.crt still old
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    with pytest.raises(Crash):
        await renew_if_due(link, node, due(node))
    monkeypatch.undo()
    await link.close()

    key, cert = pair(node)
    staged = node.pending_cert_path.read_bytes()
    assert key != enrolled[0] and cert == enrolled[1]  # mismatched on disk...
    credentials = node.credentials()  # ...yet read as a pair
    assert (credentials.key_pem, credentials.certificate_pem) == (key, staged)

    # The restarted node connects with it before any recovery ran.
    restarted = plane.link(node)
    await synced(plane, restarted)
    assert plane.services.nodes.inventory.get_node(node.node_id).cert_serial == serial_of(
        plane, staged
    )
    assert recover_pending_renewal(node) is identity.Recovery.COMPLETED
    assert pair(node) == (key, staged) and no_pending(node)
    await synced(plane, restarted)
    await restarted.close()


async def test_renewals_whose_answers_were_lost_leave_the_old_certificate_working(
    plane: GrpcPlane, node: EnrollmentFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = plane.link(node)
    enrolled = pair(node)
    real_write = identity.atomic_write

    def dies_before_staging_the_certificate(path: Path, data: bytes, *, mode: int = 0o644) -> None:
        if path == node.pending_cert_path:
            raise Crash
        real_write(path, data, mode=mode)

    monkeypatch.setattr(identity, "atomic_write", dies_before_staging_the_certificate)
    for _ in range(2):  # two lost answers in a row
        with pytest.raises(Crash):
            await renew_if_due(link, node, due(node))
        assert pair(node) == enrolled
    monkeypatch.undo()

    # The control plane issued two certificates the node never stored; the one it holds
    # still works, because each renewal was authenticated with it.
    await synced(plane, link)
    assert await renew_if_due(link, node, due(node)) is not None
    assert no_pending(node)
    await synced(plane, link)
    await link.close()


async def test_a_revoked_nodes_renewal_is_refused_with_a_clear_error(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = plane.link(node)
    enrolled = pair(node)
    plane.services.nodes.inventory.revoke(ADMIN, node.node_id)

    with pytest.raises(RenewalRefusedError) as refused:
        await renew_if_due(link, node, due(node))
    assert refused.value.fields["reason"] == "node-revoked"
    assert "enrolled again" in refused.value.message
    assert isinstance(refused.value, LinkRefusedError)  # callers that stop on refusals stop
    assert pair(node) == enrolled and no_pending(node)
    await link.close()


async def test_the_renewal_loop_follows_the_clock_and_stops_when_refused(
    plane: GrpcPlane, node: EnrollmentFiles
) -> None:
    link = plane.link(node)
    clock = CountingClock(datetime.now(UTC))
    config = RenewalConfig(check_interval_s=0.02, backoff=Backoff(initial_s=0.02, cap_s=0.05))
    enrolled = pair(node)
    stop = anyio.Event()
    ended: list[BaseException] = []

    async def renewing() -> None:
        try:
            await run_renewal(link, node, stop, clock=clock, config=config)
        except RenewalRefusedError as exc:
            ended.append(exc)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(renewing)
        await until(lambda: clock.reads >= 10)  # it looked several times: not due yet
        assert pair(node) == enrolled

        clock.advance(due(node) - clock.now())
        await until(lambda: pair(node)[1] != enrolled[1])
        assert key_matches_certificate(*pair(node))

        plane.services.nodes.inventory.revoke(ADMIN, node.node_id)
        await until(lambda: bool(ended))  # the loop gave up by itself
    assert ended[0].fields["reason"] == "node-revoked"
    await link.close()
