"""Control-plane settings, read from flags and `EDGEFLEET_*` env at the entry point only.

Libraries never read settings: `server.main()` builds these and passes plain values down.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    log_level: str = "info"

    @field_validator("http")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

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
