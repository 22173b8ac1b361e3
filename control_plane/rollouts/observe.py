"""What the inventory says about a rollout's nodes, as the controller's `Observations`.

What it is for: the version of the rollout's model each node runs (`running_version`),
a node's stored update status as a `NodeReport` about the candidate (`report_of`), and
the two together for a fleet (`observe`). A status counts only from the director
sequence of the rollout's own assignment on (older ones are about something else); the
watchdog has passed when the node said so (or watches nothing). What it is not for:
reading the database (the service hands it the fleet's `FleetMember`s) or deciding
anything (`machine.py`). Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Protocol

from control_plane.nodes.model import ACTIVE_TARGET, UPDATE
from control_plane.rollouts.machine import NodeReport, Observations, ReportPhase
from control_plane.rollouts.plan import FleetNode
from control_plane.trust.custom import parse_target_path

__all__ = [
    "ObservedNode",
    "fleet_node",
    "observe",
    "report_of",
    "running_version",
    "shadow_report",
    "watchdog_passed",
]

# The node's update phases (edge_node UpdatePhase) as the machine's report phases.
_PHASES: Final[Mapping[str, ReportPhase]] = {
    "downloading": "downloading",
    "verifying": "downloading",
    "self-testing": "activating",
    "active": "active",
    "failed": "failed",
    "reverted": "failed",
}
# The shadow stage's states (a health report's `shadow` section, ADR 0031).
_SHADOW_PHASES: Final[Mapping[str, ReportPhase]] = {
    "downloading": "downloading",
    "self-testing": "activating",
    "running": "active",
    "failed": "failed",
}
# An active status whose watchdog window is still open says so.
_ON_WATCH: Final = ("on watch until", "the agent restarted in the watchdog window")


def _model_version(path: object, model: str) -> tuple[bool, str | None]:
    """(whether `path` names a target of `model`, its version)."""
    if not isinstance(path, str) or not path:
        return False, None
    parsed = parse_target_path(path)
    if parsed is None or parsed.kind != "model" or parsed.model != model:
        return False, None
    return True, parsed.version


def running_version(reported_state: Mapping[str, Any], model: str) -> str | None:
    """The version of `model` the node serves (its active target, which presence keeps
    current between Hellos); None: none, or a target of another model."""
    _, version = _model_version(reported_state.get(ACTIVE_TARGET), model)
    return version


def watchdog_passed(status: Mapping[str, Any]) -> bool:
    """An active status whose watchdog window is over (or that has none)."""
    detail = status.get("detail")
    text = detail if isinstance(detail, str) else ""
    return status.get("phase") == "active" and not text.startswith(_ON_WATCH)


def report_of(
    status: object,
    *,
    model: str,
    version: str,
    since_sequence: int | None,
    samples: bool,
    now: datetime,
) -> NodeReport | None:
    """The node's stored update status as a report about `model` `version`, or None: no
    status, another target, a phase the machine does not know, or a director sequence
    below `since_sequence` (None: the rollout's assignment is not out yet)."""
    if not isinstance(status, Mapping) or since_sequence is None:
        return None
    ours, reported = _model_version(status.get("target_path"), model)
    phase = _PHASES.get(str(status.get("phase")))
    sequence = status.get("director_sequence")
    if not ours or reported != version or phase is None:
        return None
    if not isinstance(sequence, int) or sequence < since_sequence:
        return None
    reason = status.get("reason") or status.get("detail") or ""
    return NodeReport(
        version=version,
        phase=phase,
        # Received no later than now and not before the assignment it answers (its
        # sequence says so): the machine only compares it with the assignment's time.
        at=now,
        watchdog_passed=watchdog_passed(status),
        samples=samples,
        reason=str(reason) if phase == "failed" else "",
    )


def shadow_report(
    section: object,
    *,
    reported_at: datetime,
    model: str,
    version: str,
    started: datetime,
    now: datetime,
) -> NodeReport | None:
    """A health report's `shadow` section as a report about the shadow candidate, or None:
    another candidate, an unknown state, or a report made before the shadow assignment.
    Samples arrive once it runs and has compared frames."""
    if not isinstance(section, Mapping) or reported_at < started:
        return None
    phase = _SHADOW_PHASES.get(str(section.get("state")))
    if section.get("candidate") != f"{model}@{version}" or phase is None:
        return None
    compared = section.get("frames_compared")
    reason = section.get("reason") or section.get("detail") or "the shadow candidate failed"
    return NodeReport(
        version=version,
        phase=phase,
        at=now,
        shadow=True,
        samples=phase == "active" and isinstance(compared, int) and compared > 0,
        reason=str(reason) if phase == "failed" else "",
    )


class ObservedNode(Protocol):
    """What observing reads of a node: a `Node`, or the lighter `FleetMember`."""

    @property
    def id(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def reported_state(self) -> Mapping[str, Any]: ...
    @property
    def online(self) -> bool: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def revoked(self) -> bool: ...


def fleet_node(node: ObservedNode, model: str) -> FleetNode:
    return FleetNode(
        node.id,
        dict(node.labels),
        running_version(node.reported_state or {}, model),
        node.online,
        node.created_at,
    )


def observe(
    nodes: Sequence[ObservedNode],
    *,
    model: str,
    version: str,
    sequences: Mapping[str, int | None],
    sampling: Collection[str],
    now: datetime,
) -> Observations:
    """The fleet for one step: every unrevoked node, and a report for each node in
    `sequences` (the rollout's nodes with an assignment out: from which sequence on a
    status counts); `sampling`: the nodes whose health reports of `version` are fresh."""
    reports: dict[str, NodeReport] = {}
    for node in nodes:
        if node.revoked or node.id not in sequences:
            continue
        report = report_of(
            (node.reported_state or {}).get(UPDATE),
            model=model,
            version=version,
            since_sequence=sequences[node.id],
            samples=node.id in sampling,
            now=now,
        )
        if report is not None:
            reports[node.id] = report
    return Observations(
        tuple(fleet_node(n, model) for n in nodes if not n.revoked),
        reports,
    )
