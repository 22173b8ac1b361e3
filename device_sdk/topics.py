"""The MQTT topics of one camera (the device contract's transport; DESIGN §1).

    edgefleet/dev/{device_id}/results     device -> node  DeviceEnvelope(frame_result)  QoS 1
    edgefleet/dev/{device_id}/heartbeat   device -> node  DeviceEnvelope(heartbeat)     QoS 1
    edgefleet/dev/{device_id}/frame       device -> node  DeviceEnvelope(frame)         QoS 1
    edgefleet/dev/{device_id}/config      node -> device  NodeEnvelope(config), retained
    edgefleet/dev/{device_id}/time        node -> device  NodeEnvelope(time_sync)

A device id is one topic level: no ``/``, ``+``, ``#`` or NUL.
"""

from __future__ import annotations

__all__ = ["CONFIG", "FRAME", "HEARTBEAT", "RESULTS", "ROOT", "TIME", "device_topic"]

ROOT = "edgefleet/dev"
RESULTS, HEARTBEAT, FRAME, CONFIG, TIME = "results", "heartbeat", "frame", "config", "time"


def device_topic(device_id: str, leaf: str, *, root: str = ROOT) -> str:
    if not device_id or any(c in device_id for c in "/+#\0"):
        raise ValueError(f"device id {device_id!r} is not one MQTT topic level")
    return f"{root}/{device_id}/{leaf}"
