"""A real control plane (gRPC link, SQLite) for agent tests, and node configs that use it.

Tests may import `control_plane`; the agent under test does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread

from control_plane.services import ServiceConfig, build_services
from edge_node.config import AgentConfig
from edge_node.link.base import Backoff
from edge_node.link.uplink import UplinkConfig
from tests.control_plane.link.grpc_support import GrpcPlane, node_settings, running_link

FAST_UPLINK = UplinkConfig(
    idle_poll_s=0.02, heartbeat_s=0.5, ack_timeout_s=3.0, backoff=Backoff(0.05, 0.5)
)


@asynccontextmanager
async def control_plane(tmp_path: Path) -> AsyncIterator[GrpcPlane]:
    data = tmp_path / "server"
    config = ServiceConfig(
        data_dir=data,
        database_url=f"sqlite:///{tmp_path / 'edgefleet.db'}",
        artifacts_url=(data / "artifacts").as_uri(),
        refresh_interval_s=3600,
    )
    services = await anyio.to_thread.run_sync(build_services, config)
    try:
        async with running_link(services) as plane:
            yield plane
    finally:
        services.close()


def write_ca(plane: GrpcPlane, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fleet-ca.pem"
    path.write_bytes(plane.services.ca.ca_pem)
    return path


def agent_config(plane: GrpcPlane, data_dir: Path, **overrides: Any) -> AgentConfig:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "link": node_settings(plane.node_target),
        "enroll_address": plane.enroll_target,
        "bootstrap_token": plane.token(),
        "ca_file": write_ca(plane, data_dir.parent / "operator"),
        "health_interval_s": 0.2,
        "shutdown_deadline_s": 5.0,
        "uplink": FAST_UPLINK,
    }
    values.update(overrides)
    return AgentConfig(**values)
