"""The agent against a real control plane over gRPC: enrollment, Hello, health records,
restart without re-enrolling, revocation, fatal task errors and an idempotent shutdown.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import numpy as np
import pytest
from sqlalchemy import Engine, select

from control_plane.storage.models import NodeRecordRow
from edge_node.agent import (
    EXIT_REFUSED,
    HEALTH_SCHEMA,
    Agent,
    AgentContext,
    EnrollmentError,
    NodeRefusedError,
    TaskFailedError,
)
from edge_node.capture import HttpSourceConfig, StreamSource
from edge_node.clock import SystemClock
from edge_node.config import AgentConfig
from edge_node.enroll import IDENTITY_FILE
from edge_node.link.grpc_link import GrpcLinkSettings
from edge_node.outbox import Outbox
from edge_node.runtime.config import PreprocessConfig, RuntimeConfig, StreamConfig
from edge_node.runtime.pipeline import FrameResult
from edge_node.updater.host import ModelBundle
from tests.conftest import free_port
from tests.control_plane.link.grpc_support import ADMIN, until
from tests.edge_node.agent.support import agent_config, control_plane
from tests.edge_node.capture.camera import fake_camera
from tests.edge_node.runtime._models import echo_model

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def processed(agent: Agent) -> int:
    assert agent.pipeline is not None
    return sum(s.processed for s in agent.pipeline.stats().values())


def stored_payloads(engine: Engine, node_id: str, kind: str) -> list[bytes]:
    with engine.connect() as connection:
        return list(
            connection.scalars(
                select(NodeRecordRow.payload).where(
                    NodeRecordRow.node_id == node_id, NodeRecordRow.kind == kind
                )
            )
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_first_start_enrolls_says_hello_and_delivers_health_then_drains(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path) as plane:
        agent = Agent(agent_config(plane, tmp_path / "node"), SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            assert agent.files is not None
            node_id = agent.files.node_id
            await until(lambda: plane.services.nodes.inventory.get_node(node_id).online)
            await until(lambda: plane.services.records.count(node_id, "health") >= 2)
            # Safe to call twice, concurrently.
            group.start_soon(agent.shutdown, 5.0)
            await agent.shutdown(5.0)
        node = plane.services.nodes.inventory.get_node(node_id)
    assert (node.fleet, node.agent_version) == ("gates", "0.1.0")
    # The outbox was closed: another opener gets it.
    with Outbox.open(
        tmp_path / "node" / "outbox.db", node_id=node_id, budget_bytes=1 << 20, clock=SystemClock()
    ) as reopened:
        records = reopened.pending(1000, 1 << 20)
    assert all(r.kind == "health" for r in records)


async def test_a_restart_with_the_same_data_dir_does_not_enroll_again(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        data_dir = tmp_path / "node"
        first = Agent(agent_config(plane, data_dir), SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(first.run)
            await first.ready.wait()
            await first.shutdown()
        assert first.files is not None
        identity = (data_dir / IDENTITY_FILE).read_bytes()
        # No token this time: enrolling again would fail loudly.
        second = Agent(agent_config(plane, data_dir, bootstrap_token=None), SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(second.run)
            await second.ready.wait()
            assert second.files is not None
            node_id = second.files.node_id
            before = plane.services.records.count(node_id, "health")
            await until(lambda: plane.services.records.count(node_id, "health") > before)
            await second.shutdown()
        assert node_id == first.files.node_id
        assert (data_dir / IDENTITY_FILE).read_bytes() == identity
        assert len(plane.services.nodes.inventory.list_nodes()) == 1


async def test_a_revoked_node_stops_with_the_refused_exit_code(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        agent = Agent(agent_config(plane, tmp_path / "node"), SystemClock())
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:

                async def revoke_when_running() -> None:
                    await agent.ready.wait()
                    assert agent.files is not None
                    node_id = agent.files.node_id
                    await until(lambda: plane.services.records.count(node_id) >= 1)
                    plane.services.nodes.inventory.revoke(ADMIN, node_id)

                group.start_soon(revoke_when_running)
                with pytest.raises(NodeRefusedError) as caught:
                    await agent.run()
    assert caught.value.exit_code == EXIT_REFUSED
    assert caught.value.fields["reason"] == "node-revoked"


async def test_a_failing_component_stops_the_agent_and_closes_the_outbox(
    tmp_path: Path,
) -> None:
    seen: list[AgentContext] = []

    async def broken_updater(context: AgentContext, stop: anyio.Event) -> None:
        seen.append(context)
        await anyio.sleep(0.3)
        raise RuntimeError("journal unreadable")

    async with control_plane(tmp_path) as plane:
        config = agent_config(plane, tmp_path / "node")
        agent = Agent(config, SystemClock(), components={"updater": broken_updater})
        with anyio.fail_after(20), pytest.raises(TaskFailedError) as caught:
            await agent.run()
    assert caught.value.fields["task"] == "updater"
    assert "journal unreadable" in caught.value.message
    assert caught.value.exit_code == 1
    assert seen and seen[0].files.node_id
    Outbox.open(
        config.outbox_path,
        node_id=seen[0].files.node_id,
        budget_bytes=1 << 20,
        clock=SystemClock(),
    ).close()
    await agent.shutdown()  # after run() ended: returns at once


async def test_first_start_without_a_token_is_an_enrollment_error(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        agent = Agent(agent_config(plane, tmp_path / "node", bootstrap_token=None), SystemClock())
        with pytest.raises(EnrollmentError, match="bootstrap_token"):
            await agent.run()


async def test_a_used_token_is_refused_at_enrollment(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        token = plane.token()
        await plane.enroll(tmp_path / "other", token)
        agent = Agent(agent_config(plane, tmp_path / "node", bootstrap_token=token), SystemClock())
        with pytest.raises(EnrollmentError, match="refused"):
            await agent.run()


async def test_shutdown_before_run_makes_run_return_at_once(tmp_path: Path) -> None:
    agent = Agent(
        AgentConfig(data_dir=tmp_path / "node", link=GrpcLinkSettings(target="127.0.0.1:1")),
        SystemClock(),
    )
    await agent.shutdown()
    await agent.shutdown()
    with anyio.fail_after(2):
        await agent.run()
    assert not (tmp_path / "node").exists()


async def test_health_records_are_telemetry_reports_with_the_model_latency(
    tmp_path: Path,
) -> None:
    model = echo_model(tmp_path / "v1.onnx", (1, 3, 8, 8))
    runtime = RuntimeConfig(
        preprocess=PreprocessConfig(scale=1.0, mean=(0.0,), std=(1.0,)),
        streams=(StreamConfig("cam"),),
    )
    async with control_plane(tmp_path) as plane:
        config = agent_config(plane, tmp_path / "node", model_path=model, runtime=runtime)
        agent = Agent(config, SystemClock())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            with anyio.fail_after(15):
                await agent.ready.wait()
            assert agent.files is not None
            node_id = agent.files.node_id
            await until(lambda: agent.pipeline is not None)
            assert agent.pipeline is not None
            frame = np.zeros((8, 8, 3), dtype=np.uint8)
            for _ in range(20):
                agent.pipeline.submit("cam", frame)
                await anyio.sleep(0.01)
            await until(lambda: agent.pipeline is not None and processed(agent) >= 20)
            before = plane.services.records.count(node_id, "health")
            await until(lambda: plane.services.records.count(node_id, "health") > before + 1)
            await agent.shutdown(5.0)
        reports = [
            json.loads(payload)
            for payload in stored_payloads(plane.services.engine, node_id, "health")
        ]
    assert reports and all(
        r["schema"] == HEALTH_SCHEMA == "edgefleet.agent.health/2" for r in reports
    )
    assert all(r["node_id"] == node_id and r["memory"]["rss_bytes"] > 0 for r in reports)
    with_frames = [r for r in reports if r.get("latency")]
    assert with_frames, "no report carried the frames' latency"
    # A local model_path: named by its file, run with node.yaml's preprocess.
    assert set(with_frames[-1]["latency"]) == {"v1.onnx"}
    assert with_frames[-1]["model_active"] == "v1.onnx"
    assert with_frames[-1]["model_runtime"] == {
        "config": "node",
        "session_overrides": [],
        "node_preprocess_ignored": False,
    }
    # Drift baselines are kept for the next start.
    assert (tmp_path / "node" / "telemetry-baselines.json").exists()


async def test_a_configured_model_is_served_and_the_updater_seam_swaps_it(
    tmp_path: Path,
) -> None:
    first = echo_model(tmp_path / "v1.onnx", (1, 3, 8, 8))
    second = echo_model(tmp_path / "v2.onnx", (1, 3, 8, 8), add=1.0)
    runtime = RuntimeConfig(
        preprocess=PreprocessConfig(scale=1.0, mean=(0.0,), std=(1.0,)),
        streams=(StreamConfig("cam"),),
    )
    async with control_plane(tmp_path) as plane:
        agent = Agent(
            agent_config(plane, tmp_path / "node", model_path=first, runtime=runtime),
            SystemClock(),
        )
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            await agent.ready.wait()
            await until(lambda: agent.pipeline is not None)
            assert agent.pipeline is not None
            agent.pipeline.submit("cam", np.zeros((8, 8, 3), dtype=np.uint8))
            await agent.host.serve(ModelBundle.local(second))
            assert agent.pipeline.session.path == second
            await agent.shutdown()
    assert agent.pipeline is None


async def test_a_stream_with_an_http_source_is_served_across_a_swap_and_a_dead_camera_is_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = echo_model(tmp_path / "v1.onnx", (1, 3, 8, 8))
    second = echo_model(tmp_path / "v2.onnx", (1, 3, 8, 8), add=1.0)
    runtime = RuntimeConfig(
        preprocess=PreprocessConfig(scale=1.0, mean=(0.0,), std=(1.0,)),
        streams=(StreamConfig("door", target_fps=10), StreamConfig("dead", target_fps=10)),
    )
    dead = HttpSourceConfig(
        url=f"http://127.0.0.1:{free_port()}/snap.jpg", backoff_initial_s=0.05, backoff_max_s=0.2
    )
    results: list[FrameResult] = []
    with fake_camera() as camera:
        sources = (
            StreamSource("door", HttpSourceConfig(url=camera.url), fps=10.0),
            StreamSource("dead", dead, fps=10.0),
        )
        async with control_plane(tmp_path) as plane:
            config = agent_config(
                plane, tmp_path / "node", model_path=first, runtime=runtime, camera_sources=sources
            )
            count = Agent._count_result

            def record(self: Agent, result: FrameResult) -> None:
                results.append(result)
                count(self, result)

            # On the class, before the agent binds it as its runtime's `on_result`.
            monkeypatch.setattr(Agent, "_count_result", record)
            agent = Agent(config, SystemClock())
            async with anyio.create_task_group() as group:
                group.start_soon(agent.run)
                with anyio.fail_after(15):
                    await agent.ready.wait()
                await until(lambda: len(results) >= 5)
                assert {r.stream for r in results} == {"door"}
                assert results[-1].decoded.tensors[0].mean == pytest.approx(128, abs=3)
                # The same pipeline, a new session.
                await agent.host.serve(ModelBundle.local(second))
                await until(lambda: results[-1].model != results[0].model)
                await until(lambda: agent.capture_stats()["dead"].failures.get("connect", 0) >= 3)
                assert not agent.stopping
                stats = agent.capture_stats()
                assert stats["door"].captured >= 5 and stats["door"].failures == {}
                assert agent.files is not None
                node_id = agent.files.node_id

                def reported(key: str, stream: str) -> int:
                    return sum(
                        sum(v.values()) if isinstance(v, dict) else v
                        for payload in stored_payloads(plane.services.engine, node_id, "health")
                        for v in [
                            json.loads(payload).get("streams", {}).get(stream, {}).get(key, 0)
                        ]
                    )

                await until(lambda: reported("captured", "door") >= 5)
                await until(lambda: reported("capture_failed", "dead") >= 3)
                stopped_at = anyio.current_time()
                await agent.shutdown(5.0)
            assert anyio.current_time() - stopped_at < 5.0
    assert results[-1].decoded.tensors[0].mean == pytest.approx(129, abs=3)
    assert agent.pipeline is None


async def test_a_stop_while_the_control_plane_is_unreachable_at_first_start_is_clean(
    tmp_path: Path,
) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(b"not used: nothing answers")
    config = AgentConfig(
        data_dir=tmp_path / "node",
        link=GrpcLinkSettings(target=f"127.0.0.1:{free_port()}"),
        enroll_address=f"127.0.0.1:{free_port()}",
        bootstrap_token="token",
        ca_file=ca_file,
    )
    agent = Agent(config, SystemClock())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            await anyio.sleep(0.5)  # at least one refused connection and a backoff wait
            await agent.shutdown(2.0)
    assert agent.files is None
    assert not (tmp_path / "node" / IDENTITY_FILE).exists()


@pytest.mark.parametrize("content", [b"[]", b"null", b"{not json", b'{"v": "nonsense"}'])
def test_unreadable_drift_baselines_are_ignored_not_fatal(tmp_path: Path, content: bytes) -> None:
    agent = Agent(AgentConfig(data_dir=tmp_path), SystemClock())
    (tmp_path / "telemetry-baselines.json").write_bytes(content)
    agent._load_baselines()  # logs and starts from fresh baselines
    (tmp_path / "telemetry-baselines.json").unlink()
    (tmp_path / "telemetry-baselines.json").mkdir()  # not even a file
    agent._load_baselines()


def test_a_failing_baseline_save_is_warned_once_while_it_lasts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(AgentConfig(data_dir=tmp_path), SystemClock())
    (tmp_path / "telemetry-baselines.json").mkdir()  # every atomic write onto it fails
    with caplog.at_level(logging.DEBUG, logger="edge_node.agent.agent"):
        for _ in range(5):  # five health intervals on a full disk
            agent._save_baselines()
    said = [r for r in caplog.records if "could not save drift baselines" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING] + [logging.DEBUG] * 4
    (tmp_path / "telemetry-baselines.json").rmdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="edge_node.agent.agent"):
        agent._save_baselines()
        agent._save_baselines()
    assert [r.getMessage() for r in caplog.records] == ["drift baselines saved again"]
    assert (tmp_path / "telemetry-baselines.json").is_file()
