"""The shadow stage end to end on the node: the real update path (reconciler over the
in-memory fleet) driving the agent's real runtime (`RuntimeHost`: ONNX Runtime sessions,
the pipeline's tap, the `ShadowRunner`), with image models built by `onnx.helper`."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from edge_node.agent.runtime_host import RuntimeHost
from edge_node.clock import SystemClock
from edge_node.config import AgentConfig
from edge_node.runtime.config import RuntimeConfig, SessionConfig, StreamConfig
from edge_node.testing.update_world import UpdateWorld
from edge_node.updater.reconciler import OutcomeKind, Reconciler
from protos.bundle.results import InferenceResult
from protos.bundle.spec import PreprocessConfig
from protos.health_schema import SCHEMA, check_report

pytestmark = pytest.mark.anyio

SIZE = (8, 8)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def world(tmp_path: Path) -> UpdateWorld:
    world = UpdateWorld.create(tmp_path)
    world.release_image("1.0.0", 1, size=SIZE)
    world.release_image("1.0.1", 2, size=SIZE, add=-0.0)  # other bytes, the same outputs
    world.release_image("1.2.0", 3, size=SIZE, add=1.0)  # every output one higher
    # A reference made with another normalisation: the candidate fails its self-test.
    world.release_image(
        "2.0.0",
        4,
        size=SIZE,
        add=2.0,
        reference_preprocess=PreprocessConfig(size=SIZE, mean=(0.5,)),
    )
    return world


class Served:
    def __init__(self) -> None:
        self.items: list[InferenceResult] = []
        self._lock = threading.Lock()

    def __call__(self, result: InferenceResult) -> None:
        with self._lock:
            self.items.append(result)


@pytest.fixture
def served() -> Served:
    return Served()


@pytest.fixture
async def host(tmp_path: Path, served: Served) -> AsyncIterator[RuntimeHost]:
    config = AgentConfig(
        data_dir=tmp_path / "node",
        runtime=RuntimeConfig(
            session=SessionConfig(intra_op_threads=2),
            streams=(StreamConfig("cam", queue_size=64),),
        ),
    )
    host = RuntimeHost(config, SystemClock(), on_result=served, stopping=anyio.Event())
    try:
        yield host
    finally:
        await host.close()


async def frames(host: RuntimeHost, count: int) -> dict[str, Any]:
    """Submit `count` frames, one at a time, until the candidate compared them all."""
    pipeline = host.pipeline
    assert pipeline is not None
    rng = np.random.default_rng(7)
    for _ in range(count):
        before = (host.shadow_figures() or {}).get("frames_compared", 0)
        image = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        assert pipeline.submit("cam", image).queued
        deadline = time.monotonic() + 10
        while (host.shadow_figures() or {}).get("frames_compared", 0) <= before:
            assert time.monotonic() < deadline, host.shadow_figures()
            await anyio.sleep(0.002)
    figures = host.shadow_figures()
    assert figures is not None
    return figures


def section(rec: Reconciler) -> dict[str, Any]:
    report = rec.shadow.report()
    assert report is not None
    check_report({"schema": SCHEMA, "shadow": report})  # what health.proto declares
    return report


async def test_candidates_run_beside_the_served_model(
    world: UpdateWorld, host: RuntimeHost, served: Served
) -> None:
    rec = world.reconciler(host=host, shadow_host=host)
    active = world.releases["1.0.0"]
    same = world.assign(active, shadow=world.releases["1.0.1"], sample_per_mille=1000)
    outcome = await rec.apply(same)
    assert outcome.kind is OutcomeKind.APPLIED, world.reports[-1]
    runner = host.shadow
    assert runner is not None
    assert (runner.label, runner.session.config.intra_op_threads) == ("det@1.0.1", 1)
    figures = await frames(host, 4)
    assert figures["agreement"]["min_cosine"] == 1.0
    assert figures["agreement"]["max_abs_diff"] == 0.0
    assert figures["against"] == "det@1.0.0"
    report = section(rec)
    assert (report["candidate"], report["state"], report["frames_compared"]) == (
        "det@1.0.1",
        "running",
        4,
    )
    assert report["latency"]["p99_ms"] is not None and "sketch_ms" in report["latency"]
    # The served model's bytes, loaded as the candidate is, timed on the same frames.
    reference = runner.reference
    assert reference is not None and host.pipeline is not None
    assert (reference.label, reference.config.intra_op_threads) == ("det@1.0.0", 1)
    assert reference is not host.pipeline.session  # its own session, not the served one
    assert report["reference_latency"]["p99_ms"] is not None
    assert "sketch_ms" in report["reference_latency"]
    assert report["latency_ratio_p50"] > 0
    assert report["rss_delta_bytes"] is not None
    # Served: the active version only.
    assert {r.model_label for r in served.items} == {"det@1.0.0"}

    await rec.apply(world.assign(active, shadow=world.releases["1.2.0"], sample_per_mille=1000))
    figures = await frames(host, 3)
    agreement = figures["agreement"]
    assert agreement["max_abs_diff"] == pytest.approx(1.0)
    assert agreement["min_cosine"] < 0.99
    assert section(rec)["candidate"] == "det@1.2.0"
    assert {r.model_label for r in served.items} == {"det@1.0.0"}

    # Cleared by a later assignment without a candidate: stopped and unloaded.
    await rec.apply(world.assign(active))
    assert host.shadow is None and runner.session.closed and reference.closed
    assert rec.shadow.report() is None
    pipeline = host.pipeline
    assert pipeline is not None and pipeline.tap is None


async def test_a_candidate_failing_its_self_test_is_reported(
    world: UpdateWorld, host: RuntimeHost
) -> None:
    rec = world.reconciler(host=host, shadow_host=host)
    active = world.releases["1.0.0"]
    await rec.apply(world.assign(active, shadow=world.releases["2.0.0"]))
    assert host.shadow is None
    report = section(rec)
    assert (report["state"], report["reason"]) == ("failed", "self-test: preprocess-mismatch")
    assert report["candidate"] == "det@2.0.0"
    assert host.model == "det@1.0.0"  # the node serves on
