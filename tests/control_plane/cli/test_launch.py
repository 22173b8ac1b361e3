"""The `edgefleet` console script: `node run` reaches the agent without the operator CLI,
every other command reaches the CLI, and a missing extra is named, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Runs the console script's entry point with argv; FORBID (comma-separated modules or top-level
# names) makes those imports fail, as on a box installed without them.
LAUNCH = """
import sys

forbid = set(sys.argv[1].split(",")) - {""}


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name in forbid or name.partition(".")[0] in forbid:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Refuse())
sys.argv = ["edgefleet", *sys.argv[2:]]
from control_plane.cli.launch import run

run()
"""


def launch(*argv: str, forbid: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, forbid, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def test_node_run_reaches_the_agent_without_the_operator_cli() -> None:
    done = launch("node", "run", "--help", forbid="typer,rich,onnx")
    assert done.returncode == 0, done.stderr
    assert "usage: python -m edge_node run" in done.stdout
    assert "--config" in done.stdout


def test_node_run_after_root_options_still_reaches_the_agent_without_the_cli() -> None:
    done = launch("--log-format", "json", "node", "run", "--help", forbid="typer,rich,onnx")
    assert done.returncode == 0, done.stderr
    assert "usage: python -m edge_node run" in done.stdout


def test_the_agent_gets_the_root_log_format_first_and_nothing_else_of_the_root() -> None:
    from control_plane.cli.global_options import node_run

    assert node_run(["node", "run", "--config", "n.yaml"]) == ["run", "--config", "n.yaml"]
    assert node_run(["--log-format=json", "--server", "http://x", "node", "run", "-v"]) == [
        "run",
        "--log-format",
        "json",
        "-v",
    ]
    # Root options after the sub-command are the agent's own arguments, untouched.
    assert node_run(["node", "run", "--log-format", "kv"]) == ["run", "--log-format", "kv"]
    assert node_run(["-o", "json", "nodes", "list"]) is None
    assert node_run(["node", "show", "n-1"]) is None


def test_other_commands_reach_the_operator_cli() -> None:
    done = launch("model", "--help")
    assert done.returncode == 0, done.stderr
    assert "push" in done.stdout


def test_a_missing_extra_is_named() -> None:
    done = launch("model", "list", forbid="typer")
    assert done.returncode == 1
    assert "the operator CLI needs typer" in done.stderr
    assert "pip install 'edgefleet[cli]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_module_of_ours_is_a_traceback() -> None:
    """A broken install is not a missing extra: the error stays loud."""
    done = launch("model", "list", forbid="control_plane.cli.main")
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "ModuleNotFoundError" in done.stderr
