"""A whole control plane (REST + gRPC) with a signed fleet, and node agents that update
from it: the fixtures of the end-to-end update tests.

The fleet `parks` gets `det` 1.0.0 and 1.1.0 (`sample_models.tiny_detector`, input
[1,3,32,32]) pushed and signed as an operator does; more versions can be pushed and
revoked. Tests may import `control_plane`; the agent under test does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import numpy as np
import pytest
from securesystemslib.signer import Signer
from tuf.api.metadata import Metadata, Targets, Timestamp

from control_plane.cli.client import ApiClient
from control_plane.cli.main import main as cli_main
from control_plane.cli.release import ReleaseClient
from control_plane.clock import Clock
from control_plane.director.assignments import sign_assignment
from control_plane.registry import sample_models
from control_plane.services import ServiceConfig
from control_plane.trust.keys import OperatorKeyset, init_operator_keys
from edge_node.agent import Agent
from edge_node.config import AgentConfig
from edge_node.link.base import Backoff
from edge_node.link.uplink import UplinkConfig
from edge_node.runtime.config import RuntimeConfig, StreamConfig
from edge_node.testing.update_world import fragile_model_bytes
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.watchdog import WatchdogConfig
from protos.bundle.spec import RuntimeSpec
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.link.desired_support import FLEET, RunningPlane, running_plane
from tests.control_plane.link.grpc_support import ADMIN, node_settings

MODEL = "det"
SIZE = 32
FAST_UPLINK = UplinkConfig(
    idle_poll_s=0.02, heartbeat_s=0.5, ack_timeout_s=3.0, backoff=Backoff(0.05, 0.5)
)
QUICK_WATCH = WatchdogConfig(
    window_s=1.0, max_errors=3, max_error_ratio=0.5, min_frames=10, poll_s=0.05
)


def target_path(version: str) -> str:
    return f"models/{MODEL}/{version}/model.onnx"


@dataclass
class UpdateStatuses:
    """Every UpdateStatus the control plane stored, per node, in order."""

    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def of(self, node_id: str) -> list[dict[str, Any]]:
        return list(self.seen.get(node_id, []))

    def phases(self, node_id: str) -> list[tuple[str, str]]:
        return [(s["phase"], s["target_path"]) for s in self.of(node_id)]


@dataclass
class FleetPlane:
    running: RunningPlane
    keyset: OperatorKeyset
    workdir: Path
    statuses: UpdateStatuses
    sha256: dict[str, str] = field(default_factory=dict)

    @property
    def services(self) -> Any:
        return self.running.services

    def _release(self, do: Callable[[ReleaseClient], Any]) -> Any:
        with ApiClient(self.running.url, self.running.admin_token) as api:
            return do(ReleaseClient(api, self.keyset))

    async def push(
        self,
        model: Path,
        version: str,
        reference_input: Path | None = None,
        runtime: RuntimeSpec | None = None,
    ) -> None:
        """Push `version` as the operator does; with `runtime`, how it is run (signed with
        it: preprocessing, decoder, labels)."""

        def push(release: ReleaseClient) -> None:
            release.push_model(
                FLEET,
                model,
                name=MODEL,
                version=version,
                reference_input=reference_input,
                runtime=runtime,
            )

        await anyio.to_thread.run_sync(self._release, push)
        self.sha256[version] = hashlib.sha256(model.read_bytes()).hexdigest()

    async def push_signed_by(self, signer: Signer, model: Path, version: str) -> None:
        """A push whose targets metadata is signed by `signer` instead of the fleet's
        release key (the operator's own checks pass: they are about the fleet's root)."""
        keyset = _MisSigningKeyset(
            self.keyset.root_signers,
            self.keyset.root_threshold,
            self.keyset.release_signer,
            self.keyset.root_public_keys,
            signer,
        )

        def push() -> None:
            with ApiClient(self.running.url, self.running.admin_token) as api:
                ReleaseClient(api, keyset).push_model(FLEET, model, name=MODEL, version=version)

        await anyio.to_thread.run_sync(push)
        self.sha256[version] = hashlib.sha256(model.read_bytes()).hexdigest()

    def signed_for(
        self, signer: Signer, node_id: str, version: str, sequence: int
    ) -> SignedDirectorAssignment:
        """A well-formed assignment of `version` to `node_id`, valid for an hour, signed by
        `signer` (which the node may or may not trust)."""
        info = self.services.registry.get_version(FLEET, MODEL, version)
        now = datetime.now(UTC)
        return sign_assignment(
            signer,
            fleet=FLEET,
            node_id=node_id,
            sequence=sequence,
            target_path=info.target_path,
            sha256=info.sha256,
            length=info.length,
            issued_at=now,
            expires_at=now + timedelta(hours=1),
        )

    def deliver(self, node_id: str, signed: SignedDirectorAssignment) -> None:
        """Hand `signed` to the node over its live link, as a pin (or its Hello) does."""
        assert self.services.delivery.deliver(node_id, FLEET, signed), "node not connected"

    def timestamp_expires(self) -> datetime:
        """When the fleet's current timestamp.json expires."""
        data = self.services.registry.metadata_file(FLEET, "timestamp.json")
        expires: datetime = Metadata[Timestamp].from_bytes(data).signed.expires
        return expires

    async def revoke(self, version: str) -> None:
        """Raise the model's signed floor above `version`."""
        await anyio.to_thread.run_sync(
            self._release, lambda release: release.revoke(FLEET, MODEL, version)
        )

    async def pin(self, node_id: str, version: str) -> dict[str, Any]:
        """`edgefleet nodes pin` through the live REST API."""
        headers = {"Authorization": f"Bearer {self.running.admin_token}"}
        async with httpx.AsyncClient(base_url=self.running.url, headers=headers) as http:
            response = await http.post(
                f"/v1/nodes/{node_id}/pin", json={"model": MODEL, "version": version}
            )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def token(self) -> str:
        token, _ = self.services.nodes.tokens.create_bootstrap_token(
            ADMIN, FLEET, {}, timedelta(hours=1)
        )
        return str(token)

    def ca_file(self) -> Path:
        path = self.workdir / "fleet-ca.pem"
        path.write_bytes(self.services.ca.ca_pem)
        return path

    def node_config(self, data_dir: Path, **overrides: Any) -> AgentConfig:
        """An agent with one camera stream and a one-second watchdog window."""
        values: dict[str, Any] = {
            "data_dir": data_dir,
            "link": node_settings(self.running.node_target),
            "enroll_address": self.running.enroll_target,
            "bootstrap_token": self.token(),
            "ca_file": self.ca_file(),
            "health_interval_s": 0.5,
            "shutdown_deadline_s": 5.0,
            "uplink": FAST_UPLINK,
            "runtime": RuntimeConfig(streams=(StreamConfig("cam", target_fps=200),)),
            "updater": UpdaterConfig(watchdog=QUICK_WATCH, selftest_latency_budget_s=5.0),
        }
        values.update(overrides)
        return AgentConfig(**values)

    def reported(self, node_id: str) -> dict[str, Any]:
        state: dict[str, Any] = self.services.nodes.inventory.get_node(node_id).reported_state or {}
        return state


@asynccontextmanager
async def fleet_plane(
    config: ServiceConfig, workdir: Path, *, clock: Clock | None = None
) -> AsyncIterator[FleetPlane]:
    """A running control plane (on `clock`) whose fleet holds det 1.0.0 and 1.1.0, and a
    record of every update status it stores."""
    workdir.mkdir(parents=True, exist_ok=True)
    async with running_plane(config, clock=clock) as running:
        keyset = await anyio.to_thread.run_sync(
            lambda: init_operator_keys(
                workdir / "keys", root_keys=1, root_threshold=1, passphrase=None
            )
        )
        statuses = UpdateStatuses()
        nodes = running.services.nodes
        record = nodes.presence.record_update_status

        def recording(node_id: str, status: Any, now: Any = None) -> Any:
            node = record(node_id, status, now)
            statuses.seen.setdefault(node_id, []).append(dict(status))
            return node

        nodes.presence.record_update_status = recording  # the gRPC server calls it per message
        plane = FleetPlane(running, keyset, workdir, statuses)
        await anyio.to_thread.run_sync(plane._release, lambda release: release.create_fleet(FLEET))
        for seed, version in enumerate(("1.0.0", "1.1.0")):
            model = sample_models.tiny_detector(workdir / f"det-{version}.onnx", seed=seed)
            await plane.push(model, version)
        yield plane


@dataclass(frozen=True)
class _MisSigningKeyset(OperatorKeyset):
    wrong_signer: Signer | None = None

    def sign_targets(self, md: Metadata[Targets]) -> None:
        assert self.wrong_signer is not None
        md.sign(self.wrong_signer, append=False)


@dataclass
class FreshnessDuty:
    """The control plane's freshness loop (`app.py` re-signs what nears expiry on a
    schedule), run by the test at test speed so that it can be frozen and thawed."""

    fp: FleetPlane
    interval_s: float = 0.1
    frozen: bool = False
    resigned: int = 0
    _busy: bool = False

    async def run(self) -> None:
        while True:
            if not self.frozen:
                self._busy = True
                try:
                    refresh = self.fp.services.registry.refresh_expiring
                    self.resigned += len(await anyio.to_thread.run_sync(refresh))
                finally:
                    self._busy = False
            await anyio.sleep(self.interval_s)

    async def freeze(self) -> None:
        """Stop re-signing; returns once a re-signing in progress is done."""
        self.frozen = True
        await until(lambda: not self._busy)


@asynccontextmanager
async def freshness_duty(fp: FleetPlane, interval_s: float = 0.1) -> AsyncIterator[FreshnessDuty]:
    duty = FreshnessDuty(fp, interval_s)
    async with anyio.create_task_group() as group:
        group.start_soon(duty.run)
        try:
            yield duty
        finally:
            group.cancel_scope.cancel()


def node_of(agent: Agent) -> str:
    assert agent.files is not None
    return agent.files.node_id


def cli(fp: FleetPlane, *argv: str) -> int:
    """`edgefleet ARGV` as the admin, against the running control plane."""
    running = fp.running
    return cli_main(["--server", running.url, "--token", running.admin_token, *argv])


async def run_cli(fp: FleetPlane, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`edgefleet ARGV` (in a thread: the server runs on this loop); its stdout."""
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(cli, fp, *argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


async def until(condition: Callable[[], object], timeout: float = 20.0) -> None:
    """Poll `condition` (it may read the database) until true, bounded."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


# ------------------------------------------------------------- models that misbehave


def fragile_model(path: Path) -> Path:
    """`edge_node.testing.update_world.fragile_model_bytes` for det's [1,3,32,32] input:
    passes its self-test, then fails on a camera frame with a white pixel."""
    path.write_bytes(fragile_model_bytes((1, 3, SIZE, SIZE)))
    return path


def frame(value: int) -> np.ndarray[Any, Any]:
    """A camera frame (HxWx3 uint8) of one grey level."""
    return np.full((SIZE, SIZE, 3), value, dtype=np.uint8)
