"""Node settings: file < EDGEFLEET_NODE_* environment < flags, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_node.config import ConfigError, load_agent_config, load_node_settings

BASE = """\
data_dir: /var/lib/edgefleet-node
fleet: gates
server_grpc: cp.example.com:7443
memory_budget_mb: 100
runtime:
  workers: 2
  streams:
    - name: cam-1
      target_fps: 5
"""


@pytest.fixture
def node_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(BASE)
    return path


def test_the_file_alone(node_yaml: Path) -> None:
    config = load_agent_config(node_yaml)
    assert config.data_dir == Path("/var/lib/edgefleet-node")
    assert config.link.target == "cp.example.com:7443"
    assert config.memory_budget_bytes == 100 << 20
    assert config.runtime_workers == 2
    assert [s.name for s in config.runtime.streams] == ["cam-1"]
    assert config.runtime.streams[0].target_fps == 5


def test_env_overrides_the_file_and_flags_override_env(
    node_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEFLEET_NODE_MEMORY_BUDGET_MB", "200")
    monkeypatch.setenv("EDGEFLEET_NODE_SERVER_GRPC", "env.example.com:1")
    monkeypatch.setenv("EDGEFLEET_NODE_RUNTIME__WORKERS", "3")
    config = load_agent_config(node_yaml, {"server_grpc": "flag.example.com:2", "data_dir": None})
    assert config.memory_budget_bytes == 200 << 20  # env over file
    assert config.link.target == "flag.example.com:2"  # flag over env
    assert config.data_dir == Path("/var/lib/edgefleet-node")  # a flag left out changes nothing
    assert config.runtime_workers == 3  # nested env over the file ...
    assert [s.name for s in config.runtime.streams] == ["cam-1"]  # ... keeping its siblings


def test_everything_from_env_and_flags_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFLEET_NODE_DATA_DIR", "/data")
    monkeypatch.setenv("EDGEFLEET_NODE_BOOTSTRAP_TOKEN", "tok")
    config = load_agent_config(None, {"server_grpc": "127.0.0.1:7443"})
    assert (config.data_dir, config.bootstrap_token) == (Path("/data"), "tok")
    assert "tok" not in repr(config)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("memory_budget_mb: 0\n", "memory_budget_mb"),
        ("transport: carrier-pigeon\n", "transport"),
        ("transport: mqtt\n", "not supported by the agent yet"),
        ("enroll_grpc: localhost\n", "HOST:PORT"),
        ("enroll_grpc: 'host:99999'\n", "HOST:PORT"),
        ("health_interval_s: -1\n", "health_interval_s"),
        ("colour: blue\n", "colour"),
        ("runtime:\n  streams: [{name: cam, target_fps: -3}]\n", "target_fps"),
        ("runtime:\n  model_path: /m.onnx\n", "runtime.streams is empty"),
        ("runtime:\n  session: {threads: 4}\n", "threads"),
    ],
)
def test_unsafe_or_malformed_settings_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    lines = BASE.splitlines(keepends=True)
    if extra.startswith("runtime:"):
        lines = lines[: lines.index("runtime:\n")]
    path.write_text("".join(lines) + extra)
    with pytest.raises(ConfigError, match=message):
        load_agent_config(path)


def test_a_missing_server_address_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("data_dir: /d\n")
    with pytest.raises(ConfigError, match="server_grpc"):
        load_agent_config(path)


@pytest.mark.parametrize("content", ["- a\n- b\n", "a: [unclosed\n"])
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=r"node\.yaml"):
        load_node_settings(path)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_node_settings(tmp_path / "nope.yaml")


def test_the_sample_in_the_operator_guide_is_valid(tmp_path: Path) -> None:
    guide = Path(__file__).resolve().parents[3] / "docs" / "operator-guide.md"
    section = guide.read_text().split("## Running a node", 1)[1]
    sample = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "node.yaml"
    path.write_text(sample)
    config = load_agent_config(path)
    assert config.link.target == "cp.example.com:7443"
    assert [s.name for s in config.runtime.streams] == ["gate-north"]
