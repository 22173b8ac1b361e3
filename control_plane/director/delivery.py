"""Getting a new signed assignment to its node at once: the port the director calls after
a pin commits (`deliver`) or after each committed chunk of a bulk pin (`deliver_many`),
and the fan-out over whatever transports run in this process.

Delivery is a shortcut, never the only path: every Hello a node sends is answered with
its current assignment (gRPC on the stream, MQTT on its ``desired`` topic), so a node
that is offline, connected to another replica, or missed the push gets it when it next
says Hello. That is why a failed delivery is logged, not raised, and why the pin that
caused it stands.

Not here: the transports. `control_plane.link.desired` adapts the gRPC hub and the MQTT
bridge to `AssignmentDelivery`; the gRPC server and the MQTT bridge attach themselves
to `Services.delivery` (a `FanOutDelivery`) while they run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol, TypeAlias

from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

__all__ = ["AssignmentDelivery", "Delivered", "FanOutDelivery"]

log = logging.getLogger(__name__)

Delivered: TypeAlias = dict[str, tuple[str, ...]]
"""Of a `deliver_many`: node id -> the transports that took its assignment (only the nodes
some transport took)."""


class AssignmentDelivery(Protocol):
    """One way to reach nodes now. Implementations must not raise for a node they cannot
    reach: they answer with no names, and the node gets the assignment at its next Hello.
    """

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        """Hand `signed` to the node; the names of the transports that took it."""
        ...

    def deliver_many(
        self, fleet: str, assignments: Sequence[tuple[str, SignedDirectorAssignment]]
    ) -> Delivered:
        """Hand each (node id, assignment) of one fleet over in one go (a bulk pin's chunk):
        one hop into the transport for the lot, not one per node."""
        ...


class FanOutDelivery:
    """Every attached transport gets every assignment; thread-safe.

    With nothing attached (no gRPC server or MQTT bridge runs in this process: the CLI,
    a REST-only replica, tests) it delivers nothing and says so in the log. One
    transport failing does not keep the others from trying.
    """

    def __init__(self, *deliveries: AssignmentDelivery) -> None:
        self._lock = threading.Lock()
        self._deliveries: list[AssignmentDelivery] = list(deliveries)

    def attach(self, delivery: AssignmentDelivery) -> None:
        with self._lock:
            self._deliveries.append(delivery)

    def detach(self, delivery: AssignmentDelivery) -> None:
        """Forget `delivery` (by identity); a no-op when it is not attached."""
        with self._lock:
            self._deliveries = [d for d in self._deliveries if d is not delivery]

    @property
    def attached(self) -> int:
        with self._lock:
            return len(self._deliveries)

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        with self._lock:
            deliveries = list(self._deliveries)
        taken: list[str] = []
        for delivery in deliveries:
            try:
                taken.extend(delivery.deliver(node_id, fleet, signed))
            except Exception:  # a bug in one transport must not cost the others
                log.exception(
                    "delivering an assignment to node %s failed in %s",
                    node_id,
                    type(delivery).__name__,
                )
        if not deliveries:
            log.info(
                "no transport running here; node %s gets its assignment at its next Hello",
                node_id,
                extra={"node_id": node_id},
            )
        elif not taken:
            log.info(
                "node %s is not reachable from here now; it gets its assignment at its next Hello",
                node_id,
                extra={"node_id": node_id},
            )
        return tuple(taken)

    def deliver_many(
        self, fleet: str, assignments: Sequence[tuple[str, SignedDirectorAssignment]]
    ) -> Delivered:
        with self._lock:
            deliveries = list(self._deliveries)
        taken: Delivered = {}
        for delivery in deliveries:
            try:
                got = delivery.deliver_many(fleet, assignments)
            except Exception:  # a bug in one transport must not cost the others
                log.exception(
                    "delivering %d assignments of fleet %s failed in %s",
                    len(assignments),
                    fleet,
                    type(delivery).__name__,
                )
                continue
            for node_id, via in got.items():
                taken[node_id] = taken.get(node_id, ()) + via
        missed = len({node_id for node_id, _ in assignments} - taken.keys())
        if not deliveries:
            log.info(
                "no transport running here; %d nodes of fleet %s get their assignments at "
                "their next Hello",
                len(assignments),
                fleet,
            )
        elif missed:
            log.info(
                "%d of %d nodes of fleet %s are not reachable from here now; they get their "
                "assignments at their next Hello",
                missed,
                len(assignments),
                fleet,
            )
        return taken
