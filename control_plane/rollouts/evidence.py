"""A stage's health points as the gates' `Samples`: the canaries (or shadow nodes) over the
evaluation window, each with its own series before the update, and the controls over the
same window.

What it is for: `stage_samples` turns the health store's raw points (one per report,
`HealthPoint`s as stored: flat metrics and per-version latency percentiles) into
`gates.Samples`. A canary's series are its points of the candidate since it became
healthy; its baseline is as many of its points of the version it ran before, just before
its assignment. A control's series are its points over the same window, its baseline
the same number before. In the shadow stage a node's series is the candidate's P99
beside it (`shadow_p99_ms`), its baseline the served model's over the same points, and
its agreement counts come from the newest point (the node reports them since the
candidate started), its counters only the frames the candidate was compared on (never
the served model's frames or errors). Where the node timed the served model's bytes the
candidate's way on the same sampled frames (`shadow_reference_p99_ms`, ADR 0031
amendment), that is the baseline instead: the served model's own P99 includes its queue
and its thread pool, which the candidate's CPU time does not. What it is not for: reading
the database (`gates_source.py`) or judging (`gates.py`). Pure: no I/O, no framework (the
gates' data classes only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from typing import Any, Final

from control_plane.health.report import shadow_abs_diff_metric, shadow_cosine_metric
from control_plane.rollouts.gates import Counters, NodeSamples, Samples, ShadowCounts
from control_plane.rollouts.state import RolloutState
from protos.bundle.levels import ABS_DIFF_LEVELS, COSINE_LEVELS

__all__ = ["Point", "p99_s", "stage_samples"]

_KINDS: Final = ("end_to_end", "compute")


@dataclass(frozen=True, slots=True)
class Point:
    """One stored health report of a node: its time, its flat metrics and, of its
    `latency` (per `name@version` and kind, as stored), only what the gates read: each
    label's P99 (`p99_s`), worked out once. A judged node's points are kept between
    evaluations (`gates_source.py`): a map of numbers per point is cheaper to keep, and
    for the garbage collector to walk, than the stored documents."""

    at: datetime
    metrics: Mapping[str, float]
    latency: InitVar[Mapping[str, Any]]
    p99: Mapping[str, float] = field(init=False)

    def __post_init__(self, latency: Mapping[str, Any]) -> None:
        found = {label: v for label, kinds in latency.items() if (v := _p99(kinds)) is not None}
        object.__setattr__(self, "p99", found)


def _p99(kinds: object) -> float | None:
    """One label's P99 in seconds: end to end, else compute; None: neither is usable."""
    if not isinstance(kinds, Mapping):
        return None
    for kind in _KINDS:
        values = kinds.get(kind)
        value = values.get("p99_ms") if isinstance(values, Mapping) else None
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            return float(value) / 1000.0
    return None


def p99_s(point: Point, label: str) -> float | None:
    """The report's P99 of `label` (`name@version`) in seconds: end to end, else compute."""
    return point.p99.get(label)


def _with_p99(points: Iterable[Point], label: str) -> list[tuple[Point, float]]:
    """The points that carry a P99 of `label`, each with it (seconds)."""
    return [(p, v) for p in points if (v := p99_s(p, label)) is not None]


def _metric(point: Point, name: str) -> float | None:
    value = point.metrics.get(name)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _counters(points: Sequence[Point]) -> Counters:
    frames = dropped = errors = restarts = 0
    seconds = 0.0
    uptime: float | None = None
    for p in points:
        frames += int(_metric(p, "frames") or 0)
        dropped += int(_metric(p, "frames_dropped") or 0)
        errors += int(_metric(p, "errors") or 0)
        seconds += max(_metric(p, "window_s") or 0.0, 0.0)
        now = _metric(p, "uptime_s")
        if now is not None and uptime is not None and now < uptime:
            restarts += 1
        uptime = now if now is not None else uptime
    return Counters(
        frames=frames,
        errors=min(errors, frames),
        dropped=dropped,
        restarts=restarts,
        seconds=seconds,
    )


def _rss(points: Sequence[Point], origin: datetime) -> list[tuple[float, float]]:
    out = []
    for p in points:
        rss = _metric(p, "rss_bytes")
        if rss is not None and rss >= 0:
            out.append(((p.at - origin).total_seconds(), rss))
    return out


def _levels(
    point: Point, levels: Sequence[float], metric: Callable[[float], str], frames: int
) -> dict[float, int]:
    """The point's raw frame counts per level (clamped to the frames compared); empty
    unless every level was counted."""
    counts = {level: _metric(point, metric(level)) for level in levels}
    if any(count is None for count in counts.values()):
        return {}
    return {level: min(max(int(count or 0), 0), frames) for level, count in counts.items()}


def _shadow_counts(points: Sequence[Point]) -> ShadowCounts | None:
    """The newest point's agreement figures as counts. The store keeps ratios over the
    frames compared, not box counts: boxes are counted as the frames compared, and a
    matched box's score as agreeing (score agreement is not measured this way). Raw
    frames are counted by the node at fixed levels (`cosine_at_least`, `abs_diff_at_most`);
    a report without those counts has no raw frames to judge."""
    for p in reversed(points):
        frames = int(_metric(p, "shadow_frames_compared") or 0)
        if frames <= 0:
            continue
        top1, recall = _metric(p, "shadow_top1_ratio"), _metric(p, "shadow_recall")
        classified = frames if top1 is not None else 0
        boxes = frames if recall is not None else 0
        matched = round(min(max(recall or 0.0, 0.0), 1.0) * boxes)
        cosine = _levels(p, COSINE_LEVELS, shadow_cosine_metric, frames)
        abs_diff = _levels(p, ABS_DIFF_LEVELS, shadow_abs_diff_metric, frames)
        return ShadowCounts(
            frames=frames,
            classified=classified,
            top1_agreed=round(min(max(top1 or 0.0, 0.0), 1.0) * classified),
            boxes_reference=boxes,
            boxes_matched=matched,
            scores_agreed=matched,
            raw=frames if cosine or abs_diff else 0,
            cosine_at_least=cosine,
            abs_diff_at_most=abs_diff,
        )
    return None


def _canary(
    node_id: str,
    points: Sequence[Point],
    *,
    new: str,
    old: str | None,
    started: datetime,
    healthy: datetime,
    window_start: datetime,
) -> NodeSamples:
    start = max(healthy, window_start)
    after = _with_p99((p for p in points if p.at >= start), new)
    before = [] if old is None else _with_p99((p for p in points if p.at < started), old)
    before = before[-len(after) :] if after else []
    return NodeSamples(
        node_id,
        p99_s=[v for _, v in after],
        baseline_p99_s=[v for _, v in before],
        rss=_rss([p for p, _ in after], window_start),
        counters=_counters([p for p, _ in after]),
    )


def _control(
    node_id: str, points: Sequence[Point], label: str | None, window_start: datetime
) -> NodeSamples:
    if label is None:
        return NodeSamples(node_id)
    paired = _with_p99(points, label)
    within = [(p, v) for p, v in paired if p.at >= window_start]
    before = [(p, v) for p, v in paired if p.at < window_start]
    before = before[-len(within) :] if within else []
    return NodeSamples(
        node_id,
        p99_s=[v for _, v in within],
        baseline_p99_s=[v for _, v in before],
        rss=_rss([p for p, _ in within], window_start),
        counters=_counters([p for p, _ in within]),
    )


def _shadow_baseline_s(point: Point, serving: str | None) -> float | None:
    """What the candidate's P99 is compared with on `point` (seconds): the reference (the
    served model's bytes timed as the candidate is, on the same frames), else the served
    model's own P99 (a node that sends no reference)."""
    reference = _metric(point, "shadow_reference_p99_ms")
    if reference is not None and reference > 0:
        return reference / 1000.0
    return None if serving is None else p99_s(point, serving)


def _shadow(
    node_id: str, points: Sequence[Point], serving: str | None, started: datetime
) -> NodeSamples:
    after = [p for p in points if p.at >= started]
    paired = [
        (shadow, served)
        for p in after
        if (shadow := _metric(p, "shadow_p99_ms")) is not None
        and shadow > 0
        and (served := _shadow_baseline_s(p, serving)) is not None
    ]
    counts = _shadow_counts(after)
    return NodeSamples(
        node_id,
        p99_s=[shadow / 1000.0 for shadow, _ in paired],
        baseline_p99_s=[served for _, served in paired],
        # Only the candidate's own counters: the frames it was compared on. It loaded and
        # passed its self-test, or the node would have failed instead of being judged;
        # the served model's frames and errors are not the candidate's.
        counters=Counters(frames=counts.frames if counts else 0),
        shadow=counts,
    )


def stage_samples(
    state: RolloutState,
    points: Mapping[str, Sequence[Point]],
    versions: Mapping[str, str | None],
    *,
    window_start: datetime,
    now: datetime,
    canaries: Iterable[str],
) -> Samples:
    """The current stage's samples. `points`: each node's points, oldest first;
    `versions`: what each control serves; `canaries`: the stage's judged nodes (healthy
    on the candidate, or on the shadow)."""
    spec = state.spec
    new = f"{spec.model}@{spec.version}"
    shadow = spec.stages.is_shadow(state.stage)
    judged: list[NodeSamples] = []
    ends: list[datetime] = []
    for node_id in canaries:
        record = state.nodes[node_id]
        mine = points.get(node_id, ())
        old = f"{spec.model}@{record.previous}" if record.previous else None
        started = record.started_at or record.since
        if shadow:
            judged.append(_shadow(node_id, mine, old, started))
        else:
            judged.append(
                _canary(
                    node_id,
                    mine,
                    new=new,
                    old=old,
                    started=started,
                    healthy=record.since,
                    window_start=window_start,
                )
            )
        ends.extend(p.at for p in mine[-1:] if p.at >= started)
    controls = (
        []
        if shadow
        else [
            _control(
                node_id,
                points.get(node_id, ()),
                f"{spec.model}@{versions[node_id]}" if versions.get(node_id) else None,
                window_start,
            )
            for node_id in state.controls
        ]
    )
    # No canary has reported since its assignment: the window is now (too few samples),
    # not the window's start (which would read as stale samples).
    end = min(max(ends, default=now), now)
    return Samples(
        window_start=min(window_start, end),
        window_end=end,
        canaries=judged,
        controls=controls,
        stage="shadow" if shadow else "canary",
    )
