"""The control plane's exception tree; the API layer alone maps it to HTTP.

    EdgefleetError                  root of everything we raise on purpose
    ├── InvalidInputError           the caller sent something malformed      (400)
    │   ├── InvalidModelError       not an ONNX model / fails the checker    (400)
    │   ├── ArtifactIntegrityError  hash or length differs from the claim    (400)
    │   ├── PayloadTooLargeError    body or artifact over the limit          (413)
    │   └── RangeNotSatisfiableError a byte range or offset past the end      (416)
    ├── NotFoundError               no such fleet / model / version          (404)
    ├── ConflictError               lost a race or clashes with state        (409)
    ├── PolicyError                 well-formed but refused by policy         (403/422)
    │   ├── SignatureError          signature threshold not met, unknown key  (403)
    │   └── RollbackError           version / counter / floor going backwards (409)
    ├── AuthenticationError         no or unknown credentials                (401)
    ├── PermissionDeniedError       known caller, role too low               (403)
    └── UnavailableError            infrastructure down (db, object store)   (503)
        └── StorageError            artifact store failure
Every error carries structured ``fields`` so the problem document can show them.
"""

from __future__ import annotations

from typing import Any


class EdgefleetError(Exception):
    """Root of the control plane's errors."""

    title = "edgefleet error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = fields


class InvalidInputError(EdgefleetError):
    title = "invalid input"


class InvalidModelError(InvalidInputError):
    title = "invalid ONNX model"


class ArtifactIntegrityError(InvalidInputError):
    title = "artifact integrity check failed"


class PayloadTooLargeError(InvalidInputError):
    title = "payload too large"


class RangeNotSatisfiableError(InvalidInputError):
    title = "range not satisfiable"


class NotFoundError(EdgefleetError):
    title = "not found"


class ConflictError(EdgefleetError):
    title = "conflict"


class PolicyError(EdgefleetError):
    title = "refused by policy"


class SignatureError(PolicyError):
    title = "signature verification failed"


class RollbackError(PolicyError):
    title = "rollback refused"


class AuthenticationError(EdgefleetError):
    title = "authentication required"


class PermissionDeniedError(EdgefleetError):
    title = "permission denied"


class UnavailableError(EdgefleetError):
    title = "service unavailable"


class StorageError(UnavailableError):
    title = "artifact storage failure"


def reason_of(exc: EdgefleetError) -> str:
    """The short, fixed reason a refusal is counted and logged under (every transport,
    gRPC's `edgefleet-reason` trailer, the metrics' `reason` label).

    The error's own `reason` field, else its type in kebab case (`InvalidInputError` is
    ``invalid-input``).
    """
    reason = exc.fields.get("reason")
    if isinstance(reason, str) and reason:
        return reason
    name = type(exc).__name__.removesuffix("Error")
    return "".join("-" + c.lower() if c.isupper() else c for c in name).lstrip("-")
