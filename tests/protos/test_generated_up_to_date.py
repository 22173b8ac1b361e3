"""The checked-in generated protobuf code matches its .proto sources, and the generator
notices every way it can drift (stale, missing, orphaned files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protos import generate as gen


def test_checked_in_generated_code_is_up_to_date() -> None:
    problems = gen.stale_files()
    assert not problems, (
        "generated protobuf code is out of date; run `python -m protos.generate`\n  "
        + "\n  ".join(problems)
        + f"\n(generators installed: {gen.tool_versions()})"
    )


def test_check_command_exits_zero_on_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert gen.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_every_proto_is_found() -> None:
    protos = [p.as_posix() for p in gen.find_protos()]
    assert "protos/edgefleet/fleet/v1/director.proto" in protos
    assert "protos/edgefleet/fleet/v1/registry.proto" in protos


@pytest.fixture
def source_tree(tmp_path: Path) -> Path:
    """A copy of this repository's .proto sources, generated in place."""
    root = tmp_path / "src"
    for proto in gen.find_protos():
        (root / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gen.REPO_ROOT / proto, root / proto)
    gen.write_in_tree(source_root=root)
    assert gen.stale_files(source_root=root) == []
    return root


def test_check_reports_stale_missing_and_orphaned_files(source_tree: Path) -> None:
    v1 = source_tree / "protos/edgefleet/fleet/v1"
    (v1 / "director_pb2.py").write_text("# edited by hand\n")
    (v1 / "registry_pb2.pyi").unlink()
    (v1 / "retired_pb2.py").write_text("# its .proto was deleted\n")
    (v1 / "retired_pb2_grpc.pyi").write_text("")

    expected = [
        "missing: protos/edgefleet/fleet/v1/registry_pb2.pyi",
        "orphan: protos/edgefleet/fleet/v1/retired_pb2.py",
        "orphan: protos/edgefleet/fleet/v1/retired_pb2_grpc.pyi",
        "stale: protos/edgefleet/fleet/v1/director_pb2.py",
    ]
    assert gen.stale_files(source_root=source_tree) == expected
    # Regenerating in the tree repairs exactly what the check reported.
    assert gen.write_in_tree(source_root=source_tree) == expected
    assert gen.stale_files(source_root=source_tree) == []
    assert not (v1 / "retired_pb2.py").exists()


def test_a_changed_proto_makes_its_code_stale(source_tree: Path) -> None:
    proto = source_tree / "protos/edgefleet/fleet/v1/registry.proto"
    proto.write_text(proto.read_text().replace("string model = 2;", "string model_name = 2;"))
    assert gen.stale_files(source_root=source_tree) == [
        "stale: protos/edgefleet/fleet/v1/registry_pb2.py",
        "stale: protos/edgefleet/fleet/v1/registry_pb2.pyi",
    ]


def test_missing_package_init_is_reported(source_tree: Path) -> None:
    (source_tree / "protos/edgefleet/fleet/__init__.py").unlink()
    assert gen.stale_files(source_root=source_tree) == [
        "missing: protos/edgefleet/fleet/__init__.py"
    ]


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = gen.generate(tmp_path / "a")
    second = gen.generate(tmp_path / "b")
    assert first == second
    for rel in first:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_grpc_modules_only_for_files_with_a_service(tmp_path: Path) -> None:
    root = tmp_path / "src"
    pkg = root / "protos/demo/v1"
    pkg.mkdir(parents=True)
    (pkg / "messages.proto").write_text(
        'syntax = "proto3";\npackage demo.v1;\nmessage Ping { string text = 1; }\n'
    )
    (pkg / "service.proto").write_text(
        'syntax = "proto3";\npackage demo.v1;\nimport "protos/demo/v1/messages.proto";\n'
        "service Echo { rpc Say(Ping) returns (Ping); }\n"
    )
    written = {p.as_posix() for p in gen.generate(tmp_path / "out", source_root=root)}
    assert written == {
        "protos/__init__.py",
        "protos/demo/__init__.py",
        "protos/demo/v1/__init__.py",
        "protos/demo/v1/messages_pb2.py",
        "protos/demo/v1/messages_pb2.pyi",
        "protos/demo/v1/service_pb2.py",
        "protos/demo/v1/service_pb2.pyi",
        "protos/demo/v1/service_pb2_grpc.py",
        "protos/demo/v1/service_pb2_grpc.pyi",
    }
    grpc_module = (tmp_path / "out/protos/demo/v1/service_pb2_grpc.py").read_text()
    assert "class EchoStub" in grpc_module
    assert "from protos.demo.v1 import messages_pb2" in grpc_module


def test_a_broken_proto_is_a_generation_error(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "protos").mkdir(parents=True)
    (root / "protos/bad.proto").write_text('syntax = "proto3";\nmessage { }\n')
    with pytest.raises(gen.GenerationError, match="protoc exited"):
        gen.generate(tmp_path / "out", source_root=root)


def test_no_protos_is_a_generation_error(tmp_path: Path) -> None:
    (tmp_path / "protos").mkdir()
    with pytest.raises(gen.GenerationError, match=r"no \.proto files"):
        gen.generate(tmp_path / "out", source_root=tmp_path)
