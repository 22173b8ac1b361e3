"""The telemetry package's public surface, and the line between its pure cores and adapters."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "edge_node.telemetry",
    "edge_node.telemetry.config",
    "edge_node.telemetry.latency",
    "edge_node.telemetry.memory",
    "edge_node.telemetry.probe",
    "edge_node.telemetry.report",
    "edge_node.telemetry.telemetry",
    "edge_node.telemetry.thermal",
    "protos.latency_sketch",
]
# Pure cores take data and return data: no psutil, no files, no threads, no clock.
PURE = ["config", "latency", "memory", "report"]
IMPURE = {"psutil", "os", "shutil", "pathlib", "threading", "time", "logging"}
ADAPTERS = {"edge_node.telemetry.probe", "edge_node.telemetry.telemetry"}


def isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=isort_key)
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.{attribute}"


@pytest.mark.parametrize("core", PURE)
def test_pure_cores_do_no_io(core: str) -> None:
    tree = ast.parse((ROOT / "edge_node" / "telemetry" / f"{core}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {name.split(".")[0] for name in imported} & IMPURE
    assert not imported & ADAPTERS


def test_the_shared_sketch_imports_nothing_but_the_standard_library() -> None:
    tree = ast.parse((ROOT / "protos" / "latency_sketch.py").read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "math", "collections.abc", "typing"}
