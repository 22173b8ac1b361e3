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
is judged on a sample of it. The points are kept between evaluations of a stage and
only rows received since are read (ADR 0036): a warm judge decides exactly as a cold
one; `retain(rollouts)` forgets the rollouts no longer judged here. What it is not for:
the statistics (`gates.py`) or what a verdict does (`machine.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
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

    @property
    def waiting_for_data(self) -> str:
        return self.decision.waiting_for_data

    def to_dict(self) -> dict[str, Any]:
        return self.decision.to_dict()


@dataclass(slots=True)
class _Series:
    """One judged node's points as read so far: every stored point from `since` on, by
    record id, and `received` (the newest `received_at` of the read that last found any)."""

    since: datetime
    points: dict[str, Point] = field(default_factory=dict)
    received: datetime | None = None


@dataclass(slots=True)
class _Held:
    """What a rollout's current stage keeps between evaluations: its judged nodes' series."""

    stage: int
    series: dict[str, _Series] = field(default_factory=dict)


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
        self._held: dict[str, _Held] = {}
        self.rows_read = 0  # rows read from the store so far (what incremental saves)

    def check(self, spec: RolloutSpec) -> None:
        """A gates.yaml the gates cannot read is refused now, naming the field."""
        parse_gates(dict(spec.gates))

    def retain(self, rollouts: Collection[str]) -> None:
        """Forget the points kept for any rollout not in `rollouts`."""
        for rollout_id in set(self._held) - set(rollouts):
            del self._held[rollout_id]

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
        points = self._points(state, [*canaries, *controls], since, now)
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
        self, state: RolloutState, node_ids: Sequence[str], since: datetime, until: datetime
    ) -> dict[str, list[Point]]:
        """Each node's points from `since` to `until`, oldest first (ties by record id):
        the ones kept from the last evaluation of this stage, and the rows received since.
        A node not kept, or kept from later than `since`, is read whole."""
        held = self._held.get(state.rollout_id)
        if held is None or held.stage != state.stage:
            held = self._held[state.rollout_id] = _Held(state.stage)
        wanted = set(node_ids)
        for node_id in [n for n, s in held.series.items() if n not in wanted or s.since > since]:
            del held.series[node_id]
        cold = sorted(wanted - set(held.series))
        warm = sorted(wanted & set(held.series))
        for node_id in cold:
            held.series[node_id] = _Series(since)
        with self._sessions() as session:
            for start in range(0, len(cold), _ID_BATCH):
                self._read(session, held, cold[start : start + _ID_BATCH], since, None)
            for start in range(0, len(warm), _ID_BATCH):
                batch = warm[start : start + _ID_BATCH]
                marks = [held.series[n].received for n in batch]
                after = None if None in marks else min(m for m in marks if m is not None)
                self._read(session, held, batch, since, after)
        found: dict[str, list[Point]] = {}
        for node_id in node_ids:
            series = held.series[node_id]
            if series.since < since:
                kept = {k: p for k, p in series.points.items() if p.at >= since}
                series.points, series.since = kept, since
            found[node_id] = [
                p
                for _, p in sorted(series.points.items(), key=lambda item: (item[1].at, item[0]))
                if p.at <= until
            ]
        return found

    def _read(
        self,
        session: Session,
        held: _Held,
        node_ids: Sequence[str],
        since: datetime,
        received: datetime | None,
    ) -> None:
        """The nodes' rows from `since` on (received at or after `received`, when given)
        into their series. The health processor stores rows in `received_at` order, one
        batch per transaction (one cursor), so a row this statement does not see has a
        `received_at` no lower than any it sees: the next read starts at the newest seen."""
        query = select(
            HealthPointRow.node_id,
            HealthPointRow.record_id,
            HealthPointRow.at,
            HealthPointRow.received_at,
            HealthPointRow.metrics,
            HealthPointRow.latency,
        ).where(HealthPointRow.node_id.in_(node_ids), HealthPointRow.at >= since)
        if received is not None:
            query = query.where(HealthPointRow.received_at >= received)
        newest: datetime | None = None
        for node_id, record_id, at, received_at, metrics, latency in session.execute(query):
            self.rows_read += 1
            points = held.series[node_id].points
            if record_id not in points:
                points[record_id] = Point(at, metrics or {}, latency or {})
            newest = received_at if newest is None or received_at > newest else newest
        if newest is not None:
            for node_id in node_ids:
                held.series[node_id].received = newest
