"""The rollout controller's state: plain data, stored as `to_dict()` and read back by
`from_dict()` (checked field by field, each refusal naming its field).

What it is for: what `machine.step` reads and returns (`RolloutState`, one `NodeRecord`
per matched node, a `Pause`, the `Decision`s it records) and what `watch` shows
(`label`, `counts`, `canaries`, `bake_left`). What it is not for: the rules that change
it (`machine.py`). Pure: no I/O, no framework.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from control_plane.errors import InvalidInputError
from control_plane.rollouts.spec import RolloutSpec, stored_reader
from protos.fields import Fields, optional

__all__ = [
    "ENDED_VIEW_STATUSES",
    "STATE_FORMAT",
    "Decision",
    "NodePhase",
    "NodeRecord",
    "Pause",
    "PauseKind",
    "RolloutState",
    "RolloutStatus",
    "StageEnd",
    "Track",
    "aware",
    "ended_phase",
    "phase_counts",
    "plain",
]

STATE_FORMAT: Final = 1

RolloutStatus = Literal[
    "pending", "running", "baking", "paused", "rolling-back", "done", "aborted", "rolled-back"
]
NodePhase = Literal[
    "queued",
    "assigned",
    "downloading",
    "activating",
    "active-unhealthy",
    "healthy",
    "failed",
    "timed-out",
    "rolling-back",
    "rolled-back",
    "left",
]
Track = Literal["shadow", "candidate"]

ENDED_VIEW_STATUSES: Final = frozenset({"aborted", "rolled-back"})
"""Statuses after which a node's stored phase is where the rollout left it, not where it
is going: views show `ended_phase` instead (a done rollout's phases are final as they are,
and one that follows takes in enrolling nodes through `queued`)."""


def ended_phase(track: str, phase: str) -> str:
    """What a node ended as in an aborted or rolled-back rollout: a shadow stage's node
    that had not failed there, `shadow-cleared` (its shadow ended with the rollout); a node
    never started, `never-started`; any other, its phase."""
    if track == "shadow" and phase not in ("failed", "timed-out"):
        return "shadow-cleared"
    if phase == "queued":
        return "never-started"
    return phase


PauseKind = Literal["operator", "inconclusive", "no-verdict", "no-nodes"]
StageEnd = Literal["passed", "promoted", "skipped"]

_F: Final = Fields(InvalidInputError)


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of the controller, with the numbers behind it (a verdict's
    `to_dict()`, the failure budget's counts, the nodes started)."""

    at: datetime
    rollout_id: str
    kind: str
    stage: int
    text: str
    numbers: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "rollout_id": self.rollout_id,
            "kind": self.kind,
            "stage": self.stage,
            "text": self.text,
            "numbers": plain(self.numbers),
        }


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One matched node's place and progress in the rollout.

    `stage` is the canary stage that takes it (None: past a partial rollout's last
    stage); `rank` its place in the spread order; `previous` the version it ran when the
    rollout took it in; `track` what the phase is about (the shadow while the shadow stage
    runs, the candidate after); `shadowing` that a shadow assignment of ours is out;
    `touched` that it was assigned the candidate (a rollback gives it `previous` back).
    """

    stage: int | None
    rank: int
    stratum: str
    previous: str | None
    since: datetime
    phase: NodePhase = "queued"
    track: Track = "candidate"
    shadowing: bool = False
    touched: bool = False
    started_at: datetime | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "rank": self.rank,
            "stratum": self.stratum,
            "previous": self.previous,
            "since": self.since.isoformat(),
            "phase": self.phase,
            "track": self.track,
            "shadowing": self.shadowing,
            "touched": self.touched,
            "started_at": None if self.started_at is None else self.started_at.isoformat(),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Pause:
    """Why a rollout is paused, since when, and the status `resume` returns to."""

    kind: PauseKind
    reason: str
    resume_to: RolloutStatus
    since: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "resume_to": self.resume_to,
            "since": self.since.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Everything the controller knows of one rollout; plain data, stored as `to_dict()`.

    `stage` indexes `spec.stages` (the shadow stage first, when there is one); `hold` says
    why nothing starts right now (window, rate) while running; `starts` is the rate limit's
    log (time, nodes started) over its window; `promote_by` a promotion waiting for the
    next step; `ended` how each finished stage ended, in order (`StageEnd`: passed,
    promoted without a verdict, skipped); `last` the latest decision (what `watch`
    shows); `seed` orders the nodes
    (`plan.dry_run`), so a dry run with the same seed shows the nodes this rollout takes.
    """

    rollout_id: str
    spec: RolloutSpec
    status: RolloutStatus
    stage: int
    since: datetime
    seed: str
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    bake_started: datetime | None = None
    controls: tuple[str, ...] = ()
    starts: tuple[tuple[datetime, int], ...] = ()
    pause: Pause | None = None
    hold: str = ""
    baseline: str | None = None
    promote_by: str = ""
    ended: tuple[StageEnd, ...] = ()
    last: Decision | None = None

    @classmethod
    def new(
        cls, rollout_id: str, spec: RolloutSpec, now: datetime, *, seed: str | None = None
    ) -> RolloutState:
        """A created rollout: pending until its first step takes the fleet in. `seed`
        defaults to the spec's, the one a dry run uses."""
        if not isinstance(rollout_id, str) or not 0 < len(rollout_id) <= 64:
            raise _F.fail("rollout_id", "must be 1-64 characters", rollout_id)
        return cls(rollout_id, spec, "pending", 0, aware(now), spec.seed if seed is None else seed)

    # ------------------------------------------------------------------ views

    @property
    def label(self) -> str:
        """`stage 2 of 4 (10%) baking`, `paused at shadow (5): <reason>`, `done`."""
        where = self.spec.stages.label(self.stage)
        if self.status in ("running", "baking"):
            hold = f" ({self.hold})" if self.hold else ""
            return f"{where} {self.status}{hold}"
        if self.status == "paused" and self.pause is not None:
            return f"paused at {where}: {self.pause.reason}"
        return self.status

    def counts(self) -> dict[str, int]:
        """Nodes per phase."""
        return phase_counts(self.nodes)

    def canaries(self) -> tuple[str, ...]:
        """The nodes healthy on the candidate (or, in the shadow stage, on the shadow) that
        the gates judge now."""
        track: Track = "shadow" if self.spec.stages.is_shadow(self.stage) else "candidate"
        return tuple(
            node_id
            for node_id, r in self.nodes.items()
            if r.phase == "healthy" and r.track == track
        )

    def bake_left(self, now: datetime) -> timedelta | None:
        if self.status != "baking" or self.bake_started is None:
            return None
        return max(self.bake_started + self.spec.bake - now, timedelta(0))

    # --------------------------------------------------------------- storage

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "rollout_id": self.rollout_id,
            "spec": self.spec.to_dict(),
            "status": self.status,
            "stage": self.stage,
            "since": self.since.isoformat(),
            "seed": self.seed,
            "bake_started": _iso(self.bake_started),
            "controls": list(self.controls),
            "starts": [[at.isoformat(), n] for at, n in self.starts],
            "pause": None if self.pause is None else self.pause.to_dict(),
            "hold": self.hold,
            "baseline": self.baseline,
            "promote_by": self.promote_by,
            "ended": list(self.ended),
            "last": None if self.last is None else self.last.to_dict(),
            "nodes": {node_id: r.to_dict() for node_id, r in self.nodes.items()},
        }

    @classmethod
    def from_dict(cls, raw: object, *, where: str = "rollout_state") -> RolloutState:
        reader = stored_reader(where, raw, STATE_FORMAT)
        spec = reader.require("spec", lambda n, v: RolloutSpec.from_dict(v, where=n))
        state = cls(
            rollout_id=reader.require("rollout_id", _F.to_str),
            spec=spec,
            status=reader.require("status", _F.choice(RolloutStatus)),
            stage=reader.require("stage", _stage_index(spec)),
            since=reader.require("since", _time),
            seed=reader.require("seed", _F.to_str),
            bake_started=reader.take("bake_started", optional(_time), None),
            controls=reader.take("controls", _strings, ()),
            starts=reader.take("starts", _starts, ()),
            pause=reader.take("pause", optional(_pause), None),
            hold=reader.take("hold", _F.to_str, ""),
            baseline=reader.take("baseline", optional(_F.to_str), None),
            promote_by=reader.take("promote_by", _F.to_str, ""),
            ended=reader.take("ended", _stage_ends, ()),
            last=reader.take("last", optional(_decision), None),
            nodes=reader.take("nodes", _node_records, {}),
        )
        reader.finish()
        return state


# ---------------------------------------------------------------------- helpers


_PHASE_NAMES: Final = frozenset(get_args(NodePhase))


def _stage_ends(name: str, value: Any) -> tuple[StageEnd, ...]:
    if not isinstance(value, list) or len(value) > 1000:
        raise _F.fail(name, "must be a list of stage ends", value)
    check = _F.choice(StageEnd)
    return tuple(check(f"{name}[{i}]", item) for i, item in enumerate(value))


_TRACK_NAMES: Final = frozenset(get_args(Track))


def stored_record(
    name: str,
    *,
    stage: int | None,
    rank: int,
    stratum: str,
    previous: str | None,
    since: datetime,
    phase: str,
    track: str,
    shadowing: bool,
    touched: bool,
    started_at: datetime | None,
    reason: str,
) -> NodeRecord:
    """A node record from typed stored columns (a `rollout_nodes` row), as `from_dict`
    would read its document: what the columns' types do not already say (phase, track, a
    time zone on each time) is checked, a bad one named. A 10,000-node rollout is read
    every tick: through documents, the round trip cost more than the query."""
    if phase not in _PHASE_NAMES:
        raise _F.fail(f"{name}.phase", f"must be one of {', '.join(sorted(_PHASE_NAMES))}", phase)
    if track not in _TRACK_NAMES:
        raise _F.fail(f"{name}.track", f"must be one of {', '.join(sorted(_TRACK_NAMES))}", track)
    return NodeRecord(
        stage=stage,
        rank=rank,
        stratum=stratum,
        previous=previous,
        since=_aware_named(f"{name}.since", since),
        phase=phase,  # type: ignore[arg-type]  # checked above
        track=track,  # type: ignore[arg-type]  # checked above
        shadowing=bool(shadowing),
        touched=bool(touched),
        started_at=None if started_at is None else _aware_named(f"{name}.started_at", started_at),
        reason=reason,
    )


def phase_counts(nodes: Mapping[str, NodeRecord]) -> dict[str, int]:
    counts: Counter[str] = Counter(r.phase for r in nodes.values())
    return dict(counts)


def aware(now: datetime) -> datetime:
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise _F.fail("now", "must be a timezone-aware datetime", now)
    return now.astimezone(UTC)


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def plain(value: Any) -> Any:
    """A JSON-ready copy: mappings and sequences as dicts and lists, non-finite numbers as
    None, anything else unknown as its text."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


# ----------------------------------------------------------- reading it back


def _time(name: str, value: Any) -> datetime:
    text = _F.to_str(name, value)
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise _F.fail(name, "must be an ISO 8601 time", text) from exc
    return _aware_named(name, at)


def _aware_named(name: str, at: datetime) -> datetime:
    if at.tzinfo is None:
        raise _F.fail(name, "must carry a time zone", at.isoformat())
    return at.astimezone(UTC)


def _strings(name: str, value: Any) -> tuple[str, ...]:
    return tuple(_F.to_str(f"{name}[{i}]", v) for i, v in enumerate(_list(name, value)))


def _list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _F.fail(name, "must be a list", value)
    return value


def _stage_index(spec: RolloutSpec) -> Callable[[str, Any], int]:
    def convert(name: str, value: Any) -> int:
        _F.check_int(name, value, 0, spec.stages.count - 1)
        return int(value)

    return convert


def _starts(name: str, value: Any) -> tuple[tuple[datetime, int], ...]:
    out: list[tuple[datetime, int]] = []
    for i, item in enumerate(_list(name, value)):
        pair = _list(f"{name}[{i}]", item)
        if len(pair) != 2:
            raise _F.fail(f"{name}[{i}]", "must be [time, count]", pair)
        out.append((_time(f"{name}[{i}]", pair[0]), _F.to_int(f"{name}[{i}]", pair[1])))
    return tuple(out)


def _pause(name: str, value: Any) -> Pause:
    reader = _F.reader(name, value)
    pause = Pause(
        kind=reader.require("kind", _F.choice(PauseKind)),
        reason=reader.require("reason", _F.to_str),
        resume_to=reader.require("resume_to", _F.choice(RolloutStatus)),
        since=reader.require("since", _time),
    )
    reader.finish()
    return pause


def _decision(name: str, value: Any) -> Decision:
    reader = _F.reader(name, value)
    no_numbers: dict[str, Any] = {}
    numbers = reader.take("numbers", _mapping, no_numbers)
    decision = Decision(
        at=reader.require("at", _time),
        rollout_id=reader.require("rollout_id", _F.to_str),
        kind=reader.require("kind", _F.to_str),
        stage=reader.require("stage", _F.to_int),
        text=reader.require("text", _F.to_str),
        numbers=MappingProxyType(dict(numbers)),
    )
    reader.finish()
    return decision


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _F.fail(name, "must be a mapping", value)
    return dict(value)


def _node_records(name: str, value: Any) -> dict[str, NodeRecord]:
    if not isinstance(value, Mapping):
        raise _F.fail(name, "must be a mapping of node id to record", value)
    return {_F.to_str(name, k): _node_record(f"{name}.{k}", v) for k, v in value.items()}


def _node_record(name: str, value: Any) -> NodeRecord:
    reader = _F.reader(name, value)
    record = NodeRecord(
        stage=reader.require("stage", optional(_F.to_int)),
        rank=reader.require("rank", _F.to_int),
        stratum=reader.require("stratum", _F.to_str),
        previous=reader.require("previous", optional(_F.to_str)),
        since=reader.require("since", _time),
        phase=reader.require("phase", _F.choice(NodePhase)),
        track=reader.require("track", _F.choice(Track)),
        shadowing=reader.require("shadowing", _F.to_bool),
        touched=reader.require("touched", _F.to_bool),
        started_at=reader.require("started_at", optional(_time)),
        reason=reader.require("reason", _F.to_str),
    )
    reader.finish()
    return record
