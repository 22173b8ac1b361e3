"""The dependency rules of shared/DESIGN.md §2, checked on the source (AST, no imports).

- device_sdk imports nothing from control_plane or edge_node;
- edge_node and control_plane never import each other (they share only protos/);
- a pure core never imports a framework, a database, a broker or a runtime.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FRAMEWORKS = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "alembic",
    "boto3",
    "botocore",
    "paho",
    "grpc",
    "onnxruntime",
    "uvicorn",
    "httpx",
)

# Modules that hold domain rules only: they take data and `now` and return decisions.
PURE_CORES = (
    "control_plane/trust/repository.py",
    "control_plane/trust/custom.py",
    "control_plane/access/roles.py",
    "control_plane/identity/bootstrap.py",
    "control_plane/clock.py",
    "control_plane/errors.py",
    "edge_node/clock.py",
    "edge_node/errors.py",
    "edge_node/uuid7.py",
    "edge_node/runtime/config.py",
    "edge_node/runtime/streams.py",
    "edge_node/runtime/timing.py",
    "edge_node/updater/director.py",
    "edge_node/updater/journal.py",
    "edge_node/updater/config.py",
    "edge_node/updater/watchdog.py",
    "control_plane/link/mqtt_topics.py",
    "control_plane/link/wire.py",
    "control_plane/director/delivery.py",
    "control_plane/health/config.py",
    "control_plane/health/report.py",
    "control_plane/health/rollup.py",
    "control_plane/health/alerts.py",
    "protos/latency_sketch.py",
    "protos/health_schema.py",
    "edge_node/telemetry/config.py",
    "edge_node/telemetry/latency.py",
    "edge_node/telemetry/memory.py",
    "edge_node/telemetry/report.py",
    "edge_node/capture/config.py",
    "edge_node/capture/schedule.py",
)


def imported_modules(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for module in sorted((ROOT / package).rglob("*.py")):
        found += [
            f"{module.relative_to(ROOT)}: {name}"
            for name in imported_modules(module)
            if name.split(".")[0] in forbidden
        ]
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("device_sdk", ("control_plane", "edge_node")),
        ("edge_node", ("control_plane",)),
        ("control_plane", ("edge_node", "device_sdk")),
        ("protos", ("control_plane", "edge_node", "device_sdk")),
    ],
)
def test_packages_keep_to_their_side(package: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(package, forbidden) == []


@pytest.mark.parametrize("core", PURE_CORES)
def test_pure_cores_import_no_framework(core: str) -> None:
    path = ROOT / core
    assert path.exists(), f"{core} moved: update PURE_CORES"
    bad = [name for name in imported_modules(path) if name.split(".")[0] in FRAMEWORKS]
    assert bad == []


def test_the_director_knows_no_transport() -> None:
    """Transports attach to the director's delivery port; the director never imports them."""
    found = [
        f"{module.relative_to(ROOT)}: {name}"
        for module in sorted((ROOT / "control_plane" / "director").rglob("*.py"))
        for name in imported_modules(module)
        if name.startswith(("control_plane.link", "control_plane.api", "grpc", "paho"))
    ]
    assert found == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("import sqlalchemy\nfrom control_plane.errors import X\n")
    assert imported_modules(module) == ["sqlalchemy", "control_plane.errors"]
