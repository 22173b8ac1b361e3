"""Issue 12, done when: a fleet moves between two real detectors with different input
sizes and normalisation by `nodes pin` alone, and their detections are visible.

A real control plane on loopback (REST + gRPC, SQLite), the operator's `edgefleet model
push --runtime` and `edgefleet nodes pin` through the CLI, and an in-process node agent
fed camera frames. The two detectors (built with `onnx.helper`) differ as real ones do:
A takes [1,3,416,416] pixels scaled to [0, 1] and stretched; B takes [1,3,480,640] with
ImageNet's mean and std, letterboxed. The node's own preprocess config fits neither:
it serves each version with the runtime spec signed with it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from control_plane.health.config import HealthConfig
from control_plane.services import ServiceConfig
from edge_node.agent import Agent
from edge_node.clock import SystemClock
from edge_node.results.sampling import ResultsConfig
from edge_node.runtime.config import RuntimeConfig, StreamConfig
from protos.bundle.preprocess import Preprocessor
from protos.bundle.spec import PreprocessConfig, RuntimeSpec, parse_runtime_spec
from tests.control_plane.link.desired_support import FLEET
from tests.edge_node.agent.update_support import (
    FleetPlane,
    fleet_plane,
    node_of,
    run_cli,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODEL = "detector"
LABELS = ("person", "vehicle")
FRAME_HW = (360, 640)  # a 16:9 camera: A stretches it, B letterboxes it
DONE = "watchdog window passed"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# What the node would run a version without a runtime spec with: fits neither detector
# (size, channel order and normalisation all differ).
NODE_PREPROCESS = PreprocessConfig(
    size=(32, 32), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channel_order="BGR"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ----------------------------------------------------------------- the two detectors


@dataclass(frozen=True)
class Detector:
    """One detector version: its input size, runtime.yaml, and the candidate boxes its
    model emits (cx, cy, w, h in input pixels; candidate 0 is a person, 1 a vehicle)."""

    version: str
    size: tuple[int, int]  # (height, width)
    runtime_yaml: str
    boxes: tuple[tuple[float, float, float, float], ...]
    # Per class: (weight on each channel's mean, bias) of its candidate's logit.
    person: tuple[float, float]
    vehicle: tuple[float, float]

    def runtime(self) -> RuntimeSpec:
        return parse_runtime_spec(yaml.safe_load(self.runtime_yaml), where="runtime")


A = Detector(
    version="1.0.0",
    size=(416, 416),
    runtime_yaml="""\
# detector A: YOLOv8-style, pixels to [0, 1], stretched to 416x416
preprocess:
  layout: NCHW
  channel_order: RGB
  scale: 0.00392156862745098
  mean: 0
  std: 1
  dtype: float32
output:
  decoder: yolo
  box_format: cxcywh
  objectness: false
  score_threshold: 0.5
  iou_threshold: 0.5
labels: [person, vehicle]
""",
    boxes=((100, 200, 80, 200), (300, 250, 120, 80), (50, 50, 10, 10), (380, 380, 10, 10)),
    person=(2.0, -3.0),  # a white frame: sigmoid(3) = 0.95; a black one: 0.05
    vehicle=(1.5, -2.5),
)

B = Detector(
    version="1.1.0",
    size=(480, 640),
    runtime_yaml="""\
# detector B: ImageNet normalisation, letterboxed into 480x640
preprocess:
  layout: NCHW
  channel_order: RGB
  scale: 0.00392156862745098
  mean: [0.485, 0.456, 0.406]
  std: [0.229, 0.224, 0.225]
  fit: letterbox
  pad_value: 114
  dtype: float32
output:
  decoder: yolo
  box_format: cxcywh
  objectness: false
  score_threshold: 0.5
  iou_threshold: 0.5
labels: [person, vehicle]
""",
    boxes=((200, 240, 100, 120), (480, 300, 160, 100), (20, 20, 8, 8), (620, 460, 8, 8)),
    person=(1.0, -2.0),
    vehicle=(0.8, -2.0),
)


def detector_model(detector: Detector, path: Path) -> Path:
    """[1,3,H,W] -> one [1, 4+2, 4] tensor: the four candidates' boxes (constants) over
    their two class scores, sigmoid(W . channel means + b): the scores follow the
    normalised input, so a wrong normalisation changes them."""
    height, width = detector.size
    candidates = len(detector.boxes)
    weights = np.zeros((3, 2 * candidates), dtype=np.float32)
    bias = np.full((2 * candidates,), -8.0, dtype=np.float32)  # the other candidates: ~0
    for column, (weight, offset) in ((0, detector.person), (candidates + 1, detector.vehicle)):
        weights[:, column] = weight  # class c of candidate n at column c * N + n
        bias[column] = offset
    boxes = np.asarray(detector.boxes, dtype=np.float32).T.reshape(1, 4, candidates)
    initializers = [
        numpy_helper.from_array(np.asarray([1, 3], dtype=np.int64), "flat"),
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(bias, "bias"),
        numpy_helper.from_array(np.asarray([1, 2, candidates], dtype=np.int64), "grid"),
        numpy_helper.from_array(boxes, "boxes"),
    ]
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Reshape", ["pooled", "flat"], ["features"]),
        helper.make_node("MatMul", ["features", "weights"], ["weighted"]),
        helper.make_node("Add", ["weighted", "bias"], ["logits"]),
        helper.make_node("Reshape", ["logits", "grid"], ["class_logits"]),
        helper.make_node("Sigmoid", ["class_logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        f"detector-{detector.version}",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 6, candidates])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString(deterministic=True))
    return path


def expected_person(detector: Detector, frame: np.ndarray[Any, Any]) -> dict[str, Any]:
    """What the node must report for the person candidate on `frame` when it serves
    `detector` with its signed runtime spec: the score, and the box in frame fractions."""
    spec = detector.runtime()
    config = replace(spec.preprocess, size=detector.size)
    tensor = Preprocessor(config, 3)(frame)
    weight, offset = detector.person
    score = 1.0 / (1.0 + np.exp(-(weight * float(tensor.mean(axis=(2, 3)).sum()) + offset)))
    cx, cy, w, h = detector.boxes[0]
    corners = np.asarray([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    frame_h, frame_w = frame.shape[:2]
    model_h, model_w = detector.size
    if spec.preprocess.fit == "letterbox":
        scale = min(model_h / frame_h, model_w / frame_w)
        pad_x, pad_y = (model_w - frame_w * scale) / 2, (model_h - frame_h * scale) / 2
        x = (corners[[0, 2]] - pad_x) / (frame_w * scale)
        y = (corners[[1, 3]] - pad_y) / (frame_h * scale)
    else:
        x, y = corners[[0, 2]] / model_w, corners[[1, 3]] / model_h
    return {"score": score, "box": [x[0], y[0], x[1], y[1]]}


def bright_frame() -> np.ndarray[Any, Any]:
    """A white 16:9 camera frame: both candidates of either detector score over 0.5."""
    return np.full((*FRAME_HW, 3), 255, dtype=np.uint8)


# ---------------------------------------------------------------------- the node


@asynccontextmanager
async def running_agent(fp: FleetPlane, data_dir: Path) -> AsyncIterator[Agent]:
    """An enrolled, connected agent fed white camera frames until the block ends,
    sampling a result per second."""
    config = fp.node_config(
        data_dir,
        runtime=RuntimeConfig(
            preprocess=NODE_PREPROCESS, streams=(StreamConfig("cam", target_fps=200),)
        ),
        results=ResultsConfig(interval_s=1.0, drain_interval_s=0.05),
    )
    agent = Agent(config, SystemClock())
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run)
        with anyio.fail_after(20):
            await agent.ready.wait()
        assert agent.files is not None
        node_id = agent.files.node_id
        await until(lambda: fp.services.nodes.inventory.get_node(node_id).online)
        group.start_soon(feed, agent)
        try:
            yield agent
        finally:
            await agent.shutdown()


async def feed(agent: Agent) -> None:
    """Frames at ~100/s into the runtime while it serves."""
    image = bright_frame()
    while not agent.stopping:
        pipeline = agent.pipeline
        if pipeline is not None:
            pipeline.submit("cam", image)
        await anyio.sleep(0.01)


async def push(
    fp: FleetPlane, capsys: pytest.CaptureFixture[str], detector: Detector, workdir: Path
) -> dict[str, Any]:
    """`edgefleet model push detector-V.onnx --runtime runtime-V.yaml`, as an operator."""
    model = detector_model(detector, workdir / f"detector-{detector.version}.onnx")
    runtime = workdir / f"runtime-{detector.version}.yaml"
    runtime.write_text(detector.runtime_yaml)
    out = await run_cli(
        fp,
        capsys,
        *("-o", "json", "model", "push", str(model), "--fleet", FLEET, "--name", MODEL),
        *("--version", detector.version, "--keys", str(fp.workdir / "keys")),
        *("--runtime", str(runtime)),
    )
    pushed: dict[str, Any] = json.loads(out)
    return pushed


async def pin(
    fp: FleetPlane, capsys: pytest.CaptureFixture[str], node_id: str, version: str
) -> None:
    await run_cli(fp, capsys, "nodes", "pin", node_id, "--model", MODEL, "--version", version)


async def rest(fp: FleetPlane, path: str) -> Any:
    headers = {"Authorization": f"Bearer {fp.running.admin_token}"}
    async with httpx.AsyncClient(base_url=fp.running.url, headers=headers) as http:
        response = await http.get(path)
    assert response.status_code == 200, response.text
    return response.json()


async def settled(fp: FleetPlane, node_id: str, version: str) -> None:
    """`version` is active on the node and through its watchdog window."""
    path = f"models/{MODEL}/{version}/model.onnx"

    def done() -> bool:
        update = fp.reported(node_id).get("update") or {}  # one read: it moves meanwhile
        if update.get("target_path") != path:
            return False
        assert update.get("phase") not in ("failed", "reverted"), update  # fail fast, say why
        return update.get("detail") == DONE

    await until(done, timeout=30)


async def detections_of(fp: FleetPlane, node_id: str, label: str) -> list[dict[str, Any]]:
    """The newest sampled result of `label` (name@version) with detections, once the
    control plane has one (bounded); the REST document."""
    with anyio.fail_after(20):
        while True:
            results = await rest(fp, f"/v1/nodes/{node_id}/results?limit=50")
            for result in results:
                if result["model_label"] == label and result["detections"]:
                    found: list[dict[str, Any]] = result["detections"]
                    return found
            await anyio.sleep(0.1)


def assert_person(detections: Sequence[dict[str, Any]], detector: Detector) -> None:
    by_label = {d["label"]: d for d in detections}
    assert set(by_label) == set(LABELS), detections
    expected = expected_person(detector, bright_frame())
    person = by_label["person"]
    assert person["score"] == pytest.approx(expected["score"], abs=1e-3)
    assert person["box"] == pytest.approx(expected["box"], abs=1e-3)


def serving(agent: Agent) -> tuple[str, tuple[int, int] | None, PreprocessConfig]:
    pipeline = agent.pipeline
    assert pipeline is not None
    session = pipeline.session
    return session.label, session.preprocess.size, session.preprocess


# ----------------------------------------------------------------------------- the case


async def test_a_fleet_moves_between_two_detectors_by_pin_alone(
    tmp_path: Path,
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # tables as wide as their rows: no wrapped cells
    data = tmp_path / "server"
    config = ServiceConfig(
        data_dir=data,
        database_url=sqlite_url,
        artifacts_url=(data / "artifacts").as_uri(),
        max_artifact_bytes=64 << 20,
        refresh_interval_s=3600,
        health=HealthConfig(settle=timedelta(0)),  # nodes show: at once
    )
    data_dir = tmp_path / "node"
    async with fleet_plane(config, tmp_path / "ops") as fp:
        for detector in (A, B):
            pushed = await push(fp, capsys, detector, tmp_path)
            assert pushed["version"] == detector.version
            assert pushed["runtime"]["preprocess"]["size"] == list(detector.size)

        async with running_agent(fp, data_dir) as agent:
            node_id = node_of(agent)
            assert agent.pipeline is None  # nothing assigned yet

            # A: 416x416, pixels to [0, 1], stretched.
            await pin(fp, capsys, node_id, A.version)
            await settled(fp, node_id, A.version)
            pipeline = agent.pipeline
            label, size, pre = serving(agent)
            assert (label, size, pre.fit) == (f"{MODEL}@1.0.0", (416, 416), "stretch")
            assert (pre.mean, pre.std) == ((0.0,), (1.0,))
            assert pipeline is not None and pipeline.session.runtime_source == "signed"
            assert_person(await detections_of(fp, node_id, f"{MODEL}@1.0.0"), A)

            # What the operator sees: the node serves detector@1.0.0, and what it found.
            nodes = json.loads(await run_cli(fp, capsys, "-o", "json", "nodes", "list"))
            assert [n["active_model"] for n in nodes if n["id"] == node_id] == [f"{MODEL}@1.0.0"]
            table = await run_cli(fp, capsys, "nodes", "results", node_id)
            assert f"{MODEL}@1.0.0" in table and "person 0.95" in table
            # And that it runs the signed config: node.yaml's preprocess is not used (its
            # health reports, processed here: this plane runs no background duties).
            processor = fp.services.health.processor
            with anyio.fail_after(20):
                while (await rest(fp, f"/v1/nodes/{node_id}")).get("model_runtime") is None:
                    await anyio.to_thread.run_sync(
                        lambda: processor.process_pending(datetime.now(UTC) + timedelta(seconds=1))
                    )
                    await anyio.sleep(0.1)
            shown = await run_cli(fp, capsys, "nodes", "show", node_id)
            assert "runtime config: signed with the version" in shown, shown
            assert "node.yaml sets runtime.preprocess: not used" in shown, shown

            # B: 480x640, ImageNet mean/std, letterboxed; the same pipeline, no restart.
            await pin(fp, capsys, node_id, B.version)
            await settled(fp, node_id, B.version)
            assert agent.pipeline is pipeline
            label, size, pre = serving(agent)
            assert (label, size, pre.fit) == (f"{MODEL}@1.1.0", (480, 640), "letterbox")
            assert (pre.mean, pre.std) == (IMAGENET_MEAN, IMAGENET_STD)
            assert_person(await detections_of(fp, node_id, f"{MODEL}@1.1.0"), B)
            node = await rest(fp, f"/v1/nodes/{node_id}")
            assert node["active_model"] == f"{MODEL}@1.1.0"
            shown = json.loads(await run_cli(fp, capsys, "-o", "json", "nodes", "results", node_id))
            assert shown[0]["model_label"] == f"{MODEL}@1.1.0"
            table = await run_cli(fp, capsys, "nodes", "results", node_id)
            assert f"{MODEL}@1.1.0" in table and f"{MODEL}@1.0.0" in table

            # Back to A by a pin (a rollback): served at 416x416 again, nothing on the
            # node changed by hand, the same process and pipeline.
            stored = sorted(p.name for p in (data_dir / "models" / "sha256").iterdir())
            await pin(fp, capsys, node_id, A.version)
            await settled(fp, node_id, A.version)
            assert agent.pipeline is pipeline
            label, size, pre = serving(agent)
            assert (label, size, pre.mean) == (f"{MODEL}@1.0.0", (416, 416), (0.0,))
            before = {r["record_id"] for r in await rest(fp, f"/v1/nodes/{node_id}/results")}

            def newer_a(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return [
                    r
                    for r in results
                    if r["record_id"] not in before and r["model_label"] == f"{MODEL}@1.0.0"
                ]

            with anyio.fail_after(20):
                while not newer_a(await rest(fp, f"/v1/nodes/{node_id}/results")):
                    await anyio.sleep(0.1)
            fresh = newer_a(await rest(fp, f"/v1/nodes/{node_id}/results"))
            assert_person(fresh[0]["detections"], A)
            assert sorted(p.name for p in (data_dir / "models" / "sha256").iterdir()) == stored
            stats = pipeline.stats()["cam"]
            assert (dict(stats.failed), dict(stats.bad)) == ({}, {})

        # Each pin went the whole way on the node: checked, self-tested with the signed
        # runtime spec, swapped in, watched (a status repeated after a Hello is one phase).
        statuses = fp.statuses.of(node_id)
        for sequence, detector in enumerate((A, B, A), start=1):
            path = f"models/{MODEL}/{detector.version}/model.onnx"
            mine = [
                s["phase"]
                for s in statuses
                if (s["director_sequence"], s["target_path"]) == (sequence, path)
            ]
            steps = [m for i, m in enumerate(mine) if i == 0 or m != mine[i - 1]]
            assert steps == ["downloading", "verifying", "self-testing", "active"], statuses
