"""The post-commit watchdog's rules (DESIGN §5): is a freshly activated model failing?

Pure: takes the model's run counters at the start of its window and now, returns a
verdict. Not here: the window's clock, reading the counters from the runtime, or the
revert itself (the agent's updater task and the reconciler do those).

What counts: `ModelHealth.errors` are frames the model itself failed on (ONNX Runtime
raised on an input of the shape and type the model was checked to take). Bad frames
(corrupt JPEG, wrong shape) are the camera's fault and are not counted here. A process
that dies while the model is on watch is judged at the next start (`journal.Probation`),
not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from edge_node.errors import InvalidInputError

__all__ = [
    "ModelHealth",
    "WatchdogConfig",
    "WatchdogVerdict",
    "judge",
]

_MAX_WINDOW_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class WatchdogConfig:
    """`window_s` 0 turns the watchdog off (a commit is final at once).

    Within the window the model is reverted when it failed `max_errors` frames, or when
    at least `min_frames` were run and more than `max_error_ratio` of them failed.
    """

    window_s: float = 60.0
    max_errors: int = 10
    max_error_ratio: float = 0.05
    min_frames: int = 20
    poll_s: float = 1.0
    """How often the counters are read while the window runs."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and 0 <= self.window_s <= _MAX_WINDOW_S):
            raise InvalidInputError(
                f"watchdog window_s must be in [0, {_MAX_WINDOW_S:g}], got {self.window_s!r}"
            )
        if isinstance(self.max_errors, bool) or not (
            isinstance(self.max_errors, int) and self.max_errors >= 1
        ):
            raise InvalidInputError(f"watchdog max_errors must be >= 1, got {self.max_errors!r}")
        if not (math.isfinite(self.max_error_ratio) and 0 < self.max_error_ratio <= 1):
            raise InvalidInputError(
                f"watchdog max_error_ratio must be in (0, 1], got {self.max_error_ratio!r}"
            )
        if isinstance(self.min_frames, bool) or not (
            isinstance(self.min_frames, int) and self.min_frames >= 1
        ):
            raise InvalidInputError(f"watchdog min_frames must be >= 1, got {self.min_frames!r}")
        if not (math.isfinite(self.poll_s) and 0 < self.poll_s <= 60):
            raise InvalidInputError(f"watchdog poll_s must be in (0, 60], got {self.poll_s!r}")

    @property
    def enabled(self) -> bool:
        return self.window_s > 0


@dataclass(frozen=True, slots=True)
class ModelHealth:
    """Run counters of one loaded model (a session)."""

    model: str
    """The model file the session was loaded from."""
    frames: int
    """Frames the model ran, whether or not they failed."""
    errors: int
    """Of those, the ones it failed on."""


@dataclass(frozen=True, slots=True)
class WatchdogVerdict:
    """A failing model: `reason` is a short code, `detail` the numbers behind it."""

    reason: str
    detail: str


def judge(
    baseline: ModelHealth, now: ModelHealth, config: WatchdogConfig
) -> WatchdogVerdict | None:
    """The verdict on the frames run between `baseline` and `now`; None while healthy.

    Both must be counters of the same model; counters that went backwards (another
    session) judge nothing.
    """
    if now.model != baseline.model:
        return None
    errors = now.errors - baseline.errors
    frames = now.frames - baseline.frames
    if errors < 0 or frames < 0:
        return None
    if errors >= config.max_errors:
        return WatchdogVerdict(
            "watchdog-errors",
            f"{errors} inference errors in {frames} frames within the watchdog window "
            f"(limit {config.max_errors})",
        )
    if frames >= config.min_frames and errors / frames > config.max_error_ratio:
        return WatchdogVerdict(
            "watchdog-error-rate",
            f"{errors} of {frames} frames failed ({errors / frames:.1%}, limit "
            f"{config.max_error_ratio:.1%})",
        )
    return None
