"""Where the controller gets a stage's verdict: the `VerdictSource` port, and `NoGates`,
the source of a control plane without gates, whose verdict is always inconclusive.

What it is for: the service asks `judge(state, previous, now)` once per evaluation
interval and hands the verdict to `machine.step`; the `Judgement`'s document is stored as
the rollout's latest verdict (what `watch` shows, and what the next evaluation continues
from: `previous`, None when the stage has none yet). An inconclusive verdict pauses a
baked stage and never passes it, so a control plane without gates never promotes by
itself: a person promotes. What it is not for: statistics (`gates.py`) or reading the
health store (its adapter). A source may keep what it read between evaluations of
a stage (the gates keep each judged node's points); `retain` tells it which rollouts it
still judges, so it forgets the others. Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from control_plane.rollouts.machine import Outcome, Verdict
from control_plane.rollouts.spec import RolloutSpec
from control_plane.rollouts.state import RolloutState

__all__ = ["NO_GATES", "Inconclusive", "Judgement", "NoGates", "VerdictSource"]

NO_GATES: Final = "no gates on this control plane: promote the stage by hand"


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict and the document to keep of it (JSON-ready)."""

    verdict: Verdict
    document: Mapping[str, Any]


class VerdictSource(Protocol):
    def check(self, spec: RolloutSpec) -> None:
        """Refuse, naming the field, a spec whose gates this source cannot judge."""
        ...

    def judge(
        self, state: RolloutState, previous: Mapping[str, Any] | None, now: datetime
    ) -> Judgement | None:
        """The verdict on `state`'s current stage now (None: none this time)."""
        ...

    def retain(self, rollouts: Collection[str]) -> None:
        """Forget whatever is kept between evaluations for rollouts not in `rollouts` (the
        ones this replica still judges; the service says so after each tick)."""
        ...


@dataclass(frozen=True, slots=True)
class Inconclusive:
    """A verdict that could not be given, with the reason: it pauses, never passes."""

    reason: str

    @property
    def outcome(self) -> Outcome:
        return "inconclusive"

    def summary(self) -> str:
        return self.reason

    @property
    def waiting_for_data(self) -> str:
        return ""  # more time brings no verdict here: a baked stage pauses

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": "inconclusive", "summary": self.reason, "gates": []}


class NoGates:
    """Every verdict inconclusive, with the reason: a baked stage pauses for a person."""

    def check(self, spec: RolloutSpec) -> None:
        return None

    def judge(
        self, state: RolloutState, previous: Mapping[str, Any] | None, now: datetime
    ) -> Judgement:
        verdict = Inconclusive(NO_GATES)
        return Judgement(verdict, {**verdict.to_dict(), "evaluated_at": now.isoformat()})

    def retain(self, rollouts: Collection[str]) -> None:
        return None
