"""Model versions of a fleet: listing, details and artifact download with Range."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from control_plane.api.deps import ArtifactStoreDep, DirectorDep, PrincipalDep, RegistryDep
from control_plane.api.schemas import ModelVersionOut
from control_plane.api.streaming import ARTIFACT_RESPONSES, artifact_response
from control_plane.artifacts.base import ArtifactStore
from control_plane.registry.service import ModelVersionInfo

router = APIRouter(prefix="/v1/fleets/{fleet}/models", tags=["models"])


def _out(
    info: ModelVersionInfo,
    store: ArtifactStore | None = None,
    left: dict[str, list[str]] | None = None,
) -> ModelVersionOut:
    url = store.download_url(info.sha256) if store is not None else None
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
        left_on_it=(left or {}).get(info.version, []),
        runtime=info.runtime,
    )


@router.get("")
def list_models(fleet: str, _: PrincipalDep, registry: RegistryDep) -> list[ModelVersionOut]:
    """The latest version of each model."""
    return [_out(m) for m in registry.list_models(fleet)]


@router.get("/{model}")
def list_versions(
    fleet: str, model: str, _: PrincipalDep, registry: RegistryDep, director: DirectorDep
) -> list[ModelVersionOut]:
    """Every version of one model, oldest release first; a revoked one with the nodes left
    on it (`left_on_it`)."""
    versions = registry.list_versions(fleet, model)
    left = director.left_on_revoked(fleet, model)
    return [_out(m, left=left) for m in versions]


@router.get("/{model}/versions/{version}")
def get_version(
    fleet: str,
    model: str,
    version: str,
    _: PrincipalDep,
    registry: RegistryDep,
    store: ArtifactStoreDep,
) -> ModelVersionOut:
    return _out(registry.get_version(fleet, model, version), store)


@router.get(
    "/{model}/versions/{version}/artifact",
    response_class=Response,
    responses=ARTIFACT_RESPONSES,
)
def download_version(
    fleet: str,
    model: str,
    version: str,
    request: Request,
    _: PrincipalDep,
    registry: RegistryDep,
    store: ArtifactStoreDep,
) -> Response:
    """The ONNX file; honours `Range: bytes=a-b` so interrupted downloads resume."""
    info = registry.get_version(fleet, model, version)
    return artifact_response(
        lambda start, end: store.open_range(info.sha256, start, end),
        info.length,
        request.headers.get("range"),
        etag=info.sha256,
    )
