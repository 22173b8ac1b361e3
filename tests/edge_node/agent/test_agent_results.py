"""The agent's results path end to end but for the pipeline: a result handed to the
agent's result callback reaches the control plane's results store over the real gRPC
link, as a sampled `results` record, and `edgefleet nodes results` can show it."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from edge_node.agent import Agent
from edge_node.clock import SystemClock
from edge_node.results.sampling import ResultsConfig
from tests.control_plane.link.grpc_support import until
from tests.edge_node.agent.support import agent_config, control_plane
from tests.edge_node.agent.test_agent import stored_payloads
from tests.edge_node.results.support import result

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FAST_RESULTS = ResultsConfig(interval_s=1.0, max_per_minute=600, drain_interval_s=0.05)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_sampled_result_reaches_the_control_plane(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        config = replace(agent_config(plane, tmp_path / "node"), results=FAST_RESULTS)
        agent = Agent(config, SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            assert agent.files is not None
            node_id = agent.files.node_id
            # The pipeline's worker threads call the agent's result callback.
            workers = [
                threading.Thread(
                    target=lambda s=stream: [
                        agent._count_result(result(s, frame, detections=frame % 3))
                        for frame in range(1, 201)
                    ]
                )
                for stream in ("gate", "yard")
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(timeout=30)
            stored = plane.services.nodes.results.recent
            await until(lambda: {r.stream for r in stored(node_id)} == {"gate", "yard"})
            # The fan-out's other half: the latency of the version, in health reports.
            await until(
                lambda: any(
                    "detector@1.1.0" in json.loads(p)["latency"]
                    for p in stored_payloads(plane.services.engine, node_id, "health")
                )
            )
            await agent.shutdown(5.0)
        shown = plane.services.nodes.results.recent(node_id)
    assert agent.results.stats().offered == 400
    # One per stream per second at most: far fewer than were offered.
    assert 2 <= len(shown) <= 10
    first = shown[-1]
    assert (first.model_label, first.kind) == ("detector@1.1.0", "detection")
    # The newest result with detections of the stream's first interval was taken.
    assert first.document["detections_total"] > 0
    assert first.document["latency_ms"]["inference"] == 10.0


async def test_results_can_be_turned_off(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        off = replace(FAST_RESULTS, enabled=False)
        agent = Agent(replace(agent_config(plane, tmp_path / "node"), results=off), SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            assert agent.files is not None
            agent._count_result(result("gate", 1, detections=1))
            await until(lambda: plane.services.records.count(agent.files.node_id, "health") > 0)
            await agent.shutdown(5.0)
        assert agent.results_feed is None
        assert plane.services.nodes.results.recent(agent.files.node_id) == []
