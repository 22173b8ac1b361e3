"""Liveness and readiness probes (no authentication: Kubernetes calls them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from control_plane.api.deps import ReadinessDep

router = APIRouter(tags=["health"])


# `async def`: it touches nothing, and answers on the event loop even while every worker
# thread waits on the database (a plain `def` would queue behind them for a thread).
@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ready: ReadinessDep) -> JSONResponse:
    checks = ready()
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503
    )
