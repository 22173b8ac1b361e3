"""A small IoU tracker for detections that come without a track id (ADR 0038).

Line crossing and dwell need to know that the box in this frame is the object of the last
one. Cameras with their own tracker send ids; the node's own detections (and cheap
cameras') do not, so :class:`IouTracker` gives them ids: per source and class, greedy
matching on IoU (best pairs first), then on centre distance for what is left (fast, small
objects at a low frame rate overlap nothing), a new track for anything unmatched. A track
gets an id once it was seen ``min_hits`` times (a one-frame ghost never gets one), and is
evicted when not seen for ``lost_after_s`` of event time or when ``max_tracks`` are held
(the least recently seen goes). Ids are ``n<counter>`` per source, so the same frames in
the same order get the same ids: it must be fed in event-time order (after the aligner).

Not here: appearance, motion models or re-identification (a SORT/ByteTrack Kalman filter
is the next step if IoU proves too weak; see the ADR).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from edge_node.aggregation.model import Box, Detection

__all__ = ["IouTracker", "TrackerConfig", "TrackerStats", "iou"]

_UNSET: Final = -1


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    iou_threshold: float = 0.3
    # A box whose centre moved at most this far (normalised) still continues the track.
    max_centre_distance: float = 0.05
    min_hits: int = 1
    lost_after_s: float = 2.0
    max_tracks: int = 256  # per source
    max_sources: int = 1_000


@dataclass(slots=True)
class TrackerStats:
    tracks_started: int = 0
    tracks_lost: int = 0
    # Evicted because max_tracks were held.
    tracks_evicted: int = 0
    sources_refused: int = 0


@dataclass(slots=True)
class _Track:
    number: int
    class_name: str
    box: Box
    last_seen: float
    hits: int = 1


@dataclass(slots=True)
class _SourceTracks:
    counter: int = 0
    tracks: list[_Track] = field(default_factory=list)


def iou(a: Box, b: Box) -> float:
    w = min(a.x2, b.x2) - max(a.x1, b.x1)
    if w <= 0.0:
        return 0.0
    h = min(a.y2, b.y2) - max(a.y1, b.y1)
    if h <= 0.0:
        return 0.0
    inter = w * h
    union = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter
    return inter / union if union > 0.0 else 0.0


def _centre_distance(a: Box, b: Box) -> float:
    dx = (a.x1 + a.x2 - b.x1 - b.x2) * 0.5
    dy = (a.y1 + a.y2 - b.y1 - b.y2) * 0.5
    return math.hypot(dx, dy)


class IouTracker:
    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self.stats = TrackerStats()
        self._sources: dict[str, _SourceTracks] = {}

    def tracks(self, source: str) -> int:
        held = self._sources.get(source)
        return len(held.tracks) if held else 0

    def assign(
        self, source: str, at: float, detections: tuple[Detection, ...]
    ) -> tuple[Detection, ...]:
        """Fill in track ids of the detections that have none; others pass unchanged."""
        untracked = [i for i, d in enumerate(detections) if d.track_id is None]
        held = self._sources.get(source)
        if held is None:
            if not untracked:
                return detections
            if len(self._sources) >= self.config.max_sources:
                self.stats.sources_refused += 1
                return detections
            held = self._sources[source] = _SourceTracks()
        self._drop_lost(held, at)
        if not untracked:
            return detections
        config = self.config
        tracks = held.tracks
        match: dict[int, _Track] = {}  # detection index -> track
        pairs = []
        for i in untracked:
            detection = detections[i]
            box, name = detection.box, detection.class_name
            for t, track in enumerate(tracks):
                other = track.box
                # Most pairs do not overlap at all: reject them before iou() is called.
                if (
                    track.class_name == name
                    and other.x1 < box.x2
                    and box.x1 < other.x2
                    and other.y1 < box.y2
                    and box.y1 < other.y2
                ):
                    overlap = iou(box, other)
                    if overlap >= config.iou_threshold:
                        pairs.append((overlap, i, t))
        used: set[int] = set()
        for _, i, t in sorted(pairs, key=lambda p: (-p[0], p[1], p[2])):
            if i not in match and t not in used:
                match[i] = tracks[t]
                used.add(t)
        rest = [i for i in untracked if i not in match]
        if rest and len(used) < len(tracks):
            near = [
                (distance, i, t)
                for i in rest
                for t, track in enumerate(tracks)
                if t not in used
                and track.class_name == detections[i].class_name
                and (distance := _centre_distance(detections[i].box, track.box))
                <= config.max_centre_distance
            ]
            for _, i, t in sorted(near):
                if i not in match and t not in used:
                    match[i] = tracks[t]
                    used.add(t)
        out = list(detections)
        for i in untracked:
            detection = detections[i]
            found = match.get(i)
            if found is None:
                held.counter += 1
                found = _Track(held.counter, detection.class_name, detection.box, at)
                self._add(held, found)
            else:
                found.box = detection.box
                found.last_seen = at
                found.hits += 1
            if found.hits >= config.min_hits:
                out[i] = Detection(
                    detection.class_name,
                    detection.score,
                    detection.box,
                    f"n{found.number}",
                    detection.attributes,
                )
        return tuple(out)

    def _add(self, held: _SourceTracks, track: _Track) -> None:
        self.stats.tracks_started += 1
        if len(held.tracks) >= self.config.max_tracks:
            oldest = min(range(len(held.tracks)), key=lambda t: held.tracks[t].last_seen)
            del held.tracks[oldest]
            self.stats.tracks_evicted += 1
        held.tracks.append(track)

    def _drop_lost(self, held: _SourceTracks, at: float) -> None:
        before = at - self.config.lost_after_s
        if any(t.last_seen < before for t in held.tracks):
            kept = [t for t in held.tracks if t.last_seen >= before]
            self.stats.tracks_lost += len(held.tracks) - len(kept)
            held.tracks = kept
