"""Reconciler over MemoryNodeLink with real TUF metadata and real director signatures.

The control plane's own helpers build the fleet's repository (tests may import
control_plane; the product code may not): root, targets with two model versions, their
reference pairs and a floor, snapshot and timestamp, served through MemoryLinkPeer.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Snapshot, Timestamp

from control_plane.director.assignments import sign_assignment
from control_plane.trust import repository as repo
from control_plane.trust.custom import model_target_path
from edge_node.clock import ManualClock
from edge_node.link.memory import MemoryLinkPeer, MemoryNodeLink
from edge_node.updater.journal import Journal, JournalState, ModelRef, Phase
from edge_node.updater.reconciler import (
    OutcomeKind,
    Reconciler,
    ReconcilerLimits,
    UpdatePhase,
)
from edge_node.updater.selftest import SelfTestResult, self_test
from edge_node.updater.store import DiskUsage, ModelStore
from edge_node.updater.tuf_fetch import TufClient
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.trust.helpers import MONTH, Fleet
from tests.edge_node.updater._models import model_bytes, reference_bytes

pytestmark = pytest.mark.anyio

NODE = "n-0123456789ab"
FLEET = "gates"
MODEL = "det"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
    reports: list[tuple[UpdatePhase, str]] = field(default_factory=list)
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

        async def report(phase: UpdatePhase, detail: str) -> None:
            self.reports.append((phase, detail))

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
            limits=ReconcilerLimits(space_margin_bytes=1000, download_attempts=2),
            sleep=lambda _: asyncio.sleep(0),
        )

    def phases(self) -> list[str]:
        return [phase.value for phase, _ in self.reports]


@pytest.fixture
def world(tmp_path: Path) -> World:
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


# ------------------------------------------------------------------------ cases


async def test_normal_update_then_idempotent(world: World) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    rec = world.reconciler()
    outcome = await rec.apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    state = world.journal.load()
    assert state.active == ModelRef(new.path, new.sha256)
    assert state.previous == ModelRef(first.path, first.sha256)
    assert state.director_sequence == 2
    assert world.activated[-1] == world.store.path_of(new.sha256)
    assert world.store.path_of(new.sha256).read_bytes() == new.data
    assert world.phases()[-4:] == ["downloading", "verifying", "self-testing", "active"]
    assert_consistent(world, state)

    reports, activations = len(world.reports), len(world.activated)
    again = await rec.apply(signed)
    assert (again.kind, again.reason) == (OutcomeKind.UNCHANGED, "replayed")
    assert len(world.activated) == activations
    assert len(world.reports) == reports
    assert world.journal.load().active == state.active


async def test_tampered_artifact_fails_and_stays_on_old(world: World) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    world.peer.artifacts[new.sha256] = new.data[:-1] + b"\x00"
    outcome = await world.reconciler().apply(world.assign(new))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "hash-mismatch")
    state = world.journal.load()
    assert state.active == ModelRef(first.path, first.sha256)
    assert state.failed == ModelRef(new.path, new.sha256) and state.attempts == 1
    assert world.phases()[-2:] == ["failed", "reverted"]
    assert not world.store.exists(new.sha256)
    assert_consistent(world, state)


async def test_assignment_for_another_node(world: World) -> None:
    outcome = await world.reconciler().apply(
        world.assign(world.releases["1.0.0"], node_id="n-someoneelse")
    )
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "wrong-node")
    assert world.journal.load() == JournalState()
    assert world.reports == [(UpdatePhase.FAILED, "wrong-node")]


async def test_stale_assignment_is_refused(world: World) -> None:
    old = world.assign(world.releases["1.0.0"])
    world.sequence = 5
    await world.reconciler().apply(world.assign(world.releases["1.1.0"]))
    outcome = await world.reconciler().apply(old)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "stale")
    assert world.journal.load().active == ModelRef(
        world.releases["1.1.0"].path, world.releases["1.1.0"].sha256
    )


async def test_below_the_floor(world: World) -> None:
    world.raise_floor(2)
    outcome = await world.reconciler().apply(world.assign(world.releases["1.0.0"]))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "below-floor")
    assert world.journal.load().director_sequence == 0


async def test_target_not_in_tuf(world: World) -> None:
    ghost = Release(
        "9.9.9", model_target_path(MODEL, "9.9.9"), b"ghost", hashlib.sha256(b"ghost").hexdigest()
    )
    outcome = await world.reconciler().apply(world.assign(ghost))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "unknown-target")


async def test_self_test_output_mismatch_reverts(world: World) -> None:
    first = await install_first(world)
    bad = world.release("2.0.0", add=3.0, counter=3, reference_add=4.0)
    outcome = await world.reconciler().apply(world.assign(bad))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "self-test: output-mismatch")
    state = world.journal.load()
    assert state.active == ModelRef(first.path, first.sha256)
    assert world.activated == [world.store.path_of(first.sha256)]
    assert_consistent(world, state)


async def test_model_that_fails_to_load_reverts(world: World) -> None:
    first = await install_first(world)
    broken = world.release("2.0.0", add=0.0, counter=3, content=b"not onnx at all")
    outcome = await world.reconciler().apply(world.assign(broken))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "self-test: load-failed")
    assert world.journal.load().active == ModelRef(first.path, first.sha256)


async def test_activation_failure_reverts(world: World) -> None:
    async def refuse(path: Path) -> None:
        raise RuntimeError("swap refused")

    outcome = await world.reconciler(activate=refuse).apply(world.assign(world.releases["1.0.0"]))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "activate-failed")
    assert world.journal.load().active is None


async def test_disk_too_full_is_refused_before_download(world: World) -> None:
    world.free = 500
    downloads: list[str] = []

    class CountingLink(MemoryNodeLink):
        async def fetch_artifact(
            self, target_path: str, sha256: str, offset: int = 0
        ) -> AsyncIterator[bytes]:
            downloads.append(target_path)
            async for chunk in super().fetch_artifact(target_path, sha256, offset):
                yield chunk

    rel = world.releases["1.0.0"]
    signed = world.assign(rel)
    outcome = await world.reconciler(link=CountingLink(world.peer)).apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "disk-full")
    assert downloads == []
    assert world.journal.load() == JournalState()
    # Space freed: the same assignment now applies (its sequence was not spent).
    world.free = 10**12
    assert (await world.reconciler().apply(signed)).kind is OutcomeKind.APPLIED


async def test_redelivery_retries_a_transient_failure(world: World) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]  # stream ends short: link trouble
    signed = world.assign(rel)
    outcome = await world.reconciler().apply(signed)
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REVERTED, "link-unavailable")
    world.peer.artifacts[rel.sha256] = rel.data
    outcome = await world.reconciler().apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    assert world.journal.load().active == ModelRef(rel.path, rel.sha256)


async def test_redelivery_gives_up_after_max_attempts(world: World) -> None:
    rel = world.releases["1.0.0"]
    world.peer.artifacts[rel.sha256] = rel.data[:10]
    signed = world.assign(rel)
    kinds = [(await world.reconciler().apply(signed)).reason for _ in range(4)]
    assert kinds == ["link-unavailable"] * 3 + ["too-many-attempts"]


# ---------------------------------------------------------------- crash + resume


def _crash_in(phase: str, w: World) -> dict[str, Any]:
    """Reconciler arguments that 'SIGKILL' the process at `phase`."""

    class CrashingLink(MemoryNodeLink):
        async def fetch_artifact(
            self, target_path: str, sha256: str, offset: int = 0
        ) -> AsyncIterator[bytes]:
            yield w.peer.artifacts[sha256][:7]
            raise Crash

    class CrashingStore(ModelStore):
        def install(self, temp_file: Path, sha256: str, length: int) -> Path:
            raise Crash

    def crashing_selftest(*args: Any) -> SelfTestResult:
        raise Crash

    async def crashing_activate(path: Path) -> None:
        raise Crash

    store_args = {"disk_usage": lambda _: DiskUsage(10**13, 0, 10**12)}
    return {
        "downloading": {"link": CrashingLink(w.peer)},
        "verifying": {"store": CrashingStore(w.tmp / "node" / "models", **store_args)},
        "self-testing": {"selftest": crashing_selftest},
        "activating": {"activate": crashing_activate},
    }[phase]


@pytest.mark.parametrize("phase", ["downloading", "verifying", "self-testing", "activating"])
async def test_crash_in_each_phase_then_resume_converges(world: World, phase: str) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    signed = world.assign(new)
    with pytest.raises(Crash):
        await world.reconciler(**_crash_in(phase, world)).apply(signed)
    crashed = world.journal.load()
    assert crashed.phase is Phase.TRIAL and crashed.trial == ModelRef(new.path, new.sha256)

    rec = world.reconciler()  # the restarted process
    state = await rec.resume_after_crash()
    assert state.active == ModelRef(first.path, first.sha256)
    assert state.failed == ModelRef(new.path, new.sha256)
    assert state.last_error == "interrupted by a restart"
    assert_consistent(world, state)
    assert world.journal.load() == state
    # Resuming twice changes nothing; a re-delivery then completes the update.
    assert (await rec.resume_after_crash()).active == state.active
    outcome = await rec.apply(signed)
    assert outcome.kind is OutcomeKind.APPLIED
    assert_consistent(world, world.journal.load())


async def test_crash_after_commit_before_gc(world: World) -> None:
    await install_first(world)
    new = world.releases["1.1.0"]
    rec = world.reconciler()
    original_gc = ModelStore.gc

    def crashing_gc(self: ModelStore, keep: Any) -> list[str]:
        raise Crash

    ModelStore.gc = crashing_gc  # type: ignore[method-assign]
    try:
        with pytest.raises(Crash):
            await rec.apply(world.assign(new))
    finally:
        ModelStore.gc = original_gc  # type: ignore[method-assign]
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(new.path, new.sha256)
    assert_consistent(world, state)


async def test_resume_falls_back_to_previous_when_active_is_gone(world: World) -> None:
    first = await install_first(world)
    new = world.releases["1.1.0"]
    await world.reconciler().apply(world.assign(new))
    path = world.store.path_of(new.sha256)
    path.chmod(0o644)
    path.write_bytes(b"bit rot")
    state = await world.reconciler().resume_after_crash()
    assert state.active == ModelRef(first.path, first.sha256)
    assert_consistent(world, state)
