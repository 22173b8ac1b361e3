"""Node settings: file < EDGEFLEET_NODE_* environment < flags, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from edge_node.config import ConfigError, NodeSettings, load_agent_config, load_node_settings

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


@pytest.mark.parametrize(("cpus", "expected"), [(1, 0), (2, 1), (16, 1)])
def test_preprocess_threads_default_to_one_on_a_multi_core_box(
    node_yaml: Path, monkeypatch: pytest.MonkeyPatch, cpus: int, expected: int
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)))
    assert load_agent_config(node_yaml).runtime_preprocess_threads == expected
    node_yaml.write_text(BASE.replace("  workers: 2\n", "  workers: 2\n  preprocess_threads: 3\n"))
    assert load_agent_config(node_yaml).runtime_preprocess_threads == 3  # said, whatever the box


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
        ("transport: mqtt\n", "server_grpc, enroll_grpc|gRPC settings with transport mqtt"),
        ("enroll_grpc: localhost\n", "HOST:PORT"),
        ("enroll_grpc: 'host:99999'\n", "HOST:PORT"),
        ("health_interval_s: -1\n", "health_interval_s"),
        ("colour: blue\n", "colour"),
        ("runtime:\n  streams: [{name: cam, target_fps: -3}]\n", "target_fps"),
        ("runtime:\n  model_path: /m.onnx\n", "runtime.streams is empty"),
        ("runtime:\n  session: {threads: 4}\n", "threads"),
        ("runtime:\n  preprocess_threads: -1\n", "preprocess_threads"),
        ("updater:\n  watchdog: {window_s: -1}\n", "window_s"),
        ("updater:\n  watchdog: {max_error_ratio: 2}\n", "max_error_ratio"),
        ("updater:\n  max_attempts: 0\n", "max_attempts"),
        ("updater:\n  selftest_latency_budget_ms: 0\n", "selftest_latency_budget_ms"),
        ("updater:\n  auto_rollback: true\n", "auto_rollback"),
        ("telemetry:\n  leak_slope_mb_per_h: 0\n", "leak_slope_mb_per_h"),
        ("telemetry:\n  leak_slope: 5\n", "unknown keys leak_slope"),
        ("telemetry: 3\n", "telemetry"),
    ],
)
def test_unsafe_or_malformed_settings_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    lines = BASE.splitlines(keepends=True)
    if extra.startswith(("runtime:", "updater:", "telemetry:")):
        lines = lines[: lines.index("runtime:\n")]
    path.write_text("".join(lines) + extra)
    with pytest.raises(ConfigError, match=message):
        load_agent_config(path)


MQTT = """\
data_dir: /var/lib/edgefleet-node
fleet: gates
transport: mqtt
server_mqtt: broker.example.com:8883
server_http: https://cp.example.com
"""


def test_an_mqtt_node_needs_the_broker_and_the_https_api(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(MQTT)
    config = load_agent_config(path, {"http_ca_file": tmp_path / "ca.pem"})
    assert (config.transport, config.link) == ("mqtt", None)
    assert config.mqtt is not None
    assert (config.mqtt.host, config.mqtt.port) == ("broker.example.com", 8883)
    assert config.mqtt.http_url == "https://cp.example.com"
    assert config.mqtt.http_ca_file == tmp_path / "ca.pem"
    assert config.mqtt.login_grace_s == 3600.0
    assert (config.mqtt.tls, config.mqtt.ca_file) == (False, None)


@pytest.mark.parametrize(
    ("drop", "extra", "message"),
    [
        ("server_mqtt", "", "server_mqtt"),
        ("server_http", "", "server_http"),
        ("", "server_grpc: cp.example.com:7443\n", "gRPC settings with transport mqtt"),
        ("server_mqtt", "server_mqtt: broker\n", "HOST:PORT"),
        ("server_http", "server_http: http://cp.example.com\n", "plain http to another"),
        ("server_http", "server_http: ftp://cp.example.com\n", "not an http"),
        ("", "mqtt_login_grace_s: -1\n", "mqtt_login_grace_s"),
        ("", "mqtt_ca_file: /ca.pem\n", "set mqtt_tls: true"),
    ],
)
def test_mqtt_settings_that_are_refused(
    tmp_path: Path, drop: str, extra: str, message: str
) -> None:
    lines = [line for line in MQTT.splitlines(keepends=True) if not drop or drop not in line]
    path = tmp_path / "node.yaml"
    path.write_text("".join(lines) + extra)
    with pytest.raises(ConfigError, match=message):
        load_agent_config(path)


def test_plain_http_only_to_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(MQTT.replace("https://cp.example.com", "http://127.0.0.1:8080"))
    config = load_agent_config(path)
    assert config.mqtt is not None and config.mqtt.http_url == "http://127.0.0.1:8080"


def test_the_updater_is_on_by_default_with_a_watchdog(node_yaml: Path) -> None:
    updater = load_agent_config(node_yaml).updater
    assert updater.enabled
    assert (updater.watchdog.window_s, updater.watchdog.max_errors) == (60.0, 10)
    assert (updater.max_artifact_bytes, updater.space_margin_bytes) == (4 << 30, 256 << 20)
    assert updater.selftest_latency_budget_s == 1.0


def test_telemetry_settings_from_the_file_with_the_memory_budget(node_yaml: Path) -> None:
    node_yaml.write_text(BASE + "telemetry:\n  drift_alert_ratio: 2.0\n  leak_for_s: 60\n")
    config = load_agent_config(node_yaml)
    assert (config.telemetry.drift_alert_ratio, config.telemetry.leak_for_s) == (2.0, 60)
    # The node's memory budget is the telemetry's unless the section sets its own.
    assert config.telemetry.memory_budget_bytes == config.memory_budget_bytes


def test_updater_settings_from_the_file_and_env(
    node_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_yaml.write_text(
        BASE
        + "updater:\n  max_artifact_mb: 64\n  selftest_latency_budget_ms: 250\n"
        + "  watchdog: {window_s: 5, max_errors: 2, max_error_ratio: 0.5, min_frames: 3}\n"
    )
    monkeypatch.setenv("EDGEFLEET_NODE_UPDATER__WATCHDOG__WINDOW_S", "0")
    monkeypatch.setenv("EDGEFLEET_NODE_UPDATER__SPACE_MARGIN_MB", "1")
    updater = load_agent_config(node_yaml).updater
    assert updater.max_artifact_bytes == 64 << 20
    assert updater.space_margin_bytes == 1 << 20
    assert updater.selftest_latency_budget_s == 0.25
    assert (updater.watchdog.window_s, updater.watchdog.enabled) == (0.0, False)
    assert (updater.watchdog.max_errors, updater.watchdog.min_frames) == (2, 3)


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
    password = tmp_path / "broker.pass"  # the files it names are read at start
    password.write_text("pw\n")
    path = tmp_path / "node.yaml"
    path.write_text(sample.replace("/etc/edgefleet/broker.pass", str(password)))
    config = load_agent_config(path)
    assert config.link.target == "cp.example.com:7443"
    assert [s.name for s in config.runtime.streams] == ["gate-north"]
    assert config.updater.watchdog.window_s == 60
    assert config.devices is not None
    assert sorted(config.devices.cameras) == ["gate-cam-1", "gate-cam-2"]
    assert config.devices.password == "pw"


def _setting_names(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, info in model.model_fields.items():
        names.append(prefix + name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += _setting_names(annotation, f"{prefix}{name}.")
    return names


def test_the_sample_in_the_operator_guide_shows_every_setting() -> None:
    guide = Path(__file__).resolve().parents[3] / "docs" / "operator-guide.md"
    section = guide.read_text().split("## Running a node", 1)[1]
    sample = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])

    def present(dotted: str) -> bool:
        node = sample
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = [n for n in _setting_names(NodeSettings) if not present(n)]
    assert missing == []


def test_results_sampling_is_on_by_default_and_set_from_the_file_and_env(
    node_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = load_agent_config(node_yaml).results
    assert results.enabled
    assert (results.interval_s, results.max_per_minute, results.max_pending) == (10.0, 30, 500)
    node_yaml.write_text(BASE + "results:\n  interval_s: 2\n  max_per_minute: 120\n")
    monkeypatch.setenv("EDGEFLEET_NODE_RESULTS__ENABLED", "false")
    results = load_agent_config(node_yaml).results
    assert (results.interval_s, results.max_per_minute, results.enabled) == (2.0, 120, False)


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("results:\n  interval_s: 0.1\n", "results.interval_s"),
        ("results:\n  max_per_minute: 100000\n", "results.max_per_minute"),
        ("results:\n  outbox_share: 2\n", "results.outbox_share"),
        ("results:\n  sample_every: 3\n", "results.sample_every"),
    ],
)
def test_unsafe_results_settings_are_refused_naming_the_field(
    node_yaml: Path, section: str, named: str
) -> None:
    node_yaml.write_text(BASE + section)
    with pytest.raises(ConfigError, match=named):
        load_agent_config(node_yaml)


def test_aggregation_is_off_until_a_rules_file_is_named(node_yaml: Path) -> None:
    assert not load_agent_config(node_yaml).aggregation.enabled
    node_yaml.write_text(BASE + "aggregation:\n  rules_file: /etc/edgefleet/rules.yaml\n")
    aggregation = load_agent_config(node_yaml).aggregation
    assert aggregation.enabled
    assert aggregation.rules_file == Path("/etc/edgefleet/rules.yaml")
    assert (aggregation.tick_s, aggregation.queue_size) == (0.05, 10_000)
    node_yaml.write_text(BASE + "aggregation:\n  enabled: false\n  rules_file: /r.yaml\n")
    assert not load_agent_config(node_yaml).aggregation.enabled


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("aggregation:\n  tick_s: 0\n", "aggregation.tick_s"),
        ("aggregation:\n  queue_size: 0\n", "aggregation.queue_size"),
        ("aggregation:\n  rules: /r.yaml\n", "aggregation.rules"),
    ],
)
def test_unsafe_aggregation_settings_are_refused_naming_the_field(
    node_yaml: Path, section: str, named: str
) -> None:
    node_yaml.write_text(BASE + section)
    with pytest.raises(ConfigError, match=named):
        load_agent_config(node_yaml)


DEVICES = """\
devices:
  host: 127.0.0.1
  port: 1884
  client_id: node-gates-7
  username: edge-node
  password_file: {password}
  cameras:
    cam-a: {{target_fps: 10, skip_policy: even}}
    cam-b:
  limits: {{rate_per_s: 30, burst: 60}}
"""


def test_devices_are_off_unless_configured_and_the_password_is_read_from_its_file(
    node_yaml: Path, tmp_path: Path
) -> None:
    assert load_agent_config(node_yaml).devices is None
    password = tmp_path / "broker.pass"
    password.write_text("s3cret\n")
    node_yaml.write_text(BASE + DEVICES.format(password=password))
    devices = load_agent_config(node_yaml).devices
    assert devices is not None
    assert (devices.host, devices.port, devices.client_id) == ("127.0.0.1", 1884, "node-gates-7")
    assert (devices.username, devices.password) == ("edge-node", "s3cret")  # newline dropped
    assert sorted(devices.cameras) == ["cam-a", "cam-b"]
    assert devices.cameras["cam-a"].target_fps == 10
    assert devices.cameras["cam-a"].skip_policy == "even"
    assert (devices.limits.rate_per_s, devices.limits.burst) == (30, 60)
    assert "s3cret" not in repr(devices)
    node_yaml.write_text(BASE + "devices:\n  enabled: false\n  cameras: {cam-a: null}\n")
    assert load_agent_config(node_yaml).devices is None


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("devices:\n  port: 0\n", "devices.port: must be a TCP port"),
        ("devices:\n  cameras: {cam-a: {target_fps: -1}}\n", "devices.cameras.cam-a.target_fps"),
        ("devices:\n  brokers: []\n", "devices: unknown setting.s. brokers"),
        ("devices:\n  limits: {burst: 0}\n", "devices.limits.burst"),
        ("devices:\n  enabled: maybe\n", "devices.enabled"),
        ("devices:\n  username: u\n  password_file: relative.pass\n", "devices.password_file"),
        ("devices:\n  username: u\n  password_file: /nonexistent/p\n", "devices.password_file"),
        (
            "devices:\n  username: u\n  password: a\n  password_file: /p\n",
            "devices.password_file: give password or password_file",
        ),
    ],
)
def test_unusable_device_settings_are_refused_naming_the_field(
    node_yaml: Path, section: str, named: str
) -> None:
    node_yaml.write_text(BASE + section)
    with pytest.raises(ConfigError, match=named):
        load_agent_config(node_yaml)


def test_a_password_file_without_a_username_or_empty_names_the_file(
    node_yaml: Path, tmp_path: Path
) -> None:
    password = tmp_path / "broker.pass"
    password.write_text("pw\n")
    node_yaml.write_text(BASE + f"devices:\n  password_file: {password}\n")
    with pytest.raises(ConfigError, match=r"devices\.password_file: a password needs a username"):
        load_agent_config(node_yaml)
    password.write_text("\n")
    node_yaml.write_text(BASE + f"devices:\n  username: u\n  password_file: {password}\n")
    with pytest.raises(ConfigError, match=r"devices\.password_file: .* is empty") as caught:
        load_agent_config(node_yaml)
    assert caught.value.fields["field"] == "devices.password_file"
