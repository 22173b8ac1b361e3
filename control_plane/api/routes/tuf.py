"""The fleet's TUF repository over HTTP, laid out for consistent snapshots.

`tuf.ngclient.Updater(metadata_base_url=.../tuf/metadata/, target_base_url=.../tuf/targets/)`
works against it unmodified. Reads are open: every byte is verified by the client.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from control_plane.api.deps import ArtifactStoreDep, RegistryDep
from control_plane.api.streaming import ARTIFACT_RESPONSES, artifact_response

router = APIRouter(prefix="/v1/fleets/{fleet}/tuf", tags=["tuf"])


@router.get("/metadata/{filename}")
def metadata(fleet: str, filename: str, registry: RegistryDep) -> Response:
    body = registry.metadata_file(fleet, filename)
    cache = (
        "no-cache"
        if filename in {"timestamp.json", "root.json", "targets.json"}
        else "max-age=86400"
    )
    return Response(body, media_type="application/json", headers={"Cache-Control": cache})


@router.get("/targets/{path:path}", response_class=Response, responses=ARTIFACT_RESPONSES)
def target(
    fleet: str, path: str, request: Request, registry: RegistryDep, store: ArtifactStoreDep
) -> Response:
    sha256, length = registry.resolve_target(fleet, path)
    return artifact_response(
        lambda start, end: store.open_range(sha256, start, end),
        length,
        request.headers.get("range"),
        etag=sha256,
    )
