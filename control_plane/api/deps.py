"""FastAPI dependencies: the services container, the caller and the request context."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from control_plane.access.roles import Principal
from control_plane.access.service import RequestContext
from control_plane.services import Services


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(request: Request, services: ServicesDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else None
    return services.access.authenticate(bearer)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_context(request: Request, principal: PrincipalDep) -> RequestContext:
    return RequestContext(principal=principal, request_id=request.state.request_id)


ContextDep = Annotated[RequestContext, Depends(get_context)]
