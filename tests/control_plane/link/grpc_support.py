"""A real gRPC link server on loopback ports, and nodes that enroll and talk to it.

Everything runs in the test's event loop (anyio on asyncio): the server, the nodes'
`GrpcNodeLink`s and the database calls the server makes in worker threads.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.link.grpc_server import GrpcLinkConfig, GrpcLinkServer
from control_plane.services import Services, grpc_link_server
from edge_node.enroll import EnrollmentFiles, enroll_over_grpc
from edge_node.link.base import node_message
from edge_node.link.grpc_link import GrpcLinkSettings, GrpcNodeLink
from protos.edgefleet.fleet.v1 import link_pb2
from tests.conftest import let_grpc_settle

ADMIN = RequestContext(Principal(token_id="admin", name="admin", role=Role.ADMIN), "req-admin")
FLEET = "gates"


@dataclass
class GrpcPlane:
    services: Services
    server: GrpcLinkServer
    fleet: str = FLEET

    @property
    def node_target(self) -> str:
        return f"127.0.0.1:{self.server.node_port}"

    @property
    def enroll_target(self) -> str:
        return f"127.0.0.1:{self.server.enroll_port}"

    def token(
        self, labels: dict[str, str] | None = None, ttl: timedelta = timedelta(hours=1)
    ) -> str:
        token, _ = self.services.nodes.tokens.create_bootstrap_token(
            ADMIN, self.fleet, labels or {}, ttl
        )
        return token

    async def enroll(self, directory: Path, token: str | None = None) -> EnrollmentFiles:
        return await enroll_over_grpc(
            self.enroll_target,
            self.services.ca.ca_pem,
            token or self.token(),
            "0.1.0",
            directory,
            server_name="localhost",
        )

    def link(self, files: EnrollmentFiles, **settings: Any) -> GrpcNodeLink:
        return GrpcNodeLink(node_settings(self.node_target, **settings), files.credentials)

    def channel(self, *, port: int | None = None, credentials: Any = None) -> Any:
        """A raw channel, for calls a well-behaved node never makes."""
        return grpc.aio.secure_channel(
            f"127.0.0.1:{port or self.server.node_port}",
            credentials or grpc.ssl_channel_credentials(self.services.ca.ca_pem),
            options=[("grpc.ssl_target_name_override", "localhost")],
        )


def node_settings(target: str, **overrides: Any) -> GrpcLinkSettings:
    values: dict[str, Any] = {
        "target": target,
        "server_name": "localhost",
        "connect_timeout_s": 5.0,
        "call_timeout_s": 10.0,
        "send_timeout_s": 5.0,
    }
    values.update(overrides)
    return GrpcLinkSettings(**values)


def ensure_fleet(services: Services, name: str = FLEET) -> None:
    if name not in {f.name for f in services.registry.list_fleets()}:
        services.registry.create_fleet(ADMIN, name)


@asynccontextmanager
async def running_link(
    services: Services, *, fleet: str = FLEET, **config: Any
) -> AsyncIterator[GrpcPlane]:
    """A started GrpcLinkServer on free loopback ports (revocation checked per message)."""
    ensure_fleet(services, fleet)
    values: dict[str, Any] = {
        "node_address": "127.0.0.1:0",
        "enroll_address": "127.0.0.1:0",
        "auth_recheck_s": 0.0,
    }
    values.update(config)
    server = grpc_link_server(services, GrpcLinkConfig(**values))
    await server.start()
    try:
        yield GrpcPlane(services, server, fleet)
    finally:
        await server.stop(0)
        await let_grpc_settle()


def hello(agent_version: str = "0.1.0", **fields: Any) -> link_pb2.Hello:
    return link_pb2.Hello(agent_version=agent_version, **fields)


def wire_record(seq: int, *, kind: int = link_pb2.RECORD_KIND_EVENT, payload: bytes = b"{}") -> Any:
    created = Timestamp()
    created.FromDatetime(datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=seq))
    return link_pb2.Record(
        id=str(uuid.uuid4()),
        seq=seq,
        kind=kind,  # type: ignore[arg-type]
        created_at=created,
        content_type="application/json",
        payload=payload,
    )


def batch(records: list[Any]) -> link_pb2.NodeMessage:
    return node_message(records=link_pb2.RecordBatch(records=records))


async def next_message(link: GrpcNodeLink, timeout: float = 10.0) -> link_pb2.ControlMessage:
    with anyio.fail_after(timeout):
        async for message in link.incoming():
            return message
    raise AssertionError("the stream ended without a message")  # pragma: no cover


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `condition` (it reads the database) until true, bounded."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)
