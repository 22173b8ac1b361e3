"""Which nodes a rollout takes, in which stage, and which nodes it compares them with.

What it is for: `dry_run(spec, nodes)` → a `Plan` (`--dry-run` prints its `summary()`;
the controller starts from the same plan): the nodes the selector matches, spread across
the values of the spec's `spread` labels (a stratified round-robin, so a stage of three
over three sites takes one per site), deterministic given a seed; each canary stage's
control group (matched nodes still on the old version, as many per stratum as the stage
has canaries there, filled up to `MIN_CONTROLS` from the nearest other strata; a warning
for a stage that still has fewer); where a node that enrols later belongs (`Plan.stage_of`
on the fleet as it is then); and `conflicts` with other active rollouts of the same model.
What it is not for: time, phases or actions (`machine.py`). Pure: no I/O, no framework.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from control_plane.errors import ConflictError
from control_plane.rollouts.spec import RolloutSpec
from control_plane.text import counted

__all__ = [
    "MIN_CONTROLS",
    "Candidate",
    "Conflict",
    "Controls",
    "FleetNode",
    "Plan",
    "StagePlan",
    "choose_controls",
    "conflicts",
    "dry_run",
    "pick_controls",
    "refuse_conflicts",
    "spread_order",
    "stratum_of",
]

_SHOWN: Final = 10  # node ids a summary line names before "+N more"


@dataclass(frozen=True, slots=True)
class FleetNode:
    """A fleet's node as planning sees it: `version` is the version of the rollout's model
    it runs (None: none)."""

    id: str
    labels: Mapping[str, str]
    version: str | None
    online: bool = True
    enrolled_at: datetime | None = None


def stratum_of(labels: Mapping[str, str], spread: Sequence[str]) -> str:
    """`site=a,hardware=x` (`site=` when the node has no `site` label)."""
    return ",".join(f"{key}={labels.get(key, '')}" for key in spread)


def _digest(seed: str, text: str) -> bytes:
    return hashlib.sha256(f"{seed}\n{text}".encode()).digest()


def spread_order(nodes: Sequence[FleetNode], spread: Sequence[str], seed: str) -> list[FleetNode]:
    """The order stages take nodes in: round-robin over the values of `spread[0]` (in an
    order drawn from the seed), each value's nodes ordered the same way by `spread[1:]`;
    within one stratum online nodes first, then by a hash of seed and node id."""
    if not spread:
        return sorted(nodes, key=lambda n: (not n.online, _digest(seed, n.id)))
    key, rest = spread[0], spread[1:]
    groups: dict[str, list[FleetNode]] = {}
    for node in nodes:
        groups.setdefault(node.labels.get(key, ""), []).append(node)
    ordered = [
        spread_order(groups[value], rest, seed)
        for value in sorted(groups, key=lambda v: _digest(seed, f"{key}={v}"))
    ]
    out: list[FleetNode] = []
    for i in range(max((len(g) for g in ordered), default=0)):
        out.extend(group[i] for group in ordered if i < len(group))
    return out


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that could be a control: still on the old version, outside the stage."""

    node_id: str
    stratum: str
    online: bool
    rank: int  # its place in the spread order: the last to be updated are chosen first


MIN_CONTROLS: Final = 3
"""Controls a stage gets at least (the default gates compare with no fewer: a first stage of
one canary still has a control group to be judged against)."""


@dataclass(frozen=True, slots=True)
class Controls:
    """A stage's control group: `matched`, from the canaries' own strata; `filled`, from
    the nearest other strata, when those held too few to reach `MIN_CONTROLS`."""

    matched: tuple[str, ...]
    filled: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return self.matched + self.filled


def _nearness(stratum: str, other: str) -> tuple[int, tuple[bool, ...]]:
    """How alike two strata are: how many spread labels they share, then which, the later
    ones first (with `site,hardware`: the same hardware elsewhere before another hardware
    at the same site: what a node is says more about its numbers than where it is)."""
    same = tuple(a == b for a, b in zip(stratum.split(","), other.split(","), strict=False))
    return sum(same), tuple(reversed(same))


def choose_controls(canary_strata: Mapping[str, int], pool: Iterable[Candidate]) -> Controls:
    """As many controls per stratum as the stage has canaries there, and at least
    `MIN_CONTROLS` in all (shared out over the strata by their canaries); online ones and
    those updated last first (so one control group serves as many stages as it can). When
    the canaries' strata hold too few (one node per site), the rest up to `MIN_CONTROLS`
    come from the nearest other strata (`_nearness` to the nearest canary stratum)."""
    total = sum(n for n in canary_strata.values() if n > 0)
    if total == 0:
        return Controls(())
    candidates = list(pool)
    by_stratum: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        if canary_strata.get(candidate.stratum, 0) > 0:
            by_stratum.setdefault(candidate.stratum, []).append(candidate)
    matched: list[str] = []
    for stratum in sorted(by_stratum):
        count = canary_strata[stratum]
        wanted = max(count, math.ceil(MIN_CONTROLS * count / total))
        ranked = sorted(by_stratum[stratum], key=lambda c: (not c.online, -c.rank, c.node_id))
        matched.extend(c.node_id for c in ranked[:wanted])
    short = MIN_CONTROLS - len(matched)
    if short <= 0:
        return Controls(tuple(matched))
    taken = set(matched)
    strata = sorted(s for s, n in canary_strata.items() if n > 0)

    def key(c: Candidate) -> tuple[Any, ...]:
        count, which = max(_nearness(c.stratum, s) for s in strata)
        return (-count, tuple(not w for w in which), not c.online, -c.rank, c.node_id)

    rest = sorted((c for c in candidates if c.node_id not in taken), key=key)
    return Controls(tuple(matched), tuple(c.node_id for c in rest[:short]))


def pick_controls(canary_strata: Mapping[str, int], pool: Iterable[Candidate]) -> tuple[str, ...]:
    """`choose_controls`' nodes, the matched ones first."""
    return choose_controls(canary_strata, pool).all


@dataclass(frozen=True, slots=True)
class StagePlan:
    index: int
    label: str
    shadow: bool
    target: int
    """Canary stage: nodes on the candidate once it has started (cumulative); shadow: its
    nodes."""
    nodes: tuple[str, ...]
    """The nodes this stage adds (shadow: the shadow nodes), in the order they start."""
    controls: tuple[str, ...]
    """Matched first, then `filled`."""
    filled: tuple[str, ...] = ()
    """The controls from other strata than the canaries' (too few there)."""
    remaining: int = 0
    """Nodes left on the old version during the stage (controls come from these)."""

    @property
    def short_of_controls(self) -> bool:
        """Fewer than `MIN_CONTROLS` controls though nodes stay on the old version (at
        100 % there is nobody to compare with: not a shortage)."""
        return not self.shadow and self.remaining > 0 and len(self.controls) < MIN_CONTROLS


@dataclass(frozen=True, slots=True)
class Plan:
    spec: RolloutSpec
    seed: str
    order: tuple[str, ...]
    """Matched nodes not yet on the candidate, in the order the stages take them."""
    already: tuple[str, ...]
    """Matched nodes already running the candidate: nothing to do."""
    stages: tuple[StagePlan, ...]
    strata: Mapping[str, str]
    """node id → its stratum, for every node of `order`."""
    stage_index: Mapping[str, int]
    """node id → the canary stage that takes it; nodes past a partial rollout's last
    stage are absent."""

    def stage_of(self, node_id: str) -> int | None:
        return self.stage_index.get(node_id)

    @property
    def shadow_nodes(self) -> tuple[str, ...]:
        return self.stages[0].nodes if self.spec.stages.shadow is not None else ()

    @property
    def outside(self) -> tuple[str, ...]:
        """Nodes no stage takes (a partial rollout's remainder)."""
        return tuple(n for n in self.order if n not in self.stage_index)

    def warnings(self) -> tuple[str, ...]:
        """A line per canary stage with fewer than `MIN_CONTROLS` controls (`--control
        none` asks for none: no warning), saying what to do about it."""
        if self.spec.control == "none":
            return ()
        return tuple(
            f"warning: {stage.label} has {counted(len(stage.controls), 'control')}, fewer than "
            f"{MIN_CONTROLS}: the gates "
            "that compare with controls stay inconclusive; select more nodes, take fewer in "
            "this stage, or --control none (judge the canaries by their own baseline only)"
            for stage in self.stages
            if stage.short_of_controls
        )

    def summary(self) -> str:
        """What `--dry-run` prints: the spec, then each stage's nodes and controls."""
        spread = ", ".join(self.spec.spread) or "nothing"
        counts: dict[str, int] = {}
        for stratum in self.strata.values():
            counts[stratum] = counts.get(stratum, 0) + 1
        lines = [
            self.spec.summary(),
            f"matched {counted(len(self.order) + len(self.already), 'node')}: {len(self.order)} to "
            f"update, {len(self.already)} already on {self.spec.version}",
            f"spread over {spread}: "
            + (", ".join(f"{_shown(s)} {n}" for s, n in sorted(counts.items())) or "no nodes"),
        ]
        for stage in self.stages:
            if stage.shadow:
                runs = "runs it beside its" if len(stage.nodes) == 1 else "run it beside their"
                what = f"{counted(len(stage.nodes), 'node')} {runs} model: {_ids(stage.nodes)}"
            else:
                what = (
                    f"+{len(stage.nodes)} → {stage.target} of {len(self.order)}: "
                    f"{_ids(stage.nodes)}; controls: {_ids(stage.controls) or 'none'}"
                )
                if stage.filled and stage.filled == stage.controls:
                    what += " (all from other strata: none left in the canaries' own)"
                elif stage.filled:
                    what += f" ({len(stage.filled)} from other strata: {_ids(stage.filled)})"
            lines.append(f"{stage.label}: {what}")
        if self.outside:
            lines.append(f"left on their version (partial): {_ids(self.outside)}")
        lines.extend(self.warnings())
        return "\n".join(lines)


def _shown(stratum: str) -> str:
    """A stratum for people: `site=east,hardware=(none)` for a node without `hardware`."""
    if not stratum:
        return "-"
    return ",".join(part + "(none)" if part.endswith("=") else part for part in stratum.split(","))


def _ids(ids: Sequence[str]) -> str:
    shown = " ".join(ids[:_SHOWN])
    return shown + (f" +{len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")


def dry_run(spec: RolloutSpec, nodes: Sequence[FleetNode], *, seed: str | None = None) -> Plan:
    """The plan for the fleet's `nodes` as they are now (revoked nodes left out by the
    caller); `seed` defaults to the spec's, so a dry run shows what a rollout created from
    the same spec with the same seed will do."""
    seed = spec.seed if seed is None else seed
    matched = [n for n in nodes if spec.selector.matches(n.labels)]
    already = tuple(sorted(n.id for n in matched if n.version == spec.version))
    order = spread_order([n for n in matched if n.version != spec.version], spec.spread, seed)
    strata = {n.id: stratum_of(n.labels, spec.spread) for n in order}
    stages = spec.stages
    targets = stages.targets(len(order))
    first = stages.first_canary()
    stage_index: dict[str, int] = {}
    step = 0
    for rank, node in enumerate(order):
        while step < len(targets) and rank >= targets[step]:
            step += 1
        if step == len(targets):
            break
        stage_index[node.id] = first + step
    plans: list[StagePlan] = []
    if stages.shadow is not None:
        # Shadow nodes compare the candidate with what they serve: they must serve one.
        serving = [n.id for n in order if n.version is not None]
        shadow = tuple(serving[: stages.shadow.of(len(order))])
        plans.append(StagePlan(0, stages.label(0), True, len(shadow), shadow, ()))
    by_id = {n.id: (rank, n) for rank, n in enumerate(order)}
    for step, target in enumerate(targets):
        index = first + step
        added = tuple(n for n, i in stage_index.items() if i == index)
        controls = _stage_controls(spec, strata, stage_index, by_id, index)
        plans.append(
            StagePlan(
                index,
                stages.label(index),
                False,
                target,
                added,
                controls.all,
                controls.filled,
                len(order) - target,
            )
        )
    return Plan(spec, seed, tuple(n.id for n in order), already, tuple(plans), strata, stage_index)


def _stage_controls(
    spec: RolloutSpec,
    strata: Mapping[str, str],
    stage_index: Mapping[str, int],
    by_id: Mapping[str, tuple[int, FleetNode]],
    index: int,
) -> Controls:
    if spec.control == "none":
        return Controls(())
    canaries: dict[str, int] = {}
    for node_id, i in stage_index.items():
        if i <= index:
            canaries[strata[node_id]] = canaries.get(strata[node_id], 0) + 1
    pool = (
        Candidate(node_id, strata[node_id], node.online, rank)
        for node_id, (rank, node) in by_id.items()
        if node.version is not None and stage_index.get(node_id, index + 1) > index
    )
    return choose_controls(canaries, pool)


# ------------------------------------------------------------------------- overlaps


@dataclass(frozen=True, slots=True)
class Conflict:
    """Another active rollout of the same model that can take the same nodes."""

    rollout_id: str
    other: RolloutSpec
    nodes: tuple[str, ...]
    """Nodes both select now (sorted); empty when only a node enrolling later could be."""

    def describe(self) -> str:
        selector = str(self.other.selector) or "every node"
        if self.nodes:
            where = (
                f"already targets {len(self.nodes)} of these "
                f"{'node' if len(self.nodes) == 1 else 'nodes'} ({_ids(self.nodes)})"
            )
        else:
            where = "would also take nodes that enrol later with matching labels"
        return (
            f"rollout {self.rollout_id} ({self.other.model} {self.other.version}, "
            f"{selector}) {where}"
        )


def conflicts(
    spec: RolloutSpec, others: Mapping[str, RolloutSpec], nodes: Sequence[FleetNode]
) -> tuple[Conflict, ...]:
    """The active rollouts (`others`, by id) of the same fleet and model whose selectors
    can match a node `spec` matches: one that matches now, or a label map that would match
    both (`site=a` and `hardware=x` overlap; `site=a` and `site=b` do not)."""
    found: list[Conflict] = []
    for rollout_id, other in sorted(others.items()):
        if other.fleet != spec.fleet or other.model != spec.model:
            continue
        if not spec.selector.may_overlap(other.selector):
            continue
        both = tuple(
            sorted(
                n.id
                for n in nodes
                if spec.selector.matches(n.labels) and other.selector.matches(n.labels)
            )
        )
        found.append(Conflict(rollout_id, other, both))
    return tuple(found)


def refuse_conflicts(
    spec: RolloutSpec, others: Mapping[str, RolloutSpec], nodes: Sequence[FleetNode]
) -> None:
    """Raise `ConflictError` naming every conflicting rollout; return when there is none."""
    found = conflicts(spec, others, nodes)
    if found:
        raise ConflictError(
            f"{spec.model} has an active rollout for these nodes: "
            + "; ".join(c.describe() for c in found),
            rollouts=[c.rollout_id for c in found],
            field="selector",
        )
