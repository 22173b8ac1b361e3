"""Small builders for the aggregation's tests: boxes by their anchor, frames, a rule run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from edge_node.aggregation.model import Box, Detection, Event, Observation, Provenance, Sighting
from edge_node.aggregation.rules.base import Rule

PROV = Provenance("device", "people-det", "1.0", "fw-3.2")
PROV_V2 = Provenance("device", "people-det", "1.1", "fw-3.2")
T0 = 1_790_000_000.0


def box_at(x: float, y: float, w: float = 0.1, h: float = 0.2) -> Box:
    """A box whose bottom-centre is (x, y)."""
    return Box(x - w / 2, y - h, x + w / 2, y)


def det(
    x: float,
    y: float,
    track: str | None = "1",
    cls: str = "person",
    score: float = 0.9,
    attributes: Mapping[str, str] | None = None,
) -> Detection:
    return Detection(cls, score, box_at(x, y), track, dict(attributes or {}))


def obs(
    source: str, seq: int, t: float, *detections: Detection, prov: Provenance = PROV
) -> Observation:
    return Observation(source, f"{source}-{seq}", seq, t, tuple(detections), prov)


def sighting(
    source: str, seq: int, t: float, *detections: Detection, prov: Provenance = PROV
) -> Sighting:
    return Sighting(t, obs(source, seq, t, *detections, prov=prov), tuple(detections))


def run(rule: Rule, sightings: Iterable[Sighting], until: float | None = None) -> list[Event]:
    """Feed a rule the way the engine does: advance to each sighting's time, then observe."""
    events: list[Event] = []
    for s in sightings:
        events += rule.advance(s.at)
        events += rule.observe(s)
    if until is not None:
        events += rule.advance(until)
    return events


def walk(
    source: str,
    points: Iterable[tuple[float, float]],
    track: str | None = "1",
    fps: float = 10.0,
    start: float = T0,
    cls: str = "person",
    first_seq: int = 1,
) -> list[Sighting]:
    """One object moving through `points`, one frame each at `fps`."""
    return [
        sighting(source, first_seq + i, start + i / fps, det(x, y, track, cls))
        for i, (x, y) in enumerate(points)
    ]
