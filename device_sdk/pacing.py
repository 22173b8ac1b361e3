"""The node's configuration as the camera applies it at the source: which captured
frames to process (target fps and skip policy) and whether to send JPEGs. Pure: the
caller passes each frame's capture time (seconds, any clock that does not step back)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from device_sdk.proto.edgefleet.device.v1 import device_pb2

__all__ = ["FramePacer", "SkipPolicy", "SourceConfig"]

_EPSILON_S = 1e-6  # capture stamps on the exact grid must not miss their slot


class SkipPolicy(Enum):
    # Never above target_fps: a frame is taken once a whole period has passed since the
    # last taken (lowest latency; from 30 fps at a target of 12 this gives 10).
    LATEST_WINS = "latest_wins"
    # Frames on an even grid at target_fps (from 30 fps at 12: 12 on average).
    EVEN = "even"


_FROM_PROTO = {
    device_pb2.SKIP_POLICY_UNSPECIFIED: SkipPolicy.LATEST_WINS,  # the camera's default
    device_pb2.SKIP_POLICY_LATEST_WINS: SkipPolicy.LATEST_WINS,
    device_pb2.SKIP_POLICY_EVEN: SkipPolicy.EVEN,
}


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """What the camera runs. version 0: none received yet (the camera's defaults)."""

    version: int = 0
    target_fps: float = 0.0  # 0: no limit from the node
    skip_policy: SkipPolicy = SkipPolicy.LATEST_WINS
    send_frames: bool = False

    @classmethod
    def from_proto(cls, config: device_pb2.DeviceConfig) -> SourceConfig:
        fps = config.target_fps
        return cls(
            version=config.version,
            target_fps=fps if fps > 0 and fps == fps else 0.0,  # NaN, negatives: no limit
            # A policy newer than this SDK: the default, never "skip nothing".
            skip_policy=_FROM_PROTO.get(config.skip_policy, SkipPolicy.LATEST_WINS),
            send_frames=config.send_frames,
        )


class FramePacer:
    """`admit(t, config)` is True for the captured frames to process and publish."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._next_slot: float | None = None

    def admit(self, captured_at: float, config: SourceConfig) -> bool:
        if config.target_fps <= 0:
            self._last, self._next_slot = captured_at, None
            return True
        period = 1.0 / config.target_fps
        if config.skip_policy is SkipPolicy.EVEN:
            # A gap longer than a period restarts the grid rather than bursting to catch up.
            if self._next_slot is None or captured_at >= self._next_slot + period:
                self._next_slot = captured_at
            if captured_at + _EPSILON_S < self._next_slot:
                return False
            self._next_slot += period
            self._last = captured_at
            return True
        if self._last is not None and captured_at - self._last + _EPSILON_S < period:
            return False
        self._last, self._next_slot = captured_at, None
        return True
