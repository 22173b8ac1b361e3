"""Control-plane settings, read from flags and `EDGEFLEET_*` env at the entry point only.

Libraries never read settings: `server.main()` builds these and passes plain values down.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from control_plane.errors import InvalidInputError
from control_plane.events.query import EventsConfig
from control_plane.health.config import AlertThresholds, HealthConfig
from control_plane.link.grpc_server import GrpcLinkConfig
from control_plane.link.mqtt_acl import CONTROL_PLANE_MQTT_USER
from control_plane.link.mqtt_bridge import MqttBridgeConfig
from control_plane.rollouts.notify import WebhookConfig
from control_plane.rollouts.service import RolloutConfig

# RolloutConfig's fields as the settings that set them, to name them in an error.
_ROLLOUT_SETTINGS = {
    "interval_s": "EDGEFLEET_ROLLOUT_INTERVAL_S",
    "lease": "EDGEFLEET_ROLLOUT_LEASE_S",
    "evaluation_interval": "EDGEFLEET_ROLLOUT_EVALUATION_INTERVAL_S",
}


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EDGEFLEET_", extra="ignore")

    data_dir: Path = Field(default=Path(".edgefleet"), description="state, keys, default stores")
    database_url: str | None = Field(default=None, description="default: SQLite in data_dir")
    artifacts: str | None = Field(default=None, description="file:///dir or s3://bucket/prefix")
    http: str = Field(default="127.0.0.1:8080", description="HOST:PORT for the REST API")
    max_json_bytes: int = Field(default=1 << 20, ge=1024)
    max_artifact_bytes: int = Field(default=4 << 30, ge=1 << 20)
    snapshot_ttl_hours: float = Field(default=24 * 7, gt=0)
    timestamp_ttl_hours: float = Field(default=24, gt=0)
    refresh_interval_s: float = Field(default=300, gt=0)
    # /readyz fails when a served snapshot/timestamp has less than this fraction of its TTL
    # left; below the re-signing point (half), so only a stalled freshness loop trips it.
    ready_margin_fraction: float = Field(default=0.25, gt=0, lt=0.5)
    log_level: str = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"
    # MQTT bridge: off unless `mqtt` (HOST:PORT of the broker) is set.
    mqtt: str | None = Field(default=None, description="HOST:PORT of the MQTT 5 broker")
    mqtt_username: str = Field(default=CONTROL_PLANE_MQTT_USER, min_length=1, max_length=64)
    mqtt_password_file: Path | None = Field(
        default=None, description="default: <data_dir>/mqtt/control-plane-password"
    )
    mqtt_client_id: str | None = Field(
        default=None,
        max_length=64,
        description="stable per replica; default: <mqtt_username>-<host name>",
    )
    # Who keeps the nodes' broker logins (ADR 0043).
    mqtt_accounts: Literal["file", "dynsec"] = Field(
        default="file",
        description="dynsec: the control plane, through Mosquitto's dynamic security "
        "plugin; file: `edgefleet mqtt acl` and a broker reload",
    )
    # The bridge's shared-subscription group. Over the file export, where Mosquitto's ACL
    # file does not check subscriptions, an unguessable name keeps nodes out of it.
    mqtt_share_group: str = Field(
        default="edgefleet-cp", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    )
    mqtt_reconcile_interval_s: float = Field(default=300.0, ge=1, le=86_400)
    # TLS to the broker (the bridge and the accounts connection).
    mqtt_tls: bool = False
    mqtt_ca_file: Path | None = Field(default=None, description="default: the system's CAs")
    mqtt_cert_file: Path | None = Field(default=None, description="client certificate (PEM)")
    mqtt_key_file: Path | None = Field(default=None, description="its private key (PEM)")

    # gRPC node link: off unless `grpc` (HOST:PORT of the mTLS node port) is set.
    grpc: str | None = Field(default=None, description="HOST:PORT of the nodes' mTLS gRPC port")
    grpc_enroll: str | None = Field(
        default=None, description="HOST:PORT of the gRPC enrollment port (server TLS only)"
    )
    # What nodes dial: the DNS names and IP addresses in the gRPC server certificate.
    # From the environment: EDGEFLEET_GRPC_HOSTNAMES=cp.example.com,10.0.0.5
    grpc_hostnames: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1"]
    )

    # Health store (control_plane.health): retention per resolution and alert thresholds.
    health_processor: bool = Field(
        default=True,
        description="turn stored health reports into series and alerts on this replica",
    )
    health_raw_retention_hours: float = Field(default=12, gt=0)
    health_minute_retention_days: float = Field(default=7, gt=0)
    health_hour_retention_days: float = Field(default=180, gt=0)
    alert_drift_ratio: float = Field(default=1.5, gt=1)
    alert_min_headroom_ratio: float = Field(default=0.30, gt=0, lt=1)
    alert_outbox_fill_ratio: float = Field(default=0.8, gt=0, le=1)
    alert_outbox_clear_ratio: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="outbox_near_budget clears below this fill; default 3/4 of the raise mark",
    )
    alert_leak_slope_mb_per_h: float | None = Field(
        default=None, gt=0, description="default: the node's own leak flag only"
    )
    # Sampled inference results (`edgefleet nodes results`) kept per node, newest first.
    results_per_node: int = Field(default=100, ge=1, le=10_000)
    # Event store (control_plane.events): how long events are kept, how often pruned.
    event_retention_days: float = Field(default=30, gt=0, le=3650)
    event_prune_interval_s: float = Field(default=300, gt=0, le=86_400)

    # Rollouts: the controller's loop (every replica may run it: leases), and webhooks.
    rollout_controller: bool = Field(default=True, description="step rollouts on this replica")
    keys_dir: Path | None = Field(
        default=None,
        description="online-keys/, director/, ca/ (shared by replicas); default data_dir",
    )
    init_keys: bool = Field(
        default=False, description="make a missing director key or CA on a control plane in use"
    )
    director_signer_uri: str | None = Field(
        default=None, description="securesystemslib signer URI of the director key"
    )
    director_public_key: Path | None = Field(
        default=None, description="the director key's public key file (with the URI)"
    )
    online_signer_uris: Path | None = Field(
        default=None,
        description="JSON {fleet: {role: {uri, public_key}}}: online keys behind signer URIs",
    )
    rollout_interval_s: float = Field(default=10.0, ge=0.1, le=3600)
    rollout_lease_s: float = Field(
        default=60.0, ge=5, le=3600, description="a replica that stops holds its rollouts this long"
    )
    rollout_evaluation_interval_s: float = Field(
        default=60.0, ge=1, le=86_400, description="how often the gates judge a stage"
    )
    # From the environment: EDGEFLEET_ROLLOUT_WEBHOOKS=https://chat.example/hook,https://...
    rollout_webhooks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    rollout_webhook_secret_file: Path | None = Field(
        default=None, description="the HMAC-SHA256 key of the webhooks' signatures"
    )

    def health_config(self) -> HealthConfig:
        """The health store's config; an inconsistent retention fails here, at start."""
        try:
            return HealthConfig(
                raw_retention=timedelta(hours=self.health_raw_retention_hours),
                minute_retention=timedelta(days=self.health_minute_retention_days),
                hour_retention=timedelta(days=self.health_hour_retention_days),
                thresholds=AlertThresholds(
                    drift_ratio=self.alert_drift_ratio,
                    min_headroom_ratio=self.alert_min_headroom_ratio,
                    outbox_fill_ratio=self.alert_outbox_fill_ratio,
                    outbox_clear_fill_ratio=self.alert_outbox_clear_ratio,
                    leak_slope_mb_per_h=self.alert_leak_slope_mb_per_h,
                ),
            )
        except ValueError as exc:
            raise InvalidInputError(f"health settings: {exc}") from exc

    def events_config(self) -> EventsConfig:
        """The event store's config; a retention under an hour fails here, at start."""
        return EventsConfig(
            retention=timedelta(days=self.event_retention_days),
            prune_interval_s=self.event_prune_interval_s,
        )

    def rollout_config(self) -> RolloutConfig:
        """The controller's timing; an inconsistent one fails here, at start, naming it."""
        try:
            return RolloutConfig(
                interval_s=self.rollout_interval_s,
                lease=timedelta(seconds=self.rollout_lease_s),
                evaluation_interval=timedelta(seconds=self.rollout_evaluation_interval_s),
            )
        except InvalidInputError as exc:
            setting = _ROLLOUT_SETTINGS.get(str(exc.fields.get("field")), "")
            raise InvalidInputError(
                f"rollout settings: {exc.message}" + (f" ({setting})" if setting else ""),
                **exc.fields,
            ) from exc

    def webhook_config(self) -> WebhookConfig | None:
        """The webhooks' config when URLs are set; the secret file must be (fails fast)."""
        if not self.rollout_webhooks:
            return None
        if self.rollout_webhook_secret_file is None:
            raise InvalidInputError(
                "rollout webhooks need EDGEFLEET_ROLLOUT_WEBHOOK_SECRET_FILE (their HMAC key)",
                field="rollout_webhook_secret_file",
            )
        try:
            secret = self.rollout_webhook_secret_file.read_bytes().strip()
        except OSError as exc:
            raise InvalidInputError(f"cannot read the webhook secret file: {exc}") from exc
        return WebhookConfig(tuple(self.rollout_webhooks), secret)

    @field_validator("grpc_hostnames", "rollout_webhooks", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @model_validator(mode="after")
    def _grpc_enroll_needs_grpc(self) -> ServerSettings:
        if self.grpc_enroll is not None and self.grpc is None:
            raise ValueError("grpc_enroll needs grpc (the node port) as well")
        if self.mqtt_accounts == "dynsec" and self.mqtt is None:
            raise ValueError("mqtt_accounts=dynsec needs mqtt (the broker) as well")
        if not self.mqtt_tls and any(
            f is not None for f in (self.mqtt_ca_file, self.mqtt_cert_file, self.mqtt_key_file)
        ):
            raise ValueError("mqtt_ca_file, mqtt_cert_file and mqtt_key_file need mqtt_tls")
        if (self.mqtt_cert_file is None) != (self.mqtt_key_file is None):
            raise ValueError("mqtt_cert_file and mqtt_key_file go together")
        return self

    def grpc_link_config(self) -> GrpcLinkConfig | None:
        """The gRPC link's config when `grpc` is set (names split into DNS names and IPs)."""
        if self.grpc is None:
            return None
        names, ips = [], []
        for name in self.grpc_hostnames:
            try:
                ips.append(str(ipaddress.ip_address(name)))
            except ValueError:
                names.append(name)
        return GrpcLinkConfig(
            node_address=self.grpc,
            enroll_address=self.grpc_enroll,
            hostnames=tuple(names),
            ips=tuple(ips),
        )

    @field_validator("http", "mqtt", "grpc", "grpc_enroll")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    def mqtt_bridge_config(self) -> MqttBridgeConfig | None:
        """The bridge's config when `mqtt` is set; reads the password file (fails fast)."""
        if self.mqtt is None:
            return None
        password = None
        if self.mqtt_password_file is not None:
            try:
                password = self.mqtt_password_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise InvalidInputError(f"cannot read the MQTT password file: {exc}") from exc
            if not password:
                raise InvalidInputError(f"MQTT password file {self.mqtt_password_file} is empty")
        host, _, port = self.mqtt.rpartition(":")
        return MqttBridgeConfig(
            host=host,
            port=int(port),
            username=self.mqtt_username,
            password=password,
            client_id=self.mqtt_client_id,
            share_group=self.mqtt_share_group,
            tls=self.mqtt_tls,
            ca_file=self.mqtt_ca_file,
            cert_file=self.mqtt_cert_file,
            key_file=self.mqtt_key_file,
        )

    @property
    def host(self) -> str:
        return self.http.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.http.rpartition(":")[2])

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'edgefleet.db').resolve()}"

    @property
    def resolved_artifacts(self) -> str:
        return self.artifacts or (self.data_dir / "artifacts").resolve().as_uri()

    @property
    def snapshot_ttl(self) -> timedelta:
        return timedelta(hours=self.snapshot_ttl_hours)

    @property
    def timestamp_ttl(self) -> timedelta:
        return timedelta(hours=self.timestamp_ttl_hours)
