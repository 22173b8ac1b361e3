"""The canary gates: from one evaluation window's samples, is the candidate worse than the
version it replaces? ``pass``, ``fail`` or ``inconclusive``, with every number behind it.

What it is for: the statistics of a rollout stage (ADR 0030). Canaries are compared with
control nodes still on the old version over the same window, and each canary with its own
pre-update baseline (paired); counts are judged as rates fit for sparse, mostly-zero data;
RSS trends by Theil-Sen; the shadow stage by output agreement. Too few samples make a gate
``inconclusive``, never ``pass``; a failing statistic becomes ``fail`` only after N failing
evaluations in a row. What it is not for: choosing canaries or controls, deadlines, failure
budgets, what a rollout does with a decision, or reading samples out of the health store.
Pure: numpy and scipy.stats; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple, get_args

import numpy as np
from scipy import stats

from control_plane.errors import InvalidInputError
from protos.bundle.levels import ABS_DIFF_LEVELS, COSINE_LEVELS
from protos.fields import Fields, optional

__all__ = [
    "GATE_NAMES",
    "STAGE_GATES",
    "AgreementGate",
    "CountGate",
    "Counters",
    "Decision",
    "GateResult",
    "GatesSpec",
    "LatencyVsBaselineGate",
    "LatencyVsControlGate",
    "MinSamples",
    "NodeSamples",
    "RateGate",
    "RssSlopeGate",
    "Samples",
    "ShadowCounts",
    "Shift",
    "evaluate",
    "hodges_lehmann",
    "parse_gates",
]

Outcome = Literal["pass", "fail", "inconclusive"]
Stage = Literal["shadow", "canary"]
Number = float | int | bool | str | None
"""A value of `GateResult.numbers`: JSON-safe (a float that is not finite is None)."""

_F: Final = Fields(InvalidInputError)

MAX_NODES: Final = 100_000  # per side of one evaluation
MAX_SERIES: Final = 100_000  # values in one node's series
MAX_PAIRS: Final = 250_000  # pairwise differences behind one Hodges-Lehmann estimate
MAX_RSS_POINTS: Final = 240  # points of one node behind one Theil-Sen slope
MAX_SLOPE_NODES: Final = 200  # nodes per side behind the RSS gate
MAX_STREAK: Final = 100  # the most failing evaluations a gate may wait for
WORST_NODES: Final = 3  # canaries tested one by one (the worst by their point estimate)
MB: Final = 1_000_000
SHORT_OF_DATA: Final = "short_of_data"
"""The key in a gate's numbers that marks an inconclusive answer for want of data that
more time brings (too few samples, too little exposure yet)."""

GATE_NAMES: Final = (
    "latency_vs_control",
    "latency_vs_baseline",
    "rss_slope",
    "self_test",
    "watchdog_reverts",
    "restarts",
    "error_rate",
    "dropped_frames",
    "output_agreement",
)
STAGE_GATES: Final[Mapping[str, tuple[str, ...]]] = {
    # A shadow node serves the old model: only what the candidate did beside it counts.
    "shadow": ("self_test", "latency_vs_baseline", "output_agreement"),
    "canary": GATE_NAMES[:-1],
}


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True, slots=True)
class LatencyVsControlGate:
    """Per-interval P99 of the canaries against the controls' over the same window.

    Fails when the canaries are slower by rank (Mann-Whitney U, one-sided) *and* the
    Hodges-Lehmann shift's interval clears ``shift_tolerance`` of the control median *and*
    the ratio of medians exceeds ``1 + max_increase`` (an effect size of its own); or when
    the tail is wider: more canary intervals above the controls' ``tail_quantile`` than
    chance allows (Fisher exact) *and* the ratio of those quantiles exceeds
    ``1 + max_tail_increase``. ``level_by_baseline``: when every node also reports its
    P99 before the update (controls: over the same earlier span), each node's series is
    first divided by its own level then, so that boxes that differ (cameras, scenes) are
    not read as a shift; the comparison is then of changes, in the controls' units."""

    enabled: bool = True
    max_increase: float = 0.10
    shift_tolerance: float = 0.05
    tail_quantile: float = 0.90
    max_tail_increase: float = 0.25
    level_by_baseline: bool = True
    consecutive_failures: int | None = None  # None: GatesSpec.consecutive_failures

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        _F.to_bool(f"{where}.level_by_baseline", self.level_by_baseline)
        _check_ratio(f"{where}.max_increase", self.max_increase)
        _check_ratio(f"{where}.shift_tolerance", self.shift_tolerance)
        _check_ratio(f"{where}.max_tail_increase", self.max_tail_increase)
        if not 0.5 <= self.tail_quantile <= 0.99:
            raise _F.fail(f"{where}.tail_quantile", "must be in [0.5, 0.99]", self.tail_quantile)


@dataclass(frozen=True, slots=True)
class LatencyVsBaselineGate:
    """Each canary's P99 against its own series before the update (Wilcoxon signed-rank
    of the paired log ratios, pooled and for the worst canaries one by one; in the shadow
    stage the baseline is the active model on the same node over the same window).
    Fails when significant and the median ratio exceeds ``1 + max_increase``."""

    enabled: bool = True
    max_increase: float = 0.10
    consecutive_failures: int | None = None

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        _check_ratio(f"{where}.max_increase", self.max_increase)


@dataclass(frozen=True, slots=True)
class RssSlopeGate:
    """RSS slope per node (Theil-Sen, bytes per hour). Fails when the canaries' slopes rank
    above the controls' (Mann-Whitney U) and their median exceeds the controls' median by
    ``max_increase_bytes_per_hour``, when one canary's interval lies wholly above that,
    or when one canary's interval lies wholly above ``max_bytes_per_hour`` (no control
    needed)."""

    enabled: bool = True
    max_increase_bytes_per_hour: float = 5.0 * MB
    max_bytes_per_hour: float = 20.0 * MB
    consecutive_failures: int | None = None

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        _F.check_positive(f"{where}.max_increase_bytes_per_hour", self.max_increase_bytes_per_hour)
        _F.check_positive(f"{where}.max_bytes_per_hour", self.max_bytes_per_hour)


@dataclass(frozen=True, slots=True)
class RateGate:
    """Events over exposure, canaries against controls: a conditional binomial test of the
    canaries' share of the events given their share of the exposure (widened by the
    controls' overdispersion), never a rank test. Fails when the canaries' rate is
    significantly above ``1 + max_increase`` times the controls' and above ``min_rate``;
    without a control group, when it is significantly above ``min_rate``."""

    enabled: bool = True
    max_increase: float = 0.5
    min_rate: float = 0.001  # per frame (errors, dropped frames) or per node-hour (restarts)
    consecutive_failures: int | None = None

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        _check_ratio(f"{where}.max_increase", self.max_increase)
        _F.check_positive(f"{where}.min_rate", self.min_rate)


@dataclass(frozen=True, slots=True)
class CountGate:
    """Events that should not happen at all (self-test and load failures, watchdog
    reverts), summed over the canaries: fails when more than ``max_count``; at once by
    default, since they are facts rather than noise."""

    enabled: bool = True
    max_count: int = 0
    consecutive_failures: int | None = 1

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        _F.check_int(f"{where}.max_count", self.max_count, 0, 10**9)


@dataclass(frozen=True, slots=True)
class AgreementGate:
    """The shadow stage: how often the candidate agrees with the active model on the same
    frames (top-1 label; boxes IoU-matched: recall, then score agreement of the matched;
    raw outputs: frames whose cosine similarity is at least ``raw_cosine`` and, when
    ``raw_max_abs_diff`` is set, frames whose largest absolute difference is at most it,
    both chosen among the levels the node counts at, `COSINE_LEVELS` and
    `ABS_DIFF_LEVELS`). Fails when an agreement is significantly below its minimum
    (one-sided binomial test), pooled or on one shadow node."""

    enabled: bool = True
    min_top1: float = 0.95
    min_box_recall: float = 0.90
    min_score_agreement: float = 0.90
    raw_cosine: float = 0.999
    min_raw_cosine: float = 0.95
    raw_max_abs_diff: float | None = None
    min_raw_abs_diff: float = 0.95
    consecutive_failures: int | None = None

    def _check(self, where: str) -> None:
        _check_common(where, self.enabled, self.consecutive_failures)
        for name in (
            "min_top1",
            "min_box_recall",
            "min_score_agreement",
            "min_raw_cosine",
            "min_raw_abs_diff",
        ):
            value = getattr(self, name)
            _F.check_fraction(f"{where}.{name}", value)
            if value in (0, 1):
                raise _F.fail(f"{where}.{name}", "must be strictly between 0 and 1", value)
        for name, levels in (("raw_cosine", COSINE_LEVELS), ("raw_max_abs_diff", ABS_DIFF_LEVELS)):
            value = getattr(self, name)
            if value is not None and value not in levels:
                counted = ", ".join(f"{level:g}" for level in levels)
                raise _F.fail(f"{where}.{name}", f"must be one of {counted}", value)


@dataclass(frozen=True, slots=True)
class MinSamples:
    """The least data a gate judges on; below it the gate is inconclusive."""

    latency_intervals: int = 50  # per side (Kayenta's docs ask for 50 per metric)
    control_nodes: int = 3  # control nodes behind a comparison with controls
    baseline_pairs: int = 50  # before/after pairs, all canaries together
    baseline_pairs_per_node: int = 20  # to judge one canary on its own
    rss_points: int = 10  # per node
    rss_span_s: float = 900.0  # per node, first to last point
    frames: int = 1000  # per side (error rate, dropped frames)
    node_hours: float = 0.5  # per side (restarts)
    shadow_frames: int = 200  # compared frames, all shadow nodes together
    shadow_boxes: int = 200  # reference boxes (recall) and matched boxes (scores)

    def _check(self, where: str) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "int":
                _F.check_int(f"{where}.{item.name}", value, 1, 10**9)
            else:
                _F.check_positive(f"{where}.{item.name}", value, 10.0**9)


@dataclass(frozen=True, slots=True)
class GatesSpec:
    """Every gate of a rollout with its thresholds (a gates.yaml, `parse_gates`).

    ``confidence``: of every test (one-sided at ``1 - confidence``) and every interval
    (two-sided). ``consecutive_failures``: failing evaluations in a row before a gate
    fails (a gate may set its own). ``early_fail_p``: below its minimum sample a
    proportion or rate gate may still fail (never pass) when its one-sided p-value is
    below this much stricter level (0 turns it off); the consecutive-failures rule still
    applies. ``max_sample_age_s``: samples whose window ended
    longer ago than this are inconclusive. ``compare_with_control`` false: a rollout
    without a control group; latency is then judged against the baseline only, rates
    against ``min_rate``, RSS against its ceiling. ``require_release_check``: the rollout
    is refused at creation unless the version was pushed with a passed (not forced)
    release check (`model push --baseline`, ADR 0048)."""

    confidence: float = 0.98
    consecutive_failures: int = 3
    early_fail_p: float = 1e-6
    max_sample_age_s: float = 900.0
    compare_with_control: bool = True
    require_release_check: bool = False
    min_samples: MinSamples = MinSamples()
    latency_vs_control: LatencyVsControlGate = LatencyVsControlGate()
    latency_vs_baseline: LatencyVsBaselineGate = LatencyVsBaselineGate()
    rss_slope: RssSlopeGate = RssSlopeGate()
    self_test: CountGate = CountGate()
    watchdog_reverts: CountGate = CountGate()
    restarts: RateGate = RateGate(max_increase=1.0, min_rate=0.5)
    error_rate: RateGate = RateGate(max_increase=0.5, min_rate=0.001)
    dropped_frames: RateGate = RateGate(max_increase=0.5, min_rate=0.01)
    output_agreement: AgreementGate = AgreementGate()

    def __post_init__(self) -> None:
        confidence = self.confidence
        if (
            isinstance(confidence, bool)
            or not isinstance(confidence, int | float)
            or not 0.5 <= confidence < 1
        ):
            raise _F.fail("gates.confidence", "must be a number in [0.5, 1)", confidence)
        _F.check_int("gates.consecutive_failures", self.consecutive_failures, 1, MAX_STREAK)
        early = self.early_fail_p
        if (
            isinstance(early, bool)
            or not isinstance(early, int | float)
            or not 0 <= early <= 1.0 - confidence
        ):
            raise _F.fail(
                "gates.early_fail_p", f"must be a number in [0, {1.0 - confidence:g}]", early
            )
        _F.check_positive("gates.max_sample_age_s", self.max_sample_age_s)
        _F.to_bool("gates.compare_with_control", self.compare_with_control)
        _F.to_bool("gates.require_release_check", self.require_release_check)
        for item in fields(self):
            if item.type not in _SECTIONS:
                continue
            section = getattr(self, item.name)
            if type(section).__name__ != item.type:
                raise _F.fail(f"gates.{item.name}", f"must be a {item.type}", section)
            section._check(f"gates.{item.name}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def required_failures(self, gate: str) -> int:
        """Failing evaluations in a row before `gate` fails."""
        own: int | None = getattr(self, gate).consecutive_failures
        return self.consecutive_failures if own is None else own

    def without_control(self) -> GatesSpec:
        """This spec for a rollout without control nodes."""
        return replace(self, compare_with_control=False)

    def to_dict(self) -> dict[str, Any]:
        """The stored form; `parse_gates` reads it back."""
        return asdict(self)


def _check_common(where: str, enabled: object, consecutive: object) -> None:
    _F.to_bool(f"{where}.enabled", enabled)
    if consecutive is not None:
        _F.check_int(f"{where}.consecutive_failures", consecutive, 1, MAX_STREAK)


def _check_ratio(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 100
    ):
        raise _F.fail(name, "must be a number in [0, 100]", value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _F.fail(name, "must be a finite number", value)
    return float(value)


_CONVERT: Final[Mapping[str, Callable[[str, Any], Any]]] = {
    "bool": _F.to_bool,
    "int": _F.to_int,
    "float": _number,
    "int | None": optional(_F.to_int),
    "float | None": optional(_number),
}
_SECTIONS: Final[Mapping[str, type]] = {
    cls.__name__: cls
    for cls in (
        MinSamples,
        LatencyVsControlGate,
        LatencyVsBaselineGate,
        RssSlopeGate,
        CountGate,
        RateGate,
        AgreementGate,
    )
}


def _read(cls: Any, default: Any, where: str, raw: object) -> Any:
    """A dataclass of plain fields out of a mapping: the keys it names, defaults for the
    rest, unknown keys refused."""
    reader = _F.reader(where, raw)
    values: dict[str, Any] = {}
    for item in fields(cls):
        kind = str(item.type)
        if kind in _CONVERT:
            convert = _CONVERT[kind]
        else:
            section = _SECTIONS[kind]

            def convert(
                name: str, value: Any, section: type = section, key: str = item.name
            ) -> Any:
                return _read(section, getattr(default, key), name, value)

        values[item.name] = reader.take(item.name, convert, getattr(default, item.name))
    reader.finish()
    return cls(**values)


def parse_gates(raw: Mapping[str, Any] | None) -> GatesSpec:
    """A gates.yaml already loaded (None or ``{}``: every default). Each gate is a
    mapping under its name (``error_rate: {max_increase: 1.0}``); what it leaves out keeps
    its default. Unknown keys and bad values raise `InvalidInputError` naming the field
    (``gates.error_rate.max_increase``)."""
    spec: GatesSpec = _read(GatesSpec, GatesSpec(), "gates", {} if raw is None else raw)
    return spec


# ----------------------------------------------------------------------------- samples


@dataclass(frozen=True, slots=True)
class Counters:
    """One node's counters over the window. ``frames``: frames inferred (``errors`` of
    them failed); ``dropped``: frames dropped before inference; ``seconds``: how long the
    counters cover (the exposure of ``restarts``)."""

    frames: int = 0
    errors: int = 0
    dropped: int = 0
    restarts: int = 0
    reverts: int = 0
    self_test_failures: int = 0  # self-test and load failures of the candidate
    seconds: float = 0.0

    def _check(self, where: str) -> None:
        for item in fields(self)[:-1]:
            _F.check_int(f"{where}.{item.name}", getattr(self, item.name), 0, 10**15)
        if self.errors > self.frames:
            raise _F.fail(f"{where}.errors", "must be at most frames", self.errors)
        seconds = self.seconds
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds < math.inf
        ):
            raise _F.fail(f"{where}.seconds", "must be a finite number >= 0", seconds)


@dataclass(frozen=True, slots=True)
class ShadowCounts:
    """One shadow node's comparisons of the candidate with the active model.
    ``classified``: frames with a top-1 label from both (``top1_agreed`` of them the same);
    ``boxes_reference``: the active model's boxes, ``boxes_matched`` of them found by the
    candidate (IoU-matched, same label), ``scores_agreed`` of those with a close score;
    ``raw``: frames of raw outputs compared, ``cosine_at_least`` of them per level of
    `COSINE_LEVELS` (a cosine similarity at least the level) and ``abs_diff_at_most`` per
    level of `ABS_DIFF_LEVELS` (a largest absolute difference at most the level); empty
    when the node did not count them."""

    frames: int = 0
    classified: int = 0
    top1_agreed: int = 0
    boxes_reference: int = 0
    boxes_matched: int = 0
    scores_agreed: int = 0
    raw: int = 0
    cosine_at_least: Mapping[float, int] = field(default_factory=dict)
    abs_diff_at_most: Mapping[float, int] = field(default_factory=dict)

    def _check(self, where: str) -> None:
        for item in fields(self)[:7]:
            _F.check_int(f"{where}.{item.name}", getattr(self, item.name), 0, 10**15)
        for part, whole in (
            ("classified", "frames"),
            ("top1_agreed", "classified"),
            ("boxes_matched", "boxes_reference"),
            ("scores_agreed", "boxes_matched"),
            ("raw", "frames"),
        ):
            if getattr(self, part) > getattr(self, whole):
                raise _F.fail(f"{where}.{part}", f"must be at most {whole}", getattr(self, part))
        for name, levels in (
            ("cosine_at_least", COSINE_LEVELS),
            ("abs_diff_at_most", ABS_DIFF_LEVELS),
        ):
            counts = getattr(self, name)
            if not isinstance(counts, Mapping) or not set(counts) <= set(levels):
                raise _F.fail(f"{where}.{name}", "must map counted levels to counts", counts)
            for level, count in counts.items():
                _F.check_int(f"{where}.{name}[{level:g}]", count, 0, self.raw)


@dataclass(frozen=True, slots=True)
class NodeSamples:
    """One node's samples over the window, in time order. ``p99_s``: P99 latency of each
    interval (seconds); ``baseline_p99_s``: the same before the update (a canary; a
    control's over the same earlier span measures the fleet's drift), or in the shadow
    stage the active model's beside the candidate's; ``rss``: ``(t_s, bytes)`` points."""

    node_id: str
    p99_s: Sequence[float] = ()
    baseline_p99_s: Sequence[float] = ()
    rss: Sequence[tuple[float, float]] = ()
    counters: Counters | None = None
    shadow: ShadowCounts | None = None

    def _check(self, where: str) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise _F.fail(f"{where}.node_id", "must be a non-empty string", self.node_id)
        _check_series(f"{where}.p99_s", self.p99_s)
        _check_series(f"{where}.baseline_p99_s", self.baseline_p99_s)
        _check_rss(f"{where}.rss", self.rss)
        for name, cls in (("counters", Counters), ("shadow", ShadowCounts)):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, cls):
                    raise _F.fail(f"{where}.{name}", f"must be {cls.__name__} or None", value)
                value._check(f"{where}.{name}")


@dataclass(frozen=True, slots=True)
class Samples:
    """One evaluation window: the canaries (or shadow nodes) and the controls."""

    window_start: datetime
    window_end: datetime
    canaries: Sequence[NodeSamples] = ()
    controls: Sequence[NodeSamples] = ()
    stage: Stage = "canary"

    def __post_init__(self) -> None:
        for name in ("window_start", "window_end"):
            value = getattr(self, name)
            if not isinstance(value, datetime) or value.utcoffset() is None:
                raise _F.fail(f"samples.{name}", "must be a datetime with a time zone", value)
        if self.window_start > self.window_end:
            raise _F.fail("samples.window_start", "must not be after window_end", self.window_start)
        _F.check_choice("samples.stage", self.stage, get_args(Stage))
        seen: set[str] = set()
        for side in ("canaries", "controls"):
            nodes = getattr(self, side)
            if isinstance(nodes, str | bytes) or not isinstance(nodes, Sequence):
                raise _F.fail(f"samples.{side}", "must be a list of NodeSamples", nodes)
            if len(nodes) > MAX_NODES:
                raise _F.fail(f"samples.{side}", f"at most {MAX_NODES} nodes", len(nodes))
            for index, node in enumerate(nodes):
                where = f"samples.{side}[{index}]"
                if not isinstance(node, NodeSamples):
                    raise _F.fail(where, "must be NodeSamples", node)
                node._check(where)
                if node.node_id in seen:
                    raise _F.fail(f"{where}.node_id", "appears twice", node.node_id)
                seen.add(node.node_id)


def _check_series(where: str, values: object) -> None:
    array = _array(where, values, "must be a list of numbers", "values")
    if array is None:
        return
    if array.ndim != 1:
        raise _F.fail(where, "must be a list of numbers", values)
    bad = ~(np.isfinite(array) & (array > 0))
    if bad.any():
        index = int(np.argmax(bad))
        raise _F.fail(f"{where}[{index}]", "must be a finite number > 0", array[index])


def _check_rss(where: str, points: object) -> None:
    message = "must be a list of [t_s, bytes] pairs"
    array = _array(where, points, message, "points")
    if array is None:
        return
    if array.ndim != 2 or array.shape[1] != 2:
        raise _F.fail(where, message, points)
    bad = ~(np.isfinite(array).all(axis=1) & (array[:, 1] >= 0))
    if bad.any():
        index = int(np.argmax(bad))
        raise _F.fail(f"{where}[{index}]", "must be finite, bytes >= 0", array[index].tolist())


def _array(where: str, values: object, message: str, noun: str) -> np.ndarray | None:
    """A bounded list of numbers as floats (None when empty); strings, booleans and None
    are refused, not converted."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise _F.fail(where, message, values)
    if len(values) > MAX_SERIES:
        raise _F.fail(where, f"at most {MAX_SERIES} {noun}", len(values))
    if not values:
        return None
    try:
        array = np.asarray(values)
    except ValueError:  # ragged
        raise _F.fail(where, message, values) from None
    if array.dtype.kind not in "iuf":
        raise _F.fail(where, message, values)
    return array.astype(np.float64, copy=False)


# ----------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class GateResult:
    """One gate's answer. ``failing``: this evaluation's statistics failed (the outcome is
    ``fail`` only once ``consecutive_failures`` reaches ``required_failures``);
    ``numbers``: everything behind it (n per side, statistic, p-value, shift and its
    interval, effect size, thresholds)."""

    name: str
    outcome: Outcome
    failing: bool
    consecutive_failures: int
    required_failures: int
    reason: str
    numbers: Mapping[str, Number]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "failing": self.failing,
            "consecutive_failures": self.consecutive_failures,
            "required_failures": self.required_failures,
            "reason": self.reason,
            "numbers": {key: _json_number(value) for key, value in self.numbers.items()},
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of one evaluation: fail if a gate failed, else inconclusive if one is
    (or none applies), else pass."""

    outcome: Outcome
    evaluated_at: datetime
    stage: Stage
    window_start: datetime
    window_end: datetime
    gates: tuple[GateResult, ...]

    @property
    def consecutive_failures(self) -> int:
        """The longest run of failing evaluations among the gates, this one included."""
        return max((gate.consecutive_failures for gate in self.gates), default=0)

    def gate(self, name: str) -> GateResult | None:
        return next((gate for gate in self.gates if gate.name == name), None)

    @property
    def waiting_for_data(self) -> str:
        """Why an inconclusive decision needs only more time ("" when something else is
        missing): every inconclusive gate is short of data (`SHORT_OF_DATA`) or on its way
        to ``required_failures`` failing evaluations."""
        if self.outcome != "inconclusive" or not self.gates:
            return ""
        waiting = [g for g in self.gates if g.outcome == "inconclusive"]
        if not all(g.failing or g.numbers.get(SHORT_OF_DATA) is True for g in waiting):
            return ""
        line = "; ".join(f"{g.name}: {g.reason}" for g in waiting[:2])
        return line + (f"; {len(waiting) - 2} more" if len(waiting) > 2 else "")

    def summary(self) -> str:
        """One line for a webhook or the CLI: the outcome and why."""
        if not self.gates:
            return f"{self.outcome}: no gate applies to the {self.stage} stage"
        if self.outcome == "pass":
            return f"pass: {len(self.gates)} gates pass ({', '.join(g.name for g in self.gates)})"
        named = [g for g in self.gates if g.outcome == self.outcome]
        line = "; ".join(f"{g.name}: {g.reason}" for g in named[:2])
        more = f"; {len(named) - 2} more" if len(named) > 2 else ""
        return f"{self.outcome}: {line}{more}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, every number kept; `Decision.from_dict` reads it back."""
        return {
            "outcome": self.outcome,
            "evaluated_at": self.evaluated_at.isoformat(),
            "stage": self.stage,
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "consecutive_failures": self.consecutive_failures,
            "summary": self.summary(),
            "gates": [gate.to_dict() for gate in self.gates],
        }

    @classmethod
    def from_dict(cls, raw: object) -> Decision:
        """A stored decision (`to_dict`), checked field by field."""
        reader = _F.reader("decision", raw)
        outcome = reader.require("outcome", _F.choice(Outcome))
        evaluated_at = reader.require("evaluated_at", _datetime)
        stage = reader.require("stage", _F.choice(Stage))
        window_start = reader.require("window_start", _datetime)
        window_end = reader.require("window_end", _datetime)
        gates = reader.require("gates", _gate_results)
        reader.take("consecutive_failures", _F.to_int, 0)  # derived; stored for readers
        reader.take("summary", _F.to_str, "")
        reader.finish()
        return cls(outcome, evaluated_at, stage, window_start, window_end, gates)


def _datetime(name: str, value: Any) -> datetime:
    try:
        parsed = datetime.fromisoformat(_F.to_str(name, value))
    except ValueError:
        raise _F.fail(name, "must be an ISO 8601 time", value) from None
    if parsed.utcoffset() is None:
        raise _F.fail(name, "must carry a time zone", value)
    return parsed


def _gate_results(name: str, value: Any) -> tuple[GateResult, ...]:
    if not isinstance(value, list) or len(value) > len(GATE_NAMES):
        raise _F.fail(name, f"must be a list of at most {len(GATE_NAMES)} gates", value)
    results = []
    for index, item in enumerate(value):
        reader = _F.reader(f"{name}[{index}]", item)
        results.append(
            GateResult(
                name=reader.require("name", _gate_name),
                outcome=reader.require("outcome", _F.choice(Outcome)),
                failing=reader.require("failing", _F.to_bool),
                consecutive_failures=reader.require("consecutive_failures", _F.to_int),
                required_failures=reader.require("required_failures", _F.to_int),
                reason=reader.require("reason", _F.to_str),
                numbers=reader.require("numbers", _numbers),
            )
        )
        reader.finish()
    return tuple(results)


def _gate_name(name: str, value: Any) -> str:
    _F.check_choice(name, value, GATE_NAMES)
    return str(value)


def _numbers(name: str, value: Any) -> dict[str, Number]:
    if not isinstance(value, Mapping):
        raise _F.fail(name, "must be a mapping", value)
    for key, item in value.items():
        if not isinstance(key, str) or not (
            item is None or isinstance(item, str | bool) or _is_number(item)
        ):
            raise _F.fail(f"{name}.{key}", "must be a number, a string, a boolean or null", item)
    return dict(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_number(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ----------------------------------------------------------------------------- evaluation


class _Verdict(NamedTuple):
    """A judge's answer before the consecutive-failures rule."""

    outcome: Outcome
    reason: str
    numbers: dict[str, Number]


_Judge = Callable[[GatesSpec, Any, Samples], _Verdict]


def evaluate(
    spec: GatesSpec, samples: Samples, now: datetime, history: Sequence[Decision] = ()
) -> Decision:
    """Judge one window. `history`: this stage's earlier decisions (any order); a gate
    fails only when it has failed ``required_failures`` evaluations in a row, counting
    this one; a window that ends no later than the last decision's adds no new failure."""
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise _F.fail("now", "must be a datetime with a time zone", now)
    if samples.window_end > now:
        raise _F.fail("samples.window_end", "must not be after now", samples.window_end)
    streaks, advance = _streaks(history, samples, now)
    age_s = (now - samples.window_end).total_seconds()
    results = []
    for name in STAGE_GATES[samples.stage]:
        gate = getattr(spec, name)
        if not gate.enabled or (name == "latency_vs_control" and not spec.compare_with_control):
            continue
        if age_s > spec.max_sample_age_s:
            verdict = _Verdict(
                "inconclusive",
                f"samples end {age_s:.0f} s before now (at most {spec.max_sample_age_s:.0f} s)",
                {"sample_age_s": age_s, "max_sample_age_s": spec.max_sample_age_s},
            )
        else:
            verdict = _JUDGES[name](spec, gate, samples)
        results.append(
            _gated(name, verdict, streaks.get(name, 0), advance, spec.required_failures(name))
        )
    outcomes = {result.outcome for result in results}
    outcome: Outcome = (
        "fail"
        if "fail" in outcomes
        else "inconclusive"
        if "inconclusive" in outcomes or not results
        else "pass"
    )
    return Decision(
        outcome, now, samples.stage, samples.window_start, samples.window_end, tuple(results)
    )


def _streaks(
    history: Sequence[Decision], samples: Samples, now: datetime
) -> tuple[dict[str, int], bool]:
    """Each gate's run of failing evaluations up to the last decision of this stage, and
    whether this window is newer than that decision's (a new failure counts)."""
    last: Decision | None = None
    for index, decision in enumerate(history):
        if not isinstance(decision, Decision):
            raise _F.fail(f"history[{index}]", "must be a Decision", decision)
        if decision.evaluated_at >= now:
            raise _F.fail(
                f"history[{index}].evaluated_at", "must be before now", decision.evaluated_at
            )
        if last is None or decision.evaluated_at > last.evaluated_at:
            last = decision
    if last is None or last.stage != samples.stage:
        return {}, True
    streaks = {gate.name: gate.consecutive_failures for gate in last.gates if gate.failing}
    return streaks, samples.window_end > last.window_end


def _gated(name: str, verdict: _Verdict, streak: int, advance: bool, need: int) -> GateResult:
    if verdict.outcome != "fail":
        return GateResult(name, verdict.outcome, False, 0, need, verdict.reason, verdict.numbers)
    count = streak + 1 if advance or streak == 0 else streak
    if count >= need:
        return GateResult(name, "fail", True, count, need, verdict.reason, verdict.numbers)
    reason = f"{count} of {need} failing evaluations: {verdict.reason}"
    return GateResult(name, "inconclusive", True, count, need, reason, verdict.numbers)


def _inconclusive(reason: str, numbers: dict[str, Number]) -> _Verdict:
    return _Verdict("inconclusive", reason, numbers)


def _short(reason: str, numbers: dict[str, Number]) -> _Verdict:
    """Inconclusive for want of data that more time brings (samples, exposure): the
    rollout keeps baking on it until the verdict deadline (`Decision.waiting_for_data`)."""
    numbers[SHORT_OF_DATA] = True
    return _Verdict("inconclusive", reason, numbers)


# ----------------------------------------------------------------------------- statistics


class Shift(NamedTuple):
    """A Hodges-Lehmann shift ``x - y`` and its distribution-free interval."""

    estimate: float
    low: float
    high: float


def hodges_lehmann(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, confidence: float
) -> Shift:
    """The median of all pairwise differences ``x_i - y_j`` and its two-sided interval at
    `confidence` (the order statistics that the Mann-Whitney U's normal approximation
    picks, as R's ``wilcox.test(conf.int=TRUE)`` does for large samples). Over
    ``MAX_PAIRS`` pairs, each side is first thinned to evenly spaced quantiles of itself
    and the interval is read at the same fractions of the differences as the full
    samples' would be (an approximation good to the thinned grid's resolution)."""
    n, m = len(x), len(y)
    if not n or not m:
        raise ValueError("both samples must have values")
    a, b = _thinned_pair(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    # The interval's rank among all n*m differences, as a fraction (ties ignored).
    fraction = max(0.0, 0.5 - z * math.sqrt(n * m * (n + m + 1) / 12) / (n * m))
    total = len(a) * len(b)
    k = min(math.floor(fraction * total), (total - 1) // 2)
    middle = [(total - 1) // 2, total // 2]
    ordered = np.partition(np.subtract.outer(a, b).ravel(), sorted({k, total - 1 - k, *middle}))
    estimate = float((ordered[middle[0]] + ordered[middle[1]]) / 2)
    return Shift(estimate, float(ordered[k]), float(ordered[total - 1 - k]))


def _thinned_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(a) * len(b) <= MAX_PAIRS:
        return a, b
    side = math.isqrt(MAX_PAIRS)
    if len(a) <= side:
        return a, _quantiles(b, MAX_PAIRS // len(a))
    if len(b) <= side:
        return _quantiles(a, MAX_PAIRS // len(b)), b
    return _quantiles(a, side), _quantiles(b, side)


def _quantiles(values: np.ndarray, count: int) -> np.ndarray:
    thinned: np.ndarray = np.quantile(values, (np.arange(count) + 0.5) / count)
    return thinned


def _pooled(series: Iterable[Sequence[float] | np.ndarray]) -> np.ndarray:
    parts = [np.asarray(values, dtype=np.float64) for values in series if len(values)]
    return np.concatenate(parts) if parts else np.empty(0)


def _f(value: float | np.floating[Any]) -> float:
    return float(value)


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f} %" if math.isfinite(ratio) else "n/a"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g}"


def _p(value: float) -> str:
    return f"{value:.2g}"


def _mb(bytes_per_hour: float) -> str:
    return f"{bytes_per_hour / MB:+.1f} MB/h"


def _levelled(
    canaries: Sequence[NodeSamples], controls: Sequence[NodeSamples], least: int
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """Each node's P99 series over its own median before the update, times the controls'
    median of those medians (so still in seconds, as on one typical control box): the
    boxes' own differences taken out. None unless every reporting node has a baseline of
    at least `least` intervals."""
    reporting = [node for node in (*canaries, *controls) if node.p99_s]
    if not reporting or any(len(node.baseline_p99_s) < least for node in reporting):
        return None
    level = {node.node_id: _f(np.median(node.baseline_p99_s)) for node in reporting}
    reference = _f(np.median([level[node.node_id] for node in controls if node.p99_s]))

    def pooled(nodes: Sequence[NodeSamples]) -> np.ndarray:
        return _pooled(
            np.asarray(node.p99_s, dtype=np.float64) * (reference / level[node.node_id])
            for node in nodes
            if node.p99_s
        )

    return pooled(canaries), pooled(controls), reference


def _latency_vs_control(spec: GatesSpec, gate: LatencyVsControlGate, samples: Samples) -> _Verdict:
    least = spec.min_samples
    canary = _pooled(node.p99_s for node in samples.canaries)
    control = _pooled(node.p99_s for node in samples.controls)
    control_nodes = sum(1 for node in samples.controls if node.p99_s)
    n_c, n_t = len(canary), len(control)
    numbers: dict[str, Number] = {
        "n_canary": n_c,
        "n_control": n_t,
        "canary_nodes": sum(1 for node in samples.canaries if node.p99_s),
        "control_nodes": control_nodes,
        "min_samples": least.latency_intervals,
        "min_control_nodes": least.control_nodes,
        "levelled": False,
    }
    if min(n_c, n_t) < least.latency_intervals:
        return _short(
            f"too few p99 intervals: n={n_c}/{n_t} (need {least.latency_intervals} a side)",
            numbers,
        )
    if control_nodes < least.control_nodes:
        return _inconclusive(
            f"{control_nodes} control node(s) report p99 (need {least.control_nodes})", numbers
        )
    levelled = (
        _levelled(samples.canaries, samples.controls, least.baseline_pairs_per_node)
        if gate.level_by_baseline and control_nodes
        else None
    )
    if levelled is not None:
        canary, control, reference = levelled
        numbers.update({"levelled": True, "reference_s": reference})
    alpha = spec.alpha
    ranks = stats.mannwhitneyu(canary, control, alternative="greater")
    shift = hodges_lehmann(canary, control, spec.confidence)
    median_c, median_t = _f(np.median(canary)), _f(np.median(control))
    ratio = median_c / median_t
    tolerance_s = gate.shift_tolerance * median_t
    q = gate.tail_quantile
    tail_t, tail_c = _f(np.quantile(control, q)), _f(np.quantile(canary, q))
    above_c, above_t = int((canary > tail_t).sum()), int((control > tail_t).sum())
    tail_p = _f(
        stats.fisher_exact(
            [[above_c, n_c - above_c], [above_t, n_t - above_t]], alternative="greater"
        ).pvalue
    )
    tail_ratio = tail_c / tail_t
    numbers.update(
        {
            "median_canary_s": median_c,
            "median_control_s": median_t,
            "ratio": ratio,
            "max_ratio": 1 + gate.max_increase,
            "u_statistic": _f(ranks.statistic),
            "p_value": _f(ranks.pvalue),
            "hl_shift_s": shift.estimate,
            "hl_low_s": shift.low,
            "hl_high_s": shift.high,
            "shift_tolerance_s": tolerance_s,
            "tail_quantile": q,
            "tail_canary_s": tail_c,
            "tail_control_s": tail_t,
            "tail_ratio": tail_ratio,
            "max_tail_ratio": 1 + gate.max_tail_increase,
            "tail_above_canary": above_c,
            "tail_above_control": above_t,
            "tail_p_value": tail_p,
            "alpha": alpha,
        }
    )
    line = (
        f"p99 {_pct(ratio)} vs control (HL shift {_ms(shift.estimate)} ms, "
        f"CI {_ms(shift.low)}–{_ms(shift.high)} ms, n={n_c}/{n_t}"  # noqa: RUF001
        f"{', each box by its own baseline' if levelled else ''})"
    )
    if ranks.pvalue < alpha and shift.low > tolerance_s and ratio > 1 + gate.max_increase:
        return _Verdict("fail", line, numbers)
    tail = f"q{q * 100:g} {_pct(tail_ratio)}"
    if tail_p < alpha and tail_ratio > 1 + gate.max_tail_increase:
        share = above_c / n_c
        return _Verdict(
            "fail",
            f"p99 tail {tail} vs control: {share:.0%} of canary intervals above the "
            f"control's q{q * 100:g} (p={_p(tail_p)}, n={n_c}/{n_t})",
            numbers,
        )
    return _Verdict("pass", f"{line}, tail {tail}", numbers)


def _paired_log_ratios(node: NodeSamples) -> np.ndarray:
    """log(after / before) of a node's intervals, the last k before the update paired in
    order with the first k of the window."""
    k = min(len(node.p99_s), len(node.baseline_p99_s))
    if not k:
        return np.empty(0)
    after = np.asarray(node.p99_s[:k], dtype=np.float64)
    before = np.asarray(node.baseline_p99_s[len(node.baseline_p99_s) - k :], dtype=np.float64)
    return np.log(after) - np.log(before)


def _signed_rank_p(differences: np.ndarray, alternative: str = "greater") -> tuple[float, float]:
    if not np.any(differences):
        return math.nan, 1.0
    result = stats.wilcoxon(differences, alternative=alternative)
    return _f(result.statistic), _f(result.pvalue)


def _latency_vs_baseline(
    spec: GatesSpec, gate: LatencyVsBaselineGate, samples: Samples
) -> _Verdict:
    least = spec.min_samples
    per_node = [(node.node_id, _paired_log_ratios(node)) for node in samples.canaries]
    per_node = [(node_id, d) for node_id, d in per_node if len(d)]
    pooled = np.concatenate([d for _, d in per_node]) if per_node else np.empty(0)
    numbers: dict[str, Number] = {
        "n_pairs": len(pooled),
        "canary_nodes": len(per_node),
        "min_samples": least.baseline_pairs,
    }
    if len(pooled) < least.baseline_pairs:
        reason = f"too few before/after p99 pairs: n={len(pooled)} (need {least.baseline_pairs})"
        # Pairs grow only while a canary has intervals from before its update still
        # unpaired: the baseline is in the past, so waiting cannot add to it.
        growable = sum(
            max(0, len(node.baseline_p99_s) - len(node.p99_s)) for node in samples.canaries
        )
        if len(pooled) + growable < least.baseline_pairs:
            numbers["baseline_intervals"] = sum(len(n.baseline_p99_s) for n in samples.canaries)
            return _Verdict(
                "inconclusive",
                f"{reason}: the canaries' baselines hold too few intervals from before the "
                "update, and waiting adds none",
                numbers,
            )
        return _short(reason, numbers)
    # The fleet's own drift between the two spans (load, time of day), from controls that
    # have both; taken out only when the controls show one, since a few controls' median
    # is noise of its own.
    drift = 0.0
    if samples.stage == "canary" and spec.compare_with_control:
        control = _pooled(_paired_log_ratios(node) for node in samples.controls)
        numbers["n_control_pairs"] = len(control)
        if len(control) >= least.baseline_pairs:
            _, drift_p = _signed_rank_p(control, "two-sided")
            numbers["drift_p_value"] = drift_p
            if drift_p < spec.alpha:
                drift = _f(np.median(control))
    adjusted = pooled - drift
    statistic, p_value = _signed_rank_p(adjusted)
    ratio = math.exp(_f(np.median(adjusted)))
    alpha = spec.alpha
    limit = 1 + gate.max_increase
    numbers.update(
        {
            "ratio": ratio,
            "max_ratio": limit,
            "drift_ratio": math.exp(drift),
            "w_statistic": statistic,
            "p_value": p_value,
            "alpha": alpha,
        }
    )
    drift_note = f", fleet drift {_pct(math.exp(drift))}" if drift else ""
    line = (
        f"p99 {_pct(ratio)} vs the canaries' own baseline "
        f"(Wilcoxon p={_p(p_value)}, n={len(pooled)} pairs{drift_note})"
    )
    if p_value < alpha and ratio > limit:
        return _Verdict("fail", line, numbers)
    # One canary on its own (a regression on one kind of box): tested against the
    # tolerance itself (the log ratios less log(1 + max_increase)), Bonferroni over the
    # canaries judged, since a few dozen pairs leave a point estimate too noisy to trust.
    judged = [(i, d - drift) for i, d in per_node if len(d) >= least.baseline_pairs_per_node]
    worst = sorted(judged, key=lambda item: -_f(np.median(item[1])))[:WORST_NODES]
    for node_id, differences in worst:
        node_ratio = math.exp(_f(np.median(differences)))
        _, node_p = _signed_rank_p(differences - math.log(limit))
        if node_p < alpha / len(judged):
            numbers.update(
                {"worst_node": node_id, "worst_ratio": node_ratio, "worst_p_value": node_p}
            )
            return _Verdict(
                "fail",
                f"{node_id}: p99 {_pct(node_ratio)} vs its own baseline, surely over "
                f"{_pct(limit)} (Wilcoxon p={_p(node_p)}, n={len(differences)} pairs{drift_note})",
                numbers,
            )
    return _Verdict("pass", line, numbers)


class _Slope(NamedTuple):
    node_id: str
    slope: float  # bytes per hour
    low: float
    high: float


def _slopes(nodes: Sequence[NodeSamples], least: MinSamples, confidence: float) -> list[_Slope]:
    """Theil-Sen slopes of the nodes with enough points, at most ``MAX_SLOPE_NODES`` of
    them (evenly spaced in the given order: one fit costs about a millisecond)."""
    eligible = [node for node in nodes if len(node.rss) >= least.rss_points]
    if len(eligible) > MAX_SLOPE_NODES:
        picks = np.linspace(0, len(eligible) - 1, MAX_SLOPE_NODES).round().astype(int)
        eligible = [eligible[i] for i in picks]
    found = []
    for node in eligible:
        points = np.asarray(node.rss, dtype=np.float64)
        points = points[np.argsort(points[:, 0], kind="stable")]
        if points[-1, 0] - points[0, 0] < least.rss_span_s:
            continue
        if len(points) > MAX_RSS_POINTS:
            points = points[np.linspace(0, len(points) - 1, MAX_RSS_POINTS).round().astype(int)]
        fit = stats.theilslopes(points[:, 1], points[:, 0] / 3600.0, alpha=confidence)
        found.append(_Slope(node.node_id, _f(fit.slope), _f(fit.low_slope), _f(fit.high_slope)))
    return found


def _rss_slope(spec: GatesSpec, gate: RssSlopeGate, samples: Samples) -> _Verdict:
    least = spec.min_samples
    # Each canary's interval is also judged on its own: Bonferroni over the canaries.
    canaries = max(1, sum(1 for node in samples.canaries if len(node.rss) >= least.rss_points))
    canary = _slopes(samples.canaries, least, 1 - spec.alpha / min(canaries, MAX_SLOPE_NODES))
    numbers: dict[str, Number] = {
        "canary_nodes": len(canary),
        "min_points": least.rss_points,
        "min_span_s": least.rss_span_s,
        "max_bytes_per_hour": gate.max_bytes_per_hour,
        "max_increase_bytes_per_hour": gate.max_increase_bytes_per_hour,
    }
    enough = f"{least.rss_points} RSS points over {least.rss_span_s:.0f} s"
    if not canary:
        return _short(f"no canary has {enough}", numbers)
    worst = max(canary, key=lambda s: s.low)
    numbers.update(
        {
            "canary_median_bytes_per_hour": _f(np.median([s.slope for s in canary])),
            "worst_node": worst.node_id,
            "worst_bytes_per_hour": worst.slope,
            "worst_low_bytes_per_hour": worst.low,
            "worst_high_bytes_per_hour": worst.high,
        }
    )
    if worst.low > gate.max_bytes_per_hour:
        return _Verdict(
            "fail",
            f"{worst.node_id}: RSS {_mb(worst.slope)} (CI {_mb(worst.low)} to "
            f"{_mb(worst.high)}), over the ceiling {_mb(gate.max_bytes_per_hour)}",
            numbers,
        )
    if not spec.compare_with_control:
        return _Verdict(
            "pass",
            f"no canary's RSS slope is surely over {_mb(gate.max_bytes_per_hour)} "
            f"(highest {_mb(worst.slope)}, {len(canary)} nodes)",
            numbers,
        )
    control = _slopes(samples.controls, least, spec.confidence)
    numbers["control_nodes"] = len(control)
    if len(control) < least.control_nodes:
        return _inconclusive(
            f"{len(control)} control node(s) have {enough} (need {least.control_nodes})",
            numbers,
        )
    reference = _f(np.median([s.slope for s in control]))
    excess = _f(np.median([s.slope for s in canary])) - reference
    ranks = stats.mannwhitneyu(
        [s.slope for s in canary], [s.slope for s in control], alternative="greater"
    )
    numbers.update(
        {
            "control_median_bytes_per_hour": reference,
            "excess_bytes_per_hour": excess,
            "u_statistic": _f(ranks.statistic),
            "p_value": _f(ranks.pvalue),
            "alpha": spec.alpha,
        }
    )
    line = (
        f"RSS {_mb(excess)} vs control (median slopes; p={_p(ranks.pvalue)}, "
        f"nodes {len(canary)}/{len(control)})"
    )
    if ranks.pvalue < spec.alpha and excess > gate.max_increase_bytes_per_hour:
        return _Verdict("fail", line, numbers)
    if worst.low - reference > gate.max_increase_bytes_per_hour:
        return _Verdict(
            "fail",
            f"{worst.node_id}: RSS {_mb(worst.slope)} (CI {_mb(worst.low)} to "
            f"{_mb(worst.high)}) against the controls' {_mb(reference)}",
            numbers,
        )
    return _Verdict("pass", line, numbers)


class _Rate(NamedTuple):
    """How a rate gate reads a node's counters: events, exposure, and how to say them."""

    events: Callable[[Counters], int]
    exposure: Callable[[Counters], float]
    what: str  # "error rate"
    per: str  # "frames"
    hours: bool  # exposure in node-hours (a Poisson rate) rather than trials


_RATES: Final[Mapping[str, _Rate]] = {
    "error_rate": _Rate(lambda c: c.errors, lambda c: c.frames, "error rate", "frames", False),
    "dropped_frames": _Rate(
        lambda c: c.dropped, lambda c: c.frames + c.dropped, "dropped frames", "frames", False
    ),
    "restarts": _Rate(
        lambda c: c.restarts, lambda c: c.seconds / 3600.0, "restarts", "node-hours", True
    ),
}


def _dispersion(events: Sequence[int], exposures: Sequence[float]) -> float:
    """Pearson's chi-square over the controls' nodes per degree of freedom, at least 1:
    how much more the nodes differ than a single common rate allows (quasi-Poisson)."""
    pairs = [(k, e) for k, e in zip(events, exposures, strict=True) if e > 0]
    total = sum(e for _, e in pairs)
    if len(pairs) < 2 or total <= 0:
        return 1.0
    rate = sum(k for k, _ in pairs) / total
    if rate <= 0:
        return 1.0
    chi2 = sum((k - rate * e) ** 2 / (rate * e) for k, e in pairs)
    return max(1.0, chi2 / (len(pairs) - 1))


def _exposure_text(exposure: float, hours: bool) -> str:
    return f"{exposure:.3g}" if hours else f"{exposure:,.0f}"


def _rate_text(rate: float, hours: bool) -> str:
    return f"{rate:.3g}/h" if hours else f"{rate * 100:.3g} %"


def _rate_gate(name: str) -> _Judge:
    reading = _RATES[name]

    def judge(spec: GatesSpec, gate: RateGate, samples: Samples) -> _Verdict:
        least = spec.min_samples
        need = least.node_hours if reading.hours else float(least.frames)
        canary = [n.counters for n in samples.canaries if n.counters is not None]
        e_c = sum(reading.events(c) for c in canary)
        x_c = sum(reading.exposure(c) for c in canary)
        rate_c = e_c / x_c if x_c else math.nan
        numbers: dict[str, Number] = {
            "events_canary": e_c,
            "exposure_canary": x_c,
            "rate_canary": rate_c,
            "min_exposure": need,
            "min_rate": gate.min_rate,
            "alpha": spec.alpha,
        }
        # Below the minimum exposure the test may still fail, at `early_fail_p`, never pass.
        short = x_c < need
        level = spec.early_fail_p if short else spec.alpha

        def too_little() -> _Verdict:
            return _short(
                f"too little exposure: canaries {_exposure_text(x_c, reading.hours)} "
                f"{reading.per} (need {_exposure_text(need, reading.hours)})",
                numbers,
            )

        def early(line: str) -> str:
            numbers["early_fail"] = True
            return f"{line}; early: below the minimum exposure, p < {spec.early_fail_p:g}"

        if short and (level <= 0 or x_c <= 0 or (not reading.hours and round(x_c) < 1)):
            return too_little()
        seen = f"{e_c:,}/{_exposure_text(x_c, reading.hours)} {reading.per}"
        if not spec.compare_with_control:
            if reading.hours:
                p_value = _f(stats.poisson.sf(e_c - 1, gate.min_rate * x_c))
            else:
                p_value = _f(stats.binomtest(e_c, round(x_c), gate.min_rate, "greater").pvalue)
            numbers["p_value"] = p_value
            line = (
                f"{reading.what} {_rate_text(rate_c, reading.hours)} ({seen}; "
                f"at most {_rate_text(gate.min_rate, reading.hours)}, p={_p(p_value)})"
            )
            failed = p_value < level and rate_c > gate.min_rate
            if short:
                return _Verdict("fail", early(line), numbers) if failed else too_little()
            return _Verdict("fail" if failed else "pass", line, numbers)
        control = [n.counters for n in samples.controls if n.counters is not None]
        events_t = [reading.events(c) for c in control]
        exposures_t = [reading.exposure(c) for c in control]
        e_t, x_t = sum(events_t), sum(exposures_t)
        numbers.update(
            {"events_control": e_t, "exposure_control": x_t, "control_nodes": len(control)}
        )
        if len(control) < least.control_nodes or x_t < need:
            if short:
                return too_little()
            text = (
                f"too little control exposure: {len(control)} nodes, "
                f"{_exposure_text(x_t, reading.hours)} {reading.per} "
                f"(need {least.control_nodes} nodes, {_exposure_text(need, reading.hours)})"
            )
            # Control exposure grows with time; too few control nodes does not.
            if len(control) >= least.control_nodes:
                return _short(text, numbers)
            return _inconclusive(text, numbers)
        rate_t = e_t / x_t
        allowed = 1 + gate.max_increase
        phi = _dispersion(events_t, exposures_t)
        share = allowed * x_c / (allowed * x_c + x_t)
        k, total = round(e_c / phi), round((e_c + e_t) / phi)
        p_value = _f(stats.binomtest(k, total, share, "greater").pvalue) if total else 1.0
        numbers.update(
            {
                "rate_control": rate_t,
                "max_ratio": allowed,
                "ratio": rate_c / rate_t if rate_t else (math.inf if rate_c else 1.0),
                "dispersion": phi,
                "null_share": share,
                "p_value": p_value,
            }
        )
        line = (
            f"{reading.what} {_rate_text(rate_c, reading.hours)} vs control "
            f"{_rate_text(rate_t, reading.hours)} ({seen} vs "
            f"{e_t:,}/{_exposure_text(x_t, reading.hours)}; p={_p(p_value)})"
        )
        failed = p_value < level and rate_c > gate.min_rate and rate_c > allowed * rate_t
        if short:
            return _Verdict("fail", early(line), numbers) if failed else too_little()
        return _Verdict("fail" if failed else "pass", line, numbers)

    return judge


def _canaries(count: int) -> str:
    return f"{count} {'canary' if count == 1 else 'canaries'}"


def _count_gate(field_name: str, what: str) -> _Judge:
    def judge(spec: GatesSpec, gate: CountGate, samples: Samples) -> _Verdict:
        counted = [
            (n.node_id, getattr(n.counters, field_name)) for n in samples.canaries if n.counters
        ]
        total = sum(count for _, count in counted)
        numbers: dict[str, Number] = {
            "canary_nodes": len(counted),
            "count": total,
            "max_count": gate.max_count,
        }
        if not counted:
            return _inconclusive(f"no canary reported its counters ({what})", numbers)
        if total > gate.max_count:
            node_id, most = max(counted, key=lambda item: item[1])
            numbers["worst_node"] = node_id
            return _Verdict(
                "fail",
                f"{total} {what} on {_canaries(len(counted))} ({node_id}: {most}; "
                f"at most {gate.max_count})",
                numbers,
            )
        return _Verdict("pass", f"{total} {what} on {_canaries(len(counted))}", numbers)

    return judge


class _Agreement(NamedTuple):
    label: str
    agreed: Callable[[ShadowCounts, AgreementGate], int]
    compared: Callable[[ShadowCounts, AgreementGate], int]
    minimum: Callable[[AgreementGate], float]
    least: Callable[[MinSamples], int]


def _raw_counted(counts: Mapping[float, int], level: float | None, raw: int) -> int:
    """The raw frames compared when the node counted them at `level` (else none)."""
    return raw if level is not None and level in counts else 0


_AGREEMENTS: Final = (
    _Agreement(
        "top1",
        lambda s, g: s.top1_agreed,
        lambda s, g: s.classified,
        lambda g: g.min_top1,
        lambda m: m.shadow_frames,
    ),
    _Agreement(
        "box_recall",
        lambda s, g: s.boxes_matched,
        lambda s, g: s.boxes_reference,
        lambda g: g.min_box_recall,
        lambda m: m.shadow_boxes,
    ),
    _Agreement(
        "score_agreement",
        lambda s, g: s.scores_agreed,
        lambda s, g: s.boxes_matched,
        lambda g: g.min_score_agreement,
        lambda m: m.shadow_boxes,
    ),
    # Raw outputs, frame by frame: a share of frames close enough, as top-1 is.
    _Agreement(
        "raw_cosine",
        lambda s, g: s.cosine_at_least.get(g.raw_cosine, 0),
        lambda s, g: _raw_counted(s.cosine_at_least, g.raw_cosine, s.raw),
        lambda g: g.min_raw_cosine,
        lambda m: m.shadow_frames,
    ),
    _Agreement(
        "raw_abs_diff",
        lambda s, g: s.abs_diff_at_most.get(g.raw_max_abs_diff or 0.0, 0),
        lambda s, g: _raw_counted(s.abs_diff_at_most, g.raw_max_abs_diff, s.raw),
        lambda g: g.min_raw_abs_diff,
        lambda m: m.shadow_frames,
    ),
)


def _below(agreed: int, compared: int, minimum: float) -> float:
    """p-value of "the true agreement is below `minimum`"."""
    return _f(stats.binomtest(agreed, compared, minimum, alternative="less").pvalue)


def _output_agreement(spec: GatesSpec, gate: AgreementGate, samples: Samples) -> _Verdict:
    least = spec.min_samples
    shadows = [(n.node_id, n.shadow) for n in samples.canaries if n.shadow is not None]
    frames = sum(s.frames for _, s in shadows)
    numbers: dict[str, Number] = {
        "shadow_nodes": len(shadows),
        "frames": frames,
        "alpha": spec.alpha,
    }
    few_frames = frames < least.shadow_frames
    too_few = f"too few shadow frames: {frames} (need {least.shadow_frames})"
    if few_frames and (spec.early_fail_p <= 0 or not frames):
        return _short(too_few, numbers)
    lines: list[str] = []
    short: list[str] = []
    failed: list[str] = []
    for metric in _AGREEMENTS:
        agreed = sum(metric.agreed(s, gate) for _, s in shadows)
        compared = sum(metric.compared(s, gate) for _, s in shadows)
        if not compared:
            continue
        minimum, need = metric.minimum(gate), metric.least(least)
        numbers.update({f"{metric.label}_agreed": agreed, f"{metric.label}_compared": compared})
        numbers[f"{metric.label}_min"] = minimum
        if few_frames or compared < need:
            # Below the minimum sample only overwhelming evidence counts, and only to fail.
            short.append(f"{metric.label} n={compared} (need {need})")
            if spec.early_fail_p > 0:
                p_value = _below(agreed, compared, minimum)
                numbers[f"{metric.label}_p_value"] = p_value
                if p_value < spec.early_fail_p:
                    numbers.update({metric.label: agreed / compared, "early_fail": True})
                    failed.append(
                        f"{metric.label} {agreed / compared:.1%} (min {minimum:.0%}, "
                        f"n={compared}, p={_p(p_value)}; early: below the minimum sample, "
                        f"p < {spec.early_fail_p:g})"
                    )
            continue
        p_value = _below(agreed, compared, minimum)
        numbers.update({metric.label: agreed / compared, f"{metric.label}_p_value": p_value})
        text = (
            f"{metric.label} {agreed / compared:.1%} "
            f"(min {minimum:.0%}, n={compared}, p={_p(p_value)})"
        )
        lines.append(text)
        if p_value < spec.alpha:
            failed.append(text)
            continue
        # One shadow node on its own (one kind of box may diverge), Bonferroni over nodes.
        judged = [
            (i, metric.agreed(s, gate), metric.compared(s, gate))
            for i, s in shadows
            if metric.compared(s, gate) >= need
        ]
        worst = sorted(judged, key=lambda item: item[1] / item[2])[:WORST_NODES]
        for node_id, node_agreed, node_compared in worst:
            node_p = _below(node_agreed, node_compared, minimum)
            if node_p < spec.alpha / len(judged):
                numbers.update({"worst_node": node_id, "worst_p_value": node_p})
                failed.append(
                    f"{node_id}: {metric.label} {node_agreed / node_compared:.1%} "
                    f"(min {minimum:.0%}, n={node_compared}, p={_p(node_p)})"
                )
                break
    if failed:
        return _Verdict("fail", "; ".join(failed), numbers)
    if few_frames:
        return _short(too_few, numbers)
    if short:
        return _short(f"too few shadow comparisons: {', '.join(short)}", numbers)
    if not lines:
        what = "no top-1 labels, reference boxes or raw counts"
        return _inconclusive(f"too few shadow comparisons: {what}", numbers)
    return _Verdict("pass", "; ".join(lines), numbers)


_JUDGES: Final[Mapping[str, _Judge]] = {
    "latency_vs_control": _latency_vs_control,
    "latency_vs_baseline": _latency_vs_baseline,
    "rss_slope": _rss_slope,
    "self_test": _count_gate("self_test_failures", "self-test or load failures"),
    "watchdog_reverts": _count_gate("reverts", "watchdog reverts"),
    "restarts": _rate_gate("restarts"),
    "error_rate": _rate_gate("error_rate"),
    "dropped_frames": _rate_gate("dropped_frames"),
    "output_agreement": _output_agreement,
}
