"""A version runs with the runtime config signed with it: the real update path (reconciler,
update task) over the in-memory fleet (`edge_node.testing.update_world`) driving the
agent's real runtime (`RuntimeHost`: ONNX Runtime sessions, the pipeline), with image
models that differ in input size and normalisation as two real detectors do."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from edge_node.agent.runtime_host import RuntimeHost, RuntimeUse
from edge_node.clock import ManualClock, SystemClock
from edge_node.config import AgentConfig
from edge_node.runtime.config import PreprocessConfig, RuntimeConfig, SessionConfig, StreamConfig
from edge_node.runtime.priority import Background, work_time
from edge_node.testing.update_world import Release, UpdateWorld
from edge_node.updater.host import ModelBundle, Trial
from edge_node.updater.journal import ModelRef
from edge_node.updater.reconciler import OutcomeKind, UpdatePhase
from edge_node.updater.selftest import SelfTestResult
from edge_node.updater.watchdog import ModelHealth, WatchdogConfig
from protos.bundle.results import InferenceResult

pytestmark = pytest.mark.anyio

PIXEL = 200
FRAME = np.full((24, 32, 3), PIXEL, dtype=np.uint8)  # a camera frame, not the model's size


@dataclass(frozen=True)
class Norm:
    """A model's input size and normalisation."""

    size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def node_preprocess(self) -> PreprocessConfig:
        """A node.yaml preprocess section with this normalisation (size: the model's)."""
        return PreprocessConfig(mean=self.mean, std=self.std)


SMALL = Norm((8, 8), (0.5,), (0.25,))
IMAGENET = Norm((12, 16), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# A node.yaml preprocess section that fits neither model (their sizes are signed).
NODE_PREPROCESS = PreprocessConfig(size=(16, 16), mean=(0.1,), std=(2.0,))
NO_WATCH = WatchdogConfig(window_s=0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Results:
    """What the pipeline hands `on_result`, from its worker threads."""

    def __init__(self) -> None:
        self.items: list[InferenceResult] = []
        self._lock = threading.Lock()
        self._count = threading.Semaphore(0)

    def __call__(self, result: InferenceResult) -> None:
        with self._lock:
            self.items.append(result)
        self._count.release()

    async def next(self, host: RuntimeHost) -> InferenceResult:
        """Submit one frame and return its result."""
        assert host.pipeline is not None
        assert host.pipeline.submit("cam", FRAME).queued
        got = await anyio.to_thread.run_sync(self._count.acquire, True, 10.0)
        assert got, "no result in time"
        with self._lock:
            return self.items[-1]


@asynccontextmanager
async def runtime(
    tmp_path: Path,
    results: Results,
    preprocess: PreprocessConfig | None = None,
    *,
    intra_op_threads: int = 2,
    trial_priority: Background = "nice",
) -> AsyncIterator[RuntimeHost]:
    config = AgentConfig(
        data_dir=tmp_path / "node",
        runtime_trial_priority=trial_priority,
        runtime=RuntimeConfig(
            session=SessionConfig(intra_op_threads=intra_op_threads),
            preprocess=preprocess or PreprocessConfig(),
            streams=(StreamConfig("cam", queue_size=4),),
        ),
    )
    host = RuntimeHost(config, SystemClock(), on_result=results, stopping=anyio.Event())
    try:
        yield host
    finally:
        await host.close()


def release(world: UpdateWorld, version: str, counter: int, norm: Norm, **kw: Any) -> Release:
    return world.release_image(version, counter, size=norm.size, mean=norm.mean, std=norm.std, **kw)


def expected(norm: Norm) -> object:
    """What an echo image model outputs for FRAME: its shape, and the lowest and highest
    normalised value over the channels."""
    mean = norm.mean * (3 // len(norm.mean))
    std = norm.std * (3 // len(norm.std))
    values = [(PIXEL / 255 - m) / s for m, s in zip(mean, std, strict=True)]
    low, high = pytest.approx(min(values), abs=1e-5), pytest.approx(max(values), abs=1e-5)
    return (1, 3, *norm.size), low, high


def seen(result: InferenceResult) -> object:
    (tensor,) = result.decoded.tensors
    return tensor.shape, tensor.min, tensor.max


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    world = UpdateWorld.create(tmp_path)
    release(world, "1.0.0", 1, SMALL)
    release(world, "1.1.0", 2, IMAGENET)
    return world


async def test_a_version_runs_with_the_preprocessing_signed_with_it(
    world: UpdateWorld, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    results = Results()
    caplog.set_level(logging.WARNING, "edge_node.agent.runtime_host")
    async with runtime(tmp_path, results, NODE_PREPROCESS) as host:
        outcome = await world.reconciler(host=host).apply(world.assign(world.releases["1.0.0"]))
        assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
        # The self-test ran on the session that now serves: its 1 + 5 runs are counted on
        # it, and no other session was loaded for the trial.
        health = host.health()
        assert health is not None and (health.frames, health.errors) == (6, 0)
        assert host.pipeline is not None
        session = host.pipeline.session
        assert (session.label, session.config.intra_op_threads) == ("det@1.0.0", 2)
        result = await results.next(host)
        assert seen(result) == expected(SMALL)
        assert (result.model, result.version, result.model_label) == ("det", "1.0.0", "det@1.0.0")
        assert host.runtime_use() == RuntimeUse("signed", ("intra_op_threads",), True)
        assert host.model == "det@1.0.0"
    ignored = [r for r in caplog.records if "node.yaml sets runtime.preprocess" in r.message]
    assert len(ignored) == 1 and "det@1.0.0" in ignored[0].message


async def test_a_fleet_moves_between_two_models_by_assignment_alone_and_back(
    world: UpdateWorld, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    results = Results()
    caplog.set_level(logging.INFO, "edge_node.runtime.pipeline")
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    async with runtime(tmp_path, results) as host:
        rec = world.reconciler(host=host)
        assert (await rec.apply(world.assign(first))).kind is OutcomeKind.APPLIED
        assert seen(await results.next(host)) == expected(SMALL)

        assert (await rec.apply(world.assign(second))).kind is OutcomeKind.APPLIED
        result = await results.next(host)
        assert seen(result) == expected(IMAGENET)
        assert result.model_label == "det@1.1.0"
        assert "model swapped: det@1.0.0 -> det@1.1.0" in caplog.messages

        # A rollback is a fresh assignment of the first: it needs nothing from node.yaml.
        back = await rec.apply(world.assign(first))
        assert back.kind is OutcomeKind.APPLIED
        result = await results.next(host)
        assert seen(result) == expected(SMALL)
        assert result.model_label == "det@1.0.0"
        assert world.journal.load().active == ModelRef(first.path, first.sha256)

        # And the watchdog's revert to `previous` serves 1.1.0 with its own bundle again.
        state = world.journal.load()
        assert state.active is not None
        outcome = await rec.revert_active(state.active, "watchdog-errors", "test")
        assert outcome.kind is OutcomeKind.REVERTED
        assert seen(await results.next(host)) == expected(IMAGENET)


async def test_a_revoked_model_with_nothing_allowed_stops_serving_until_a_good_one_comes(
    world: UpdateWorld, tmp_path: Path
) -> None:
    """ADR 0035 on the real runtime: the pipeline stops, and the next version starts one."""
    results = Results()
    first, second = world.releases["1.0.0"], world.releases["1.1.0"]
    async with runtime(tmp_path, results) as host:
        rec = world.reconciler(host=host)
        assert (await rec.apply(world.assign(first))).kind is OutcomeKind.APPLIED
        world.raise_floor(2)
        refused = await rec.apply(world.assign(first, renewal=True))
        assert refused.reason == "below-floor"
        assert (host.pipeline, host.model, host.health()) == (None, None, None)

        assert (await rec.apply(world.assign(second))).kind is OutcomeKind.APPLIED
        assert seen(await results.next(host)) == expected(IMAGENET)


async def test_a_version_signing_the_same_bytes_with_another_spec_is_a_new_target(
    tmp_path: Path,
) -> None:
    """A corrected normalisation needs no new model: 1.0.1 signs 1.0.0's bytes with
    another mean/std. The node tries and serves it with its own spec (not "already
    active" with 1.0.0's), and goes back to 1.0.0's just as well."""
    world = UpdateWorld.create(tmp_path)
    corrected = Norm(SMALL.size, (0.25,), (0.5,))
    first = release(world, "1.0.0", 1, SMALL)
    fixed = release(world, "1.0.1", 2, corrected)
    assert first.sha256 == fixed.sha256
    results = Results()
    async with runtime(tmp_path, results) as host:
        rec = world.reconciler(host=host)
        assert (await rec.apply(world.assign(first))).kind is OutcomeKind.APPLIED
        assert seen(await results.next(host)) == expected(SMALL)
        outcome = await rec.apply(world.assign(fixed))
        assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
        result = await results.next(host)
        assert (seen(result), result.model_label) == (expected(corrected), "det@1.0.1")
        back = await rec.apply(world.assign(first))
        assert back.kind is OutcomeKind.APPLIED, world.reports[-1]
        result = await results.next(host)
        assert (seen(result), result.model_label) == (expected(SMALL), "det@1.0.0")
    # One copy of the bytes, a bundle record per version.
    store = rec.store
    assert store.read_bundle(first.sha256, first.path)["version"] == "1.0.0"
    assert store.read_bundle(fixed.sha256, fixed.path)["version"] == "1.0.1"


class WatchedTrials:
    """The host, recording for each trial the CPU priority it ran at and whether the
    self-test's clock (`work_time`) stood still while the thread slept."""

    def __init__(self, host: RuntimeHost) -> None:
        self.host = host
        self.seen: list[tuple[str, int, bool]] = []

    async def serve(
        self, bundle: ModelBundle, *, trial: Trial | None = None
    ) -> SelfTestResult | None:
        assert trial is not None

        def watched(load: Any) -> SelfTestResult:
            nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            start = work_time()
            time.sleep(0.2)
            self.seen.append((bundle.version, nice, work_time() - start < 0.1))
            return trial(load)

        return await self.host.serve(bundle, trial=watched)

    def health(self) -> ModelHealth | None:
        return self.host.health()


@pytest.mark.parametrize(
    ("intra_op_threads", "priority", "lowered"),
    [(1, "nice", True), (2, "nice", False), (1, "normal", False)],
)
async def test_a_hot_swaps_trial_runs_at_background_priority_timed_on_cpu_time(
    world: UpdateWorld, tmp_path: Path, intra_op_threads: int, priority: Background, lowered: bool
) -> None:
    """While frames are served, the next version loads and self-tests at background
    priority (nice 19), its latency timed on the thread's CPU time; not when a session
    built there would start an intra-op thread pool (it would serve at nice 19), not when
    node.yaml says normal, and not for the first model (no frames to protect)."""
    results = Results()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    async with runtime(
        tmp_path, results, intra_op_threads=intra_op_threads, trial_priority=priority
    ) as host:
        watched = WatchedTrials(host)
        rec = world.reconciler(host=watched)
        for version in ("1.0.0", "1.1.0"):
            outcome = await rec.apply(world.assign(world.releases[version]))
            assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
        assert seen(await results.next(host)) == expected(IMAGENET)
        # The serving threads kept their priority.
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    background = (max(own, 19), True) if lowered else (own, False)
    assert watched.seen == [("1.0.0", own, False), ("1.1.0", *background)]


async def test_a_version_signed_without_a_runtime_spec_runs_with_the_nodes_preprocess(
    tmp_path: Path,
) -> None:
    # Mixed fleets: a version pushed before bundles carries no custom.runtime.
    world = UpdateWorld.create(tmp_path)
    old = release(world, "0.9.0", 1, SMALL, signed=False)
    results = Results()
    async with runtime(tmp_path, results, SMALL.node_preprocess()) as host:
        outcome = await world.reconciler(host=host).apply(world.assign(old))
        assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
        assert seen(await results.next(host)) == expected(SMALL)
        assert host.runtime_use() == RuntimeUse("node", ("intra_op_threads",), False)
        assert host.model == "det@0.9.0"


async def test_a_node_preprocess_that_differs_from_the_reference_fails_the_self_test(
    tmp_path: Path,
) -> None:
    # The bug: a second model ran with the first one's normalisation and still
    # passed. Now the reference frame goes through the node's preprocessing and is caught.
    world = UpdateWorld.create(tmp_path)
    old = release(world, "0.9.0", 1, SMALL, signed=False)
    results = Results()
    async with runtime(tmp_path, results, IMAGENET.node_preprocess()) as host:
        outcome = await world.reconciler(host=host).apply(world.assign(old))
        assert (outcome.kind, outcome.reason) == (
            OutcomeKind.REVERTED,
            "self-test: preprocess-mismatch",
        )
        assert host.pipeline is None and host.runtime_use() is None


async def test_a_reference_made_with_another_mean_fails_as_preprocess_mismatch(
    world: UpdateWorld, tmp_path: Path
) -> None:
    results = Results()
    cli_mean = PreprocessConfig(size=IMAGENET.size, mean=(0.5,), std=IMAGENET.std)
    bad = release(world, "1.2.0", 3, IMAGENET, reference_preprocess=cli_mean)
    async with runtime(tmp_path, results) as host:
        rec = world.reconciler(host=host)
        assert (await rec.apply(world.assign(world.releases["1.0.0"]))).kind is OutcomeKind.APPLIED
        outcome = await rec.apply(world.assign(bad))
        assert (outcome.kind, outcome.reason) == (
            OutcomeKind.REVERTED,
            "self-test: preprocess-mismatch",
        )
        failed = next(r for r in world.reports if r.phase is UpdatePhase.FAILED)
        assert failed.target_path == bad.path
        assert "'images'" in failed.detail and "largest difference" in failed.detail
        # The model that served before keeps serving, with its own preprocessing.
        assert host.model == "det@1.0.0"
        assert seen(await results.next(host)) == expected(SMALL)


def _offline(world: UpdateWorld) -> None:
    """The control plane is gone: no metadata, no models, no link."""
    world.peer.metadata.clear()
    world.peer.artifacts.clear()
    world.peer.up = False


async def _install(world: UpdateWorld, tmp_path: Path, rel: Release) -> Path:
    """Apply `rel` through a node's update task, then stop that node; returns its bundle."""
    world.write_trust_anchors()
    clock = ManualClock(world.now, sleeps_advance=True)
    async with runtime(tmp_path, Results()) as host:
        task = world.update_task(host, clock=clock, watchdog=NO_WATCH)
        await task.start()
        outcome = await task.reconciler.apply(world.assign(rel))
        assert outcome.kind is OutcomeKind.APPLIED
        bundle = task.reconciler.store.bundle_path_of(rel.sha256, rel.path)
    assert bundle.is_file()
    return bundle


async def test_the_signed_bundle_survives_a_restart_offline(
    world: UpdateWorld, tmp_path: Path
) -> None:
    rel = world.releases["1.1.0"]
    await _install(world, tmp_path, rel)
    _offline(world)
    results = Results()
    # node.yaml's preprocess fits neither model: what serves comes from the stored bundle.
    async with runtime(tmp_path, results, NODE_PREPROCESS) as host:
        task = world.update_task(
            host, clock=ManualClock(world.now, sleeps_advance=True), watchdog=NO_WATCH
        )
        state = await task.start()
        assert state.active == ModelRef(rel.path, rel.sha256)
        result = await results.next(host)
        assert seen(result) == expected(IMAGENET)
        assert result.model_label == "det@1.1.0"
        assert host.runtime_use() == RuntimeUse("signed", ("intra_op_threads",), True)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
async def test_without_a_usable_bundle_the_nodes_preprocess_serves_and_the_log_says_so(
    world: UpdateWorld, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    rel = world.releases["1.0.0"]
    bundle = await _install(world, tmp_path, rel)
    bundle.unlink()  # an install from before bundles has none
    if damage == "corrupt":
        bundle.write_bytes(b'{"bundle": {"format": 1}, "sha256": "00"}')
    _offline(world)
    results = Results()
    caplog.set_level(logging.WARNING, "edge_node.updater.reconciler")
    async with runtime(tmp_path, results, SMALL.node_preprocess()) as host:
        task = world.update_task(
            host, clock=ManualClock(world.now, sleeps_advance=True), watchdog=NO_WATCH
        )
        await task.start()
        result = await results.next(host)
        assert seen(result) == expected(SMALL)
        assert result.model_label == "det@1.0.0"  # named from its target path all the same
        assert host.runtime_use() == RuntimeUse("node", ("intra_op_threads",), False)
    words = "has no bundle record" if damage == "missing" else "is damaged"
    assert any(words in m and "node's preprocess config" in m for m in caplog.messages)
