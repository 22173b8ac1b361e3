"""`DeviceIntake` alone: a camera's envelopes (built as device_sdk builds them) in,
observations, TimeSync answers and clock offsets out, every bad input counted by reason
and none of them raising."""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from edge_node.aggregation.model import Provenance
from edge_node.devices.config import CameraSettings, DeviceGatewayConfig, IntakeLimits
from edge_node.devices.intake import REASONS, ClockOffset, DeviceIntake, TimeSyncDue

NOW = 1_767_225_600.0  # node clock, UNIX seconds
ROOT = "edgefleet/dev"


def stamp(unix_s: float) -> Timestamp:
    t = Timestamp()
    t.FromMicroseconds(round(unix_s * 1e6))
    return t


def envelope(device: str = "cam-a", message_id: str = "m1", **body: Any) -> bytes:
    return device_pb2.DeviceEnvelope(
        protocol_version=body.pop("protocol_version", 1),
        message_id=message_id,
        device_id=device,
        boot_id="boot-1",
        sent_at=stamp(body.pop("sent_at", NOW)),
        **body,
    ).SerializeToString()


def result(
    captured_at: float = NOW, *detections: device_pb2.Detection, seq: int = 1
) -> device_pb2.FrameResult:
    return device_pb2.FrameResult(
        frame_seq=seq,
        captured_at=stamp(captured_at),
        detections=list(detections),
        model="plates",
        model_version="2.1.0",
    )


def detection(
    x_min: float = 0.1, y_min: float = 0.2, x_max: float = 0.3, y_max: float = 0.4, **kw: Any
) -> device_pb2.Detection:
    return device_pb2.Detection(
        class_name=kw.pop("class_name", "vehicle"),
        score=kw.pop("score", 0.9),
        bbox=device_pb2.BoundingBox(x_min=x_min, y_min=y_min, x_max=x_max, y_max=y_max),
        **kw,
    )


def heartbeat(
    offset_us: int = 0, samples: int = 0, config_version: int = 0
) -> device_pb2.Heartbeat:
    return device_pb2.Heartbeat(
        clock=device_pb2.ClockEstimate(offset_us=offset_us, error_us=800, samples=samples),
        firmware_version="fw-3.2.0",
        config_version=config_version,
    )


def make_intake(**limits: Any) -> DeviceIntake:
    config = DeviceGatewayConfig(
        cameras={"cam-a": CameraSettings(), "cam-b": CameraSettings(target_fps=5)},
        limits=IntakeLimits(**limits),
    )
    return DeviceIntake(config, now=0.0, config_version=1000)


def test_a_result_becomes_an_observation_with_its_provenance() -> None:
    intake = make_intake()
    beat = intake.take(
        f"{ROOT}/cam-a/heartbeat", envelope(message_id="h1", heartbeat=heartbeat()), NOW, 0.0
    )
    assert beat.time_sync == TimeSyncDue("cam-a", "h1", round(NOW * 1e6), round(NOW * 1e6))
    assert beat.clock is None  # no estimate yet (samples == 0)
    plate = detection(track_id=7, attributes={"plate_text": "AB123CD"})
    untracked = detection(0.5, 0.5, 1.0000001, 0.9, class_name="person", score=0.5)
    outcome = intake.take(
        f"{ROOT}/cam-a/results",
        envelope(frame_result=result(NOW - 1.0, plate, untracked, seq=42)),
        NOW,
        0.1,
    )
    observation = outcome.observation
    assert observation is not None and outcome.rejected is None
    assert (observation.source, observation.observation_id, observation.frame_seq) == (
        "cam-a",
        "m1",
        42,
    )
    assert observation.captured_at == pytest.approx(NOW - 1.0)  # the camera's clock, as sent
    assert observation.provenance == Provenance("device", "plates", "2.1.0", "fw-3.2.0")
    first, second = observation.detections
    assert first.track_id == "7" and first.attributes == {"plate_text": "AB123CD"}
    assert astuple(first.box) == pytest.approx((0.1, 0.2, 0.3, 0.4))  # float32 on the wire
    assert (second.class_name, second.score, second.track_id) == ("person", 0.5, None)
    assert second.box.x2 == 1.0  # float rounding past the edge is clamped, not refused
    assert intake.health()["accepted"] == {"heartbeats": 1, "results": 1}


def test_a_heartbeat_with_an_estimate_gives_the_offset_and_shifts_the_time_checks() -> None:
    intake = make_intake(max_future_s=5.0)
    clock_ahead = 3600.0  # the camera's clock runs an hour ahead of the node's
    beat = intake.take(
        f"{ROOT}/cam-a/heartbeat",
        envelope(message_id="h1", heartbeat=heartbeat(int(clock_ahead * 1e6), samples=3)),
        NOW,
        0.0,
    )
    assert beat.clock == ClockOffset("cam-a", clock_ahead, 0.0008)
    ahead = intake.take(
        f"{ROOT}/cam-a/results", envelope(frame_result=result(NOW + clock_ahead)), NOW, 0.0
    )
    assert ahead.observation is not None  # an hour ahead on its clock is now on the node's
    # cam-b has no estimate: the same capture time is an hour in the node's future.
    other = intake.take(
        f"{ROOT}/cam-b/results",
        envelope("cam-b", frame_result=result(NOW + clock_ahead)),
        NOW,
        0.0,
    )
    assert other.rejected == "timestamp_future"
    cameras = intake.health()["cameras"]
    assert cameras["cam-a"]["clock_offset_s"] == clock_ahead
    assert cameras["cam-b"]["clock_offset_s"] is None


def test_a_redelivery_is_not_a_second_observation() -> None:
    intake = make_intake()
    payload = envelope(message_id="same", frame_result=result())
    assert intake.take(f"{ROOT}/cam-a/results", payload, NOW, 0.0).observation is not None
    again = intake.take(f"{ROOT}/cam-a/results", payload, NOW + 5, 5.0)
    assert again.rejected == "duplicate" and again.observation is None
    # The same id from another camera is another message.
    other = envelope("cam-b", message_id="same", frame_result=result())
    assert intake.take(f"{ROOT}/cam-b/results", other, NOW, 5.0).observation is not None
    heartbeat_payload = envelope(message_id="h", heartbeat=heartbeat())
    assert intake.take(f"{ROOT}/cam-a/heartbeat", heartbeat_payload, NOW, 6.0).time_sync
    assert intake.take(f"{ROOT}/cam-a/heartbeat", heartbeat_payload, NOW, 7.0).time_sync is None
    assert intake.health()["rejected"]["duplicate"] == 2


def test_a_result_taken_back_unprocessed_is_taken_again_on_its_redelivery() -> None:
    # The aggregation refused it: the gateway leaves it unacked and forgets its id, so the
    # broker's redelivery is an observation again, not a duplicate.
    intake = make_intake()
    payload = envelope(message_id="refused", frame_result=result())
    outcome = intake.take(f"{ROOT}/cam-a/results", payload, NOW, 0.0)
    assert outcome.observation is not None and outcome.key == ("cam-a", "refused")
    intake.forget(outcome.key)
    again = intake.take(f"{ROOT}/cam-a/results", payload, NOW + 5, 5.0)
    assert again.observation is not None and again.rejected is None
    assert intake.take(f"{ROOT}/cam-a/results", payload, NOW + 6, 6.0).rejected == "duplicate"


BAD_INPUTS = [
    ("oversize", f"{ROOT}/cam-a/results", b"x" * 2000),
    (
        "oversize",
        f"{ROOT}/cam-a/results",
        envelope(frame_result=result(NOW, *[detection()] * 4)),
    ),
    ("wrong_topic", f"{ROOT}/cam-a/status", envelope(frame_result=result())),
    ("wrong_topic", f"{ROOT}/cam-a/results/x", envelope(frame_result=result())),
    ("wrong_topic", "other/cam-a/results", envelope(frame_result=result())),
    ("wrong_topic", f"{ROOT}/cam-a/heartbeat", envelope(frame_result=result())),
    ("unknown_device", f"{ROOT}/cam-x/results", envelope("cam-x", frame_result=result())),
    ("malformed", f"{ROOT}/cam-a/results", b"\xff\xff\xff not protobuf"),
    ("malformed", f"{ROOT}/cam-a/results", envelope()),  # no body
    ("malformed", f"{ROOT}/cam-a/results", envelope(message_id="", frame_result=result())),
    (
        "malformed",
        f"{ROOT}/cam-a/results",
        envelope(frame_result=result(NOW, detection(0.5, 0.2, 0.3, 0.4))),  # swapped
    ),
    (
        "malformed",
        f"{ROOT}/cam-a/results",
        envelope(frame_result=result(NOW, detection(x_max=1.5))),
    ),
    (
        "malformed",
        f"{ROOT}/cam-a/results",
        envelope(frame_result=result(NOW, detection(score=float("nan")))),
    ),
    (
        "protocol_version",
        f"{ROOT}/cam-a/results",
        envelope(protocol_version=2, frame_result=result()),
    ),
    ("device_mismatch", f"{ROOT}/cam-a/results", envelope("cam-b", frame_result=result())),
    ("timestamp_future", f"{ROOT}/cam-a/results", envelope(frame_result=result(NOW + 60))),
    ("timestamp_past", f"{ROOT}/cam-a/results", envelope(frame_result=result(NOW - 200))),
    ("timestamp_past", f"{ROOT}/cam-a/results", envelope(frame_result=result(0.0))),
]


@pytest.mark.parametrize(("reason", "topic", "payload"), BAD_INPUTS)
def test_bad_input_is_counted_by_reason_and_dropped(
    reason: str, topic: str, payload: bytes
) -> None:
    intake = make_intake(
        max_payload_bytes=1000, max_detections=3, max_future_s=30.0, max_past_s=100.0
    )
    outcome = intake.take(topic, payload, NOW, 0.0)
    assert outcome.rejected == reason
    assert outcome.observation is None and outcome.time_sync is None
    health = intake.health()
    assert health["rejected"] == {r: int(r == reason) for r in REASONS}
    assert health["accepted"] == {}
    if "/cam-a/" in topic and reason not in ("oversize", "wrong_topic"):
        assert health["cameras"]["cam-a"]["rejected"] == {reason: 1}
    # Nothing bad stops the next good message.
    good = intake.take(
        f"{ROOT}/cam-a/results", envelope(message_id="ok", frame_result=result()), NOW, 0.0
    )
    assert good.observation is not None


def test_the_unknown_devices_are_listed_a_few() -> None:
    intake = make_intake()
    for n in range(40):
        intake.take(
            f"{ROOT}/cam-{n}x/results", envelope(f"cam-{n}x", frame_result=result()), NOW, 0.0
        )
    health = intake.health()
    assert health["rejected"]["unknown_device"] == 40
    assert health["unknown_devices"][:2] == ["cam-0x", "cam-1x"]
    assert len(health["unknown_devices"]) == 16


def test_a_flooding_camera_is_limited_and_the_others_are_not() -> None:
    intake = make_intake(rate_per_s=10.0, burst=5)
    taken = {"cam-a": 0, "cam-b": 0}
    for n in range(200):  # cam-a sends 100 a second for 2 s; cam-b 5 a second
        t = n * 0.01
        a = envelope(message_id=f"a{n}", frame_result=result(NOW + t))
        taken["cam-a"] += (
            intake.take(f"{ROOT}/cam-a/results", a, NOW + t, t).observation is not None
        )
        if n % 20 == 0:
            b = envelope("cam-b", message_id=f"b{n}", frame_result=result(NOW + t))
            taken["cam-b"] += (
                intake.take(f"{ROOT}/cam-b/results", b, NOW + t, t).observation is not None
            )
    assert taken["cam-b"] == 10  # every one
    assert 5 + 19 <= taken["cam-a"] <= 5 + 21  # the burst, then 10 a second
    cameras = intake.health()["cameras"]
    assert cameras["cam-a"]["rejected"]["rate_limited"] == 200 - taken["cam-a"]
    assert cameras["cam-b"]["rejected"] == {}


def test_a_frame_is_taken_and_counted_without_an_observation() -> None:
    intake = make_intake()
    frame = device_pb2.Frame(frame_seq=1, captured_at=stamp(NOW), jpeg=b"\xff\xd8")
    outcome = intake.take(f"{ROOT}/cam-a/frame", envelope(frame=frame), NOW, 0.0)
    assert outcome.rejected is None and outcome.observation is None
    assert intake.health()["accepted"] == {"frames": 1}


def test_a_camera_ahead_of_the_nodes_config_version_is_sent_a_higher_one() -> None:
    intake = make_intake()
    assert intake.config_version("cam-a") == 1000
    same = intake.take(
        f"{ROOT}/cam-a/heartbeat",
        envelope(message_id="h1", heartbeat=heartbeat(config_version=1000)),
        NOW,
        0.0,
    )
    assert same.config_due is None
    ahead = intake.take(
        f"{ROOT}/cam-a/heartbeat",
        envelope(message_id="h2", heartbeat=heartbeat(config_version=5000)),
        NOW,
        0.0,
    )
    assert ahead.config_due == "cam-a"
    assert intake.config_version("cam-a") == 5001
    assert intake.config_version("cam-b") == 1000


def test_a_config_version_at_the_top_of_uint64_is_left_alone() -> None:
    intake = make_intake()
    top = heartbeat(config_version=2**64 - 1)
    outcome = intake.take(f"{ROOT}/cam-a/heartbeat", envelope(heartbeat=top), NOW, 0.0)
    assert outcome.config_due is None and outcome.time_sync is not None
    assert intake.config_version("cam-a") == 1000


@pytest.mark.parametrize(
    "bad",
    [
        {"message_id": "m\x00"},
        {"message_id": "m" * 257},
        {"model": "plates\x00"},
        {"class_name": "v" * 257},
        {"attribute": ("color", "red\x00")},
    ],
    ids=["nul-id", "long-id", "nul-model", "long-class", "nul-attribute"],
)
def test_text_the_event_store_cannot_hold_is_refused_as_malformed(bad: dict[str, Any]) -> None:
    # Found by fuzzing (test_intake_fuzz): the message id becomes an event's evidence id,
    # the class and model its entity and provenance; with a NUL or over 256 characters
    # the control plane refused the whole event (events.wire), for every camera in it.
    d = detection(class_name=bad.get("class_name", "vehicle"))
    if "attribute" in bad:
        d.attributes[bad["attribute"][0]] = bad["attribute"][1]
    frame = result(NOW, d)
    frame.model = bad.get("model", frame.model)
    intake = make_intake()
    payload = envelope(message_id=bad.get("message_id", "m1"), frame_result=frame)
    assert intake.take(f"{ROOT}/cam-a/results", payload, NOW, 1.0).rejected == "malformed"
    at_the_limit = envelope(message_id="m" * 256, frame_result=result(NOW, detection()))
    assert intake.take(f"{ROOT}/cam-a/results", at_the_limit, NOW, 2.0).rejected is None


def test_a_heartbeat_with_a_nul_in_its_firmware_is_refused() -> None:
    beat = heartbeat()
    beat.firmware_version = "fw\x00"
    intake = make_intake()
    payload = envelope(heartbeat=beat)
    assert intake.take(f"{ROOT}/cam-a/heartbeat", payload, NOW, 1.0).rejected == "malformed"
