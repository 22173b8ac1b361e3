"""The `edgefleet` CLI against a real control plane: exit codes, JSON output, errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from control_plane.cli.main import main
from control_plane.registry import sample_models
from tests.conftest import free_port
from tests.control_plane.conftest import LiveServer


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str], keys: Path):
        self.server = server
        self.capsys = capsys
        self.keys = keys

    def run(self, *args: str, token: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            [
                "--server",
                self.server.url,
                "--token",
                self.server.admin_token if token is None else token,
                *args,
            ]
        )
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run("--output", "json", *args)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(live_server: LiveServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    return Cli(live_server, capsys, tmp_path / "keys")


def test_keys_init_writes_private_keys_0600_and_never_overwrites(cli: Cli) -> None:
    made = cli.json("keys", "init", "--out", str(cli.keys), "--root-keys", "3")
    assert made["root_threshold"] == 2
    assert len(made["root_keyids"]) == 3
    for key in cli.keys.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    code, _, err = cli.run("keys", "init", "--out", str(cli.keys))
    assert code == 1
    assert "error:" in err


def test_the_whole_release_flow_through_the_cli(cli: Cli, tmp_path: Path) -> None:
    cli.json("keys", "init", "--out", str(cli.keys))
    fleet = cli.json("fleet", "create", "factory", "--keys", str(cli.keys))
    assert fleet["state"] == "active"
    model = sample_models.tiny_detector(tmp_path / "det.onnx")
    pushed = cli.json(
        "model",
        "push",
        str(model),
        "--fleet",
        "factory",
        "--name",
        "det",
        "--version",
        "1.0.0",
        "--keys",
        str(cli.keys),
    )
    assert pushed["release_counter"] == 1
    assert pushed["targets_version"] == 2

    listed = cli.json("model", "list", "--fleet", "factory")
    assert [(m["model"], m["version"]) for m in listed] == [("det", "1.0.0")]
    shown = cli.json("model", "show", "det", "--fleet", "factory", "--version", "1.0.0")
    assert shown["custom"]["io"]["outputs"][0]["name"] == "scores"

    second = sample_models.tiny_detector(tmp_path / "det2.onnx", seed=2)
    cli.json(
        "model",
        "push",
        str(second),
        "--fleet",
        "factory",
        "--name",
        "det",
        "--version",
        "1.1.0",
        "--keys",
        str(cli.keys),
    )
    revoked = cli.json(
        "model", "revoke", "det", "1.0.0", "--fleet", "factory", "--keys", str(cli.keys)
    )
    assert revoked["floor"] == 2
    versions = cli.json("model", "show", "det", "--fleet", "factory")
    assert [(v["version"], v["revoked"]) for v in versions] == [("1.0.0", True), ("1.1.0", False)]

    audit = cli.json("audit", "list", "--action", "targets.push")
    assert len(audit) == 3
    assert {e["outcome"] for e in audit} == {"ok"}

    # human-readable table output works too
    code, out, _ = cli.run("model", "list", "--fleet", "factory")
    assert code == 0
    assert "det" in out


def test_token_commands(cli: Cli) -> None:
    created = cli.json("token", "create", "--role", "viewer", "--name", "dashboard")
    assert created["token"].startswith("eft_")
    listed = cli.json("token", "list")
    assert {t["name"] for t in listed} == {"bootstrap-admin", "dashboard"}
    code, _, err = cli.run("token", "create", "--role", "admin", token=created["token"])
    assert code == 1
    assert "needs role admin" in err
    cli.json("token", "revoke", created["id"])
    code, _, err = cli.run("fleet", "list", token=created["token"])
    assert code == 1
    assert "revoked" in err


def test_a_bad_model_is_a_clear_error(cli: Cli, tmp_path: Path) -> None:
    cli.json("keys", "init", "--out", str(cli.keys))
    cli.json("fleet", "create", "shops", "--keys", str(cli.keys))
    garbage = tmp_path / "notes.onnx"
    garbage.write_text("not a model")
    code, _, err = cli.run(
        "model",
        "push",
        str(garbage),
        "--fleet",
        "shops",
        "--name",
        "det",
        "--version",
        "1.0.0",
        "--keys",
        str(cli.keys),
    )
    assert code == 1
    assert "not an ONNX model" in err


def test_missing_token_and_dead_server_are_clear_errors(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEFLEET_TOKEN", raising=False)
    assert main(["fleet", "list"]) == 1
    assert "no API token" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["--server", dead, "--token", "eft_x", "fleet", "list"]) == 1
    assert "cannot reach the control plane" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "push"]) == 2
    assert main(["--output", "yaml", "fleet", "list"]) == 2
