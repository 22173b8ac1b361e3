"""The `NodeLink` contract (edge_node/link/base.py): every test runs over every link.

The memory link is the fake the uplink's and the updater's tests stand on; here it has
to behave as the gRPC link against a real control plane and the MQTT link through a
real Mosquitto and the control plane's bridge do. What only one adapter does (chunk
offsets, topics, the Last Will) stays in that adapter's own tests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import anyio
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from edge_node.link.base import (
    LinkError,
    LinkNotFoundError,
    LinkRefusedError,
    LinkRequestError,
    LinkUnavailableError,
    NodeLink,
    node_message,
)
from edge_node.results.feed import encode_result
from protos.edgefleet.fleet.v1 import link_pb2
from tests.edge_node.link_contract._kits import LinkKit
from tests.edge_node.results.support import result

pytestmark = pytest.mark.anyio

# Every wait of the contract is bounded: a link that hangs fails the test.
WAIT_S = 15.0


def hello(agent_version: str = "0.1.0") -> link_pb2.Hello:
    return link_pb2.Hello(agent_version=agent_version)


def records(count: int, first_seq: int = 1) -> list[link_pb2.Record]:
    created = Timestamp()
    created.FromDatetime(datetime(2026, 12, 1, tzinfo=UTC))
    return [
        link_pb2.Record(
            id=str(uuid.uuid4()),
            seq=first_seq + n,
            kind=link_pb2.RECORD_KIND_EVENT,
            created_at=created,
            content_type="application/json",
            payload=b'{"n": %d}' % n,
        )
        for n in range(count)
    ]


def batch(items: list[link_pb2.Record]) -> link_pb2.NodeMessage:
    return node_message(records=link_pb2.RecordBatch(records=items))


async def acked(link: NodeLink, expected: set[str]) -> None:
    """Read `incoming()` until acks have named every id in `expected` (other messages
    skipped): the check itself, since past `WAIT_S` it fails the test (TimeoutError)."""
    seen: set[str] = set()
    with anyio.fail_after(WAIT_S):
        async for message in link.incoming():
            if message.WhichOneof("body") == "ack":
                seen.update(message.ack.record_ids)
            if expected <= seen:
                return
    raise AssertionError("incoming() ended without raising")


async def command(link: NodeLink) -> str:
    with anyio.fail_after(WAIT_S):
        async for message in link.incoming():
            if message.WhichOneof("body") == "command":
                return message.command.name
    raise AssertionError("incoming() ended without raising")


async def hello_seen(kit: LinkKit, agent_version: str) -> None:
    with anyio.fail_after(WAIT_S):
        while not await kit.hello_seen(agent_version):
            await anyio.sleep(0.02)


async def drain(messages: AsyncIterator[link_pb2.ControlMessage]) -> None:
    async for _ in messages:
        pass


@pytest.fixture
async def link(link_kit: LinkKit) -> AsyncIterator[NodeLink]:
    made = link_kit.link()
    try:
        yield made
    finally:
        await made.close()


# ----------------------------------------------------------------------------- connect


async def test_connect_delivers_the_hello(link_kit: LinkKit, link: NodeLink) -> None:
    await link.connect(hello("7.7.7"))
    await hello_seen(link_kit, "7.7.7")


async def test_send_and_incoming_need_a_connection(link: NodeLink) -> None:
    with pytest.raises(LinkUnavailableError):
        await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    with pytest.raises(LinkUnavailableError):
        await drain(link.incoming())


async def test_a_refused_node_is_told_so_and_not_asked_to_retry(link_kit: LinkKit) -> None:
    refused = link_kit.refused_link()
    try:
        with anyio.fail_after(WAIT_S), pytest.raises(LinkRefusedError):
            await refused.connect(hello())
    finally:
        await refused.close()


async def test_an_unreachable_control_plane_is_unavailable_within_a_bound(
    link_kit: LinkKit,
) -> None:
    nowhere = link_kit.unreachable_link()
    started = time.monotonic()
    try:
        with pytest.raises(LinkUnavailableError) as info:
            await nowhere.connect(hello())
        assert not isinstance(info.value, LinkRefusedError)
        with pytest.raises(LinkUnavailableError):
            await nowhere.send(node_message(heartbeat=link_pb2.Heartbeat()))
    finally:
        await nowhere.close()
    assert time.monotonic() - started < WAIT_S


async def test_a_control_plane_that_never_answers_is_unavailable_after_the_timeout(
    link_kit: LinkKit,
) -> None:
    silent = link_kit.silent_link(connect_timeout_s=0.5)
    started = time.monotonic()
    try:
        with anyio.fail_after(WAIT_S), pytest.raises(LinkUnavailableError) as info:
            await silent.connect(hello())
        assert not isinstance(info.value, LinkRefusedError)
    finally:
        await silent.close()
    assert 0.4 <= time.monotonic() - started < 5.0


# ----------------------------------------------------------------------------- records


async def test_records_are_acked_on_incoming_once_stored(link_kit: LinkKit, link: NodeLink) -> None:
    await link.connect(hello())
    sent = records(5)
    await link.send(batch(sent))
    await acked(link, {r.id for r in sent})
    # The ack means stored: the control plane holds every record by then.
    assert await link_kit.stored() == 5


async def test_records_of_every_kind_are_acked_once_stored(
    link_kit: LinkKit, link: NodeLink
) -> None:
    await link.connect(hello())
    sent = records(3)
    sent[1].kind = link_pb2.RECORD_KIND_HEALTH
    sent[2].kind = link_pb2.RECORD_KIND_RESULTS  # a sampled result, as the agent's feed sends
    sent[2].payload = encode_result(result("gate", 7, detections=2))
    await link.send(batch(sent))
    await acked(link, {r.id for r in sent})
    assert await link_kit.stored() == 3


async def test_a_resent_batch_is_acked_again_and_stored_once(
    link_kit: LinkKit, link: NodeLink
) -> None:
    await link.connect(hello())
    sent = records(3)
    ids = {r.id for r in sent}
    await link.send(batch(sent))
    await acked(link, ids)
    await link.send(batch(sent))  # the node did not see the ack: it resends
    await acked(link, ids)
    assert await link_kit.stored() == 3


# ----------------------------------------------------------------------------- downlink


async def test_a_command_from_the_control_plane_arrives_on_incoming(
    link_kit: LinkKit, link: NodeLink
) -> None:
    await link.connect(hello())
    await link_kit.send_command("resync")
    assert await command(link) == "resync"


# ----------------------------------------------------------------------------- outages


async def test_the_link_breaks_when_the_control_plane_goes_and_reconnects_when_back(
    link_kit: LinkKit, link: NodeLink
) -> None:
    await link.connect(hello())
    await link_kit.go_down()
    with anyio.fail_after(WAIT_S), pytest.raises(LinkUnavailableError):
        await drain(link.incoming())
    with anyio.fail_after(WAIT_S), pytest.raises(LinkUnavailableError):
        await link.connect(hello())
    await link_kit.come_back()
    with anyio.fail_after(WAIT_S):
        await link.connect(hello())
    sent = records(2)
    await link.send(batch(sent))
    await acked(link, {r.id for r in sent})


async def test_connect_again_replaces_the_connection(link_kit: LinkKit, link: NodeLink) -> None:
    await link.connect(hello())
    await link.connect(hello("0.2.0"))
    sent = records(1)
    await link.send(batch(sent))
    await acked(link, {r.id for r in sent})
    await hello_seen(link_kit, "0.2.0")


# ----------------------------------------------------------------------------- close


async def test_close_is_idempotent_and_ends_the_link(link: NodeLink) -> None:
    await link.close()  # before any connect
    await link.connect(hello())
    await link.close()
    await link.close()
    with pytest.raises(LinkUnavailableError):
        await link.send(node_message(heartbeat=link_pb2.Heartbeat()))
    with pytest.raises(LinkUnavailableError):
        await drain(link.incoming())


async def test_close_ends_a_waiting_incoming(link: NodeLink) -> None:
    await link.connect(hello())
    outcome: list[BaseException] = []
    reading = anyio.Event()

    async def read() -> None:
        try:
            messages = link.incoming()
            # Nothing awaits between this and the iteration's first wait for a message.
            reading.set()
            async for _ in messages:
                pass
        except LinkError as exc:
            outcome.append(exc)

    with anyio.fail_after(WAIT_S):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            await reading.wait()
            # Every task, the reader's too, waits now: the reader inside `incoming()`.
            await anyio.wait_all_tasks_blocked()
            assert outcome == []  # it is still waiting, not ended by itself
            await link.close()
    assert len(outcome) == 1 and isinstance(outcome[0], LinkUnavailableError)


# ----------------------------------------------------------------------------- downloads


async def test_a_missing_file_is_a_request_error_and_the_link_stays_up(
    link_kit: LinkKit, link: NodeLink
) -> None:
    await link.connect(hello())
    with pytest.raises(LinkRequestError) as metadata:
        await link.fetch_metadata("99.root.json")
    with pytest.raises(LinkRequestError) as artifact:
        async for _ in link.fetch_artifact("models/none/1/model.onnx", "0" * 64):
            pass
    if link_kit.has_repository:
        assert isinstance(metadata.value, LinkNotFoundError)
        assert isinstance(artifact.value, LinkNotFoundError)
    sent = records(1)
    await link.send(batch(sent))
    await acked(link, {r.id for r in sent})
