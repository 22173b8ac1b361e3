"""What nodes' models saw over REST and the CLI (`GET /v1/nodes/{id}/results`, `edgefleet
nodes results`), and the active version by name in `nodes list` / `nodes show`."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.services import Services
from control_plane.trust.custom import target_label
from tests.control_plane.conftest import LiveServer
from tests.control_plane.link.test_ingest import record
from tests.control_plane.link.test_results_store import document, results_record
from tests.control_plane.nodes.test_api import enroll, new_token
from tests.control_plane.nodes.test_cli import Cli
from tests.control_plane.nodes.test_cli import enroll as enroll_live

TARGET = "models/detector/1.1.0/model.onnx"


def with_results(services: Services, node_id: str) -> list[str]:
    """Three results over the ingest, as the node inbox stores them; their ids, newest first."""
    sent = [
        results_record(1, document("gate", 10)),
        results_record(
            2,
            document(
                "yard",
                20,
                kind="classification",
                detections=[
                    {"class_id": 3, "label": "truck", "score": 0.77},
                    {"class_id": 1, "label": "car", "score": 0.12},
                ],
                detections_total=2,
                version=None,
                model="plates.onnx",
            ),
        ),
        results_record(
            3,
            document(
                "gate",
                30,
                detections=[
                    {"class_id": 0, "label": "person", "score": 0.91, "box": [0.1, 0.2, 0.3, 0.4]},
                    {"class_id": 0, "label": "person", "score": 0.85, "box": [0.5, 0.2, 0.6, 0.5]},
                    {"class_id": 2, "label": "plate", "score": 0.66, "box": [0.4, 0.7, 0.5, 0.8]},
                ],
                detections_total=5,
            ),
        ),
        record(4),
    ]
    services.records.store(node_id, sent)
    return [r.id for r in reversed(sent[:3])]


def hello(services: Services, node_id: str, active: str, update: dict[str, Any] | None) -> None:
    services.nodes.presence.record_hello(
        node_id, "0.2.0", "grpc", {"active_target": active, "installed_targets": [active]}
    )
    if update is not None:
        services.nodes.presence.record_update_status(node_id, update)


# ------------------------------------------------------------------------------ REST


@pytest.fixture
def node_id(client: TestClient) -> str:
    assert client.post("/v1/fleets", json={"name": "gates"}).status_code == 201
    token = new_token(client, "gates")["token"]
    enrolled = enroll(TestClient(client.app), token)
    assert enrolled.status_code == 201, enrolled.text
    return str(enrolled.json()["node_id"])


def test_a_viewer_reads_a_nodes_results_newest_first(
    client: TestClient, services: Services, node_id: str
) -> None:
    ids = with_results(services, node_id)
    viewer = client.post("/v1/tokens", json={"name": "dash", "role": "viewer"}).json()["token"]
    as_viewer = {"Authorization": f"Bearer {viewer}"}

    response = client.get(f"/v1/nodes/{node_id}/results", headers=as_viewer)
    assert response.status_code == 200, response.text
    shown = response.json()
    assert [r["record_id"] for r in shown] == ids
    newest = shown[0]
    assert (newest["stream"], newest["model_label"], newest["kind"]) == (
        "gate",
        "detector@1.1.0",
        "detection",
    )
    assert (newest["frame_id"], newest["detections_total"]) == (30, 5)
    assert newest["detections"][0] == {
        "class_id": 0,
        "label": "person",
        "score": 0.91,
        "box": [0.1, 0.2, 0.3, 0.4],
    }
    assert newest["latency_ms"] == {
        "queue": 1.0,
        "preprocess": 2.0,
        "inference": 10.0,
        "decode": 0.5,
    }
    assert newest["captured_at"].startswith("2026-12-01T09:00:00.04")
    assert shown[1]["model_label"] == "plates.onnx"  # a local file: no version

    gate = client.get(f"/v1/nodes/{node_id}/results?stream=gate&limit=1").json()
    assert [r["frame_id"] for r in gate] == [30]
    assert client.get(f"/v1/nodes/{node_id}/results?stream=dock").json() == []


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/nodes/n-000000000000/results", 404),
        ("/v1/nodes/{node}/results?limit=0", 422),
        ("/v1/nodes/{node}/results?limit=1001", 422),
        ("/v1/nodes/{node}/results?stream=" + "x" * 300, 422),
    ],
)
def test_bad_result_queries(client: TestClient, node_id: str, path: str, status: int) -> None:
    response = client.get(path.format(node=node_id))
    assert response.status_code == status, response.text


def test_results_need_a_token(client: TestClient, node_id: str) -> None:
    response = client.get(f"/v1/nodes/{node_id}/results", headers={"Authorization": ""})
    assert response.status_code == 401


def test_the_node_shows_what_it_serves_by_name(
    client: TestClient, services: Services, node_id: str
) -> None:
    assert client.get(f"/v1/nodes/{node_id}").json()["active_model"] is None
    hello(services, node_id, TARGET, None)
    assert client.get(f"/v1/nodes/{node_id}").json()["active_model"] == "detector@1.1.0"
    (listed,) = client.get("/v1/nodes").json()
    assert listed["active_model"] == "detector@1.1.0"


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("models/detector/1.1.0/model.onnx", "detector@1.1.0"),
        ("models/plates/2.0.0-rc.1/model.onnx", "plates@2.0.0-rc.1"),
        ("models/detector/1.1.0/reference.npz", "reference.npz"),
        ("/opt/models/local.onnx", "local.onnx"),
        ("local.onnx", "local.onnx"),
        ("", None),
        (None, None),
    ],
)
def test_target_labels(path: str | None, label: str | None) -> None:
    assert target_label(path) == label


# ------------------------------------------------------------------------------- CLI


@pytest.fixture
def cli(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")  # rich folds table cells on narrow terminals
    with live_server.api() as api:
        api.create_fleet("gates")
    return Cli(live_server, capsys)


@pytest.fixture
def live_node(cli: Cli) -> str:
    token = cli.json("node", "token", "create", "--fleet", "gates")["token"]
    return str(enroll_live(cli.server, token)["node_id"])


def test_nodes_results_prints_what_the_model_saw(cli: Cli, live_node: str) -> None:
    code, out, err = cli.run("nodes", "results", live_node)
    assert code == 0, err
    assert f"node {live_node} has sent no results" in out

    with_results(cli.server.services, live_node)
    code, out, err = cli.run("nodes", "results", live_node)
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if "stream" in line)
    columns = ("time", "stream", "model", "kind", "detections", "queue/pre/infer/decode ms")
    assert all(column in header for column in columns), header
    gate = next(i for i, line in enumerate(lines) if "person 0.91" in line)
    assert "2026-12-01 09:00:00.040" in lines[gate]
    assert "detector@1.1.0" in lines[gate] and "detection" in lines[gate]
    assert "person 0.91 [0.10,0.20,0.30,0.40]" in lines[gate]
    assert "1.0/2.0/10.0/0.5" in lines[gate]
    assert "plate 0.66 [0.40,0.70,0.50,0.80]" in lines[gate + 2]
    assert "+2 more" in lines[gate + 3]  # five detected, three shown
    assert "truck 0.77" in out and "plates.onnx" in out  # classification, a local file

    code, out, _ = cli.run("nodes", "results", live_node, "--stream", "yard")
    assert "truck 0.77" in out and "person" not in out
    shown = cli.json("nodes", "results", live_node, "--limit", "2")
    assert [r["frame_id"] for r in shown] == [30, 20]
    code, _, err = cli.run("nodes", "results", live_node, "--limit", "0")
    assert code != 0 and "--limit" in err


def test_nodes_list_and_show_name_the_active_version(cli: Cli, live_node: str) -> None:
    update = {
        "target_path": "models/detector/1.2.0/model.onnx",
        "phase": "failed",
        "detail": "self-test: output-mismatch",
        "director_sequence": 2,
        "at": None,
    }
    hello(cli.server.services, live_node, TARGET, update)
    code, out, err = cli.run("nodes", "list")
    assert code == 0, err
    header = next(line for line in out.splitlines() if " id " in line)
    row = next(line for line in out.splitlines() if live_node in line)
    assert "active" in header and "detector@1.1.0" in row

    code, out, err = cli.run("nodes", "show", live_node)
    assert code == 0, err
    assert "detector@1.1.0" in out
    assert "last update: failed — self-test: output-mismatch" in out
    assert "detector@1.2.0 (models/detector/1.2.0/model.onnx)" in out
    shown = cli.json("nodes", "show", live_node)
    assert shown["active_model"] == "detector@1.1.0"
