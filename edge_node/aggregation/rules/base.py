"""What every rule shares: the ``Rule`` protocol, bounded per-track state, zone membership.

A rule is fed in event-time order by the engine: a rule with timers gets ``advance(at)``
before each sighting at ``at`` (so a timer due before a frame fires before the frame is
applied, whatever the batching), then ``observe(sighting)``. Per-track state lives in a
:class:`TrackBook`: a dict in last-seen order (sightings come in time order, so the least
recently seen is first), capped at ``max_entries`` and expired after ``lost_after_s``:
lazily when a key comes back (so the outcome never depends on when ``expire`` ran) and
from the front by ``expire``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from edge_node.aggregation.geometry import Anchor, Polygon, anchor_point, point_in_polygon
from edge_node.aggregation.model import Detection, Event, Evidence, Provenance, Sighting

__all__ = [
    "BookStats",
    "Rule",
    "TrackBook",
    "Visit",
    "ZoneMembership",
    "ZoneVisitConfig",
    "ZoneVisitRule",
    "track_key",
    "wanted",
]


class Rule(Protocol):
    rule_id: str
    # Cameras whose sightings this rule reads; None: every camera.
    cameras: frozenset[str] | None
    # Whether advance() can raise events (a timer): such a rule is advanced before every
    # sighting; one without (its advance only frees state) once per batch.
    has_timers: bool

    def observe(self, sighting: Sighting) -> list[Event]: ...

    def advance(self, at: float) -> list[Event]: ...

    def state_size(self) -> int: ...


def wanted(detection: Detection, classes: frozenset[str] | None, min_score: float) -> bool:
    return (classes is None or detection.class_name in classes) and detection.score >= min_score


def track_key(source: str, detection: Detection) -> str:
    return f"{source}/{detection.track_id}"


@dataclass(slots=True)
class BookStats:
    expired: int = 0
    # Dropped because max_entries were held (the least recently seen first).
    evicted: int = 0


S = TypeVar("S")


@dataclass(slots=True)
class _Entry(Generic[S]):
    last_seen: float
    state: S


class TrackBook(Generic[S]):
    """Per-key state in last-seen order; bounded by time and by count."""

    def __init__(self, lost_after_s: float, max_entries: int) -> None:
        self.lost_after_s = lost_after_s
        self.max_entries = max_entries
        self.stats = BookStats()
        self._entries: dict[str, _Entry[S]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def touch(self, key: str, at: float, new: Callable[[], S]) -> S:
        """The state of `key` (a fresh one if unknown), now the most recently seen."""
        entries = self._entries
        entry = entries.pop(key, None)
        if entry is not None and entry.last_seen < at - self.lost_after_s:
            entry = None
            self.stats.expired += 1
        if entry is None:
            entry = _Entry(at, new())
            if len(entries) >= self.max_entries:
                del entries[next(iter(entries))]
                self.stats.evicted += 1
        entry.last_seen = at
        entries[key] = entry
        return entry.state

    def expire(self, at: float) -> None:
        entries = self._entries
        before = at - self.lost_after_s
        while entries:
            key = next(iter(entries))
            if entries[key].last_seen >= before:
                return
            del entries[key]
            self.stats.expired += 1


@dataclass(slots=True)
class Visit:
    """A track's membership of a zone, with inertia: ``inside`` changes only after
    ``inertia`` consecutive frames say the other thing (Frigate's zone inertia)."""

    inside: bool = False
    streak: int = 0
    # The first frame of the current streak (the visit's start once it is confirmed).
    streak_first: Evidence | None = None
    streak_provenance: set[Provenance] = field(default_factory=set)
    entered: Evidence | None = None  # first frame of the confirmed visit
    fired: bool = False
    # Who produced the frames of the visit (from its first frame on).
    provenance: set[Provenance] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class ZoneMembership:
    polygon: Polygon
    anchor: Anchor
    inertia: int

    def contains(self, detection: Detection) -> bool:
        x, y = anchor_point(detection.box, self.anchor)
        return point_in_polygon(x, y, self.polygon)

    def update(
        self, visit: Visit, inside: bool, evidence: Evidence, provenance: Provenance
    ) -> bool:
        """Apply one frame; True when the visit's state just flipped."""
        if inside == visit.inside:
            visit.streak = 0
            visit.streak_first = None
            if inside:
                visit.provenance.add(provenance)
            return False
        if visit.streak == 0:
            visit.streak_first = evidence
            visit.streak_provenance = {provenance}
        else:
            visit.streak_provenance.add(provenance)
        visit.streak += 1
        if visit.streak < self.inertia:
            return False
        visit.inside = inside
        visit.streak = 0
        visit.entered = visit.streak_first if inside else None
        visit.provenance = visit.streak_provenance if inside else set()
        visit.streak_first = None
        visit.streak_provenance = set()
        visit.fired = False
        return True


class ZoneVisitConfig(Protocol):
    """What a rule over visits of one camera's zone is configured with."""

    @property
    def rule_id(self) -> str: ...
    @property
    def camera(self) -> str: ...
    @property
    def polygon(self) -> Polygon: ...
    @property
    def anchor(self) -> Anchor: ...
    @property
    def inertia(self) -> int: ...
    @property
    def lost_after_s(self) -> float: ...
    @property
    def max_tracks(self) -> int: ...


class ZoneVisitRule:
    """The part zone intrusion and dwell share: one camera, a zone with inertia, a
    :class:`Visit` per track (bounded, expired), untracked detections counted."""

    has_timers = False

    def __init__(self, config: ZoneVisitConfig) -> None:
        self.rule_id = config.rule_id
        self.cameras: frozenset[str] | None = frozenset({config.camera})
        self.zone = ZoneMembership(config.polygon, config.anchor, config.inertia)
        self.visits: TrackBook[Visit] = TrackBook(config.lost_after_s, config.max_tracks)
        self.untracked = 0

    def state_size(self) -> int:
        return len(self.visits)

    def advance(self, at: float) -> list[Event]:
        self.visits.expire(at)
        return []
