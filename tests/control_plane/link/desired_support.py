"""Desired-state tests end to end: a whole control plane (REST + gRPC and/or the MQTT
bridge, one event loop), a fleet with real signed models, and the node's own checks.

The node verifies with nothing but what it got at enrollment (the director key and the
fleet's first TUF root) and TUF metadata it refreshed itself with python-tuf.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.to_thread
from securesystemslib.signer import Key
from tuf.ngclient import Updater

from control_plane.cli.client import ApiClient
from control_plane.cli.release import ReleaseClient
from control_plane.clock import Clock
from control_plane.link.grpc_server import GrpcLinkConfig
from control_plane.registry import sample_models
from control_plane.server import ControlPlane
from control_plane.services import ServiceConfig, Services, build_services
from control_plane.trust.keys import init_operator_keys
from edge_node.updater.director import TargetInfo, VerifiedAssignment, verify_assignment
from protos.edgefleet.fleet.v1 import link_pb2
from tests.conftest import free_port

FLEET = "parks"


@dataclass
class RunningPlane:
    services: Services
    plane: ControlPlane
    url: str

    @property
    def admin_token(self) -> str:
        return self.services.admin_token_file.read_text().strip()

    @property
    def node_target(self) -> str:
        assert self.plane.link is not None
        return f"127.0.0.1:{self.plane.link.node_port}"

    @property
    def enroll_target(self) -> str:
        assert self.plane.link is not None
        return f"127.0.0.1:{self.plane.link.enroll_port}"


@asynccontextmanager
async def running_plane(
    config: ServiceConfig, *, grpc: bool = True, clock: Clock | None = None
) -> AsyncIterator[RunningPlane]:
    """A started ControlPlane on free loopback ports; gRPC with `grpc`, MQTT when
    `config.mqtt` is set; on `clock` (default: the system's)."""
    services = await anyio.to_thread.run_sync(lambda: build_services(config, clock=clock))
    port = free_port()
    link = (
        GrpcLinkConfig(node_address="127.0.0.1:0", enroll_address="127.0.0.1:0") if grpc else None
    )
    plane = ControlPlane(
        services,
        host="127.0.0.1",
        port=port,
        grpc=link,
        log_level="warning",
        run_background=False,
    )
    await plane.start()
    try:
        yield RunningPlane(services, plane, f"http://127.0.0.1:{port}")
    finally:
        await plane.stop()
        services.close()


def publish_fleet(url: str, admin_token: str, workdir: Path) -> None:
    """Fleet `parks` with `det` 1.0.0 and 1.1.0, pushed and signed as an operator does."""
    keyset = init_operator_keys(workdir / "keys", root_keys=1, root_threshold=1, passphrase=None)
    with ApiClient(url, admin_token) as api:
        release = ReleaseClient(api, keyset)
        release.create_fleet(FLEET)
        for seed, version in enumerate(("1.0.0", "1.1.0")):
            model = sample_models.tiny_detector(workdir / f"det-{version}.onnx", seed=seed)
            release.push_model(FLEET, model, name="det", version=version)


def tuf_view(url: str, trusted_root: bytes, workdir: Path) -> Updater:
    """The node's view of the fleet's targets, refreshed from its enrollment root."""
    (workdir / "meta").mkdir(parents=True)
    (workdir / "targets").mkdir()
    base = f"{url}/v1/fleets/{FLEET}/tuf"
    updater = Updater(
        metadata_dir=str(workdir / "meta"),
        metadata_base_url=f"{base}/metadata/",
        target_base_url=f"{base}/targets/",
        target_dir=str(workdir / "targets"),
        bootstrap=trusted_root,
    )
    updater.refresh()
    return updater


def node_accepts(
    message: link_pb2.ControlMessage,
    *,
    director_key: Key,
    node_id: str,
    view: Updater,
    last_sequence: int = 0,
) -> VerifiedAssignment:
    """The node's checks of a DesiredState it received (raises if it refuses it)."""
    assert message.WhichOneof("body") == "desired", message

    def target(path: str) -> TargetInfo | None:
        info = view.get_targetinfo(path)
        if info is None:
            return None
        return TargetInfo(info.path, info.hashes["sha256"], info.length, info.custom)

    def floor(model: str) -> int:
        info = view.get_targetinfo(f"floors/{model}.json")
        return 0 if info is None else int(info.custom["floor"])

    return verify_assignment(
        message.desired.assignment,
        director_key=director_key,
        node_id=node_id,
        fleet=FLEET,
        last_sequence=last_sequence,
        now=datetime.now(UTC),
        target_lookup=target,
        floor_lookup=floor,
    )
