"""ASGI middleware: request ids with the access log, and request body limits (enforced
while streaming). Not for authentication or problem documents (see api.problems).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api.problems import problem
from control_plane.errors import PayloadTooLargeError
from control_plane.logs import current_request_id

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
access_log = logging.getLogger("control_plane.access")


class RequestIdMiddleware:
    """Takes a sane `X-Request-ID` from the caller or makes one; echoes it back, puts it on
    every log line of the request, and writes one access line when the request ends.

    `monotonic` (seconds) times the request; tests pass a fake one.
    """

    def __init__(self, app: ASGIApp, monotonic: Callable[[], float] = time.perf_counter) -> None:
        self.app = app
        self.monotonic = monotonic

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500  # what the client sees if the app fails before it answers
        started = self.monotonic()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers") or [])
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            client = scope.get("client")
            access_log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round((self.monotonic() - started) * 1000, 1),
                    "client": f"{client[0]}:{client[1]}" if client else None,
                },
            )
            current_request_id.reset(token)


class BodyLimitMiddleware:
    """Refuses bodies over a limit: up front from Content-Length, else while counting.

    `large` lists (method, path regex, limit) for the few routes that stream artifacts.
    """

    def __init__(
        self, app: ASGIApp, *, default_limit: int, large: Sequence[tuple[str, str, int]] = ()
    ) -> None:
        self.app = app
        self.default_limit = default_limit
        self.large = [(m, re.compile(p), lim) for m, p, lim in large]

    def limit_for(self, method: str, path: str) -> int:
        for m, pattern, limit in self.large:
            if m == method and pattern.fullmatch(path):
                return limit
        return self.default_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope["path"])
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            response = problem(
                413,
                "payload too large",
                f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes",
                type_="https://edgefleet.dev/problems/payload-too-large",
                request=Request(scope),
                extra={"limit": limit},
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLargeError(
                        f"request body exceeds the limit of {limit} bytes", limit=limit
                    )
            return message

        await self.app(scope, counting_receive, send)
