"""The node's NodeEnvelopes, read back as the SDK reads them."""

from __future__ import annotations

from device_sdk.pacing import SkipPolicy, SourceConfig
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.timesync import ClockEstimator
from edge_node.devices.config import CameraSettings
from edge_node.devices.replies import config_message, time_sync_message


def test_a_config_reads_back_as_the_sdk_applies_it() -> None:
    settings = CameraSettings(target_fps=12.5, skip_policy="even", send_frames=True)
    payload = config_message(settings, 1_767_225_600_000, message_id="c1", sent_at_us=5)
    envelope = device_pb2.NodeEnvelope.FromString(payload)
    assert (envelope.protocol_version, envelope.message_id) == (1, "c1")
    applied = SourceConfig.from_proto(envelope.config)
    assert applied == SourceConfig(
        version=1_767_225_600_000, target_fps=12.5, skip_policy=SkipPolicy.EVEN, send_frames=True
    )
    default = device_pb2.NodeEnvelope.FromString(
        config_message(CameraSettings(), 1, message_id="c2", sent_at_us=5)
    )
    assert default.config.skip_policy == device_pb2.SKIP_POLICY_UNSPECIFIED


def test_a_time_sync_gives_the_sdk_the_offset() -> None:
    # The camera is 2 s ahead; 10 ms each way; the node holds the heartbeat 1 ms.
    node_received, node_sent = 1_000_010_000, 1_000_011_000
    device_sent, device_received = 1_002_000_000, 1_002_021_000
    payload = time_sync_message(
        "h1", device_sent, node_received, message_id="t1", sent_at_us=node_sent
    )
    envelope = device_pb2.NodeEnvelope.FromString(payload)
    sync = envelope.time_sync
    assert sync.heartbeat_id == "h1"
    estimator = ClockEstimator()
    assert estimator.add(
        sync.device_sent_at.ToMicroseconds(),
        sync.node_received_at.ToMicroseconds(),
        envelope.sent_at.ToMicroseconds(),
        device_received,
    )
    estimate = estimator.estimate()
    assert (estimate.offset_us, estimate.error_us) == (2_000_000, 10_000)
