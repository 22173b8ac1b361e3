"""A fleet's TUF repository and director in memory, for tests of the updater.

The control plane's own helpers build the fleet's repository (tests may import
control_plane; the product code may not): root, targets with two model versions, their
reference pairs and a floor, snapshot and timestamp, served through MemoryLinkPeer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Snapshot, Timestamp

from control_plane.director.assignments import sign_assignment
from control_plane.trust import repository as repo
from control_plane.trust.custom import model_target_path
from edge_node.clock import ManualClock
from edge_node.testing.memory_link import MemoryLinkPeer, MemoryNodeLink
from edge_node.updater.journal import Journal, JournalState, Phase
from edge_node.updater.reconciler import (
    OutcomeKind,
    Reconciler,
    ReconcilerLimits,
    UpdateReport,
)
from edge_node.updater.selftest import SelfTestResult, self_test
from edge_node.updater.store import DiskUsage, ModelStore
from edge_node.updater.tuf_fetch import TufClient
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.trust.helpers import MONTH, Fleet
from tests.edge_node.updater._models import model_bytes, reference_bytes

NODE = "n-0123456789ab"
FLEET = "gates"
MODEL = "det"


class Crash(BaseException):
    """Stands for SIGKILL: not an Exception, so no revert runs."""


@dataclass
class Release:
    version: str
    path: str
    data: bytes
    sha256: str


@dataclass
class World:
    tmp: Path
    fleet: Fleet
    peer: MemoryLinkPeer
    director: CryptoSigner
    releases: dict[str, Release] = field(default_factory=dict)
    snapshot: Metadata[Snapshot] | None = None
    timestamp: Metadata[Timestamp] | None = None
    sequence: int = 0
    free: int = 10**12
    reports: list[UpdateReport] = field(default_factory=list)
    activated: list[Path] = field(default_factory=list)

    def release(
        self,
        version: str,
        add: float,
        counter: int,
        *,
        reference_add: float | None = None,
        content: bytes | None = None,
    ) -> Release:
        data = content if content is not None else model_bytes(self.tmp, add)
        ref = reference_bytes(self.tmp, add if reference_add is None else reference_add)
        self.fleet.release_model(MODEL, version, counter, content=data, reference=ref)
        self.publish()
        rel = Release(
            version, model_target_path(MODEL, version), data, hashlib.sha256(data).hexdigest()
        )
        self.releases[version] = rel
        return rel

    def raise_floor(self, floor: int) -> None:
        md, content = repo.raise_floor(self.fleet.targets, MODEL, floor, self.fleet.now + MONTH)
        self.fleet.artifacts[hashlib.sha256(content).hexdigest()] = content
        md.sign(self.fleet.release)
        self.fleet.accept(md)
        self.publish()

    def publish(self) -> None:
        targets = self.fleet.targets
        now = self.fleet.now
        self.peer.metadata[f"{targets.signed.version}.targets.json"] = repo.to_bytes(targets)
        snapshot = repo.make_snapshot(targets, previous=self.snapshot, expires=now + MONTH)
        snapshot.sign(self.fleet.snapshot)
        timestamp = repo.make_timestamp(
            snapshot.signed.version, previous=self.timestamp, expires=now + MONTH
        )
        timestamp.sign(self.fleet.timestamp)
        self.peer.metadata[f"{snapshot.signed.version}.snapshot.json"] = repo.to_bytes(snapshot)
        self.peer.metadata["timestamp.json"] = repo.to_bytes(timestamp)
        self.snapshot, self.timestamp = snapshot, timestamp
        self.peer.artifacts.update(self.fleet.artifacts)

    def assign(
        self,
        rel: Release,
        *,
        node_id: str = NODE,
        sequence: int | None = None,
        length: int | None = None,
    ) -> SignedDirectorAssignment:
        if sequence is None:
            self.sequence += 1
            sequence = self.sequence
        now = self.fleet.now
        return sign_assignment(
            self.director,
            fleet=FLEET,
            node_id=node_id,
            sequence=sequence,
            target_path=rel.path,
            sha256=rel.sha256,
            length=len(rel.data) if length is None else length,
            issued_at=now - timedelta(minutes=1),
            expires_at=now + timedelta(hours=1),
        )

    @property
    def store(self) -> ModelStore:
        return ModelStore(
            self.tmp / "node" / "models",
            disk_usage=lambda _: DiskUsage(10**13, 0, self.free),
        )

    @property
    def journal(self) -> Journal:
        return Journal(self.tmp / "node" / "journal.json", ManualClock(self.fleet.now))

    def reconciler(
        self,
        *,
        link: MemoryNodeLink | None = None,
        selftest: Callable[[Path, Path, float, float], SelfTestResult] | None = None,
        activate: Callable[[Path], Any] | None = None,
        store: ModelStore | None = None,
        watchdog_s: float = 0.0,
    ) -> Reconciler:
        link = link or MemoryNodeLink(self.peer)
        tuf = TufClient(
            link,
            asyncio.get_running_loop(),
            metadata_dir=self.tmp / "node" / "tuf",
            trusted_root=self.tmp / "node" / "tuf-root.json",
        )

        async def default_activate(path: Path) -> None:
            self.activated.append(path)

        async def report(report: UpdateReport) -> None:
            self.reports.append(report)

        def default_selftest(model: Path, ref: Path, atol: float, rtol: float) -> SelfTestResult:
            return self_test(
                model, ref, atol=atol, rtol=rtol, latency_budget_s=5.0, memory_budget_bytes=1 << 34
            )

        return Reconciler(
            journal=self.journal,
            store=store or self.store,
            link=link,
            tuf_client_factory=tuf.refresh,
            director_key=self.director.public_key,
            node_id=NODE,
            fleet=FLEET,
            clock=ManualClock(self.fleet.now),
            selftest=selftest or default_selftest,
            activate=activate or default_activate,
            report=report,
            limits=ReconcilerLimits(
                space_margin_bytes=1000, download_attempts=2, watchdog_s=watchdog_s
            ),
            sleep=lambda _: asyncio.sleep(0),
        )

    def phases(self) -> list[str]:
        return [r.phase.value for r in self.reports]


def make_world(tmp_path: Path) -> World:
    """Two releases of `det` (1.0.0, 1.1.0), published; the node's dir is tmp/node."""
    fleet = Fleet.create(root_keys=1, root_threshold=1, now=datetime.now(UTC))
    peer = MemoryLinkPeer()
    root = repo.to_bytes(fleet.root)
    peer.metadata["1.root.json"] = root
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "tuf-root.json").write_bytes(root)
    w = World(tmp_path, fleet, peer, CryptoSigner.generate_ed25519())
    w.publish()
    w.release("1.0.0", add=1.0, counter=1)
    w.release("1.1.0", add=2.0, counter=2)
    return w


def assert_consistent(w: World, state: JournalState) -> None:
    assert state.phase is Phase.IDLE and state.trial is None
    store = w.store
    for ref in (state.active, state.previous):
        if ref is not None:
            assert store.verify(ref.sha256), ref
    assert store.installed() <= state.referenced_sha256s()


async def install_first(w: World) -> Release:
    rel = w.releases["1.0.0"]
    outcome = await w.reconciler().apply(w.assign(rel))
    assert outcome.kind is OutcomeKind.APPLIED, outcome
    return rel


def write_trust_anchors(w: World, directory: Path) -> None:
    """What enrollment leaves in a node's data dir: the fleet root and the director key."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tuf-root.json").write_bytes(repo.to_bytes(w.fleet.root))
    key = w.director.public_key
    (directory / "director-key.json").write_text(json.dumps({"keyid": key.keyid, **key.to_dict()}))
