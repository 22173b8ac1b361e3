"""`edgefleet server`: build the services from settings and serve the REST API."""

from __future__ import annotations

import logging

import uvicorn

from control_plane.api.app import create_app
from control_plane.services import ServiceConfig, Services, build_services
from control_plane.settings import ServerSettings

log = logging.getLogger(__name__)


def service_config(settings: ServerSettings) -> ServiceConfig:
    return ServiceConfig(
        data_dir=settings.data_dir.resolve(),
        database_url=settings.resolved_database_url,
        artifacts_url=settings.resolved_artifacts,
        max_json_bytes=settings.max_json_bytes,
        max_artifact_bytes=settings.max_artifact_bytes,
        snapshot_ttl=settings.snapshot_ttl,
        timestamp_ttl=settings.timestamp_ttl,
        refresh_interval_s=settings.refresh_interval_s,
    )


def serve(settings: ServerSettings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    services: Services = build_services(service_config(settings))
    if services.admin_token_file.exists():
        log.info("admin token file: %s", services.admin_token_file)
    try:
        uvicorn.run(
            create_app(services),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            timeout_graceful_shutdown=10,
        )
    finally:
        services.close()
