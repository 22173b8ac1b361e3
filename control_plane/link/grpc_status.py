"""The one place that maps domain errors to gRPC status codes (problems.py does HTTP).

Servicers raise `EdgefleetError`s; the guard interceptor turns them into a status, the
`edgefleet-reason` trailer and a refusal count. Nothing else picks status codes.
"""

from __future__ import annotations

from typing import Final

import grpc

from control_plane import errors

__all__ = ["REASON_TRAILER", "status_for"]

REASON_TRAILER: Final = "edgefleet-reason"

_STATUS: Final[list[tuple[type[errors.EdgefleetError], grpc.StatusCode]]] = [
    (errors.PayloadTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.RangeNotSatisfiableError, grpc.StatusCode.OUT_OF_RANGE),
    (errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.ConflictError, grpc.StatusCode.ABORTED),
    (errors.SignatureError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.PolicyError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
]


def status_for(exc: errors.EdgefleetError) -> grpc.StatusCode:
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL
