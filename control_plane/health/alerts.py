"""Alert rules and their life cycle, in pure Python: what a report or a node's liveness
says about each alert kind, and what that means for the alert already stored.

What it is for: the health processor asks ``conditions(metrics, thresholds)`` for every
new point and ``offline_condition`` for every node, then ``next_step`` for each kind,
and writes what it is told. Not for storage: no I/O, no clock (``now`` comes in).

A condition is *unknown* (``None``) when the report does not carry the number behind
it (an old agent, a box without thermal sensors): unknown never raises nor clears.
A condition may be *holding*: not bad enough to raise, not good enough to clear (the
hysteresis band of ``outbox_near_budget``, between its clear and raise marks); an open
alert stays open through it and nothing new is raised. An operator's clear silences an
alert until its condition is seen to end; only then can the same condition raise a new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from control_plane.health.config import AlertThresholds

__all__ = [
    "ALERT_KINDS",
    "REFUSED_ASSIGNMENT_REASONS",
    "AlertState",
    "Condition",
    "Step",
    "assignment_condition",
    "conditions",
    "next_step",
    "offline_condition",
]

ALERT_KINDS: Final = (
    "node_offline",
    "drift",
    "leak_suspected",
    "memory_headroom_low",
    "throttling",
    "outbox_near_budget",
    "assignment_refused",
)
REPORT_KINDS: Final = (
    "drift",
    "leak_suspected",
    "memory_headroom_low",
    "throttling",
    "outbox_near_budget",
)
REFUSED_ASSIGNMENT_REASONS: Final = frozenset(
    {"stale", "sequence-jump", "unknown-key", "bad-signature"}
)
"""Update-status reasons that mean the director cannot reach the node: its assignments
are refused as stale or unsigned by a key it trusts (a stolen director key, ADR 0045)."""

Step = Literal["raise", "update", "clear", "mark-ended", "none"]


@dataclass(frozen=True, slots=True)
class Condition:
    active: bool
    details: dict[str, Any]
    # Inactive but inside the hysteresis band: an open alert is kept (and updated).
    holding: bool = False


@dataclass(frozen=True, slots=True)
class AlertState:
    """The newest stored alert of one kind for one node."""

    open: bool
    cleared_by_operator: bool
    ended: bool


def offline_condition(*, online: bool, ever_seen: bool, revoked: bool) -> Condition | None:
    """Offline is an alert only for a node that was seen once and is not revoked."""
    if revoked or not ever_seen:
        return Condition(False, {}) if revoked else None
    return Condition(not online, {"online": online})


def assignment_condition(update: object) -> Condition | None:
    """`assignment_refused` from the node's latest update status (`reported_state.update`):
    active while it says the node refused an assignment for a reason in
    `REFUSED_ASSIGNMENT_REASONS`; unknown (None) while the node reported none."""
    if not isinstance(update, Mapping):
        return None
    reason = update.get("reason")
    active = update.get("phase") == "failed" and reason in REFUSED_ASSIGNMENT_REASONS
    if not active:
        return Condition(False, {})
    facts = update.get("facts")
    return Condition(
        True,
        {
            "reason": reason,
            "detail": str(update.get("detail", ""))[:300],
            "director_sequence": update.get("director_sequence"),
            "facts": dict(facts) if isinstance(facts, Mapping) else {},
        },
    )


def conditions(
    metrics: Mapping[str, float], thresholds: AlertThresholds
) -> dict[str, Condition | None]:
    """Each report-driven alert kind's condition in this report (None: not reported)."""
    found: dict[str, Condition | None] = {}

    drift = metrics.get("drift_p99_ratio")
    found["drift"] = (
        None
        if drift is None
        else Condition(
            drift >= thresholds.drift_ratio,
            {"p99_ratio": drift, "threshold": thresholds.drift_ratio},
        )
    )

    flag = metrics.get("leak_suspected")
    slope = metrics.get("rss_slope_mb_per_h")
    limit = thresholds.leak_slope_mb_per_h
    if flag is None and (slope is None or limit is None):
        found["leak_suspected"] = None
    else:
        by_slope = limit is not None and slope is not None and slope >= limit
        found["leak_suspected"] = Condition(
            bool(flag) or by_slope,
            {
                "rss_slope_mb_per_h": slope,
                "node_flag": None if flag is None else bool(flag),
                "threshold_mb_per_h": limit,
                "rss_bytes": metrics.get("rss_bytes"),
            },
        )

    headroom = metrics.get("headroom_ratio")
    found["memory_headroom_low"] = (
        None
        if headroom is None
        else Condition(
            headroom < thresholds.min_headroom_ratio,
            {
                "headroom_ratio": headroom,
                "threshold": thresholds.min_headroom_ratio,
                "rss_bytes": metrics.get("rss_bytes"),
                "memory_budget_bytes": metrics.get("memory_budget_bytes"),
            },
        )
    )

    throttled = metrics.get("throttled")
    found["throttling"] = (
        None
        if throttled is None
        else Condition(
            bool(throttled),
            {
                "throttle_events": metrics.get("throttle_events"),
                "max_temp_c": metrics.get("max_temp_c"),
                "cpu_freq_khz": metrics.get("cpu_freq_khz"),
            },
        )
    )

    found["outbox_near_budget"] = _outbox_condition(metrics, thresholds)
    return found


def _outbox_condition(
    metrics: Mapping[str, float], thresholds: AlertThresholds
) -> Condition | None:
    """Raised at ``outbox_fill_ratio`` or by the node's alarm (events refused, health
    thinned); cleared only below ``outbox_clear_fill_ratio`` with the alarm off. A backlog
    draining past the raise mark while new reports trickle in stays one alert."""
    fill = metrics.get("outbox_fill_ratio")
    alarm = metrics.get("outbox_alarm")
    if fill is None and alarm is None:
        return None
    active = bool(alarm) or (fill is not None and fill >= thresholds.outbox_fill_ratio)
    return Condition(
        active,
        {
            "fill_ratio": fill,
            "threshold": thresholds.outbox_fill_ratio,
            "clear_below": thresholds.outbox_clear_mark,
            "alarm": None if alarm is None else bool(alarm),
            "outbox_bytes": metrics.get("outbox_bytes"),
            "outbox_budget_bytes": metrics.get("outbox_budget_bytes"),
            "outbox_dropped_health": metrics.get("outbox_dropped_health"),
            "outbox_refused_events": metrics.get("outbox_refused_events"),
        },
        holding=not active and fill is not None and fill >= thresholds.outbox_clear_mark,
    )


def next_step(latest: AlertState | None, condition: Condition | None) -> Step:
    """What to do with the newest stored alert of a kind, given the condition now."""
    if condition is None:
        return "none"
    if condition.active:
        if latest is not None and latest.open:
            return "update"
        if latest is not None and latest.cleared_by_operator and not latest.ended:
            return "none"  # silenced by the operator until the condition ends
        return "raise"
    if condition.holding:
        return "update" if latest is not None and latest.open else "none"
    if latest is None:
        return "none"
    if latest.open:
        return "clear"
    if not latest.ended:
        return "mark-ended"
    return "none"
