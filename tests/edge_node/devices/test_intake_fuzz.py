"""Fuzzing `DeviceIntake.take` with what a camera (or anyone on the node's broker) can
publish (hypothesis, bounded): any bytes, mutated envelopes, hostile field values, on
any topic. It never raises: every message is taken or refused under one of `REASONS`,
and the counters add up to the messages seen.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from device_sdk.proto.edgefleet.device.v1 import device_pb2
from edge_node.devices.intake import REASONS, DeviceIntake, Outcome
from tests.edge_node.devices.test_intake import (
    NOW,
    ROOT,
    detection,
    envelope,
    heartbeat,
    make_intake,
    result,
)
from tests.fuzz_support import FUZZ, wire_bytes

RESULT = envelope(frame_result=result(NOW - 0.1, detection(), detection(score=0.5)))
HEARTBEAT = envelope(message_id="m2", heartbeat=heartbeat(offset_us=1500, samples=3))
FRAME = envelope(message_id="m3", frame=device_pb2.Frame(frame_seq=1, jpeg=b"\xff\xd8"))
TOPICS = st.one_of(
    st.sampled_from(
        [
            *(f"{ROOT}/cam-a/{leaf}" for leaf in ("results", "heartbeat", "frame")),
            *(f"{ROOT}/{rest}" for rest in ("cam-b/results", "cam-z/results", "cam-a", "/")),
        ]
    ),
    st.text(max_size=64),
)


def _counted(intake: DeviceIntake) -> int:
    return sum(intake.accepted.values()) + sum(intake.rejected.values())


def _checked(outcome: Outcome) -> None:
    assert outcome.rejected is None or outcome.rejected in REASONS
    if outcome.observation is not None:
        for d in outcome.observation.detections:
            assert 0.0 <= d.score <= 1.0
            assert 0.0 <= d.box.x1 <= d.box.x2 <= 1.0
            assert 0.0 <= d.box.y1 <= d.box.y2 <= 1.0
        # What reaches an event must be readable by the control plane's event store.
        assert "\x00" not in outcome.observation.observation_id
        assert len(outcome.observation.observation_id) <= 256


def test_the_valid_messages_are_taken() -> None:
    intake = make_intake()
    leaves = ("results", "heartbeat", "frame")
    outcomes = [
        intake.take(f"{ROOT}/cam-a/{leaf}", payload, NOW, 1.0)
        for leaf, payload in zip(leaves, (RESULT, HEARTBEAT, FRAME), strict=True)
    ]
    assert [o.rejected for o in outcomes] == [None, None, None]
    assert outcomes[0].observation is not None and outcomes[1].time_sync is not None


@FUZZ
@given(
    messages=st.lists(
        st.tuples(TOPICS, wire_bytes(RESULT, HEARTBEAT, FRAME)), min_size=1, max_size=8
    )
)
def test_any_message_on_any_topic_is_taken_or_counted_as_refused(
    messages: list[tuple[str, bytes]],
) -> None:
    intake = make_intake()
    for step, (topic, payload) in enumerate(messages):
        _checked(intake.take(topic, payload, NOW + step, 1.0 + step))
    assert intake.messages == len(messages) == _counted(intake)


@FUZZ
@given(
    offset_us=st.integers(-(2**63), 2**63 - 1),
    error_us=st.integers(0, 2**64 - 1),
    config_version=st.integers(0, 2**64 - 1),
    captured_s=st.integers(-(2**40), 2**40),
    corners=st.tuples(*[st.floats(width=32)] * 4),
    score=st.floats(width=32),
    count=st.integers(0, 300),
)
def test_hostile_field_values_are_taken_or_refused_never_raised(
    offset_us: int,
    error_us: int,
    config_version: int,
    captured_s: int,
    corners: tuple[float, float, float, float],
    score: float,
    count: int,
) -> None:
    intake = make_intake()
    beat = heartbeat(offset_us=offset_us, samples=1, config_version=config_version)
    beat.clock.error_us = error_us
    frame = result(float(NOW), *[detection(*corners, score=score)] * min(count, 3))
    frame.captured_at.seconds = captured_s
    if count > 3:
        frame.detections.extend([detection()] * count)
    for step, (leaf, payload) in enumerate(
        [
            ("heartbeat", envelope(message_id="h", heartbeat=beat)),
            ("results", envelope(message_id="r", frame_result=frame)),
        ]
    ):
        _checked(intake.take(f"{ROOT}/cam-a/{leaf}", payload, NOW, 1.0 + step))
    assert intake.messages == 2 == _counted(intake)
