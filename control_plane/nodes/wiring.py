"""Builds the node role services over one store, one CA, one clock and one refusal count.

For the composition root (`control_plane.services`) and tests; adapters are handed the
single role they use, never this bundle.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import Clock
from control_plane.identity.ca import CertificateAuthority
from control_plane.link.broker_accounts import BrokerAccounts, FileExportAccounts
from control_plane.nodes.authentication import NodeAuthentication
from control_plane.nodes.broker_logins import BrokerLogins
from control_plane.nodes.enrollment import Enrollments
from control_plane.nodes.inventory import NodeInventory
from control_plane.nodes.model import NodeConfig, NodeRefusals
from control_plane.nodes.presence import NodePresence
from control_plane.nodes.results import NodeResults
from control_plane.nodes.tokens import BootstrapTokens

__all__ = ["NodeServices", "build_node_services"]


@dataclass(frozen=True, slots=True)
class NodeServices:
    tokens: BootstrapTokens
    enrollment: Enrollments
    authentication: NodeAuthentication
    presence: NodePresence
    inventory: NodeInventory
    # The sampled inference results nodes sent (what their models saw).
    results: NodeResults
    # Refused enrollments and node calls of every role (`edgefleet_node_refusals_total`).
    refusals: NodeRefusals
    # The broker's node logins against the database (a no-op over the file export).
    broker_logins: BrokerLogins


def build_node_services(
    sessions: sessionmaker[Session],
    ca: CertificateAuthority,
    clock: Clock,
    config: NodeConfig | None = None,
    *,
    accounts: BrokerAccounts | None = None,
) -> NodeServices:
    """`accounts`: the broker's logins (default: the file export, nothing to call)."""
    config = config or NodeConfig()
    accounts = accounts or FileExportAccounts()
    refusals = NodeRefusals()
    presence = NodePresence(sessions, clock, refusals, config)
    return NodeServices(
        tokens=BootstrapTokens(sessions, clock, config),
        enrollment=Enrollments(sessions, ca, clock, refusals, config, accounts),
        authentication=NodeAuthentication(sessions, ca, clock, refusals),
        presence=presence,
        inventory=NodeInventory(sessions, clock, presence, accounts),
        results=NodeResults(sessions),
        refusals=refusals,
        broker_logins=BrokerLogins(sessions, accounts, clock),
    )
