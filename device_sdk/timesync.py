"""The camera's estimate of its clock against its node's, from TimeSync replies to its
heartbeats (NTP's offset and error; device.proto's TimeSync states the formulas). The
best of the last few samples (the smallest error) is the estimate. Pure."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["ClockEstimate", "ClockEstimator"]


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    offset_us: int = 0  # camera clock minus node clock
    error_us: int = 0
    samples: int = 0  # 0: no estimate yet


class ClockEstimator:
    def __init__(self, window: int = 8) -> None:
        self._samples: deque[tuple[int, int]] = deque(maxlen=window)

    def add(
        self,
        device_sent_us: int,
        node_received_us: int,
        node_sent_us: int,
        device_received_us: int,
    ) -> bool:
        """One round trip; False (ignored) if it is impossible (negative round trip)."""
        round_trip = (device_received_us - device_sent_us) - (node_sent_us - node_received_us)
        if round_trip < 0 or node_sent_us < node_received_us:
            return False
        offset = ((device_sent_us - node_received_us) + (device_received_us - node_sent_us)) // 2
        self._samples.append((round_trip // 2, offset))
        return True

    def estimate(self) -> ClockEstimate:
        if not self._samples:
            return ClockEstimate()
        error, offset = min(self._samples)
        return ClockEstimate(offset_us=offset, error_us=error, samples=len(self._samples))
