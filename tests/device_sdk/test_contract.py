"""The device contract v1 (device_sdk/proto): messages round-trip, newer writers' fields
and body cases are tolerated, and it lives beside the fleet protos in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from protos import generate

ROOT = Path(__file__).resolve().parents[2]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _stamp(iso: str) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.fromisoformat(iso))
    return stamp


def _frame_result() -> device_pb2.DeviceEnvelope:
    plate = device_pb2.Detection(
        class_name="vehicle",
        score=0.875,
        bbox=device_pb2.BoundingBox(x_min=0.25, y_min=0.5, x_max=0.75, y_max=1.0),
        track_id=2**40 + 3,
        attributes={"plate_text": "AB123CD", "colour": "red"},
    )
    return device_pb2.DeviceEnvelope(
        protocol_version=1,
        message_id="0191f3a2-7c4e-7000-8000-000000000001",
        device_id="cam-gate-a",
        boot_id="b-7",
        sent_at=_stamp("2026-03-01T12:00:00.250+00:00"),
        frame_result=device_pb2.FrameResult(
            frame_seq=41,
            captured_at=_stamp("2026-03-01T12:00:00.200+00:00"),
            detections=[plate],
            model="plates",
            model_version="2.1.0",
            width=1920,
            height=1080,
        ),
    )


def test_package_and_where_the_contract_lives() -> None:
    assert device_pb2.DESCRIPTOR.package == "edgefleet.device.v1"
    # Inside device_sdk, so that the SDK's own wheel ships it (ADR 0022).
    assert device_pb2.DESCRIPTOR.name == "device_sdk/proto/edgefleet/device/v1/device.proto"


def test_the_generator_covers_the_device_contract() -> None:
    """`make protos` writes it, and the up-to-date check (tests/protos) compares it."""
    assert Path("device_sdk/proto/edgefleet/device/v1/device.proto") in generate.find_protos()
    assert not [p for p in generate.stale_files() if "device_sdk/" in p]


def test_a_frame_result_round_trips() -> None:
    original = _frame_result()
    parsed = device_pb2.DeviceEnvelope.FromString(original.SerializeToString())
    assert parsed == original
    assert parsed.WhichOneof("body") == "frame_result"
    detection = parsed.frame_result.detections[0]
    assert detection.attributes["plate_text"] == "AB123CD"
    assert detection.bbox.x_max == 0.75
    assert parsed.frame_result.captured_at.ToDatetime(tzinfo=UTC) == datetime(
        2026, 3, 1, 12, 0, 0, 200_000, tzinfo=UTC
    )


def test_every_device_message_travels_with_an_idempotency_id() -> None:
    envelope = device_pb2.DeviceEnvelope.DESCRIPTOR
    assert {"protocol_version", "message_id", "device_id", "boot_id"} <= set(
        envelope.fields_by_name
    )
    bodies = {
        f.name: f.message_type.name if f.message_type else None
        for f in envelope.oneofs_by_name["body"].fields
    }
    assert bodies == {"frame_result": "FrameResult", "heartbeat": "Heartbeat", "frame": "Frame"}
    node = device_pb2.NodeEnvelope.DESCRIPTOR
    assert {f.name for f in node.oneofs_by_name["body"].fields} == {"config", "time_sync"}


def test_heartbeat_and_config_carry_what_the_node_and_camera_need() -> None:
    beat = device_pb2.DeviceEnvelope(
        protocol_version=1,
        message_id="m-2",
        heartbeat=device_pb2.Heartbeat(
            clock=device_pb2.ClockEstimate(offset_us=-1_250, error_us=400, samples=8),
            config_version=3,
            frames_captured=10,
            frames_skipped=2,
        ),
    )
    parsed = device_pb2.DeviceEnvelope.FromString(beat.SerializeToString())
    assert parsed.heartbeat.clock.offset_us == -1_250  # sint64: a camera behind its node
    config = device_pb2.NodeEnvelope(
        protocol_version=1,
        message_id="n-1",
        config=device_pb2.DeviceConfig(
            version=4,
            target_fps=7.5,
            skip_policy=device_pb2.SKIP_POLICY_EVEN,
            send_frames=True,
        ),
    )
    got = device_pb2.NodeEnvelope.FromString(config.SerializeToString()).config
    assert (got.version, got.target_fps, got.skip_policy, got.send_frames) == (
        4,
        7.5,
        device_pb2.SKIP_POLICY_EVEN,
        True,
    )
    # A config that names no policy means the camera's default, never "skip nothing".
    assert device_pb2.DeviceConfig().skip_policy == device_pb2.SKIP_POLICY_UNSPECIFIED


def test_fields_and_body_cases_from_a_newer_writer_are_tolerated_and_kept() -> None:
    newer_field = _field(9, 2, _varint(5) + b"hello")  # a future envelope field
    parsed = device_pb2.DeviceEnvelope.FromString(_frame_result().SerializeToString() + newer_field)
    assert parsed.frame_result.frame_seq == 41
    assert parsed.SerializeToString().endswith(newer_field)  # passed on, not dropped
    # A body case this reader does not know: the envelope still parses, with no body.
    future_body = _field(2, 2, _varint(3) + b"m-3") + _field(20, 2, _varint(0))
    unknown = device_pb2.DeviceEnvelope.FromString(future_body)
    assert unknown.message_id == "m-3"
    assert unknown.WhichOneof("body") is None


@pytest.mark.parametrize("device_first", [True, False])
def test_the_device_and_fleet_contracts_load_in_one_process(device_first: bool) -> None:
    device = "from device_sdk.proto.edgefleet.device.v1 import device_pb2"
    fleet = (
        "from protos.edgefleet.fleet.v1 import director_pb2, link_pb2, link_pb2_grpc, registry_pb2"
    )
    code = "\n".join([device, fleet] if device_first else [fleet, device])
    code += "\nassert device_pb2.DeviceEnvelope(message_id='x').message_id == 'x'"
    code += "\nassert link_pb2.DESCRIPTOR.package != device_pb2.DESCRIPTOR.package"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=60)
