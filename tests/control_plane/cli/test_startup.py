"""`edgefleet --help` stays fast: it must not import the server, HTTP, TUF, ONNX or crypto.

Each case runs the CLI in a fresh interpreter and reads back `sys.modules`, so a heavy
import creeping back into a command module fails here by name (timings: bench/cli_startup.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Top-level packages `--help` must not load, and our own modules that pull them in.
HEAVY = frozenset(
    {
        "alembic",
        "boto3",
        "botocore",
        "cryptography",
        "fastapi",
        "grpc",
        "httpcore",
        "httpx",
        "numpy",
        "onnx",
        "onnxruntime",
        "paho",
        "psutil",
        # Not pydantic itself: typer uses it for options with min/max (`keys init`).
        "pydantic_settings",
        "securesystemslib",
        "sqlalchemy",
        "starlette",
        "tuf",
        "uvicorn",
    }
)
HEAVY_OWN = frozenset(
    {
        "control_plane.cli.client",
        "control_plane.cli.release",
        "control_plane.registry",
        "control_plane.server",
        "control_plane.services",
        "control_plane.settings",
        "control_plane.trust",
    }
)
GROUPS = [
    "keys",
    "fleet",
    "model",
    "token",
    "audit",
    "node",
    "nodes",
    "mqtt",
    "alerts",
    "rollout",
]

_DUMP = """
import json, sys
from control_plane.cli.main import main
code = main(sys.argv[1:])
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def loaded_by(*args: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _DUMP, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100"},
        check=False,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES="))), done.stdout


def heavy_in(modules: set[str]) -> set[str]:
    top = {name.split(".")[0] for name in modules} & HEAVY
    own = {m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY_OWN)}
    return top | own


@pytest.mark.parametrize("group", [None, *GROUPS])
def test_help_imports_nothing_heavy(group: str | None) -> None:
    modules, out = loaded_by(*([group] if group else []), "--help")
    assert "Usage: edgefleet" in out
    assert "control_plane.cli.commands.registry" in modules  # every group was registered
    assert heavy_in(modules) == set()


def test_a_command_loads_what_it_needs_and_only_that() -> None:
    # The dump is not blind: a command that talks HTTP does load httpx and the client.
    modules, _ = loaded_by("--server", "http://127.0.0.1:9", "--token", "t", "fleet", "list")
    assert {"httpx", "control_plane.cli.client"} <= modules
    assert heavy_in(modules) == {"httpx", "httpcore", "control_plane.cli.client"}
