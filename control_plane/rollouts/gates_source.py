"""The gates as the controller's `VerdictSource`: the stage's canaries, controls and
baselines read from the health store's raw points, judged by `gates.evaluate`.

What it is for: `GatesVerdicts.judge(state, previous, now)` reads each judged node's
points (canaries healthy on the candidate, or shadow nodes; the stage's controls; the
canaries' own points before their assignment), builds `Samples` (`evidence.py`) and
evaluates them with the rollout's gates (`spec.gates`, a gates.yaml over the defaults;
`--control none`, or a stage with no control node left, such as the last, judges
without controls), continuing from the stage's previous
decision. `check(spec)` refuses a bad gates.yaml at creation. At most `max_nodes`
canaries and controls are read per evaluation (the first by rank): a 10,000-node stage
is judged on a sample of it. What it is not for: the statistics (`gates.py`) or what a
verdict does (`machine.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.errors import InvalidInputError
from control_plane.rollouts.evidence import Point, stage_samples
from control_plane.rollouts.gates import Decision, evaluate, parse_gates
from control_plane.rollouts.spec import RolloutSpec
from control_plane.rollouts.state import RolloutState
from control_plane.rollouts.verdicts import Inconclusive, Judgement
from control_plane.storage.models import HealthPointRow

__all__ = ["GatesVerdicts"]

log = logging.getLogger(__name__)

_ID_BATCH: Final = 500


class _Judged:
    """A gates decision as the machine's verdict: its summary without the leading
    outcome (the machine says "inconclusive: …" or "the gates failed …" itself)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    @property
    def outcome(self) -> Any:
        return self.decision.outcome

    def summary(self) -> str:
        return self.decision.summary().removeprefix(f"{self.decision.outcome}: ")

    def to_dict(self) -> dict[str, Any]:
        return self.decision.to_dict()


class GatesVerdicts:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        lookback: timedelta = timedelta(hours=1),
        retention: timedelta = timedelta(hours=12),
        max_nodes: int = 200,
    ) -> None:
        lookback = min(lookback, retention)  # nothing older is kept to read
        if lookback < timedelta(minutes=1):
            raise InvalidInputError("the gates' lookback must be at least 1 min")
        self._sessions = sessions
        self._lookback = lookback
        self._retention = retention
        self._max_nodes = max_nodes

    def check(self, spec: RolloutSpec) -> None:
        """A gates.yaml the gates cannot read is refused now, naming the field."""
        parse_gates(dict(spec.gates))

    def judge(
        self, state: RolloutState, previous: Mapping[str, Any] | None, now: datetime
    ) -> Judgement | None:
        spec = state.spec
        gates = parse_gates(dict(spec.gates))
        if spec.control == "none" or not state.controls:
            # No control group: `--control none`, or a stage with nobody left on the old
            # version (the last of a rollout to 100 %) is judged against baselines only.
            gates = gates.without_control()
        canaries = sorted(state.canaries(), key=lambda n: state.nodes[n].rank)[: self._max_nodes]
        controls = state.controls[: self._max_nodes]
        window_start = now - self._lookback
        starts = [state.nodes[n].started_at or state.nodes[n].since for n in canaries]
        since = max(min([window_start, *starts]) - self._lookback, now - self._retention)
        points = self._points([*canaries, *controls], since, now)
        versions = {n: state.nodes[n].previous for n in controls if n in state.nodes}
        samples = stage_samples(
            state, points, versions, window_start=window_start, now=now, canaries=canaries
        )
        history = []
        if previous is not None:
            try:
                history.append(Decision.from_dict(dict(previous)))
            except InvalidInputError:
                log.warning(
                    "rollout %s: its stored verdict is unreadable; starting over", state.rollout_id
                )
        try:
            decision = evaluate(gates, samples, now, [d for d in history if d.evaluated_at < now])
        except InvalidInputError as exc:
            refused = Inconclusive(f"the samples could not be judged: {exc.message}")
            return Judgement(refused, refused.to_dict())
        return Judgement(_Judged(decision), decision.to_dict())

    def _points(
        self, node_ids: Sequence[str], since: datetime, until: datetime
    ) -> dict[str, list[Point]]:
        found: dict[str, list[Point]] = {n: [] for n in node_ids}
        ids = sorted(set(node_ids))
        with self._sessions() as session:
            for start in range(0, len(ids), _ID_BATCH):
                rows = session.execute(
                    select(
                        HealthPointRow.node_id,
                        HealthPointRow.at,
                        HealthPointRow.metrics,
                        HealthPointRow.latency,
                    )
                    .where(
                        HealthPointRow.node_id.in_(ids[start : start + _ID_BATCH]),
                        HealthPointRow.at >= since,
                        HealthPointRow.at <= until,
                    )
                    .order_by(HealthPointRow.node_id, HealthPointRow.at)
                )
                for node_id, at, metrics, latency in rows:
                    found[node_id].append(Point(at, metrics or {}, latency or {}))
        return found
