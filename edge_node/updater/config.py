"""The updater's settings as the agent runs with them: plain, frozen, checked.

Built by `edge_node.config` from the `updater:` section of node.yaml; nothing here reads
files or the environment. Not here: what the settings do (the agent's updater task and
the reconciler).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from edge_node.errors import InvalidInputError
from edge_node.updater.watchdog import WatchdogConfig

__all__ = ["UpdaterConfig"]

_GIB: Final = 1 << 30


@dataclass(frozen=True, slots=True)
class UpdaterConfig:
    enabled: bool = True
    """Off: the agent ignores assignments and serves `runtime.model_path`, if any."""
    max_artifact_bytes: int = 4 * _GIB
    """A model (or its reference pair) larger than this is refused before download."""
    space_margin_bytes: int = 256 << 20
    """Free disk that must remain after a download; less refuses it ("disk-full")."""
    max_attempts: int = 3
    """Failed trials of one target after which a re-delivery is no longer retried."""
    retry_initial_s: float = 10.0
    retry_max_s: float = 600.0
    """The backoff (capped, full jitter) before a refused assignment or a trial that
    failed for a reason that may pass is tried again: `retry_initial_s` doubling per
    attempt, up to `retry_max_s`."""
    selftest_latency_budget_s: float = 1.0
    """Median latency of the reference input on the candidate model, at most."""
    max_sequence_jump: int = 2**32
    """How far above the last accepted director sequence an assignment may be."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)

    def __post_init__(self) -> None:
        for name in ("max_artifact_bytes", "max_attempts", "max_sequence_jump"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"updater {name} must be an integer >= 1, got {value!r}")
        margin = self.space_margin_bytes
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise InvalidInputError(f"updater space_margin_bytes must be >= 0, got {margin!r}")
        if not (
            math.isfinite(self.retry_initial_s)
            and math.isfinite(self.retry_max_s)
            and 0 < self.retry_initial_s <= self.retry_max_s <= 86_400
        ):
            raise InvalidInputError(
                "updater retry_initial_s and retry_max_s must satisfy "
                f"0 < retry_initial_s <= retry_max_s <= 86400, got {self.retry_initial_s!r} "
                f"and {self.retry_max_s!r}"
            )
        budget = self.selftest_latency_budget_s
        if not (math.isfinite(budget) and 0 < budget <= 600):
            raise InvalidInputError(
                f"updater selftest_latency_budget_s must be in (0, 600], got {budget!r}"
            )
