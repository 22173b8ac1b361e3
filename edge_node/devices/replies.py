"""The node's messages to a camera (device.proto's NodeEnvelope): its `DeviceConfig`
(published retained on ``.../config``) and the `TimeSync` answer to a heartbeat (on
``.../time``). Pure: they are built from the values, ids and times the caller passes.

Why the config version is a time: DeviceConfig.version must rise whenever the node's
settings change, and the camera ignores one that does not. The gateway stamps the
milliseconds of the node's clock when it starts (ADR 0041), so a changed node.yaml
takes effect at the next start without anyone counting versions; a camera that reports a
higher version (the node's clock went back) gets one above its own.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from edge_node.devices.config import CameraSettings

__all__ = ["PROTOCOL_VERSION", "config_message", "time_sync_message"]

PROTOCOL_VERSION = 1
_SKIP = {
    "default": device_pb2.SKIP_POLICY_UNSPECIFIED,
    "latest_wins": device_pb2.SKIP_POLICY_LATEST_WINS,
    "even": device_pb2.SKIP_POLICY_EVEN,
}


def _stamp_us(unix_us: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMicroseconds(unix_us)
    return stamp


def config_message(
    settings: CameraSettings, version: int, *, message_id: str, sent_at_us: int
) -> bytes:
    config = device_pb2.DeviceConfig(
        version=version,
        target_fps=settings.target_fps,
        skip_policy=_SKIP[settings.skip_policy],
        send_frames=settings.send_frames,
    )
    envelope = device_pb2.NodeEnvelope(
        protocol_version=PROTOCOL_VERSION,
        message_id=message_id,
        sent_at=_stamp_us(sent_at_us),
        config=config,
    )
    return envelope.SerializeToString()


def time_sync_message(
    heartbeat_id: str,
    device_sent_at_us: int,
    node_received_at_us: int,
    *,
    message_id: str,
    sent_at_us: int,
) -> bytes:
    """`sent_at_us` is the node's clock as the answer leaves: stamp it last."""
    envelope = device_pb2.NodeEnvelope(
        protocol_version=PROTOCOL_VERSION,
        message_id=message_id,
        sent_at=_stamp_us(sent_at_us),
        time_sync=device_pb2.TimeSync(
            heartbeat_id=heartbeat_id,
            device_sent_at=_stamp_us(device_sent_at_us),
            node_received_at=_stamp_us(node_received_at_us),
        ),
    )
    return envelope.SerializeToString()
