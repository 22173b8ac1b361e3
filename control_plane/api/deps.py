"""FastAPI dependencies: one ``Annotated`` alias per service, the caller and the context.

A route names the services it uses (``RegistryDep``, ``HealthQueriesDep`` ...), never the
whole container; not for logic: each getter only picks its service off the app's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from control_plane.access.roles import Principal
from control_plane.access.service import AccessService, RequestContext
from control_plane.artifacts.base import ArtifactStore
from control_plane.clock import Clock
from control_plane.director.service import DirectorService
from control_plane.events.store import EventStore
from control_plane.health.clearing import AlertClearing
from control_plane.health.queries import HealthQueries
from control_plane.identity.ca import CertificateAuthority
from control_plane.link.node_inbox import NodeInbox
from control_plane.nodes.inventory import NodeInventory
from control_plane.nodes.results import NodeResults
from control_plane.nodes.tokens import BootstrapTokens
from control_plane.registry.service import RegistryService
from control_plane.rollouts.service import RolloutService
from control_plane.services import ServiceConfig, Services


# The getters only pick a service off the app, so they are `async def`: FastAPI runs a
# plain `def` dependency in its threadpool, a hop per request for an attribute read.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


# The whole container: for the getters below only; no route takes it.
ServicesDep = Annotated[Services, Depends(get_services)]


async def get_access(services: ServicesDep) -> AccessService:
    return services.access


async def get_alert_clearing(services: ServicesDep) -> AlertClearing:
    return services.health.alerts


async def get_artifact_store(services: ServicesDep) -> ArtifactStore:
    return services.store


async def get_certificate_authority(services: ServicesDep) -> CertificateAuthority:
    return services.ca


async def get_clock(services: ServicesDep) -> Clock:
    return services.clock


async def get_director(services: ServicesDep) -> DirectorService:
    return services.director


async def get_event_store(services: ServicesDep) -> EventStore:
    return services.events


async def get_health_queries(services: ServicesDep) -> HealthQueries:
    return services.health.queries


async def get_node_inventory(services: ServicesDep) -> NodeInventory:
    return services.nodes.inventory


async def get_node_results(services: ServicesDep) -> NodeResults:
    return services.nodes.results


async def get_node_tokens(services: ServicesDep) -> BootstrapTokens:
    return services.nodes.tokens


async def get_readiness(services: ServicesDep) -> Callable[[], dict[str, str]]:
    return services.ready


async def get_registry(services: ServicesDep) -> RegistryService:
    return services.registry


async def get_rest_inbox(request: Request) -> NodeInbox:
    """The REST transport's node inbox (the enrollment route), made with the app."""
    inbox: NodeInbox = request.app.state.rest_inbox
    return inbox


async def get_rollouts(services: ServicesDep) -> RolloutService:
    return services.rollouts


async def get_service_config(services: ServicesDep) -> ServiceConfig:
    return services.config


AccessDep = Annotated[AccessService, Depends(get_access)]
AlertClearingDep = Annotated[AlertClearing, Depends(get_alert_clearing)]
ArtifactStoreDep = Annotated[ArtifactStore, Depends(get_artifact_store)]
CertificateAuthorityDep = Annotated[CertificateAuthority, Depends(get_certificate_authority)]
ClockDep = Annotated[Clock, Depends(get_clock)]
DirectorDep = Annotated[DirectorService, Depends(get_director)]
EventStoreDep = Annotated[EventStore, Depends(get_event_store)]
HealthQueriesDep = Annotated[HealthQueries, Depends(get_health_queries)]
NodeInventoryDep = Annotated[NodeInventory, Depends(get_node_inventory)]
NodeResultsDep = Annotated[NodeResults, Depends(get_node_results)]
NodeTokensDep = Annotated[BootstrapTokens, Depends(get_node_tokens)]
ReadinessDep = Annotated[Callable[[], dict[str, str]], Depends(get_readiness)]
RegistryDep = Annotated[RegistryService, Depends(get_registry)]
RestInboxDep = Annotated[NodeInbox, Depends(get_rest_inbox)]
RolloutsDep = Annotated[RolloutService, Depends(get_rollouts)]
ServiceConfigDep = Annotated[ServiceConfig, Depends(get_service_config)]


# Declares the bearer scheme in the OpenAPI document (securitySchemes, and `security` on
# every route that takes a caller); it only reads the header: `authenticate` decides, so a
# missing or wrong token is the API's own 401 problem, never FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, description="An API token (`edgefleet token create`).")


def get_principal(
    access: AccessDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Principal:
    bearer = credentials.credentials.strip() if credentials is not None else None
    return access.authenticate(bearer)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_context(request: Request, principal: PrincipalDep) -> RequestContext:
    return RequestContext(principal=principal, request_id=request.state.request_id)


ContextDep = Annotated[RequestContext, Depends(get_context)]
