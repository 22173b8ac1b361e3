"""The transports behind the director's `AssignmentDelivery` port: the gRPC hub and the
MQTT bridge, each pushing a freshly signed assignment to the node it is for.

`HubDelivery` queues a `DesiredState` on the node's Sync stream when the node is
connected to this replica (and only then). `MqttDelivery` rings the node's retained
``desired`` doorbell with the assignment, so the broker hands it over now or when the
node next subscribes. Neither raises for a node it cannot reach; the node gets its
current assignment at its next Hello anyway. `deliver_many` (a bulk pin's chunk) is one
hop into the gRPC event loop for the whole chunk, or every doorbell published at once
and their PUBACKs awaited under one deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from control_plane.director.delivery import Delivered
from control_plane.errors import UnavailableError
from control_plane.link import wire
from control_plane.link.hub import LinkHub
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment

if TYPE_CHECKING:
    from control_plane.link.mqtt_bridge import MqttBridge

__all__ = ["HubDelivery", "MqttDelivery"]

log = logging.getLogger(__name__)

# How long a pin waits for the broker to confirm the doorbell; unconfirmed, it stays
# queued in the bridge's client and goes out when the broker is back.
MQTT_CONFIRM_S: Final = 2.0
# A chunk of doorbells: this long for the lot, plus a little per message (a broker on
# loopback confirms about 10,000 a second).
MQTT_CONFIRM_PER_MESSAGE_S: Final = 0.002


class HubDelivery:
    """Over gRPC: onto the Sync stream of a node connected to this replica."""

    def __init__(self, hub: LinkHub) -> None:
        self._hub = hub

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        return ("grpc",) if self._hub.send(node_id, wire.desired(signed)) else ()

    def deliver_many(
        self, fleet: str, assignments: Sequence[tuple[str, SignedDirectorAssignment]]
    ) -> Delivered:
        queued = self._hub.send_many(
            [(node_id, wire.desired(signed)) for node_id, signed in assignments]
        )
        return {
            node_id: ("grpc",) for (node_id, _), ok in zip(assignments, queued, strict=True) if ok
        }


class MqttDelivery:
    """Over MQTT: the node's retained ``desired`` doorbell, carrying the assignment.

    Rung for every node, whichever transport it uses now: a gRPC node that moves to
    MQTT then finds its assignment waiting.
    """

    def __init__(self, bridge: MqttBridge, *, confirm_s: float = MQTT_CONFIRM_S) -> None:
        self._bridge = bridge
        self._confirm_s = confirm_s

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        try:
            self._bridge.publish_desired(fleet, node_id, signed, timeout_s=self._confirm_s)
        except UnavailableError as exc:
            log.warning(
                "the doorbell of node %s is not confirmed by the broker (%s); it goes out "
                "when the bridge reconnects",
                node_id,
                exc.message,
                extra={"node_id": node_id},
            )
            return ()
        return ("mqtt",)

    def deliver_many(
        self, fleet: str, assignments: Sequence[tuple[str, SignedDirectorAssignment]]
    ) -> Delivered:
        timeout_s = self._confirm_s + MQTT_CONFIRM_PER_MESSAGE_S * len(assignments)
        try:
            confirmed = self._bridge.publish_desired_many(fleet, assignments, timeout_s=timeout_s)
        except UnavailableError as exc:
            log.warning(
                "%d doorbells of fleet %s were not published (%s); the nodes get their "
                "assignments at their next Hello",
                len(assignments),
                fleet,
                exc.message,
            )
            return {}
        missing = len(assignments) - sum(confirmed)
        if missing:
            log.warning(
                "%d of %d doorbells of fleet %s are not confirmed by the broker within "
                "%.1f s; they go out when the bridge reconnects",
                missing,
                len(assignments),
                fleet,
                timeout_s,
            )
        return {
            node_id: ("mqtt",)
            for (node_id, _), ok in zip(assignments, confirmed, strict=True)
            if ok
        }
