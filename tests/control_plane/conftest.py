"""A real control plane for API, CLI and TUF-client tests: uvicorn on a loopback port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.cli.client import ApiClient
from control_plane.services import ServiceConfig, Services, build_services
from tests.conftest import free_port


@pytest.fixture
def service_config(tmp_path: Path, database_url: str) -> ServiceConfig:
    data = tmp_path / "server"
    return ServiceConfig(
        data_dir=data,
        database_url=database_url,
        artifacts_url=(data / "artifacts").as_uri(),
        max_json_bytes=64 * 1024,
        max_artifact_bytes=64 << 20,
        refresh_interval_s=3600,
    )


@pytest.fixture
def services(service_config: ServiceConfig) -> Iterator[Services]:
    built = build_services(service_config)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def admin_token(services: Services) -> str:
    return services.admin_token_file.read_text().strip()


@pytest.fixture
def client(services: Services, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(services, run_background=False)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


@dataclass
class LiveServer:
    url: str
    services: Services
    admin_token: str

    def api(self, token: str | None = None) -> ApiClient:
        return ApiClient(self.url, token if token is not None else self.admin_token)


@pytest.fixture
def live_server(services: Services, admin_token: str) -> Iterator[LiveServer]:
    port = free_port()
    config = uvicorn.Config(
        create_app(services, run_background=False),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", services, admin_token)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
