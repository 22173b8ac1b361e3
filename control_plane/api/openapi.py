"""The OpenAPI document as the API really answers: every operation's problem+json errors.

FastAPI documents only the success response and its own validation error (a JSON shape
this API never sends: `problems.install` turns it into a problem). Not for routing or for
the bearer scheme (that is `deps.get_principal`'s security dependency).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from control_plane.api.problems import PROBLEM_JSON, PROBLEM_STATUSES

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details; a domain error adds its own fields.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "request_id": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"type": "string"}},
                    "msg": {"type": "string"},
                },
            },
        },
    },
    "additionalProperties": True,
}
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def with_problems(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with a `Problem` schema and, on every operation, each status that the
    one problem handler can answer, as `application/problem+json`."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    # FastAPI's validation-error shapes are never sent (a 422 is a problem here).
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for operations in document.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status in PROBLEM_STATUSES:
                code = str(status)
                if code == "422" or code not in responses:
                    responses[code] = {
                        "description": HTTPStatus(status).phrase,
                        "content": problem,
                    }
    return document


def install(app: FastAPI) -> None:
    """Serve `with_problems` of FastAPI's document, built once on first request."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_problems(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    openapi_version=app.openapi_version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
