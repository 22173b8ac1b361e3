"""`make demo`, the README's first command, runs end to end: a control plane and an edge
node process, two updates, health, a canary rollout and the node's events (in a scratch
directory, on free ports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_the_demo_runs_a_control_plane_and_a_node_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "control_plane.demo"],
        cwd=tmp_path,
        # The demo's own default width (pytest's may be narrower): its tables on one line.
        env={**os.environ, "COLUMNS": "150"},
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    output = done.stdout + done.stderr
    logs = "".join(
        f"\n--- {name}\n{(tmp_path / '.demo' / name).read_text(errors='replace')[-3000:]}"
        for name in ("server.log", "node.log")
        if (tmp_path / ".demo" / name).exists()
    )
    assert done.returncode == 0, output[-4000:] + logs
    assert "identical: True" in output
    # The INT8 build of 1.0.0, pushed with its signed comparison against FP32.
    assert "release_check   │ passed: top1_ratio" in output, output[-4000:]
    assert "models/detector/1.0.0/model.onnx active" in output
    assert "models/detector/1.1.0/model.onnx active" in output
    assert "$ edgefleet nodes list" in output
    # The canary rollout of 1.2.0: planned, created, baked, judged by the gates, done.
    assert "stage 1 of 2 (1): +1 → 1 of 1" in output, output[-4000:]
    assert "rollout 1: stage 1 of 2 (1) baking" in output, output[-4000:]
    assert "status           done" in output, output[-4000:] + logs
    assert "passed: " in output and "latency_vs_baseline" in output
    # Events: 1.2.0's boxes through the node's rules file, stored by the control plane and
    # listed by the CLI with the model version behind them.
    assert "$ edgefleet events list --fleet demo-parks --type zone.intrusion" in output
    events = output.split("$ edgefleet events list", 1)[-1]
    assert "│ zone.intrusion │ north-yard │" in events, events[:4000]
    assert "│ count.interval │ north-counts │" in events, events[:4000]
    assert "detector@1.2.0" in events and "no events" not in events
    # Nothing is left running: the node and the server were stopped (this demo's: another
    # demo may run beside it on the machine, in its own directory).
    assert left_running(tmp_path, "edge_node run --config .demo/work/node.yaml") == []
    assert left_running(tmp_path, "server --data-dir .demo/server") == []


def left_running(directory: Path, command: str) -> list[int]:
    """PIDs of processes running `command` with their working directory in `directory`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = (entry / "cwd").resolve()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if command in args and cwd.is_relative_to(directory.resolve()):
            found.append(int(entry.name))
    return found
