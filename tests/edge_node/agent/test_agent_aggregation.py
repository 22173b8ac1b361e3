"""The agent's aggregation end to end on the node: a real detector (built with
`onnx.helper`) served by the agent's runtime sees a person walk across the frame, the
node's tracker and a zone rule from node.yaml's rules file raise an intrusion, and its
event record waits in the outbox, named by the model version that saw it. A rules file
that cannot be used is reported in health while the node goes on serving.

The agent enrolls with a real control plane but its link points at a closed port, so
what the node stored stays in its outbox to be read back after shutdown.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from edge_node.agent import Agent
from edge_node.agent.aggregation_task import AggregationTaskConfig
from edge_node.aggregation.model import Provenance
from edge_node.aggregation.wire import decode_event
from edge_node.clock import SystemClock
from edge_node.config import AgentConfig
from edge_node.outbox import Outbox, Record
from edge_node.runtime.config import RuntimeConfig, StreamConfig
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.host import ModelBundle
from protos.bundle.spec import parse_runtime_spec
from tests.control_plane.link.grpc_support import node_settings
from tests.edge_node.agent.support import agent_config, control_plane

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SIZE = 16  # the detector's input: [1, 3, 16, 16]
RUNTIME = """\
preprocess: {layout: NCHW, channel_order: RGB, scale: 0.00392156862745098, mean: 0, std: 1,
             dtype: float32}
output: {decoder: yolo, box_format: cxcywh, objectness: false, score_threshold: 0.5}
labels: [person]
"""
RULES = """\
version: 1
cameras: [gate]
rules:
  - {id: yard, type: zone_intrusion, camera: gate, classes: [person],
     zone: [[0.6, 0], [1, 0], [1, 1], [0.6, 1]]}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def walker_model(path: Path) -> Path:
    """[1,3,16,16] -> [1, 5, 1]: one person candidate whose centre x follows the frame's
    brightness (cx = mean of the red channel x 16 px), 4 px wide, from y 4 to 12, score
    0.9. A brighter frame is a person further right."""
    weights = np.zeros((3, 5), dtype=np.float32)
    weights[0, 0] = SIZE
    bias = np.asarray([0.0, 8.0, 4.0, 8.0, 0.9], dtype=np.float32)
    initializers = [
        numpy_helper.from_array(np.asarray([1, 3], dtype=np.int64), "flat"),
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(bias, "bias"),
        numpy_helper.from_array(np.asarray([1, 5, 1], dtype=np.int64), "grid"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Reshape", ["pooled", "flat"], ["features"]),
        helper.make_node("MatMul", ["features", "weights"], ["weighted"]),
        helper.make_node("Add", ["weighted", "bias"], ["candidate"]),
        helper.make_node("Reshape", ["candidate", "grid"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "walker",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 5, 1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@asynccontextmanager
async def serving_agent(tmp_path: Path, rules_text: str) -> AsyncIterator[Agent]:
    """An enrolled agent serving the walker model as `people@2.0.1` on stream "gate",
    with the rules file `rules_text`; shut down when the block ends."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text)
    async with control_plane(tmp_path) as plane:
        config: AgentConfig = replace(
            agent_config(plane, tmp_path / "node"),
            link=node_settings(closed_port(), connect_timeout_s=1.0),
            updater=UpdaterConfig(enabled=False),
            runtime=RuntimeConfig(streams=(StreamConfig("gate", queue_size=4),)),
            aggregation=AggregationTaskConfig(enabled=True, rules_file=rules, tick_s=0.02),
        )
        agent = Agent(config, SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            spec = parse_runtime_spec(yaml.safe_load(RUNTIME), where="runtime")
            model = walker_model(tmp_path / "walker.onnx")
            await agent.host.serve(ModelBundle(model, "people", "2.0.1", runtime=spec))
            try:
                yield agent
            finally:
                await agent.shutdown(5.0)


async def walk_across(agent: Agent, results: Any) -> None:
    """Frames of a person walking left to right (x 0.16 -> 0.94), each processed before
    the next is submitted."""
    pipeline = agent.pipeline
    assert pipeline is not None
    for level in range(40, 250, 10):
        done = results()
        frame = np.full((SIZE, SIZE, 3), level, dtype=np.uint8)
        assert pipeline.submit("gate", frame).queued
        with anyio.fail_after(5):
            while results() == done:
                await anyio.sleep(0.002)


async def next_reports(agent: Agent, count: int) -> None:
    """Until the health task has built `count` more reports (every 0.2 s here)."""
    seen = agent.telemetry._seq
    with anyio.fail_after(5):
        while agent.telemetry._seq < seen + count:
            await anyio.sleep(0.01)


def stored(agent: Agent, kind: str) -> list[Record]:
    config, files = agent._config, agent.files
    assert files is not None
    with Outbox.open(
        config.outbox_path,
        node_id=files.node_id,
        budget_bytes=config.outbox_budget_bytes,
        clock=SystemClock(),
    ) as outbox:
        return outbox.pending(1000, 1 << 24, [kind])  # type: ignore[list-item]


async def test_a_person_crossing_into_the_zone_is_one_event_in_the_outbox(
    tmp_path: Path,
) -> None:
    async with serving_agent(tmp_path, RULES) as agent:
        aggregation = agent.aggregation
        assert aggregation is not None
        await walk_across(agent, lambda: aggregation.stats.offered)
        with anyio.fail_after(5):
            while aggregation.stats.events_stored == 0:
                await anyio.sleep(0.01)
        await next_reports(agent, 2)
    [record] = stored(agent, "event")
    event = decode_event(record.payload)
    assert record.id == event.event_id
    assert (event.type, event.rule_id) == ("zone.intrusion", "yard")
    assert event.provenance == (Provenance("node", "people", "2.0.1"),)
    assert event.entities[0].camera == "gate"
    assert aggregation.stats.queue_overflow == 0
    reports = [json.loads(r.payload) for r in stored(agent, "health")]
    sections = [r["aggregation"] for r in reports]
    assert sections[-1]["state"] == "running"
    assert (sections[-1]["rules"], sections[-1]["events"]) == (1, {"zone.intrusion": 1})
    assert sections[-1]["events_stored"] == 1


async def test_with_a_bad_rules_file_the_node_serves_and_says_why_in_health(
    tmp_path: Path,
) -> None:
    broken = RULES.replace("[0.6, 0], [1, 0], [1, 1], [0.6, 1]", "[0.6, 0], [1, 0]")
    async with serving_agent(tmp_path, broken) as agent:
        await walk_across(agent, lambda: agent.results.stats().offered)
        aggregation = agent.aggregation
        assert aggregation is not None and aggregation.state == "failed"
        assert not agent.stopping
        await next_reports(agent, 2)
    assert stored(agent, "event") == []
    reports = [json.loads(r.payload) for r in stored(agent, "health")]
    failed = [r["aggregation"] for r in reports if r["aggregation"]["state"] == "failed"]
    assert failed, "no health report said the aggregation failed"
    assert "rules[0].zone" in failed[-1]["error"]
    # The model served all along: its frames are in the node's latency figures.
    assert any("people@2.0.1" in r["latency"] for r in reports)
