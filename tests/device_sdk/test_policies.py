"""The SDK's small pure parts: reconnect backoff, pacing at the source, the clock-offset
estimate, message ids and topics."""

from __future__ import annotations

import uuid

import pytest

from device_sdk.backoff import Backoff, BackoffPolicy
from device_sdk.ids import uuid7
from device_sdk.pacing import FramePacer, SkipPolicy, SourceConfig
from device_sdk.proto.edgefleet.device.v1 import device_pb2
from device_sdk.timesync import ClockEstimate, ClockEstimator
from device_sdk.topics import device_topic


def test_backoff_is_full_jitter_under_a_capped_exponential() -> None:
    asked: list[tuple[float, float]] = []

    def top(low: float, high: float) -> float:
        asked.append((low, high))
        return high

    backoff = Backoff(BackoffPolicy(base_s=0.5, cap_s=8.0), uniform=top)
    delays = [backoff.next_delay() for _ in range(7)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(low == 0.0 for low, _ in asked)  # full jitter: anywhere from zero


def test_backoff_resets_only_after_a_connection_that_held() -> None:
    backoff = Backoff(BackoffPolicy(base_s=1.0, cap_s=60.0, reset_after_s=30.0), uniform=max)
    for _ in range(4):
        backoff.next_delay()
    backoff.connected(at=100.0)
    backoff.disconnected(at=110.0)  # flapping: keep backing off
    assert backoff.ceiling() == 16.0
    backoff.connected(at=200.0)
    backoff.disconnected(at=240.0)
    assert backoff.ceiling() == 1.0


def test_backoff_with_the_real_random_stays_in_range() -> None:
    backoff = Backoff(BackoffPolicy(base_s=1.0, cap_s=4.0))
    delays = [backoff.next_delay() for _ in range(200)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 150  # jittered, not a fixed ladder


def admitted(config: SourceConfig, fps: float, seconds: float) -> int:
    pacer = FramePacer()
    frames = round(fps * seconds)
    return sum(pacer.admit(1_000.0 + n / fps, config) for n in range(frames))


@pytest.mark.parametrize(
    ("policy", "target", "expected"),
    [
        (SkipPolicy.LATEST_WINS, 10.0, 100),
        (SkipPolicy.EVEN, 10.0, 100),
        (SkipPolicy.LATEST_WINS, 12.0, 100),  # never above target: every third frame
        (SkipPolicy.EVEN, 12.0, 120),  # on average exactly the target
        (SkipPolicy.EVEN, 60.0, 300),  # above the camera's rate: every frame
    ],
)
def test_pacing_from_30_fps(policy: SkipPolicy, target: float, expected: int) -> None:
    config = SourceConfig(version=1, target_fps=target, skip_policy=policy)
    assert admitted(config, fps=30, seconds=10) == expected


def test_no_target_admits_every_frame_and_a_gap_does_not_burst() -> None:
    assert admitted(SourceConfig(), fps=30, seconds=2) == 60
    pacer = FramePacer()
    even = SourceConfig(version=1, target_fps=5, skip_policy=SkipPolicy.EVEN)
    assert pacer.admit(0.0, even)
    assert pacer.admit(10.0, even)  # after a 10 s gap: one frame, then the grid again
    assert not pacer.admit(10.1, even)
    assert pacer.admit(10.2, even)


def test_a_config_from_the_wire_is_made_safe() -> None:
    assert SourceConfig.from_proto(device_pb2.DeviceConfig(version=3, target_fps=float("nan"))) == (
        SourceConfig(version=3)
    )
    assert SourceConfig.from_proto(device_pb2.DeviceConfig(target_fps=-5)).target_fps == 0.0
    newer_policy = device_pb2.DeviceConfig(skip_policy=7)  # type: ignore[arg-type]
    assert SourceConfig.from_proto(newer_policy).skip_policy is SkipPolicy.LATEST_WINS
    even = device_pb2.DeviceConfig(skip_policy=device_pb2.SKIP_POLICY_EVEN, send_frames=True)
    assert SourceConfig.from_proto(even) == SourceConfig(
        skip_policy=SkipPolicy.EVEN, send_frames=True
    )


def test_the_clock_estimate_takes_the_tightest_round_trip() -> None:
    estimator = ClockEstimator(window=4)
    assert estimator.estimate() == ClockEstimate()
    # The camera runs 2 ms ahead of its node. Round trip 10 ms (5 each way), then 2 ms.
    assert estimator.add(1_000_000, 1_000_000 - 2_000 + 5_000, 1_000_000 - 2_000 + 5_100, 1_010_100)
    assert estimator.add(2_000_000, 2_000_000 - 2_000 + 1_000, 2_000_000 - 2_000 + 1_000, 2_002_000)
    assert estimator.estimate() == ClockEstimate(offset_us=2_000, error_us=1_000, samples=2)
    assert not estimator.add(0, 0, 10, 5)  # answered before it was asked: ignored
    assert estimator.estimate().samples == 2


def test_message_ids_are_uuid7_ordered_by_time_and_unique() -> None:
    made = [uuid7(1_767_225_600.0 + n / 1000) for n in range(1000)]
    assert all(uuid.UUID(m).version == 7 for m in made)
    assert len(set(made)) == 1000
    assert [m[:13] for m in made] == sorted(m[:13] for m in made)  # the millisecond leads


def test_a_device_id_is_one_topic_level() -> None:
    assert device_topic("cam-1", "results") == "edgefleet/dev/cam-1/results"
    for bad in ("", "a/b", "a+", "#", "a\0"):
        with pytest.raises(ValueError, match="topic level"):
            device_topic(bad, "results")
