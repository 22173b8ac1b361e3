"""The aggregation's domain types: what goes in (observations), what comes out (events).

An :class:`Observation` is one camera frame's detections as the aggregation sees them,
whoever produced them: a camera's own model (the device contract, ``device.proto``) or
the node's runtime (``protos.bundle.results.InferenceResult``). The adapters from those
two are not here (they come with the wiring); this module is the seam they target. Times
are float seconds since the UNIX epoch; ``captured_at`` is on the camera's clock, and the
aligner moves it onto the node's. Boxes are normalised to [0, 1], origin top left.

Not here: the rules (``edge_node.aggregation.rules``), the wire form of an event
(``edge_node.aggregation.wire``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from types import MappingProxyType
from typing import Any, Final, Literal

__all__ = [
    "EVENT_NAMESPACE",
    "Box",
    "Detection",
    "Entity",
    "Event",
    "Evidence",
    "Observation",
    "Provenance",
    "Sighting",
    "event_id",
    "make_box",
    "make_detection",
    "make_evidence",
    "make_observation",
    "make_provenance",
    "provenance_of",
]

_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})
_NO_VALUES: Final[Mapping[str, float]] = MappingProxyType({})

# uuid5 namespace of event ids: uuid5(NAMESPACE_URL, "urn:edgefleet:event").
EVENT_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "urn:edgefleet:event")


@dataclass(frozen=True, slots=True)
class Box:
    """``x1 <= x2``, ``y1 <= y2``, in [0, 1] of the frame; origin top left."""

    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True, slots=True)
class Detection:
    """One object in one frame. ``track_id`` is the camera's (or the node tracker's) id,
    stable while the object stays in view; ``None`` when nobody tracked it."""

    class_name: str
    score: float
    box: Box
    track_id: str | None = None
    # e.g. {"plate_text": "AB123CD"}.
    attributes: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True, order=True)
class Provenance:
    """What produced the detections: ``origin`` "device" (a camera's model, with its
    firmware) or "node" (the node's runtime)."""

    origin: Literal["device", "node"]
    model: str
    model_version: str
    firmware: str = ""


@dataclass(frozen=True, slots=True)
class Observation:
    """One frame's results from one source (camera).

    ``observation_id`` is the idempotency id: a resend carries the same one and is
    applied once. ``captured_at`` is on the source's own clock.
    """

    source: str
    observation_id: str
    frame_seq: int
    captured_at: float
    detections: tuple[Detection, ...]
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class Sighting:
    """An observation released by the aligner: ``at`` is its event time on the node's
    clock (``captured_at`` minus the source's clock offset). Rules see only these, in
    ``(at, source, frame_seq, observation_id)`` order."""

    at: float
    observation: Observation
    detections: tuple[Detection, ...]  # after the tracker (track ids filled in)

    @property
    def source(self) -> str:
        return self.observation.source

    def evidence(self) -> Evidence:
        o = self.observation
        return make_evidence(o.source, o.frame_seq, self.at, o.observation_id)


@dataclass(frozen=True, slots=True, order=True)
class Evidence:
    """A frame behind an event: which camera, which frame, when (node clock)."""

    camera: str
    frame_seq: int
    at: float
    observation_id: str


@dataclass(frozen=True, slots=True)
class Entity:
    """Who the event is about: ``kind`` "track" (id is ``camera/track``), "plate" or
    "class" (a count's class)."""

    kind: str
    id: str
    class_name: str = ""
    camera: str = ""


@dataclass(frozen=True, slots=True)
class Event:
    """Something an operator cares about. ``event_id`` is a function of the rule and the
    facts behind the event (never of the arrival order or the wall clock), so a replay of
    the same input is the same event, which the outbox and the event store drop."""

    event_id: str
    type: str
    rule_id: str
    at: float
    entities: tuple[Entity, ...]
    evidence: tuple[Evidence, ...]
    provenance: tuple[Provenance, ...]
    attributes: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    values: Mapping[str, float] = field(default_factory=lambda: _NO_VALUES)


# ----------------------------------------------------------------- fast construction
#
# A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (a
# global lookup, an attribute lookup and a generic call per field): about 1 µs for a
# `Box`, 2 µs a detection, a third of the intake's CPU per result in bench.device_events.
# On the hot paths (the device intake, `Sighting.evidence`) these build the same objects
# by setting the slots through their descriptors, which skips the frozen ``__setattr__``
# the same way the generated ``__init__`` does; no checks, no defaults: every field is
# given, in declaration order. The objects are the types themselves, so equality, hash,
# order and immutability (``FrozenInstanceError`` on assignment) are unchanged.

_new = object.__new__


def _setters(cls: type, *names: str) -> tuple[Any, ...]:
    fields = tuple(f.name for f in dataclass_fields(cls))
    if fields != names:  # a field added to the type must be added here too
        raise TypeError(f"{cls.__name__}: fast construction of {names}, fields are {fields}")
    return tuple(cls.__dict__[name].__set__ for name in names)


_BOX = _setters(Box, "x1", "y1", "x2", "y2")
_DETECTION = _setters(Detection, "class_name", "score", "box", "track_id", "attributes")
_PROVENANCE = _setters(Provenance, "origin", "model", "model_version", "firmware")
_OBSERVATION = _setters(
    Observation,
    "source",
    "observation_id",
    "frame_seq",
    "captured_at",
    "detections",
    "provenance",
)
_EVIDENCE = _setters(Evidence, "camera", "frame_seq", "at", "observation_id")


def make_box(x1: float, y1: float, x2: float, y2: float, _s: tuple[Any, ...] = _BOX) -> Box:
    """``Box(x1, y1, x2, y2)``, faster (see above)."""
    box: Box = _new(Box)
    _s[0](box, x1)
    _s[1](box, y1)
    _s[2](box, x2)
    _s[3](box, y2)
    return box


def make_detection(
    class_name: str,
    score: float,
    box: Box,
    track_id: str | None,
    attributes: Mapping[str, str],
    _s: tuple[Any, ...] = _DETECTION,
) -> Detection:
    """``Detection(class_name, score, box, track_id, attributes)``, faster (see above)."""
    detection: Detection = _new(Detection)
    _s[0](detection, class_name)
    _s[1](detection, score)
    _s[2](detection, box)
    _s[3](detection, track_id)
    _s[4](detection, attributes)
    return detection


def make_provenance(
    origin: Literal["device", "node"],
    model: str,
    model_version: str,
    firmware: str,
    _s: tuple[Any, ...] = _PROVENANCE,
) -> Provenance:
    """``Provenance(origin, model, model_version, firmware)``, faster (see above)."""
    provenance: Provenance = _new(Provenance)
    _s[0](provenance, origin)
    _s[1](provenance, model)
    _s[2](provenance, model_version)
    _s[3](provenance, firmware)
    return provenance


def make_observation(
    source: str,
    observation_id: str,
    frame_seq: int,
    captured_at: float,
    detections: tuple[Detection, ...],
    provenance: Provenance,
    _s: tuple[Any, ...] = _OBSERVATION,
) -> Observation:
    """``Observation(...)`` with every field, in order, faster (see above)."""
    observation: Observation = _new(Observation)
    _s[0](observation, source)
    _s[1](observation, observation_id)
    _s[2](observation, frame_seq)
    _s[3](observation, captured_at)
    _s[4](observation, detections)
    _s[5](observation, provenance)
    return observation


def make_evidence(
    camera: str, frame_seq: int, at: float, observation_id: str, _s: tuple[Any, ...] = _EVIDENCE
) -> Evidence:
    """``Evidence(camera, frame_seq, at, observation_id)``, faster (see above)."""
    evidence: Evidence = _new(Evidence)
    _s[0](evidence, camera)
    _s[1](evidence, frame_seq)
    _s[2](evidence, at)
    _s[3](evidence, observation_id)
    return evidence


def event_id(rule_id: str, event_type: str, *key: object) -> str:
    """The deterministic id: uuid5 over the rule, the type and the event's key facts."""
    name = "\x1f".join((rule_id, event_type, *(_key_part(k) for k in key)))
    return str(uuid.uuid5(EVENT_NAMESPACE, name))


def _key_part(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6f}"  # microseconds: what the wire's Timestamp keeps
    return str(value)


def provenance_of(sightings: Iterable[Sighting]) -> tuple[Provenance, ...]:
    """The distinct producers behind some sightings, sorted (stable across replays)."""
    return tuple(sorted({s.observation.provenance for s in sightings}))
