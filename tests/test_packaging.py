"""Each installable part (ADR 0022) installs into a fresh venv and brings only its own deps.

The camera SDK (`./device_sdk`), the edge box (`.[node]`) and the control plane
(`.[server]`) are pip-installed from a copy of this tree's files (what a fresh clone
has), the three at once, then checked from inside their venvs. pip needs its index or
its cache; where neither answers the tests skip, except under CI=true, where a failed
pip fails them. Not for the dev install `make` does (every test run proves that one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_architecture import CLI_ONLY, FRAMEWORKS, NUMPY_MODULES, PURE_CORES, module_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_S = 600

# Server-side distributions a box must never carry (names as `canonical` spells them).
SERVER_ONLY = frozenset(
    {
        "fastapi",
        "starlette",
        "uvicorn",
        "sqlalchemy",
        "alembic",
        "psycopg",
        "boto3",
        "botocore",
        "scipy",
    }
)

# Prints {"dists": [names]} for the venv's installed distributions.
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({'dists': sorted({d.metadata['Name'] for d in m.distributions()})}))"
)

# Imports every module of the given packages; prints {"failed": {module: error}}.
IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys

failed = {}
skipped = tuple(filter(None, sys.argv[2].split(","))) if len(sys.argv) > 2 else ()
for name in sys.argv[1].split(","):
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        # alembic's env.py runs only under alembic's own command context.
        if ".migrations" in info.name or info.name.startswith(skipped):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed[info.name] = repr(exc)
print(json.dumps({"failed": failed}))
"""

# Imports one module with no import hook; prints the frameworks then in sys.modules.
LOADED_AFTER_IMPORT = """
import importlib, json, sys

importlib.import_module(sys.argv[1])
frameworks = set(sys.argv[2].split(","))
print(json.dumps({"loaded": sorted({m.partition(".")[0] for m in sys.modules} & frameworks)}))
"""


# Where the SDK landed, what it ships beside code, and that its messages work.
DEVICE_CHECK = """
import json, pathlib, device_sdk
from device_sdk.proto.edgefleet.device.v1 import device_pb2

root = pathlib.Path(device_sdk.__file__).parent
sent = device_pb2.DeviceEnvelope(protocol_version=1, message_id="m-1").SerializeToString()
print(json.dumps({
    "root": str(root),
    "files": sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.suffix in {".typed", ".proto", ".pyi"}
    ),
    "round_trip": device_pb2.DeviceEnvelope.FromString(sent).message_id,
}))
"""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Part:
    """One part's venv while (and after) pip installs into it."""

    name: str
    venv: Path
    baseline: frozenset[str]  # what the bare venv held (pip, setuptools)
    pip: subprocess.Popen[str]
    done: bool = False

    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command of this venv away from the tree (cwd, PYTHONPATH): the install alone."""
        return subprocess.run(
            args, capture_output=True, text=True, cwd=self.venv, env=_clean_env(), timeout=120
        )

    def run_python(self, code: str, *args: str) -> dict[str, object]:
        done = self.run(str(self.python()), "-c", code, *args)
        assert done.returncode == 0, done.stderr
        result: dict[str, object] = json.loads(done.stdout)
        return result

    def installed(self) -> frozenset[str]:
        """Distributions pip added to the bare venv."""
        dists = self.run_python(LIST_DISTRIBUTIONS)["dists"]
        assert isinstance(dists, list)
        return frozenset(canonical(d) for d in dists) - self.baseline


def _clean_env() -> dict[str, str]:
    # PYTHONPATH would put this tree (or /work/main's) ahead of what pip installed.
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _copy_of_the_tree(dest: Path) -> Path:
    """The files a fresh clone of this working tree has (tracked plus untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        cwd=ROOT,
        check=False,
    )
    if listed.returncode == 0:
        for rel in listed.stdout.decode().split("\0"):
            if rel and (ROOT / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)
    else:  # not a git checkout (an unpacked archive): copy it, leaving build output out
        shutil.copytree(
            ROOT,
            dest,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".demo"
            ),
        )
    return dest


def _start(name: str, requirement: str, venv: Path, source: Path) -> Part:
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", LIST_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        check=True,
        # Away from the tree: `python -c` puts its cwd first on sys.path, and a checkout
        # that `make` installed editable holds edgefleet.egg-info at its root.
        cwd=venv,
        env=_clean_env(),
    )
    baseline = frozenset(canonical(d) for d in json.loads(listed.stdout)["dists"])
    pip = subprocess.Popen(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            # Byte-compiling thousands of files is most of an install's CPU; not needed here.
            "--no-compile",
            requirement,
        ],
        cwd=source,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Part(name, venv, baseline, pip)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Part]]:
    """The three installs, started together (they overlap on downloads and unpacking)."""
    where = tmp_path_factory.mktemp("packaging")
    source = _copy_of_the_tree(where / "src")
    requirements = {"device": "./device_sdk", "node": ".[node]", "server": ".[server]"}
    # Seven seconds each (ensurepip), so made side by side too.
    making = {
        name: subprocess.Popen(
            [sys.executable, "-m", "venv", str(where / f"venv-{name}")], env=_clean_env()
        )
        for name in requirements
    }
    assert all(proc.wait(timeout=120) == 0 for proc in making.values())
    started = {
        name: _start(name, requirement, where / f"venv-{name}", source)
        for name, requirement in requirements.items()
    }
    try:
        yield started
    finally:
        for part in started.values():
            if part.pip.poll() is None:
                part.pip.kill()
                part.pip.wait()


def installed_part(parts: dict[str, Part], name: str) -> Part:
    part = parts[name]
    if not part.done:
        try:
            output, _ = part.pip.communicate(timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            part.pip.kill()
            output, _ = part.pip.communicate()
        part.done = True
        if part.pip.returncode != 0:
            message = f"pip could not install the {name} part:\n{output[-3000:]}"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
    return part


def test_the_device_sdk_installs_with_paho_and_protobuf_only(parts: dict[str, Part]) -> None:
    device = installed_part(parts, "device")
    assert device.installed() == {"edgefleet-device", "paho-mqtt", "protobuf"}
    shipped = device.run_python(DEVICE_CHECK)
    assert str(shipped["root"]).startswith(str(device.venv))  # the wheel's copy, not the tree
    assert shipped["files"] == [
        "proto/edgefleet/device/v1/device.proto",
        "proto/edgefleet/device/v1/device_pb2.pyi",
        "py.typed",
    ]
    assert shipped["round_trip"] == "m-1"


def test_a_box_installs_no_server_package(parts: dict[str, Part]) -> None:
    node = installed_part(parts, "node")
    installed = node.installed()
    assert {"edgefleet", "onnxruntime", "paho-mqtt", "grpcio"} <= installed
    assert installed & SERVER_ONLY == set()
    # Every module of the box's packages imports with what the box has.
    report = node.run_python(IMPORT_EVERYTHING, "edge_node,protos,device_sdk")
    assert report["failed"] == {}
    # The box's own script, and `edgefleet node run` without the operator CLI.
    for command, shows in (
        (["edgefleet-node", "--help"], "{run,devices}"),
        (["edgefleet", "node", "run", "--help"], "--config CONFIG"),
    ):
        done = node.run(str(node.venv / "bin" / command[0]), *command[1:])
        assert done.returncode == 0, done.stderr
        assert shows in done.stdout
    # The operator's commands say what is missing instead of a traceback.
    refused = node.run(str(node.venv / "bin" / "edgefleet"), "model", "list")
    assert refused.returncode == 1
    assert "pip install 'edgefleet[cli]'" in refused.stderr


@pytest.mark.parametrize(
    "core", [c for c in PURE_CORES if not c.startswith("control_plane/")], ids=str
)
def test_a_box_imports_each_pure_core_without_a_framework(
    parts: dict[str, Part], core: str
) -> None:
    """No import hook here: boto3 is simply not installed, and nothing else may load."""
    node = installed_part(parts, "node")
    report = node.run_python(LOADED_AFTER_IMPORT, module_name(core), ",".join(FRAMEWORKS))
    assert report["loaded"] == []


def test_the_server_installs_without_onnx_runtime(parts: dict[str, Part]) -> None:
    server = installed_part(parts, "server")
    installed = server.installed()
    assert {"edgefleet", "fastapi", "sqlalchemy", "alembic", "psycopg", "boto3"} <= installed
    assert {"scipy", "numpy"} <= installed  # the rollout gates' statistics (ADR 0030)
    assert installed & {"onnxruntime", "onnx", "psutil", "pillow", "pyyaml"} == set()
    skipped = ",".join((*CLI_ONLY, *NUMPY_MODULES))  # tests/test_architecture.py: need numpy
    report = server.run_python(IMPORT_EVERYTHING, "control_plane,protos", skipped)
    assert report["failed"] == {}
    done = server.run(str(server.venv / "bin" / "edgefleet"), "server", "--help")
    assert done.returncode == 0, done.stderr
    assert "--database-url" in done.stdout
