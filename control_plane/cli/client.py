"""A small typed HTTP client for the control plane's REST API, used by the CLI.

Problem documents become `ApiError`s carrying status and detail; connection
failures become `ApiUnavailableError`. Nothing here prints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from control_plane.errors import EdgefleetError, UnavailableError

CHUNK = 1 << 20


class ApiError(EdgefleetError):
    """The server answered with an error (RFC 9457 problem document)."""

    def __init__(self, status: int, title: str, detail: str, problem: dict[str, Any]) -> None:
        super().__init__(f"{title}: {detail}" if detail else title, status=status)
        self.status = status
        self.title = title
        self.detail = detail
        self.problem = problem


class ApiUnavailableError(UnavailableError):
    pass


def file_sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    length = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            length += len(chunk)
    return digest.hexdigest(), length


class ApiClient:
    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": "edgefleet-cli/0.1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server = server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=httpx.Timeout(timeout, read=max(timeout, 300.0)),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiUnavailableError(
                f"cannot reach the control plane at {self.server}: {exc}", server=self.server
            ) from exc
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    # -- endpoints

    def create_fleet(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json("POST", "/v1/fleets", json={"name": name})
        return result

    def upload_root(self, fleet: str, root: dict[str, Any], targets: dict[str, Any]) -> Any:
        return self.json("PUT", f"/v1/fleets/{fleet}/root", json={"root": root, "targets": targets})

    def rotate_root(self, fleet: str, root: dict[str, Any], targets: dict[str, Any]) -> Any:
        return self.json(
            "POST", f"/v1/fleets/{fleet}/root", json={"root": root, "targets": targets}
        )

    def new_online_keys(self, fleet: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json("POST", f"/v1/fleets/{fleet}/online-keys")
        return result

    def metadata(self, fleet: str, filename: str) -> bytes:
        return self.request("GET", f"/v1/fleets/{fleet}/tuf/metadata/{filename}").content

    def artifact_exists(self, sha256: str) -> bool:
        try:
            self.request("HEAD", f"/v1/artifacts/{sha256}")
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def upload_file(
        self,
        path: Path,
        sha256: str,
        length: int,
        progress: Callable[[int], None] | None = None,
    ) -> Any:
        def body() -> Iterator[bytes]:
            with path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    if progress is not None:
                        progress(len(chunk))
                    yield chunk

        return self.json(
            "PUT",
            f"/v1/artifacts/{sha256}",
            content=body(),
            headers={"Content-Length": str(length), "Content-Type": "application/octet-stream"},
        )

    def upload_bytes(self, data: bytes) -> Any:
        sha256 = hashlib.sha256(data).hexdigest()
        return self.json(
            "PUT",
            f"/v1/artifacts/{sha256}",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )

    def push_targets(self, fleet: str, targets: bytes) -> Any:
        return self.json(
            "POST",
            f"/v1/fleets/{fleet}/targets",
            content=targets,
            headers={"Content-Type": "application/json"},
        )


def _api_error(response: httpx.Response) -> ApiError:
    try:
        problem = response.json()
        if not isinstance(problem, dict):
            raise ValueError
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:500]}
    return ApiError(
        response.status_code,
        str(problem.get("title") or response.reason_phrase),
        str(problem.get("detail") or ""),
        problem,
    )
