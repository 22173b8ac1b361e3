"""Global options (`--server`, `--token`, `-o/--output`, `--log-format`) before or after
the sub-command, against a real control plane; and the argument rewrite behind it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from control_plane.cli.global_options import hoist_global_options
from control_plane.cli.main import main
from tests.conftest import free_port
from tests.control_plane.conftest import LiveServer


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["fleet", "list", "-o", "json"], ["-o", "json", "fleet", "list"]),
        (["fleet", "list", "--output=json"], ["--output=json", "fleet", "list"]),
        (["fleet", "list", "-ojson"], ["-ojson", "fleet", "list"]),
        (
            ["-o", "table", "model", "list", "--fleet", "f", "--server", "http://x", "-o", "json"],
            ["-o", "table", "--server", "http://x", "-o", "json", "model", "list", "--fleet", "f"],
        ),
        (["--log-format", "json", "server"], ["--log-format", "json", "server"]),
        # The agent's arguments are the agent's; `--` ends options.
        (
            ["node", "run", "--server-grpc", "h:1", "-o", "x"],
            ["node", "run", "--server-grpc", "h:1", "-o", "x"],
        ),
        (
            ["-o", "json", "node", "run", "--token", "t"],
            ["-o", "json", "node", "run", "--token", "t"],
        ),
        (["nodes", "show", "--", "-o"], ["nodes", "show", "--", "-o"]),
        # Without its value an option stays put, for typer to report.
        (["fleet", "list", "--token"], ["fleet", "list", "--token"]),
    ],
)
def test_hoisting(argv: list[str], expected: list[str]) -> None:
    assert hoist_global_options(argv) == expected


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_options_work_before_and_after_the_sub_command(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDGEFLEET_TOKEN", raising=False)
    connect = ["--server", live_server.url, "--token", live_server.admin_token]
    assert run(capsys, *connect, "fleet", "create", "--help")[0] == 0
    created = run(capsys, *connect, "-o", "json", "token", "create", "--role", "viewer")
    assert created[0] == 0, created[2]

    before = run(capsys, *connect, "-o", "json", "token", "list")
    after = run(capsys, "token", "list", *connect, "-o", "json")
    mixed = run(
        capsys,
        "--server",
        live_server.url,
        "token",
        "list",
        "--output=json",
        "--token",
        live_server.admin_token,
    )
    assert before[0] == after[0] == mixed[0] == 0, (before[2], after[2], mixed[2])
    listed = json.loads(before[1])
    assert {t["role"] for t in listed} >= {"viewer"}
    assert json.loads(after[1]) == json.loads(mixed[1]) == listed

    table = run(capsys, *connect, "token", "list")
    assert table[0] == 0 and not table[1].lstrip().startswith("[")
    # The later one wins, as for any option typer reads twice.
    assert json.loads(run(capsys, "-o", "table", *connect, "token", "list", "-o", "json")[1])


def test_an_option_after_the_sub_command_beats_the_environment(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_SERVER", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("EDGEFLEET_TOKEN", live_server.admin_token)
    code, _, err = run(capsys, "fleet", "list")
    assert code == 1 and "cannot reach the control plane" in err
    code, out, err = run(capsys, "fleet", "list", "--server", live_server.url, "-o", "json")
    assert code == 0, err
    assert json.loads(out) == []


def test_bad_global_options_after_the_sub_command_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(capsys, "fleet", "list", "-o", "yaml")[0] == 2
    assert run(capsys, "fleet", "list", "--log-format", "xml")[0] == 2
    code, _, err = run(capsys, "fleet", "list", "--token")
    assert code == 2 and "--token" in err


def test_a_bad_log_format_in_the_environment_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_LOG_FORMAT", "xml")
    code, _, err = run(capsys, "fleet", "list")
    assert code == 2 and "--log-format must be logfmt or json" in err


def test_node_run_hands_the_root_log_format_to_the_agent(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "control_plane.cli.main",
            "--log-format",
            "json",
            "node",
            "run",
            "--data-dir",
            str(tmp_path / "empty"),
            "--fleet",
            "f",
            "--server-grpc",
            "127.0.0.1:9",
        ],
        env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    (record,) = (json.loads(line) for line in done.stderr.splitlines())
    assert record["logger"] == "edge_node" and "holds no node identity" in record["msg"]


@pytest.mark.parametrize(
    ("server", "token", "warned"),
    [
        ("http://0.0.0.0:1", "eft_x", True),  # not loopback (Linux connects it locally)
        ("http://cp.invalid:1", "eft_x", True),  # a name may resolve anywhere
        ("http://127.0.0.1:1", "eft_x", False),
        ("http://localhost:1", "eft_x", False),
        ("http://[::1]:1", "eft_x", False),
        ("https://0.0.0.0:1", "eft_x", False),
        ("http://0.0.0.0:1", "", False),  # no token, nothing to leak
    ],
)
def test_a_token_over_plain_http_to_another_machine_is_warned_about(
    server: str, token: str, warned: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--server", server, "fleet", "list"]
    code = main([*argv, "--token", token] if token else argv)
    assert code == 1  # nothing listens there; the call fails either way
    err = capsys.readouterr().err
    assert ("sending the API token in clear text to " + server in err) is warned
