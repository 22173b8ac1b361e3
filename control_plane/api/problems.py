"""RFC 9457 problem details: the one place that maps domain errors to HTTP statuses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane import errors

PROBLEM_JSON = "application/problem+json"

_STATUS: list[tuple[type[errors.EdgefleetError], int]] = [
    (errors.PayloadTooLargeError, 413),
    (errors.RangeNotSatisfiableError, 416),
    (errors.InvalidInputError, 400),
    (errors.NotFoundError, 404),
    (errors.ConflictError, 409),
    (errors.RollbackError, 409),
    (errors.SignatureError, 403),
    (errors.PolicyError, 422),
    (errors.AuthenticationError, 401),
    (errors.PermissionDeniedError, 403),
    (errors.UnavailableError, 503),
]


# Every status a problem can carry: the domain errors above, and the request-level ones
# (a body over its limit, a wrong method, a validation error); documented on every operation.
PROBLEM_STATUSES: tuple[int, ...] = tuple(
    sorted({status for _, status in _STATUS} | {405, 413, 422})
)


def status_for(exc: errors.EdgefleetError) -> int:
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def _slug(exc: errors.EdgefleetError) -> str:
    name = type(exc).__name__.removesuffix("Error")
    return "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    type_: str = "about:blank",
    request: Request | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": type_, "title": title, "status": status, "detail": detail}
    if request is not None:
        body["instance"] = request.url.path
        request_id = getattr(request.state, "request_id", None)
        if request_id:
            body["request_id"] = request_id
    if extra:
        body.update({k: v for k, v in extra.items() if k not in body})
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def install(app: FastAPI) -> None:
    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, errors.EdgefleetError)
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return problem(
            status,
            exc.title,
            exc.message,
            type_=f"https://edgefleet.dev/problems/{_slug(exc)}",
            request=request,
            extra={k: _jsonable(v) for k, v in exc.fields.items()},
            headers=headers,
        )

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return problem(exc.status_code, _reason(exc.status_code), str(exc.detail), request=request)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        issues = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        return problem(
            422,
            "request validation failed",
            "the request did not match the API schema",
            request=request,
            extra={"errors": issues},
        )

    app.add_exception_handler(errors.EdgefleetError, on_domain_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase.lower()
    except ValueError:
        return "error"
