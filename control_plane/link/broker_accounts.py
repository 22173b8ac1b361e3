"""The `BrokerAccounts` port: who may log in to the MQTT broker, managed by the control plane.

What it is for: enrollment over MQTT creates a node's broker login (username and client
id = node id, a role that reaches only its own topics), revocation removes it and cuts
the node off, and a periodic reconcile (`plan_reconcile`, pure) brings the broker back
in line with the database. Two adapters: `mqtt_dynsec.DynsecAccounts` (Mosquitto 2's
dynamic security plugin, over MQTT) and `FileExportAccounts` here, for brokers fed by
`edgefleet mqtt acl` (the operator renders and reloads; nothing happens at enrollment).
What it is not: the password files (`mqtt_acl`) or the bridge (`mqtt_bridge`). Pure:
no broker client is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Protocol

from control_plane.errors import UnavailableError

__all__ = [
    "MANAGED_TEXTNAME",
    "BrokerAccounts",
    "BrokerAccountsUnavailableError",
    "BrokerLogin",
    "FileExportAccounts",
    "ReconcilePlan",
    "node_role",
    "plan_reconcile",
]

# The mark on every broker login the control plane made: reconcile touches no other.
MANAGED_TEXTNAME: Final = "edgefleet node"
# An unknown managed login younger than this may be an enrollment still committing.
ORPHAN_GRACE: Final = timedelta(minutes=10)


class BrokerAccountsUnavailableError(UnavailableError):
    title = "MQTT broker accounts unavailable"


def node_role(node_id: str) -> str:
    """The broker role holding one node's ACLs."""
    return f"edgefleet-node-{node_id}"


@dataclass(frozen=True, slots=True)
class BrokerLogin:
    """A managed login as the broker reports it."""

    node_id: str
    fleet: str | None = None
    clientid: str | None = None
    roles: tuple[str, ...] = ()
    disabled: bool = False
    created_at: datetime | None = None

    @property
    def bound(self) -> bool:
        """Whether the login is usable only under its own client id, with its role."""
        return (
            self.clientid == self.node_id
            and node_role(self.node_id) in self.roles
            and not self.disabled
        )


class BrokerAccounts(Protocol):
    """One broker's logins. Every method is idempotent; a broker that cannot be reached
    (after the adapter's own bounded retries) raises `BrokerAccountsUnavailableError`."""

    @property
    def manages_logins(self) -> bool:
        """False where the broker is fed by files an operator renders (nothing to call)."""
        ...

    def ensure_control_plane(self) -> bool:
        """The control plane's own account may read the shared uplink and write the
        downlink; True when something had to change (the broker then drops its
        connections, which reconnect)."""
        ...

    def add_node(self, node_id: str, fleet: str, password: str, *, now: datetime) -> None:
        """A login for `node_id` bound to client id `node_id`, reaching only its topics."""
        ...

    def remove_node(self, node_id: str) -> None:
        """No login for `node_id` any more; a connected session is dropped at once."""
        ...

    def bind_node(self, node_id: str, fleet: str) -> None:
        """Repair an existing login: its client id binding, role and enabled state."""
        ...

    def logins(self) -> Mapping[str, BrokerLogin]:
        """Every managed login (marked `MANAGED_TEXTNAME`), by node id."""
        ...

    def close(self) -> None: ...


class FileExportAccounts:
    """The broker reads `edgefleet mqtt acl`'s files: the database is the only state,
    and the operator renders and reloads. Nothing to do at enrollment or revocation."""

    manages_logins = False

    def ensure_control_plane(self) -> bool:
        return False

    def add_node(self, node_id: str, fleet: str, password: str, *, now: datetime) -> None:
        return None

    def remove_node(self, node_id: str) -> None:
        return None

    def bind_node(self, node_id: str, fleet: str) -> None:
        return None

    def logins(self) -> Mapping[str, BrokerLogin]:
        return {}

    def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    """What a reconcile pass does: remove, repair, and report (it cannot restore)."""

    # Managed logins of revoked nodes, and of nodes the database does not know.
    remove: tuple[str, ...] = ()
    # Logins of enrolled nodes not bound to their client id or role (node id -> fleet).
    repair: Mapping[str, str] = field(default_factory=dict)
    # Enrolled, unrevoked MQTT nodes without a login: the broker lost them. Only the
    # password's hash is stored, which the plugin cannot take: re-enroll, or restore the
    # broker's state from a backup.
    missing: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.remove or self.repair or self.missing)


def plan_reconcile(
    enrolled: Mapping[str, str],
    revoked: Set[str],
    present: Mapping[str, BrokerLogin],
    now: datetime,
    *,
    orphan_grace: timedelta = ORPHAN_GRACE,
) -> ReconcilePlan:
    """Compare the database (`enrolled`: node id -> fleet of unrevoked MQTT nodes;
    `revoked`) with the broker's managed logins.

    A login the database does not know is removed only once older than `orphan_grace`
    (or of unknown age): enrollment creates the login before its transaction commits.
    """
    remove: list[str] = []
    repair: dict[str, str] = {}
    for node_id, login in sorted(present.items()):
        if node_id in revoked:
            remove.append(node_id)
        elif node_id in enrolled:
            if not login.bound:
                repair[node_id] = enrolled[node_id]
        elif login.created_at is None or now - login.created_at >= orphan_grace:
            remove.append(node_id)
    missing = tuple(sorted(set(enrolled) - set(present)))
    return ReconcilePlan(remove=tuple(remove), repair=repair, missing=missing)
