"""Model versions of a fleet: listing, details and artifact download with Range."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas import ModelVersionOut
from control_plane.api.streaming import artifact_response
from control_plane.registry.service import ModelVersionInfo
from control_plane.services import Services

router = APIRouter(prefix="/v1/fleets/{fleet}/models", tags=["models"])


def _out(info: ModelVersionInfo, services: Services | None = None) -> ModelVersionOut:
    url = services.store.download_url(info.sha256) if services is not None else None
    return ModelVersionOut(
        fleet=info.fleet,
        model=info.model,
        version=info.version,
        release_counter=info.release_counter,
        target_path=info.target_path,
        sha256=info.sha256,
        length=info.length,
        custom=info.custom,
        targets_version=info.targets_version,
        created_at=info.created_at,
        created_by=info.created_by,
        revoked=info.revoked,
        download_url=url,
    )


@router.get("")
def list_models(fleet: str, _: PrincipalDep, services: ServicesDep) -> list[ModelVersionOut]:
    """The latest version of each model."""
    return [_out(m) for m in services.registry.list_models(fleet)]


@router.get("/{model}")
def list_versions(
    fleet: str, model: str, _: PrincipalDep, services: ServicesDep
) -> list[ModelVersionOut]:
    """Every version of one model, oldest release first."""
    return [_out(m) for m in services.registry.list_versions(fleet, model)]


@router.get("/{model}/versions/{version}")
def get_version(
    fleet: str, model: str, version: str, _: PrincipalDep, services: ServicesDep
) -> ModelVersionOut:
    return _out(services.registry.get_version(fleet, model, version), services)


@router.get("/{model}/versions/{version}/artifact")
def download_version(
    fleet: str, model: str, version: str, request: Request, _: PrincipalDep, services: ServicesDep
) -> Response:
    """The ONNX file; honours `Range: bytes=a-b` so interrupted downloads resume."""
    info = services.registry.get_version(fleet, model, version)
    store = services.store
    return artifact_response(
        lambda start, end: store.open_range(info.sha256, start, end),
        info.length,
        request.headers.get("range"),
        etag=info.sha256,
    )
