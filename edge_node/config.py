"""The node agent's settings: read once at the entry point, checked, and handed down frozen.

Precedence, lowest first: the YAML file (``--config``), then ``EDGEFLEET_NODE_*``
environment variables (nested with ``__``, e.g. ``EDGEFLEET_NODE_RUNTIME__WORKERS=2``),
then command-line flags. ``NodeSettings`` (pydantic-settings) lives only here and in
``edge_node.__main__``; the agent itself takes the frozen :class:`AgentConfig`.

Not here: what the agent does with them (``edge_node.agent``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource
from pydantic_settings import SettingsConfigDict as _SettingsConfigDict

from edge_node.agent.aggregation_task import AggregationTaskConfig
from edge_node.capture.config import (
    DEFAULT_FPS,
    MAX_CREDENTIALS_BYTES,
    CaptureConfigError,
    HttpSourceConfig,
    SourceConfig,
    StreamSource,
    parse_credentials,
    parse_source,
)
from edge_node.devices.config import DeviceGatewayConfig, DeviceGatewayConfigError
from edge_node.errors import InvalidInputError
from edge_node.identity import RenewalConfig
from edge_node.link.base import Backoff
from edge_node.link.grpc_link import GrpcLinkSettings
from edge_node.link.uplink import UplinkConfig
from edge_node.results.sampling import (
    MAX_INTERVAL_S,
    MAX_PER_MINUTE,
    MAX_STREAMS,
    MIN_INTERVAL_S,
    ResultsConfig,
)
from edge_node.runtime.config import (
    RuntimeConfig,
    parse_preprocess_config,
    parse_scheduler_config,
    parse_session_config,
    parse_streams,
    preprocess_threads_for,
)
from edge_node.runtime.errors import RuntimeConfigError
from edge_node.runtime.priority import Background
from edge_node.telemetry.config import TelemetryConfig, parse_telemetry_config
from edge_node.updater.config import UpdaterConfig
from edge_node.updater.https_fetch import HttpsRepositoryConfig
from edge_node.updater.watchdog import WatchdogConfig

__all__ = [
    "AGENT_VERSION",
    "ENV_PREFIX",
    "AgentConfig",
    "AggregationSettings",
    "ConfigError",
    "MqttTransportConfig",
    "NodeSettings",
    "ResultsSettings",
    "RuntimeSettings",
    "UpdaterSettings",
    "WatchdogSettings",
    "device_settings",
    "load_agent_config",
    "load_node_settings",
    "to_agent_config",
]

AGENT_VERSION: Final = "0.1.0"
ENV_PREFIX: Final = "EDGEFLEET_NODE_"
_MAX_CONFIG_BYTES: Final = 1 << 20
# HOST:PORT with a DNS name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS: Final = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?):(\d{1,5})$")


class ConfigError(InvalidInputError):
    """The node's configuration is missing, malformed or unsafe (exit code 2)."""

    title = "invalid node configuration"


def _check_address(value: str | None) -> str | None:
    if value is None:
        return None
    match = _ADDRESS.match(value)
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return value


class RuntimeSettings(BaseModel):
    """The optional local inference runtime (sections as ``edge_node.runtime.config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: Path | None = None
    workers: int = Field(default=1, ge=1, le=64)
    # None: one when the agent may use two or more CPUs, else none (ADR 0027)
    preprocess_threads: int | None = Field(default=None, ge=0, le=64)
    # The next version's load and self-test during a hot swap (edge_node.runtime.priority)
    trial_priority: Literal["nice", "idle", "normal"] = "nice"
    session: dict[str, Any] = Field(default_factory=dict)
    preprocess: dict[str, Any] = Field(default_factory=dict)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    streams: list[dict[str, Any]] = Field(default_factory=list)


class WatchdogSettings(BaseModel):
    """After an update: how long the new model is on watch, and what reverts it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(default=60.0, ge=0, le=86400)
    max_errors: int = Field(default=10, ge=1, le=1_000_000)
    max_error_ratio: float = Field(default=0.05, gt=0, le=1)
    min_frames: int = Field(default=20, ge=1, le=1_000_000)


class UpdaterSettings(BaseModel):
    """Model updates from the control plane's director (see docs/operator-guide.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    max_artifact_mb: int = Field(default=4096, gt=0, le=1 << 20)
    space_margin_mb: int = Field(default=256, ge=0, le=1 << 20)
    max_attempts: int = Field(default=3, ge=1, le=100)
    retry_initial_s: float = Field(default=10.0, gt=0, le=3600)
    retry_max_s: float = Field(default=600.0, gt=0, le=86400)
    selftest_latency_budget_ms: float = Field(default=1000.0, gt=0, le=600_000)
    max_sequence_jump: int = Field(default=2**32, ge=1, le=2**63)
    """A director assignment more than this above the last accepted sequence is refused
    (`sequence-jump`): a forged 2^64-1 cannot lock the director out (ADR 0045)."""
    watchdog: WatchdogSettings = Field(default_factory=WatchdogSettings)

    @model_validator(mode="after")
    def _retry_bounds(self) -> UpdaterSettings:
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError(
                f"updater.retry_max_s ({self.retry_max_s:g}) must not be below "
                f"updater.retry_initial_s ({self.retry_initial_s:g})"
            )
        return self


class ResultsSettings(BaseModel):
    """The sample of inference results the control plane shows (`edgefleet nodes results`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # Per stream, at most one result this often (one with detections preferred).
    interval_s: float = Field(default=10.0, ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    # All streams together.
    max_per_minute: int = Field(default=30, ge=1, le=MAX_PER_MINUTE)
    max_streams: int = Field(default=64, ge=1, le=MAX_STREAMS)
    # Waiting in the outbox at most: this many, and this share of its budget.
    max_pending: int = Field(default=500, ge=1, le=100_000)
    outbox_share: float = Field(default=0.1, ge=0.001, le=1.0)

    def config(self) -> ResultsConfig:
        return ResultsConfig(
            enabled=self.enabled,
            interval_s=self.interval_s,
            max_per_minute=self.max_per_minute,
            max_streams=self.max_streams,
            max_pending=self.max_pending,
            outbox_share=self.outbox_share,
        )


class AggregationSettings(BaseModel):
    """The node's own detections into events by a rules file (docs/operator-guide.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # The rules (edge_node.aggregation.config); none: no aggregation. A file that cannot
    # be used is reported at start (log and health) and the node serves without it.
    rules_file: Path | None = None
    # How often the task aggregates what the pipeline handed over and moves time on (0.05 s:
    # paced P50 about 145 ms against 200-250 at 0.2, for about 5 % of a core at 8 cameras
    # x 25 fps; docs/benchmarks.md, bench.device_events).
    tick_s: float = Field(default=0.05, ge=0.01, le=60)
    # Results waiting for the task; one more of the node's own is counted (queue_overflow)
    # and left out; a camera's waits for room, then is refused (left unacked, ADR 0041).
    queue_size: int = Field(default=10_000, ge=1, le=1_000_000)
    # Events the outbox refused (budget, full disk), held to be tried again.
    max_held_events: int = Field(default=10_000, ge=1, le=1_000_000)

    def config(self) -> AggregationTaskConfig:
        return AggregationTaskConfig(
            enabled=self.enabled and self.rules_file is not None,
            rules_file=self.rules_file,
            tick_s=self.tick_s,
            queue_size=self.queue_size,
            max_held_events=self.max_held_events,
        )


class NodeSettings(BaseSettings):
    """Everything a node's ``node.yaml`` holds; see docs/operator-guide.md."""

    model_config = _SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    data_dir: Path
    fleet: str | None = None
    transport: Literal["grpc", "mqtt"] = "grpc"
    server_grpc: str | None = None
    enroll_grpc: str | None = None
    server_name: str | None = None
    # transport mqtt: the broker, and the REST API (enrollment, TUF metadata and models).
    server_mqtt: str | None = None
    server_http: str | None = None
    http_ca_file: Path | None = None
    mqtt_login_grace_s: float = Field(default=3600.0, ge=0, le=30 * 86400)
    mqtt_tls: bool = False
    mqtt_ca_file: Path | None = None
    bootstrap_token: SecretStr | None = None
    ca_file: Path | None = None
    memory_budget_mb: int = Field(default=512, gt=0, le=1 << 20)
    outbox_budget_mb: int = Field(default=256, gt=0, le=1 << 20)
    health_interval_s: float = Field(default=30.0, gt=0, le=86400)
    shutdown_deadline_s: float = Field(default=10.0, gt=0, le=600)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    updater: UpdaterSettings = Field(default_factory=UpdaterSettings)
    results: ResultsSettings = Field(default_factory=ResultsSettings)
    aggregation: AggregationSettings = Field(default_factory=AggregationSettings)
    # Health report windows and thresholds: edge_node.telemetry.TelemetryConfig's keys.
    telemetry: dict[str, Any] = Field(default_factory=dict)
    # The device gateway (cameras over the local broker): DeviceGatewayConfig's keys plus
    # `enabled` and `password_file`; absent or null: no gateway.
    devices: dict[str, Any] | None = None

    _check_addresses = field_validator("server_grpc", "enroll_grpc", "server_mqtt")(_check_address)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) over environment; the file comes in below them (load_node_settings).
        return (init_settings, env_settings)


@dataclass(frozen=True, slots=True)
class MqttTransportConfig:
    """An MQTT node's transport: the broker for messages, HTTPS for enrollment and models."""

    host: str
    port: int
    http_url: str  # the control plane's REST API
    http_ca_file: Path | None = None  # None: the system's CAs verify the HTTPS server
    # After enrollment the broker may not know the node yet (`edgefleet mqtt acl` and a
    # reload are the operator's steps): its refusals are retried this long, then final.
    login_grace_s: float = 3600.0
    tls: bool = False
    ca_file: Path | None = None  # for TLS to the broker; None: the system's CAs
    keepalive_s: int = 30
    connect_timeout_s: float = 10.0

    def repository(self, fleet: str) -> HttpsRepositoryConfig:
        return HttpsRepositoryConfig(self.http_url, fleet, self.http_ca_file)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What the agent runs with: plain, frozen, checked. `link` for transport grpc,
    `mqtt` for transport mqtt."""

    data_dir: Path
    link: GrpcLinkSettings | None = None
    fleet: str | None = None
    transport: Literal["grpc", "mqtt"] = "grpc"
    enroll_address: str | None = None
    bootstrap_token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    memory_budget_bytes: int = 512 << 20
    outbox_budget_bytes: int = 256 << 20
    health_interval_s: float = 30.0
    shutdown_deadline_s: float = 10.0
    model_path: Path | None = None
    runtime_workers: int = 1
    runtime_preprocess_threads: int = 0
    runtime_trial_priority: Background = "nice"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    # Streams fed by a camera source (edge_node.capture); the others are fed by callers.
    camera_sources: tuple[StreamSource, ...] = ()
    updater: UpdaterConfig = field(default_factory=UpdaterConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    aggregation: AggregationTaskConfig = field(default_factory=AggregationTaskConfig)
    # The device gateway; None: no cameras over the local broker (node.yaml `devices:`).
    devices: DeviceGatewayConfig | None = None
    uplink: UplinkConfig = field(default_factory=UplinkConfig)
    renewal: RenewalConfig = field(default_factory=RenewalConfig)
    agent_version: str = AGENT_VERSION
    mqtt: MqttTransportConfig | None = None

    def __post_init__(self) -> None:
        if (self.transport == "mqtt") != (self.mqtt is not None):
            raise ConfigError("transport mqtt goes with the mqtt settings, and only with them")

    @property
    def outbox_path(self) -> Path:
        return self.data_dir / "outbox.db"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from exc
    if len(data) > _MAX_CONFIG_BYTES:
        raise ConfigError(f"the config file {path} is over {_MAX_CONFIG_BYTES} bytes")
    try:
        loaded = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the config file {path} is not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"the config file {path} must hold a mapping of settings")
    return {str(k): v for k, v in loaded.items()}


def load_node_settings(
    config_file: Path | None = None, flags: Mapping[str, Any] | None = None
) -> NodeSettings:
    """The settings from file < environment < flags (flags that are None are not given)."""
    file_values = _read_yaml(config_file) if config_file is not None else {}
    given = {k: v for k, v in (flags or {}).items() if v is not None}

    class _Layered(NodeSettings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, InitSettingsSource(settings_cls, file_values))

    try:
        layered = _Layered(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid node settings: {problems}") from exc
    return layered


def to_agent_config(settings: NodeSettings) -> AgentConfig:
    """Cross-field checks and the frozen config; ConfigError for anything unsafe."""
    link: GrpcLinkSettings | None = None
    mqtt: MqttTransportConfig | None = None
    if settings.transport == "mqtt":
        mqtt = _mqtt_transport(settings)
    elif settings.server_grpc is None:
        raise ConfigError("server_grpc (HOST:PORT of the control plane's node port) is required")
    else:
        link = GrpcLinkSettings(target=settings.server_grpc, server_name=settings.server_name)
    runtime = settings.runtime
    stream_dicts, sources = _split_sources(runtime.streams)
    try:
        runtime_config = RuntimeConfig(
            session=parse_session_config(runtime.session),
            preprocess=parse_preprocess_config(runtime.preprocess),
            streams=parse_streams(stream_dicts),
            scheduler=parse_scheduler_config(runtime.scheduler),
        )
    except RuntimeConfigError as exc:
        raise ConfigError(f"invalid runtime settings: {exc}") from exc
    fps = {s.name: s.target_fps or DEFAULT_FPS for s in runtime_config.streams}
    camera_sources = tuple(
        StreamSource(name, _with_credentials(name, source), fps[name])
        for name, source in sources.items()
    )
    if runtime.model_path is not None and not runtime_config.streams:
        raise ConfigError("runtime.model_path is set but runtime.streams is empty")
    token = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
    memory_budget_bytes = settings.memory_budget_mb << 20
    try:
        telemetry = parse_telemetry_config(
            settings.telemetry, memory_budget_bytes=memory_budget_bytes
        )
    except InvalidInputError as exc:
        raise ConfigError(f"invalid telemetry settings: {exc.message}") from exc
    updater = settings.updater
    watchdog = updater.watchdog
    return AgentConfig(
        data_dir=settings.data_dir,
        link=link,
        mqtt=mqtt,
        fleet=settings.fleet,
        transport=settings.transport,
        enroll_address=settings.enroll_grpc,
        bootstrap_token=token or None,
        ca_file=settings.ca_file,
        memory_budget_bytes=memory_budget_bytes,
        outbox_budget_bytes=settings.outbox_budget_mb << 20,
        health_interval_s=settings.health_interval_s,
        shutdown_deadline_s=settings.shutdown_deadline_s,
        model_path=runtime.model_path,
        runtime_workers=runtime.workers,
        runtime_preprocess_threads=(
            runtime.preprocess_threads
            if runtime.preprocess_threads is not None
            else preprocess_threads_for(_usable_cpus())
        ),
        runtime_trial_priority=runtime.trial_priority,
        runtime=runtime_config,
        camera_sources=camera_sources,
        updater=UpdaterConfig(
            enabled=updater.enabled,
            max_artifact_bytes=updater.max_artifact_mb << 20,
            space_margin_bytes=updater.space_margin_mb << 20,
            max_attempts=updater.max_attempts,
            retry_initial_s=updater.retry_initial_s,
            retry_max_s=updater.retry_max_s,
            selftest_latency_budget_s=updater.selftest_latency_budget_ms / 1000,
            max_sequence_jump=updater.max_sequence_jump,
            watchdog=WatchdogConfig(
                window_s=watchdog.window_s,
                max_errors=watchdog.max_errors,
                max_error_ratio=watchdog.max_error_ratio,
                min_frames=watchdog.min_frames,
                poll_s=min(1.0, watchdog.window_s / 10) if watchdog.window_s else 1.0,
            ),
        ),
        telemetry=telemetry,
        results=settings.results.config(),
        aggregation=settings.aggregation.config(),
        devices=_devices(settings.devices),
        uplink=UplinkConfig(backoff=Backoff(initial_s=0.5, cap_s=30.0)),
    )


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _split_sources(
    streams: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, SourceConfig]]:
    """The streams without their ``source`` key (the runtime's parser knows none), and the
    parsed sources by stream name."""
    plain: list[dict[str, Any]] = []
    sources: dict[str, SourceConfig] = {}
    for raw in streams:
        if not isinstance(raw, dict) or "source" not in raw:
            plain.append(raw)
            continue
        stream = {k: v for k, v in raw.items() if k != "source"}
        plain.append(stream)
        name = stream.get("name")
        if raw["source"] is None:
            continue
        if not isinstance(name, str):
            continue  # parse_streams refuses it with its own message
        try:
            sources[name] = parse_source(name, raw["source"])
        except CaptureConfigError as exc:
            raise ConfigError(f"invalid runtime settings: {exc.message}") from exc
    return plain, sources


def _with_credentials(stream: str, source: SourceConfig) -> SourceConfig:
    """Read an HTTP source's credentials file now: a missing or malformed one fails at start."""
    if not isinstance(source, HttpSourceConfig) or source.credentials_file is None:
        return source
    path = source.credentials_file
    where = f"streams.{stream}.source.credentials_file"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CREDENTIALS_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_CREDENTIALS_BYTES:
        raise ConfigError(f"{where}: {path} is over {MAX_CREDENTIALS_BYTES} bytes")
    try:
        credentials = parse_credentials(where, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path} is not UTF-8 text") from exc
    except CaptureConfigError as exc:
        raise ConfigError(f"{exc.message} ({path})") from exc
    return replace(source, credentials=credentials)


def device_settings(raw: Mapping[str, Any] | None) -> DeviceGatewayConfig | None:
    """node.yaml's ``devices:`` alone (``edgefleet-node devices``); None when disabled."""
    return _devices(raw)


def _devices(raw: Mapping[str, Any] | None) -> DeviceGatewayConfig | None:
    """node.yaml's ``devices:``, its ``password_file`` read now (a missing or empty one
    fails at start, like the other credentials files)."""
    if raw is None:
        return None
    options = dict(raw)
    enabled = options.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(
            f"devices.enabled: must be true or false (got {enabled!r})", field="devices.enabled"
        )
    password_file = options.pop("password_file", None)
    if password_file is not None:
        if "password" in options:
            raise ConfigError(
                "devices.password_file: give password or password_file, not both",
                field="devices.password_file",
            )
        options["password"] = _read_password(password_file)
    try:
        config = DeviceGatewayConfig.from_mapping(options, where="devices")
    except DeviceGatewayConfigError as exc:
        field_name = str(exc.fields.get("field", "devices"))
        message = exc.message
        if field_name == "devices.password" and password_file is not None:
            field_name = "devices.password_file"  # the field the operator wrote
            message = message.replace("devices.password:", "devices.password_file:", 1)
        raise ConfigError(f"invalid device settings: {message}", field=field_name) from exc
    return config if enabled else None


def _read_password(value: object) -> str:
    where = "devices.password_file"
    if not isinstance(value, str) or not value or not Path(value).is_absolute():
        raise ConfigError(f"{where}: must be an absolute path (got {value!r})", field=where)
    path = Path(value)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CREDENTIALS_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}", field=where) from exc
    if len(data) > MAX_CREDENTIALS_BYTES:
        raise ConfigError(f"{where}: {path} is over {MAX_CREDENTIALS_BYTES} bytes", field=where)
    try:
        password = data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path} is not UTF-8 text", field=where) from exc
    if not password:
        raise ConfigError(f"{where}: {path} is empty", field=where)
    return password


def _mqtt_transport(settings: NodeSettings) -> MqttTransportConfig:
    misplaced = [
        name for name in ("server_grpc", "enroll_grpc") if getattr(settings, name) is not None
    ]
    if misplaced:
        raise ConfigError(
            f"{', '.join(misplaced)}: gRPC settings with transport mqtt; an MQTT node uses "
            "server_mqtt and server_http"
        )
    if settings.server_mqtt is None:
        raise ConfigError("server_mqtt (HOST:PORT of the MQTT broker) is required for mqtt")
    if settings.server_http is None:
        raise ConfigError(
            "server_http (URL of the control plane's REST API, https://...) is required for "
            "mqtt: the node enrolls and downloads models there"
        )
    if settings.mqtt_ca_file is not None and not settings.mqtt_tls:
        raise ConfigError("mqtt_ca_file is for TLS to the broker: set mqtt_tls: true as well")
    host, _, port = settings.server_mqtt.rpartition(":")
    mqtt = MqttTransportConfig(
        host=host.strip("[]"),
        port=int(port),
        http_url=settings.server_http,
        http_ca_file=settings.http_ca_file,
        login_grace_s=settings.mqtt_login_grace_s,
        tls=settings.mqtt_tls,
        ca_file=settings.mqtt_ca_file,
    )
    try:
        mqtt.repository(settings.fleet or "fleet")
    except InvalidInputError as exc:
        raise ConfigError(f"server_http: {exc.message}") from exc
    return mqtt


def load_agent_config(
    config_file: Path | None = None, flags: Mapping[str, Any] | None = None
) -> AgentConfig:
    return to_agent_config(load_node_settings(config_file, flags))
