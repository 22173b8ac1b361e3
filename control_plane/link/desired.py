"""The transports behind the director's `AssignmentDelivery` port: the gRPC hub and the
MQTT bridge, each pushing a freshly signed assignment to the node it is for.

`HubDelivery` queues a `DesiredState` on the node's Sync stream when the node is
connected to this replica (and only then). `MqttDelivery` rings the node's retained
``desired`` doorbell with the assignment, so the broker hands it over now or when the
node next subscribes. Neither raises for a node it cannot reach; the node gets its
current assignment at its next Hello anyway.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

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


class HubDelivery:
    """Over gRPC: onto the Sync stream of a node connected to this replica."""

    def __init__(self, hub: LinkHub) -> None:
        self._hub = hub

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        return ("grpc",) if self._hub.send(node_id, wire.desired(signed)) else ()


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
