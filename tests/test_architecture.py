"""The dependency rules of shared/DESIGN.md §2, checked on the source (AST) and by import.

- device_sdk imports nothing from control_plane or edge_node;
- edge_node and control_plane never import each other (they share only protos/);
- a pure core never imports a framework, a database, a broker or a runtime, neither
  itself (AST) nor through anything it imports (a fresh interpreter that refuses them);
- numpy is for the node and the operator's CLI (ADR 0022): the server's modules never
  import it, nor the numpy half of protos.bundle, except the rollout statistics, whose
  scipy brings numpy into the server install (ADR 0030).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

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
    "psutil",
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
    "edge_node/runtime/shadow_budget.py",
    "edge_node/updater/director.py",
    "edge_node/updater/journal.py",
    "edge_node/updater/config.py",
    "edge_node/updater/watchdog.py",
    "edge_node/updater/host.py",
    "control_plane/link/mqtt_topics.py",
    "control_plane/link/broker_accounts.py",
    "control_plane/link/wire.py",
    "control_plane/link/records.py",
    "control_plane/nodes/model.py",
    "control_plane/durations.py",
    "control_plane/text.py",
    "control_plane/registry/freshness.py",
    "control_plane/director/delivery.py",
    "control_plane/director/revocation.py",
    "control_plane/health/config.py",
    "control_plane/health/report.py",
    "control_plane/health/rollup.py",
    "control_plane/health/alerts.py",
    "control_plane/events/wire.py",
    "control_plane/events/query.py",
    "protos/latency_sketch.py",
    "protos/health_schema.py",
    "protos/fields.py",
    "edge_node/telemetry/config.py",
    "edge_node/telemetry/latency.py",
    "edge_node/telemetry/memory.py",
    "edge_node/telemetry/report.py",
    "edge_node/capture/config.py",
    "edge_node/capture/schedule.py",
    "protos/bundle/spec.py",
    "protos/bundle/results.py",
    "protos/bundle/geometry.py",
    "protos/bundle/preprocess.py",
    "protos/bundle/decoders.py",
    "protos/bundle/agreement.py",
    "protos/bundle/levels.py",
    "edge_node/results/sampling.py",
    "control_plane/rollouts/cron.py",
    "control_plane/rollouts/spec.py",
    "control_plane/rollouts/plan.py",
    "control_plane/rollouts/state.py",
    "control_plane/rollouts/machine.py",
    "control_plane/rollouts/simulation.py",
    "control_plane/rollouts/observe.py",
    "control_plane/rollouts/verdicts.py",
    "control_plane/rollouts/evidence.py",
    "control_plane/rollouts/gates.py",
    "edge_node/aggregation/errors.py",
    "edge_node/aggregation/model.py",
    "edge_node/aggregation/geometry.py",
    "edge_node/aggregation/timeline.py",
    "edge_node/aggregation/tracker.py",
    "edge_node/aggregation/config.py",
    "edge_node/aggregation/engine.py",
    "edge_node/aggregation/wire.py",
    "edge_node/aggregation/node_results.py",
    "edge_node/aggregation/rules/base.py",
    "edge_node/aggregation/rules/zone.py",
    "edge_node/aggregation/rules/line.py",
    "edge_node/aggregation/rules/dwell.py",
    "edge_node/aggregation/rules/counts.py",
    "edge_node/aggregation/rules/correlation.py",
    "edge_node/devices/config.py",
    "edge_node/devices/limits.py",
    "edge_node/devices/replies.py",
    "edge_node/devices/intake.py",
    "device_sdk/buffer.py",
    "device_sdk/backoff.py",
    "device_sdk/pacing.py",
    "device_sdk/timesync.py",
    "device_sdk/topics.py",
    "device_sdk/ids.py",
    "device_sdk/clock.py",
    "device_sdk/errors.py",
)

# Modules that need numpy (the node's and the CLI's, never the server's). The rest of
# protos.bundle (spec, results) is what the server reads, and imports without numpy.
NUMPY_MODULES = (
    "protos.bundle.geometry",
    "protos.bundle.preprocess",
    "protos.bundle.decoders",
    "protos.bundle.agreement",
)
NUMPY_FREE_BUNDLE = ("protos.bundle", "protos.bundle.spec", "protos.bundle.results")

# The operator's modules that check or run ONNX models: `edgefleet[cli]`, not the server
# (tests/test_packaging.py imports everything else on a server install).
CLI_ONLY = (
    "control_plane.registry.onnx_inspect",
    "control_plane.registry.reference_frame",
    "control_plane.registry.sample_models",
    "control_plane.cli.release",
    "control_plane.cli.runtime_file",
    "control_plane.registry.model_data",
    "control_plane.registry.model_compare",
    "control_plane.registry.quantization",
    "control_plane.registry.release_check",
    "control_plane.registry.float_baseline",
    "control_plane.demo",
)
# The server's modules that need numpy and scipy, which `edgefleet[server]` carries for
# them (ADR 0030); a module that imports one at import time is listed here too.
STATISTICS_MODULES = (
    "control_plane.rollouts.gates",
    "control_plane.rollouts.evidence",
    "control_plane.rollouts.gates_source",
)
NUMPY_PACKAGES = frozenset({"numpy", "scipy", "onnx", "onnxruntime", "PIL"})


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
        ("device_sdk", ("control_plane", "edge_node", "protos")),
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


# Our own packages: an attempt to import a framework from one of them is always a fault.
OURS = frozenset({"control_plane", "edge_node", "device_sdk", "protos"})

# Third-party modules that try a framework import and carry on without it, as
# (framework, importing module). Each is tolerated here only because the probe refuses
# the import, so the framework never loads; tests/test_packaging.py proves on a node
# install that the framework is not even installed there.
ALLOWED_TRY_IMPORTS = frozenset(
    {
        # securesystemslib.signer registers its AWS KMS signer inside `try: import boto3`;
        # tuf.api.metadata imports securesystemslib.signer, so every TUF-reading core does.
        ("boto3", "securesystemslib.signer._aws_signer"),
    }
)

# Runs in a fresh interpreter: refuses every framework import (recording who asked),
# imports one module and prints what happened as JSON.
PROBE = """
import importlib, json, sys

frameworks = frozenset(sys.argv[2].split(","))
attempts = []


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in frameworks:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(
            ("importlib", "_frozen_importlib")
        ):
            frame = frame.f_back
        attempts.append([name, frame.f_globals.get("__name__", "?") if frame else "?"])
        raise ModuleNotFoundError(f"{name} is refused in this probe", name=name)


sys.meta_path.insert(0, Refuse())
error = None
try:
    importlib.import_module(sys.argv[1])
except Exception as exc:
    error = repr(exc)
loaded = sorted({m.partition(".")[0] for m in sys.modules} & frameworks)
print(json.dumps({"error": error, "loaded": loaded, "attempts": attempts}))
"""


class Probe(TypedDict):
    error: str | None  # repr of what the import raised
    loaded: list[str]  # frameworks in sys.modules afterwards
    attempts: list[list[str]]  # [framework module, importing module] per refused import


def module_name(core: str) -> str:
    return core.removesuffix(".py").replace("/", ".")


def probe_import(module: str, refused: tuple[str, ...] = FRAMEWORKS) -> Probe:
    """Import `module` in a fresh interpreter that refuses every framework import."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, ",".join(refused)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    result: Probe = json.loads(done.stdout)
    return result


def faults(probe: Probe) -> list[str]:
    """What in a probe's report breaks the purity rule (empty: the module is pure)."""
    found = []
    if probe["error"] is not None:
        found.append(f"import failed: {probe['error']}")
    found += [f"loaded {name}" for name in probe["loaded"]]
    for name, importer in probe["attempts"]:
        framework = name.partition(".")[0]
        if importer.partition(".")[0] in OURS:
            found.append(f"{importer} imports {name}")
        elif (framework, importer) not in ALLOWED_TRY_IMPORTS:
            found.append(f"{importer} tries {name} (not in ALLOWED_TRY_IMPORTS)")
    return found


@pytest.mark.parametrize("core", PURE_CORES)
def test_pure_cores_import_without_a_framework(core: str) -> None:
    """Purity is a property of the import graph: package __init__s and third parties too."""
    assert faults(probe_import(module_name(core))) == []


def test_the_probe_sees_a_framework_behind_an_import() -> None:
    # ingest.py imports SQLAlchemy itself.
    direct = probe_import("control_plane.link.ingest")
    assert ["sqlalchemy", "control_plane.link.ingest"] in direct["attempts"]
    assert "control_plane.link.ingest imports sqlalchemy" in faults(direct)
    # cli/release.py names no framework (the AST test passes it), but its client does.
    release = Path("control_plane/cli/release.py")
    assert not [n for n in imported_modules(ROOT / release) if n.split(".")[0] in FRAMEWORKS]
    assert "control_plane.cli.client imports httpx" in faults(
        probe_import("control_plane.cli.release")
    )


def test_only_allow_listed_third_party_tries_are_tolerated() -> None:
    allowed = Probe(
        error=None, loaded=[], attempts=[["boto3", "securesystemslib.signer._aws_signer"]]
    )
    assert faults(allowed) == []
    other = Probe(error=None, loaded=[], attempts=[["grpc", "tuf.ngclient"]])
    assert faults(other) == ["tuf.ngclient tries grpc (not in ALLOWED_TRY_IMPORTS)"]
    assert faults(Probe(error=None, loaded=["psutil"], attempts=[])) == ["loaded psutil"]


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


@pytest.mark.parametrize("module", NUMPY_FREE_BUNDLE)
def test_what_the_server_reads_of_the_bundle_needs_no_numpy(module: str) -> None:
    assert faults(probe_import(module, (*FRAMEWORKS, "numpy"))) == []


def test_the_numpy_half_of_the_bundle_is_seen_by_the_probe() -> None:
    probe = probe_import("protos.bundle.decoders", (*FRAMEWORKS, "numpy"))
    assert "protos.bundle.decoders imports numpy" in faults(probe)


def import_time_modules(path: Path) -> list[str]:
    """What importing ``path`` imports (not the imports inside its functions), with
    ``from a import b`` counted as both ``a`` and ``a.b``."""
    names: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
                names.extend(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []))

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return names


def test_the_server_side_imports_no_numpy() -> None:
    """Only the CLI's modules and the rollout statistics may need numpy when imported; one
    that imports a CLI module is a CLI module too (list it in CLI_ONLY), one that imports
    the statistics is listed in STATISTICS_MODULES."""
    needs_numpy = (*NUMPY_MODULES, *CLI_ONLY, *STATISTICS_MODULES)
    found = []
    for package in ("control_plane", "protos"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = module_name(str(path.relative_to(ROOT))).removesuffix(".__init__")
            if module in needs_numpy or "migrations" in module:
                continue
            found += [
                f"{module}: {name}"
                for name in import_time_modules(path)
                if name.partition(".")[0] in NUMPY_PACKAGES or name in needs_numpy
            ]
    assert found == []


@pytest.mark.parametrize("package", ["edge_node", "device_sdk", "protos"])
def test_only_the_server_imports_scipy(package: str) -> None:
    """scipy is in `[server]` alone (ADR 0030): the box and the camera never need it."""
    assert offenders(package, ("scipy",)) == []


def test_the_import_time_reader_skips_function_bodies(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from protos.bundle import decoders\n"
        "try:\n    import numpy\nexcept ImportError:\n    pass\n"
        "def f():\n    import onnx\n"
    )
    assert import_time_modules(module) == ["protos.bundle", "protos.bundle.decoders", "numpy"]
