"""Generate the checked-in Python code for every ``.proto`` under ``protos/`` and
``device_sdk/proto/`` (the device contract, shipped inside the device SDK's own wheel).

    python -m protos.generate            regenerate in the tree (also drops orphans)
    python -m protos.generate --check    exit 1 listing generated files that are stale
    python -m protos.generate --out DIR  generate under DIR instead

Sources compile from the repository root (``-I .``), so ``protos/edgefleet/fleet/v1/
director.proto`` becomes the module ``protos.edgefleet.fleet.v1.director_pb2`` and
``device_sdk/proto/edgefleet/device/v1/device.proto`` ``device_sdk.proto.edgefleet.device.
v1.device_pb2``. Each
file gets ``_pb2.py`` plus a mypy-protobuf ``_pb2.pyi`` stub; a file that declares a
service also gets ``_pb2_grpc.py`` and ``_pb2_grpc.pyi``. Output depends only on the
sources and the versions of grpcio-tools and mypy-protobuf. This is a developer tool:
nothing at runtime imports it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from google.protobuf import descriptor_pb2

__all__ = [
    "GENERATED_SUFFIXES",
    "REPO_ROOT",
    "GenerationError",
    "find_protos",
    "generate",
    "main",
    "stale_files",
    "write_in_tree",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where .proto sources live, relative to the repository root. The device contract sits
# inside device_sdk so that the SDK's wheel carries it without depending on `protos`.
_SOURCE_DIRS = ("protos", "device_sdk/proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
_MESSAGE_OUTPUTS = ("_pb2.py", "_pb2.pyi")
_SERVICE_OUTPUTS = ("_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerationError(Exception):
    """protoc or one of its plugins failed, or a tool is missing."""


def find_protos(source_root: Path = REPO_ROOT) -> list[Path]:
    """Every ``.proto`` under the source dirs of ``source_root``, relative to it, sorted."""
    return sorted(
        p.relative_to(source_root)
        for package_dir in _source_dirs(source_root)
        for p in package_dir.rglob("*.proto")
        if not any(part.startswith(".") for part in p.relative_to(package_dir).parts)
    )


def _source_dirs(source_root: Path) -> list[Path]:
    return [source_root / d for d in _SOURCE_DIRS if (source_root / d).is_dir()]


def generate(out_dir: Path, *, source_root: Path = REPO_ROOT) -> list[Path]:
    """Compile every proto of ``source_root`` into ``out_dir``; return the files written.

    The returned paths are relative to ``out_dir`` and include the ``__init__.py``
    of each package directory (created empty, never overwritten).
    """
    source_root = source_root.resolve()
    protos = find_protos(source_root)
    if not protos:
        where = " or ".join(str(source_root / d) for d in _SOURCE_DIRS)
        raise GenerationError(f"no .proto files under {where}")
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{source_root}", f"-I{_well_known_protos()}"]
    sources = [str(source_root / p) for p in protos]

    with_services = _protos_with_services(includes, sources)
    _protoc(
        [
            *includes,
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--python_out={out_dir}",
            f"--mypy_out={out_dir}",
            "--mypy_opt=quiet",
            *sources,
        ]
    )
    if with_services:
        _protoc(
            [
                *includes,
                f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
                f"--grpc_python_out={out_dir}",
                f"--mypy_grpc_out={out_dir}",
                "--mypy_grpc_opt=quiet",
                *(str(source_root / p) for p in protos if p in with_services),
            ]
        )

    written: list[Path] = []
    for proto in protos:
        suffixes = _MESSAGE_OUTPUTS + (_SERVICE_OUTPUTS if proto in with_services else ())
        written.extend(_module_path(proto, suffix) for suffix in suffixes)
    for package in _package_dirs(protos):
        init = out_dir / package / "__init__.py"
        if not init.exists():
            init.touch()
        written.append(package / "__init__.py")
    missing = [str(p) for p in written if not (out_dir / p).is_file()]
    if missing:
        raise GenerationError(f"protoc did not write {', '.join(missing)}")
    return sorted(written)


def stale_files(*, source_root: Path = REPO_ROOT) -> list[str]:
    """What differs between the checked-in generated code and a fresh generation.

    Each entry reads ``"<reason>: <path>"``: ``stale`` (content differs), ``missing``
    (not checked in) or ``orphan`` (a generated file with no ``.proto`` behind it).
    An empty list means the tree is up to date.
    """
    source_root = source_root.resolve()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="protos-check-") as tmp:
        fresh_dir = Path(tmp)
        expected = generate(fresh_dir, source_root=source_root)
        for rel in expected:
            checked_in = source_root / rel
            if not checked_in.is_file():
                problems.append(f"missing: {rel.as_posix()}")
            elif rel.name == "__init__.py":
                continue  # ours to write in: only its existence matters
            elif checked_in.read_bytes() != (fresh_dir / rel).read_bytes():
                problems.append(f"stale: {rel.as_posix()}")
    problems.extend(f"orphan: {rel.as_posix()}" for rel in _orphans(source_root, expected))
    return sorted(problems)


def write_in_tree(*, source_root: Path = REPO_ROOT) -> list[str]:
    """Regenerate into the tree; return what changed (same format as ``stale_files``).

    Only files whose bytes differ are rewritten, and orphaned generated files are
    deleted, so that afterwards ``stale_files()`` is empty.
    """
    source_root = source_root.resolve()
    changed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="protos-gen-") as tmp:
        fresh_dir = Path(tmp)
        expected = generate(fresh_dir, source_root=source_root)
        for rel in expected:
            target = source_root / rel
            fresh = (fresh_dir / rel).read_bytes()
            if target.is_file() and (rel.name == "__init__.py" or target.read_bytes() == fresh):
                continue
            changed.append(f"{'stale' if target.exists() else 'missing'}: {rel.as_posix()}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp_target = target.with_name(f".{target.name}.tmp")
            tmp_target.write_bytes(fresh)
            tmp_target.replace(target)
    for rel in _orphans(source_root, expected):
        (source_root / rel).unlink()
        changed.append(f"orphan: {rel.as_posix()}")
    return sorted(changed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protos.generate", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="exit 1 if checked-in generated code is stale"
    )
    mode.add_argument("--out", type=Path, help="generate under this directory instead")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale_files()
            if problems:
                print(
                    "generated protobuf code is out of date; run `python -m protos.generate`"
                    f" (generators here: {tool_versions()}):",
                    file=sys.stderr,
                )
                for line in problems:
                    print(f"  {line}", file=sys.stderr)
                return 1
            print("generated protobuf code is up to date")
        elif args.out is not None:
            for rel in generate(args.out):
                print(rel.as_posix())
        else:
            for line in write_in_tree():
                print(f"updated {line}")
    except GenerationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def tool_versions() -> str:
    """The generator versions, which the checked-in output depends on."""
    found = []
    for dist in ("grpcio-tools", "mypy-protobuf", "protobuf"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def _protos_with_services(includes: list[str], sources: list[str]) -> set[Path]:
    with tempfile.TemporaryDirectory(prefix="protos-desc-") as tmp:
        descriptor_file = Path(tmp) / "descriptors.pb"
        _protoc([*includes, f"--descriptor_set_out={descriptor_file}", *sources])
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(descriptor_file.read_bytes())
    return {Path(f.name) for f in descriptors.file if f.service}


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    # protoc writes its diagnostics to stderr itself; we only see the exit code.
    code = protoc.main(["grpc_tools.protoc", *args])
    if code != 0:
        raise GenerationError(f"protoc exited with {code} (see its messages above)")


def _well_known_protos() -> Path:
    """grpcio-tools' bundled ``google/protobuf/*.proto`` (timestamp, duration...)."""
    import grpc_tools

    return Path(grpc_tools.__file__).resolve().parent / "_proto"


def _plugin(name: str) -> str:
    # Prefer the plugin installed beside this interpreter (the project's venv).
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise GenerationError(f"{name} not found: install mypy-protobuf (pip install -e '.[dev]')")
    return found


def _module_path(proto: Path, suffix: str) -> Path:
    return proto.with_name(proto.stem + suffix)


def _package_dirs(protos: list[Path]) -> list[Path]:
    dirs: set[Path] = set()
    for proto in protos:
        for parent in proto.parents:
            if parent == Path():
                break
            dirs.add(parent)
    return sorted(dirs)


def _orphans(source_root: Path, expected: list[Path]) -> list[Path]:
    """Checked-in generated modules that no ``.proto`` produces any more."""
    wanted = set(expected)
    return sorted(
        rel
        for package_dir in _source_dirs(source_root)
        for p in package_dir.rglob("*")
        if p.is_file()
        and p.name.endswith(GENERATED_SUFFIXES)
        and "__pycache__" not in p.parts
        and (rel := p.relative_to(source_root)) not in wanted
    )


if __name__ == "__main__":
    sys.exit(main())
