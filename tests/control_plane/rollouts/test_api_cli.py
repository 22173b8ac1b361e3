"""Rollouts over REST and the CLI against a real control plane (uvicorn on loopback): a dry
run, create, status, watch, the commands and their roles, refusals as problem details.
The controller is ticked by hand (the server runs without its background loops)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.access.roles import Role
from control_plane.access.service import SYSTEM
from control_plane.cli.commands import rollouts as rollout_commands
from control_plane.cli.release import ReleaseClient
from control_plane.registry import sample_models
from control_plane.storage import session_factory
from control_plane.storage.models import HealthLatestRow
from control_plane.trust.keys import init_operator_keys
from tests.control_plane.cli.test_cli import Cli
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr

FLEET = "parks"


@pytest.fixture
def fleet(live_server: LiveServer, tmp_path: Path) -> list[str]:
    """Fleet `parks` with det 1.0.0 and 1.1.0, and four nodes serving 1.0.0."""
    keyset = init_operator_keys(tmp_path / "keys", root_keys=1, root_threshold=1, passphrase=None)
    with live_server.api() as api:
        release = ReleaseClient(api, keyset)
        release.create_fleet(FLEET)
        for version, seed in (("1.0.0", 1), ("1.1.0", 2)):
            model = sample_models.tiny_detector(tmp_path / f"{version}.onnx", seed=seed)
            release.push_model(FLEET, model, name="det", version=version)
    nodes = live_server.services.nodes
    ids = []
    for i in range(4):
        token, _ = nodes.tokens.create_bootstrap_token(
            SYSTEM, FLEET, {"site": "ab"[i % 2]}, timedelta(hours=1)
        )
        node_id = nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id
        state = {"active_target": "models/det/1.0.0/model.onnx"}
        nodes.presence.record_hello(node_id, "0.1.0", "grpc", state)
        ids.append(node_id)
    return ids


@pytest.fixture
def cli(live_server: LiveServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    return Cli(live_server, capsys, tmp_path / "keys")


def token(server: LiveServer, role: Role) -> str:
    created, _ = server.services.access.create_token(SYSTEM, name=role.label, role=role)
    return created


CREATE = ["rollout", "create", "--fleet", FLEET, "--model", "det", "--version", "1.1.0"]
OPTIONS = ["--stages", "1,100%", "--bake", "5m", "--spread", "site"]


def test_the_rollout_commands_round_trip(cli: Cli, fleet: list[str], tmp_path: Path) -> None:
    code, out, err = cli.run(*CREATE, *OPTIONS, "--dry-run")
    assert code == 0, err
    assert "det 1.1.0 to fleet parks (every node): 1,100%, bake 5m" in out
    assert "stage 1 of 2 (1): +1 → 1 of 4" in out
    assert cli.json("rollout", "list") == []  # a dry run stores nothing

    gates = tmp_path / "gates.yaml"
    gates.write_text("error_rate:\n  max_increase: 1.0\n")
    created = cli.json(*CREATE, *OPTIONS, "--gates", str(gates), "--window", "cron * * * * *", "1h")
    assert (created["status"], created["created_by"]) == ("pending", "bootstrap-admin")
    assert created["spec"]["gates"] == {"error_rate": {"max_increase": 1.0}}
    assert created["spec"]["window"] == {"cron": "* * * * *", "duration": "1h"}
    rollout = created["id"]

    cli.server.services.rollouts.tick()
    shown = cli.json("rollout", "status", rollout)
    assert shown["label"].startswith("stage 1 of 2 (1) running")
    assert shown["counts"] == {"assigned": 1, "queued": 3}
    code, out, _ = cli.run("rollout", "status", rollout)
    assert code == 0 and "stage 1 of 2 (1) running" in out and "nodes-started" in out
    code, out, _ = cli.run("rollout", "watch", rollout, "--once")
    assert code == 0 and "queued=3 assigned=1" in out

    paused = cli.json("rollout", "pause", rollout, "--note", "checking the gate camera")
    assert paused["status"] == "paused"
    assert "checking the gate camera" in paused["pause"]["reason"]
    code, out, _ = cli.run("rollout", "status", rollout)
    since = paused["pause"]["since"][:19].replace("T", " ")
    assert code == 0 and f"at {since} because " in out
    resumed = cli.json("rollout", "resume", rollout)
    assert resumed["status"] == "running"
    code, _, err = cli.run("rollout", "promote", rollout)
    assert code == 1 and "promote does not apply" in err

    back = cli.json("rollout", "rollback", rollout, "--note", "pager")
    assert back["status"] == "rolling-back"
    state = cli.server.services.rollouts.state(rollout)
    (touched,) = [n for n, r in state.nodes.items() if r.touched]
    latest = cli.server.services.director.latest(touched)
    assert latest is not None and latest.version == "1.0.0"
    assert latest.created_by == f"rollout:{rollout}"
    listed = cli.json("rollout", "list", "--fleet", FLEET)
    assert [(r["id"], r["status"]) for r in listed] == [(rollout, "rolling-back")]
    code, out, _ = cli.run("rollout", "list")
    assert code == 0 and "rolling-back" in out


def test_refusals_are_problems_naming_the_field_or_the_other_rollout(
    live_server: LiveServer, fleet: list[str], cli: Cli
) -> None:
    code, _, err = cli.run(*CREATE, *OPTIONS[:2], "--bake", "soon")
    assert code == 1 and "bake" in err
    first = cli.json(*CREATE, *OPTIONS, "--selector", "site=a")
    body = {"model": "det", "version": "1.1.0", "stages": "1,100%"}
    headers = {"Authorization": f"Bearer {live_server.admin_token}"}
    with httpx.Client(base_url=live_server.url, headers=headers) as http:
        clash = http.post(f"/v1/fleets/{FLEET}/rollouts", json=body)
        assert clash.status_code == 409
        assert clash.headers["content-type"] == "application/problem+json"
        problem = clash.json()
        assert problem["rollouts"] == [first["id"]] and problem["field"] == "selector"
        assert f"rollout {first['id']}" in problem["detail"]
        dry = http.post(f"/v1/fleets/{FLEET}/rollouts", json={**body, "dry_run": True})
        assert dry.status_code == 200
        assert [c["rollout"] for c in dry.json()["conflicts"]] == [first["id"]]
        missing = http.get("/v1/rollouts/999")
        assert missing.status_code == 404
        wrong = http.post(f"/v1/rollouts/{first['id']}/explode")
        assert wrong.status_code == 422

    viewer = token(live_server, Role.VIEWER)
    operator = token(live_server, Role.OPERATOR)
    code, _, err = cli.run("rollout", "pause", first["id"], token=viewer)
    assert code == 1 and "needs role operator" in err
    assert cli.run("rollout", "status", first["id"], token=viewer)[0] == 0
    code, _, err = cli.run(*CREATE, *OPTIONS, "--selector", "site=b", token=operator)
    assert code == 1 and "needs role release-manager" in err
    code, out, _ = cli.run(*CREATE, *OPTIONS, "--selector", "site=b", "--dry-run", token=operator)
    assert code == 0 and "matched 2 nodes" in out


def test_json_output_of_watch_is_one_document(cli: Cli, fleet: list[str]) -> None:
    created: dict[str, Any] = cli.json(*CREATE, *OPTIONS)
    code, out, _ = cli.run("--output", "json", "rollout", "watch", created["id"])
    assert code == 0
    assert json.loads(out)["id"] == created["id"]


def test_status_shows_the_shadow_stage_with_its_nodes(cli: Cli, fleet: list[str]) -> None:
    """During the shadow stage its node is counted there (not under the canary stage it
    joins later) and listed with what its newest report says of the candidate."""
    created = cli.json(*CREATE, "--stages", "shadow:1,100%", "--bake", "5m", "--spread", "site")
    rollout = created["id"]
    cli.server.services.rollouts.tick()
    state = cli.server.services.rollouts.state(rollout)
    (shadow,) = [n for n, r in state.nodes.items() if r.track == "shadow"]
    started = state.nodes[shadow].started_at
    assert started is not None
    with session_factory(cli.server.services.engine)() as session:
        session.add(
            HealthLatestRow(
                node_id=shadow,
                record_id="r1",
                at=started + timedelta(seconds=30),
                schema="edgefleet.agent.health/2",
                metrics={},
                latency={},
                shadow={"candidate": "det@1.1.0", "state": "running", "frames_compared": 120},
            )
        )
        session.commit()

    shown = cli.json("rollout", "status", rollout)
    assert shown["stage_counts"] == {"0": {"assigned": 1}, "1": {"queued": 3}}
    assert shown["shadow_nodes"] == [
        {
            "node_id": shadow,
            "phase": "assigned",
            "state": "running",
            "frames_compared": 120,
            "reason": "",
        }
    ]
    code, out, _ = cli.run("rollout", "status", rollout)
    assert code == 0
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "assigned=1" in rows["shadow (1)"]
    assert "queued=3" in rows["stage 1 of 1 (100%)"]
    assert "assigned" not in rows["stage 1 of 1 (100%)"]
    assert "running" in rows[shadow] and "120" in rows[shadow]

    # Ended, its nodes show what they ended as, not the phase they were left in.
    back = cli.json("rollout", "rollback", rollout, "--note", "wrong build")
    assert back["status"] == "rolled-back"
    assert back["counts"] == {"never-started": 3, "shadow-cleared": 1}
    assert back["stage_counts"] == {"0": {"shadow-cleared": 1}, "1": {"never-started": 3}}
    assert [(n["phase"], n["state"], n["frames_compared"]) for n in back["shadow_nodes"]] == [
        ("shadow-cleared", "", 120)
    ]
    (listed,) = cli.json("rollout", "list")
    assert listed["counts"] == {"never-started": 3, "shadow-cleared": 1}
    code, out, _ = cli.run("rollout", "status", rollout)
    assert code == 0 and "never-started=3 shadow-cleared=1" in out and "running" not in out


def test_create_warns_of_a_stage_short_of_controls(cli: Cli, fleet: list[str]) -> None:
    # Four nodes, two canaries: two stay on 1.0.0, fewer than the three controls wanted.
    short = [*CREATE, "--stages", "2,100%", "--bake", "5m", "--spread", "site"]
    code, out, err = cli.run(*short, "--dry-run")
    assert code == 0, err
    assert "warning: stage 1 of 2 (2) has 2 controls, fewer than 3" in out
    code, out, err = cli.run(*short)
    assert code == 0, err
    assert "warning: stage 1 of 2 (2) has 2 controls, fewer than 3" in out
    assert "--control none" in out


def test_watch_to_a_pipe_prints_a_line_per_change(
    cli: Cli, fleet: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    created = cli.json(*CREATE, *OPTIONS)
    rollout = created["id"]
    steps = iter(
        [
            lambda: cli.server.services.rollouts.tick(),  # pending → running
            lambda: None,  # nothing changed: no line
            lambda: httpx.post(
                f"{cli.server.url}/v1/rollouts/{rollout}/abort",
                headers={"Authorization": f"Bearer {cli.server.admin_token}"},
                json={"note": "stop"},
            ).raise_for_status(),
        ]
    )
    written: list[str] = []

    def step(_: float) -> None:
        written.append(cli.capsys.readouterr().out)  # what was out before this poll
        next(steps)()

    monkeypatch.setattr(rollout_commands, "_sleep", step)
    code, out, err = cli.run("rollout", "watch", rollout, "--interval", "0.2", "--timeout", "60")
    assert code == 0, err
    lines = [line for chunk in [*written, out] for line in chunk.splitlines()]
    assert len(lines) == 3
    assert "pending | nodes - | last " in lines[0]
    assert "stage 1 of 2 (1) running | nodes queued=3 assigned=1 | last nodes-started: " in lines[1]
    assert "aborted | nodes assigned=1 never-started=3 | last aborted: aborted by" in lines[2]
    assert written[1].count("\n") == 1  # each line is out (flushed) before the next poll
