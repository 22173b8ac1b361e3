"""FastAPI dependencies: the services container, the caller and the request context."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from control_plane.access.roles import Principal
from control_plane.access.service import RequestContext
from control_plane.clock import Clock
from control_plane.identity.ca import CertificateAuthority
from control_plane.link.node_inbox import NodeInbox
from control_plane.nodes.inventory import NodeInventory
from control_plane.nodes.tokens import BootstrapTokens
from control_plane.services import ServiceConfig, Services


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


# ------------------------------------------------------------------ node routes
# Each node route names the one service it uses, never the whole `Services`.


def get_node_tokens(services: ServicesDep) -> BootstrapTokens:
    return services.nodes.tokens


NodeTokensDep = Annotated[BootstrapTokens, Depends(get_node_tokens)]


def get_node_inventory(services: ServicesDep) -> NodeInventory:
    return services.nodes.inventory


NodeInventoryDep = Annotated[NodeInventory, Depends(get_node_inventory)]


def get_rest_inbox(request: Request, services: ServicesDep) -> NodeInbox:
    """The node inbox of the REST transport (the enrollment route), one per app."""
    inbox: NodeInbox | None = getattr(request.app.state, "rest_inbox", None)
    if inbox is None:
        # Made on first use, not at app creation: tests build apps they never call.
        # Two racing first requests make two; the loser's is simply dropped.
        inbox = services.node_inbox("rest", auth_cache_s=0.0)
        request.app.state.rest_inbox = inbox
    return inbox


RestInboxDep = Annotated[NodeInbox, Depends(get_rest_inbox)]


def get_certificate_authority(services: ServicesDep) -> CertificateAuthority:
    return services.ca


CertificateAuthorityDep = Annotated[CertificateAuthority, Depends(get_certificate_authority)]


def get_clock(services: ServicesDep) -> Clock:
    return services.clock


ClockDep = Annotated[Clock, Depends(get_clock)]


def get_service_config(services: ServicesDep) -> ServiceConfig:
    return services.config


ServiceConfigDep = Annotated[ServiceConfig, Depends(get_service_config)]
