"""Content-addressed artifact upload (streamed, verified) and existence checks."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from control_plane.api.deps import ContextDep, PrincipalDep, RegistryDep
from control_plane.api.schemas import ArtifactOut
from control_plane.api.streaming import consume_in_thread
from control_plane.errors import InvalidInputError

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


@router.put("/{sha256}")
async def upload_artifact(
    sha256: str, request: Request, response: Response, ctx: ContextDep, registry: RegistryDep
) -> ArtifactOut:
    """Stream the body into the store; visible only if its sha256 and length match."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise InvalidInputError("artifact uploads need a Content-Length header")
    length = int(declared)
    created = await consume_in_thread(
        request.stream(),
        lambda chunks: registry.upload_artifact(ctx, sha256, length, chunks),
    )
    response.status_code = 201 if created else 200
    return ArtifactOut(sha256=sha256, length=length, created=created)


# A HEAD answer has no body: documented without content (FastAPI would say JSON).
@router.head(
    "/{sha256}",
    response_class=Response,
    responses={
        200: {"description": "Stored; Content-Length is its size."},
        404: {"description": "Not stored."},
    },
)
def artifact_exists(sha256: str, _: PrincipalDep, registry: RegistryDep) -> Response:
    size = registry.artifact_size(sha256)
    if size is None:
        return Response(status_code=404)
    return Response(status_code=200, headers={"Content-Length": str(size)})
