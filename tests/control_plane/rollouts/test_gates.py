"""The canary gates (control_plane.rollouts.gates) on seeded synthetic fleets: noise passes,
real regressions fail, thin data is inconclusive, N failing evaluations in a row fail."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from control_plane.errors import InvalidInputError
from control_plane.rollouts.gates import (
    GATE_NAMES,
    SHORT_OF_DATA,
    AgreementGate,
    Counters,
    Decision,
    GateResult,
    GatesSpec,
    LatencyVsControlGate,
    MinSamples,
    NodeSamples,
    RateGate,
    Samples,
    ShadowCounts,
    evaluate,
    hodges_lehmann,
    parse_gates,
)
from protos.bundle.levels import ABS_DIFF_LEVELS, COSINE_LEVELS

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MB = 1_000_000
ONCE = GatesSpec(consecutive_failures=1)  # every failing evaluation fails: the statistics alone


def node(
    rng: np.random.Generator,
    node_id: str,
    *,
    minutes: int = 30,
    factor: float = 1.0,
    spread: float = 0.15,
    leak: float = 0.0,
    rss: bool = True,
    errors: float = 1e-4,
    offset_sigma: float = 0.03,
    box: float = 1.0,
) -> NodeSamples:
    """One node: per-interval P99 around 20 ms (lognormal noise, a per-node offset), its
    baseline before the update, an RSS point a minute, and a window's counters."""
    offset = box * rng.lognormal(0.0, offset_sigma)  # the box's own speed
    p99 = 0.020 * offset * rng.lognormal(0.0, spread, minutes) * factor
    baseline = 0.020 * offset * rng.lognormal(0.0, 0.15, minutes)
    t = np.arange(minutes + 1) * 60.0
    level = 300 * MB + rng.normal(0.0, 50 * MB)
    memory = level + leak * t / 3600.0 + rng.normal(0.0, 1 * MB, len(t))
    frames = minutes * 600
    return NodeSamples(
        node_id,
        p99_s=p99.tolist(),
        baseline_p99_s=baseline.tolist(),
        rss=list(zip(t.tolist(), memory.tolist(), strict=True)) if rss else [],
        counters=Counters(
            frames=frames,
            errors=int(rng.poisson(frames * errors)),
            dropped=int(rng.binomial(frames, 0.005)),
            seconds=minutes * 60.0,
        ),
    )


def fleet(
    seed: int,
    *,
    canaries: int = 3,
    controls: int = 6,
    minutes: int = 30,
    canary: dict[str, Any] | None = None,
    rss: bool = True,
) -> Samples:
    rng = np.random.default_rng(seed)
    return Samples(
        window_start=START,
        window_end=START + timedelta(minutes=minutes),
        canaries=[
            node(rng, f"c{i}", minutes=minutes, rss=rss, **(canary or {})) for i in range(canaries)
        ],
        controls=[node(rng, f"t{i}", minutes=minutes, rss=rss) for i in range(controls)],
    )


def judge(samples: Samples, spec: GatesSpec = ONCE, **kwargs: Any) -> Decision:
    return evaluate(spec, samples, samples.window_end + timedelta(seconds=5), **kwargs)


def number(result: GateResult, key: str) -> float:
    value = result.numbers[key]
    assert isinstance(value, int | float), (key, value)
    return float(value)


def outcome(decision: Decision, gate: str) -> str:
    result = decision.gate(gate)
    assert result is not None, f"{gate} not judged"
    return result.outcome


# ----------------------------------------------------------------------------- latency


def test_identical_fleets_pass_every_gate() -> None:
    decision = judge(fleet(1, canaries=5, controls=20))
    assert decision.outcome == "pass", decision.summary()
    assert [g.name for g in decision.gates] == list(GATE_NAMES[:-1])
    latency = decision.gate("latency_vs_control")
    assert latency is not None
    assert latency.numbers["n_canary"] == 150 and latency.numbers["n_control"] == 600
    assert latency.numbers["p_value"] is not None and latency.numbers["hl_low_s"] is not None


def test_noise_alone_rarely_fails_a_single_evaluation() -> None:
    """200 seeds, each judged once with no consecutive-failures rule: at most 2 % fail."""
    failed = [
        seed
        for seed in range(200)
        if judge(fleet(1000 + seed, minutes=20, rss=False)).outcome == "fail"
    ]
    assert len(failed) <= 4, failed


@pytest.mark.parametrize("factor", [1.3, 2.0])
def test_a_slower_p99_fails_against_control_and_baseline(factor: float) -> None:
    decision = judge(fleet(2, canary={"factor": factor}))
    assert decision.outcome == "fail"
    control = decision.gate("latency_vs_control")
    assert control is not None and control.outcome == "fail"
    assert control.reason.startswith("p99 +") and "vs control (HL shift" in control.reason
    assert control.numbers["ratio"] == pytest.approx(factor, rel=0.1)
    assert outcome(decision, "latency_vs_baseline") == "fail"


def test_same_median_with_a_wider_tail_fails() -> None:
    """kayenta#780: the rank test sees no shift; the tail check does."""
    decision = judge(fleet(3, canary={"spread": 0.6}))
    gate = decision.gate("latency_vs_control")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("p99 tail q90 +")
    assert gate.numbers["ratio"] == pytest.approx(1.0, abs=0.1)
    assert number(gate, "tail_p_value") < 0.02


def test_a_12_5_percent_slowdown_fails_an_allowed_10_percent() -> None:
    """kayenta#744: the effect size is a gate of its own; with 15 % allowed it passes."""
    samples = fleet(4, canaries=5, controls=20, canary={"factor": 1.125, "spread": 0.05})
    assert outcome(judge(samples), "latency_vs_control") == "fail"
    looser = replace(ONCE, latency_vs_control=LatencyVsControlGate(max_increase=0.15))
    assert outcome(judge(samples, looser), "latency_vs_control") == "pass"


def test_slower_boxes_on_the_same_model_pass_once_levelled_by_their_baselines() -> None:
    """Canaries on boxes 20 % slower than the controls' (before and after): not a shift."""
    samples = fleet(26, canaries=5, controls=20, canary={"box": 1.2})
    gate = judge(samples).gate("latency_vs_control")
    assert gate is not None and gate.outcome == "pass", gate.reason
    assert gate.numbers["levelled"] is True and "each box by its own baseline" in gate.reason
    raw = replace(ONCE, latency_vs_control=LatencyVsControlGate(level_by_baseline=False))
    assert outcome(judge(samples, raw), "latency_vs_control") == "fail"
    slower = fleet(26, canaries=5, controls=20, canary={"box": 1.2, "factor": 1.3})
    assert outcome(judge(slower), "latency_vs_control") == "fail"


def test_a_fleet_wide_slowdown_is_drift_not_a_regression() -> None:
    """Every box 30 % slower than before the update (load), canaries and controls alike."""
    rng = np.random.default_rng(27)
    samples = Samples(
        START,
        START + timedelta(minutes=30),
        canaries=[node(rng, f"c{i}", factor=1.3, rss=False) for i in range(5)],
        controls=[node(rng, f"t{i}", factor=1.3, rss=False) for i in range(20)],
    )
    gate = judge(samples).gate("latency_vs_baseline")
    assert gate is not None and gate.outcome == "pass", gate.reason
    assert number(gate, "drift_ratio") == pytest.approx(1.3, rel=0.05)
    assert "fleet drift +3" in gate.reason
    alone = judge(replace(samples, controls=[])).gate("latency_vs_baseline")
    assert alone is not None and alone.outcome == "fail"


def test_one_canary_slower_than_its_own_baseline_fails_alone() -> None:
    rng = np.random.default_rng(5)
    samples = fleet(5)
    slow = node(rng, "c-slow", factor=1.6)
    samples = replace(samples, canaries=[*samples.canaries, slow])
    gate = judge(samples).gate("latency_vs_baseline")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("c-slow: p99 +")
    assert gate.numbers["worst_node"] == "c-slow"


# ----------------------------------------------------------------------------- thin data


def test_too_few_samples_are_inconclusive_with_the_reason() -> None:
    decision = judge(fleet(6, canaries=1, minutes=12, canary={"factor": 3.0}))
    gate = decision.gate("latency_vs_control")
    assert gate is not None and gate.outcome == "inconclusive"
    assert gate.reason == "too few p99 intervals: n=12/72 (need 50 a side)"
    assert outcome(decision, "rss_slope") == "inconclusive"  # 12 minutes < 15 minutes
    assert decision.outcome != "pass"


def test_no_data_is_inconclusive_never_pass() -> None:
    empty = Samples(START, START + timedelta(minutes=30))
    decision = judge(empty)
    assert decision.outcome == "inconclusive"
    assert {g.outcome for g in decision.gates} == {"inconclusive"}
    silent = Samples(
        START,
        START + timedelta(minutes=30),
        canaries=[NodeSamples("c0")],
        controls=[NodeSamples(f"t{i}") for i in range(5)],
    )
    assert judge(silent).outcome == "inconclusive"


def test_stale_samples_are_inconclusive() -> None:
    samples = fleet(7)
    late = samples.window_end + timedelta(minutes=20)
    decision = evaluate(ONCE, samples, late)
    assert decision.outcome == "inconclusive"
    assert decision.gates[0].reason == "samples end 1200 s before now (at most 900 s)"


# ----------------------------------------------------------------------------- N in a row


def test_only_n_failing_evaluations_in_a_row_fail() -> None:
    spec = GatesSpec()  # three in a row
    history: list[Decision] = []
    bad = fleet(8, canary={"factor": 2.0})
    for count, minutes in enumerate((28, 29, 30), start=1):
        window = replace(bad, window_end=START + timedelta(minutes=minutes))
        decision = judge(window, spec, history=history)
        gate = decision.gate("latency_vs_control")
        assert gate is not None and gate.failing and gate.consecutive_failures == count
        if count < 3:
            assert decision.outcome == "inconclusive"
            assert gate.reason.startswith(f"{count} of 3 failing evaluations: p99 +")
        history.append(decision)
    assert decision.outcome == "fail"
    assert decision.consecutive_failures == 3


def test_a_pass_between_failures_starts_the_count_again() -> None:
    spec = GatesSpec()
    bad, good = fleet(9, canary={"factor": 2.0}), fleet(10)
    first = judge(replace(bad, window_end=START + timedelta(minutes=28)), spec)
    second = judge(replace(good, window_end=START + timedelta(minutes=29)), spec, history=[first])
    third = judge(bad, spec, history=[first, second])
    gate = third.gate("latency_vs_control")
    assert gate is not None and gate.consecutive_failures == 1
    assert third.outcome == "inconclusive"


def test_the_same_window_judged_again_adds_no_failure() -> None:
    spec = GatesSpec()
    bad = fleet(11, canary={"factor": 2.0})
    first = evaluate(spec, bad, bad.window_end + timedelta(seconds=1))
    again = evaluate(spec, bad, bad.window_end + timedelta(seconds=2), [first])
    gate = again.gate("latency_vs_control")
    assert gate is not None and gate.consecutive_failures == 1


def test_history_of_another_stage_or_from_the_future_does_not_count() -> None:
    bad = fleet(12, canary={"factor": 2.0})
    spec = replace(GatesSpec(), consecutive_failures=2)
    earlier = evaluate(spec, replace(bad, window_end=START + timedelta(minutes=29)), bad.window_end)
    shadowed = replace(earlier, stage="shadow")
    assert judge(bad, spec, history=[shadowed]).outcome == "inconclusive"
    assert judge(bad, spec, history=[earlier]).outcome == "fail"
    future = replace(earlier, evaluated_at=bad.window_end + timedelta(hours=1))
    with pytest.raises(InvalidInputError) as refused:
        judge(bad, spec, history=[future])
    assert refused.value.fields["field"] == "history[0].evaluated_at"


def test_a_self_test_failure_fails_at_once() -> None:
    samples = fleet(13)
    broken = replace(samples.canaries[0], counters=Counters(frames=100, self_test_failures=1))
    decision = judge(replace(samples, canaries=[broken, *samples.canaries[1:]]), GatesSpec())
    gate = decision.gate("self_test")
    assert gate is not None and gate.outcome == "fail" and gate.required_failures == 1
    assert gate.reason == "1 self-test or load failures on 3 canaries (c0: 1; at most 0)"
    assert decision.outcome == "fail"


# ----------------------------------------------------------------------------- counts


def test_mostly_zero_errors_with_a_real_rise_fail_and_identical_ones_pass() -> None:
    """kayenta#426: judged as a rate, not by ranks of mostly-zero intervals."""
    assert outcome(judge(fleet(14, canary={"errors": 1e-4})), "error_rate") == "pass"
    decision = judge(fleet(15, canary={"errors": 5e-3}))
    gate = decision.gate("error_rate")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("error rate 0.")
    assert number(gate, "p_value") < 1e-6


def test_a_rise_under_the_minimum_rate_passes() -> None:
    decision = judge(fleet(16, canary={"errors": 5e-4}))  # x5, but 0.05 % < 0.1 %
    assert outcome(decision, "error_rate") == "pass"


def test_a_crash_loop_fails_the_restart_gate() -> None:
    samples = fleet(17)
    crashing = replace(
        samples.canaries[0], counters=Counters(frames=18_000, restarts=6, seconds=1800)
    )
    decision = judge(replace(samples, canaries=[crashing, *samples.canaries[1:]]))
    assert outcome(decision, "restarts") == "fail"


def test_without_a_control_group_rates_are_judged_against_the_minimum() -> None:
    spec = ONCE.without_control()
    rising = fleet(18, canary={"errors": 5e-3})
    decision = judge(replace(rising, controls=[]), spec)
    assert decision.gate("latency_vs_control") is None
    assert outcome(decision, "error_rate") == "fail"
    assert outcome(decision, "rss_slope") == "pass"  # the ceiling alone
    assert outcome(judge(replace(fleet(19), controls=[]), spec), "error_rate") == "pass"


# ----------------------------------------------------------------------------- RSS


def test_a_10_mb_per_hour_leak_fails_the_rss_gate() -> None:
    decision = judge(fleet(20, canaries=5, controls=20, canary={"leak": 10 * MB}))
    gate = decision.gate("rss_slope")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("RSS +")
    assert gate.numbers["excess_bytes_per_hour"] == pytest.approx(10 * MB, rel=0.3)
    assert outcome(judge(fleet(21, canaries=5, controls=20)), "rss_slope") == "pass"


def test_a_leak_over_the_ceiling_fails_without_controls() -> None:
    samples = fleet(22, canary={"leak": 60 * MB})
    gate = judge(replace(samples, controls=[]), ONCE.without_control()).gate("rss_slope")
    assert gate is not None and gate.outcome == "fail"
    assert "over the ceiling +20.0 MB/h" in gate.reason


# ----------------------------------------------------------------------------- shadow


def with_long_baseline(sample: NodeSamples) -> NodeSamples:
    """Hours of intervals from before the update, as a node on the old version for
    long has: pairs then grow with time after it."""
    return replace(sample, baseline_p99_s=sample.baseline_p99_s * 10)


def shadow_stage(*counts: ShadowCounts) -> Samples:
    rng = np.random.default_rng(23)
    nodes = [
        with_long_baseline(
            replace(node(rng, f"s{i}", rss=False), shadow=count, counters=Counters(frames=100))
        )
        for i, count in enumerate(counts)
    ]
    return Samples(START, START + timedelta(minutes=30), canaries=nodes, stage="shadow")


def test_shadow_agreement_below_the_minimum_fails() -> None:
    good = ShadowCounts(frames=500, classified=500, top1_agreed=495)
    decision = judge(shadow_stage(good, good))
    assert [g.name for g in decision.gates] == [
        "self_test",
        "latency_vs_baseline",
        "output_agreement",
    ]
    assert decision.outcome == "pass", decision.summary()
    poor = ShadowCounts(frames=500, classified=500, top1_agreed=430)  # 86 % < 95 %
    gate = judge(shadow_stage(poor, poor)).gate("output_agreement")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("top1 86.0% (min 95%, n=1000, p=")


def test_one_diverging_shadow_node_fails_and_boxes_are_judged() -> None:
    boxes = ShadowCounts(frames=300, boxes_reference=900, boxes_matched=880, scores_agreed=860)
    diverging = ShadowCounts(frames=300, boxes_reference=900, boxes_matched=600, scores_agreed=580)
    gate = judge(shadow_stage(boxes, boxes, boxes, boxes, diverging)).gate("output_agreement")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("s4: box_recall 66.7%")
    assert outcome(judge(shadow_stage(boxes, boxes)), "output_agreement") == "pass"


def raw(frames: int, cosine: int, abs_diff: int | None = None) -> ShadowCounts:
    """Raw frames as a node counts them: `cosine` of them at every cosine level, and
    `abs_diff` (all, when None) within every difference level."""
    within = frames if abs_diff is None else abs_diff
    return ShadowCounts(
        frames=frames,
        raw=frames,
        cosine_at_least=dict.fromkeys(COSINE_LEVELS, cosine),
        abs_diff_at_most=dict.fromkeys(ABS_DIFF_LEVELS, within),
    )


def test_raw_outputs_are_judged_by_the_share_of_frames_that_agree() -> None:
    agreeing = raw(300, cosine=297)
    gate = judge(shadow_stage(agreeing, agreeing)).gate("output_agreement")
    assert gate is not None and gate.outcome == "pass", gate.reason
    assert gate.reason.startswith("raw_cosine 99.0% (min 95%, n=600, p=")
    assert "raw_abs_diff_compared" not in gate.numbers  # no tolerance set: not judged
    diverging = raw(300, cosine=240)
    gate = judge(shadow_stage(diverging, diverging)).gate("output_agreement")
    assert gate is not None and gate.outcome == "fail"
    assert gate.reason.startswith("raw_cosine 80.0% (min 95%, n=600, p=")
    # A largest difference within a tolerance, when the gates set one.
    spec = replace(
        ONCE,
        output_agreement=parse_gates(
            {"output_agreement": {"raw_max_abs_diff": 0.01}}
        ).output_agreement,
    )
    far = raw(300, cosine=300, abs_diff=200)
    gate = judge(shadow_stage(far, far), spec).gate("output_agreement")
    assert gate is not None and gate.outcome == "fail"
    assert "raw_abs_diff 66.7% (min 95%, n=600" in gate.reason
    # A node that does not count raw frames (an older agent) is never judged on them.
    uncounted = ShadowCounts(frames=300)
    gate = judge(shadow_stage(uncounted, uncounted)).gate("output_agreement")
    assert gate is not None and gate.outcome == "inconclusive"


def test_raw_agreement_levels_are_the_ones_a_node_counts() -> None:
    assert (
        parse_gates({"output_agreement": {"raw_cosine": 0.99}}).output_agreement.raw_cosine == 0.99
    )
    with pytest.raises(InvalidInputError, match=r"gates\.output_agreement\.raw_cosine"):
        parse_gates({"output_agreement": {"raw_cosine": 0.995}})
    with pytest.raises(InvalidInputError, match=r"gates\.output_agreement\.raw_max_abs_diff"):
        parse_gates({"output_agreement": {"raw_max_abs_diff": 0.05}})


def test_too_few_shadow_comparisons_are_inconclusive() -> None:
    few = ShadowCounts(frames=150, classified=150, top1_agreed=150)
    gate = judge(shadow_stage(few)).gate("output_agreement")
    assert gate is not None and gate.outcome == "inconclusive"
    assert gate.reason == "too few shadow frames: 150 (need 200)"


def test_overwhelming_disagreement_fails_below_the_minimum_sample() -> None:
    """A new-user trial: top-1 34 % at n=29 (p ~ 1e-20) waited for 200 frames."""
    bad = ShadowCounts(frames=29, classified=29, top1_agreed=10)
    gate = judge(shadow_stage(bad)).gate("output_agreement")
    assert gate is not None and gate.outcome == "fail" and gate.numbers["early_fail"] is True
    assert gate.reason.startswith("top1 34.5% (min 95%, n=29, p=")
    assert gate.reason.endswith("early: below the minimum sample, p < 1e-06)")
    # Still N failing evaluations in a row.
    spec, history = GatesSpec(), []
    for count in (1, 2, 3):
        window = replace(shadow_stage(bad), window_end=START + timedelta(minutes=30 + count))
        decision = judge(window, spec, history=history)
        history.append(decision)
        assert decision.outcome == ("fail" if count == 3 else "inconclusive")
    assert "output_agreement: 1 of 3 failing evaluations: top1" in history[0].waiting_for_data
    # Off, or evidence that is only suggestive: too few frames, waiting for more.
    off = judge(shadow_stage(bad), replace(ONCE, early_fail_p=0.0)).gate("output_agreement")
    assert off is not None and off.outcome == "inconclusive"
    for agreed in (25, 29):  # 86 %: p ~ 0.07; 100 %: never an early pass
        thin = ShadowCounts(frames=29, classified=29, top1_agreed=agreed)
        decision = judge(shadow_stage(thin))
        assert outcome(decision, "output_agreement") == "inconclusive"
        assert "output_agreement: too few shadow frames: 29 (need 200)" in decision.waiting_for_data
    raw_bad = raw(40, cosine=5)  # raw outputs: 12 % of frames close at n=40
    assert outcome(judge(shadow_stage(raw_bad)), "output_agreement") == "fail"


def test_an_overwhelming_error_rate_fails_below_the_minimum_exposure() -> None:
    few = fleet(21, canaries=1, minutes=1)  # 600 canary frames (need 1000)
    crashing = replace(few.canaries[0], counters=Counters(frames=600, errors=120, seconds=60))
    decision = judge(replace(few, canaries=[crashing]))
    gate = decision.gate("error_rate")
    assert gate is not None and gate.outcome == "fail" and gate.numbers["early_fail"] is True
    assert gate.reason.endswith("early: below the minimum exposure, p < 1e-06")
    quiet = replace(few.canaries[0], counters=Counters(frames=600, errors=1, seconds=60))
    gate = judge(replace(few, canaries=[quiet])).gate("error_rate")
    assert gate is not None and gate.outcome == "inconclusive"
    assert gate.reason == "too little exposure: canaries 600 frames (need 1,000)"
    spec = ONCE.without_control()
    alone = judge(replace(few, canaries=[crashing], controls=[]), spec).gate("error_rate")
    assert alone is not None and alone.outcome == "fail"


def test_only_data_that_time_brings_keeps_a_stage_waiting() -> None:
    sample = fleet(6, canaries=1, minutes=12)
    thin = judge(replace(sample, canaries=[with_long_baseline(n) for n in sample.canaries]))
    assert thin.outcome == "inconclusive"
    assert thin.waiting_for_data.startswith("latency_vs_control: too few p99 intervals")
    empty = judge(Samples(START, START + timedelta(minutes=30)))  # no counters at all
    assert empty.outcome == "inconclusive" and empty.waiting_for_data == ""
    stale = evaluate(ONCE, fleet(7), START + timedelta(minutes=50))
    assert stale.waiting_for_data == ""
    assert judge(fleet(10)).waiting_for_data == ""  # a pass waits for nothing
    read_back = Decision.from_dict(json.loads(json.dumps(thin.to_dict())))
    assert read_back.waiting_for_data == thin.waiting_for_data


# ----------------------------------------------------------------------------- the spec


def test_parse_gates_reads_overrides_and_round_trips() -> None:
    spec = parse_gates(
        {
            "confidence": 0.99,
            "consecutive_failures": 2,
            "early_fail_p": 1e-9,
            "min_samples": {"latency_intervals": 80},
            "error_rate": {"max_increase": 1, "min_rate": 0.01},
            "output_agreement": {"enabled": False},
        }
    )
    assert spec.confidence == 0.99 and spec.min_samples.latency_intervals == 80
    assert spec.early_fail_p == 1e-9 and GatesSpec().early_fail_p == 1e-6
    assert spec.error_rate == RateGate(max_increase=1.0, min_rate=0.01)
    assert spec.output_agreement == AgreementGate(enabled=False)
    assert spec.min_samples == replace(MinSamples(), latency_intervals=80)
    assert parse_gates(json.loads(json.dumps(spec.to_dict()))) == spec
    assert parse_gates(None) == GatesSpec() == parse_gates({})


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"confidance": 0.9}, "gates.confidance"),
        ({"error_rate": {"max_increse": 1}}, "gates.error_rate.max_increse"),
        ({"error_rate": {"max_increase": "1"}}, "gates.error_rate.max_increase"),
        ({"error_rate": {"max_increase": -1}}, "gates.error_rate.max_increase"),
        ({"confidence": 1.0}, "gates.confidence"),
        ({"consecutive_failures": 0}, "gates.consecutive_failures"),
        ({"early_fail_p": 0.05}, "gates.early_fail_p"),
        ({"early_fail_p": -1e-9}, "gates.early_fail_p"),
        ({"self_test": {"consecutive_failures": True}}, "gates.self_test.consecutive_failures"),
        ({"min_samples": {"frames": 0}}, "gates.min_samples.frames"),
        ({"min_samples": []}, "gates.min_samples"),
        ({"latency_vs_control": {"tail_quantile": 0.3}}, "gates.latency_vs_control.tail_quantile"),
        ({"output_agreement": {"min_top1": 1}}, "gates.output_agreement.min_top1"),
    ],
)
def test_parse_gates_refusals_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        parse_gates(raw)
    assert refused.value.fields["field"] == field
    assert refused.value.message.startswith(field.rsplit(".", 1)[0])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"p99_s": [0.02, math.nan]}, "samples.canaries[0].p99_s[1]"),
        ({"baseline_p99_s": [0.0]}, "samples.canaries[0].baseline_p99_s[0]"),
        ({"p99_s": [0.02, "0.03"]}, "samples.canaries[0].p99_s"),
        ({"p99_s": [True]}, "samples.canaries[0].p99_s"),
        ({"rss": [(0.0, -1.0)]}, "samples.canaries[0].rss[0]"),
        ({"rss": [1.0, 2.0]}, "samples.canaries[0].rss"),
        ({"counters": Counters(frames=1, errors=2)}, "samples.canaries[0].counters.errors"),
        ({"counters": Counters(restarts=-1)}, "samples.canaries[0].counters.restarts"),
        ({"node_id": "t0"}, "samples.controls[0].node_id"),
        ({"shadow": ShadowCounts(frames=1, classified=2)}, "samples.canaries[0].shadow.classified"),
    ],
)
def test_bad_samples_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        Samples(
            START,
            START,
            canaries=[replace(NodeSamples("c0"), **change)],
            controls=[NodeSamples("t0")],
        )
    assert refused.value.fields["field"] == field


def test_a_naive_window_or_now_is_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"samples\.window_end"):
        Samples(START, datetime(2026, 3, 1, 13))
    with pytest.raises(InvalidInputError, match="now"):
        evaluate(ONCE, Samples(START, START), datetime(2026, 3, 1, 13))


# ----------------------------------------------------------------------------- the decision


def test_a_decision_is_json_safe_and_reads_back() -> None:
    decision = judge(fleet(24, canary={"factor": 1.5}))
    stored = json.dumps(decision.to_dict(), allow_nan=False)
    assert Decision.from_dict(json.loads(stored)) == replace(
        decision,
        gates=tuple(
            replace(
                g,
                numbers={
                    k: None if isinstance(v, float) and not math.isfinite(v) else v
                    for k, v in g.numbers.items()
                },
            )
            for g in decision.gates
        ),
    )
    summary = decision.summary()
    assert "\n" not in summary and summary.startswith("fail: latency_vs_control: p99 +")
    with pytest.raises(InvalidInputError) as refused:
        Decision.from_dict({**json.loads(stored), "outcome": "maybe"})
    assert refused.value.fields["field"] == "decision.outcome"


def test_hodges_lehmann_finds_a_shift_and_stays_bounded() -> None:
    rng = np.random.default_rng(25)
    y = rng.normal(0.0, 1.0, 400)
    shift = hodges_lehmann(y + 3.0, y, 0.95)
    assert shift.estimate == pytest.approx(3.0) and shift.low < 3.0 < shift.high
    big = rng.normal(0.0, 1.0, 100_000)
    wide = hodges_lehmann(big + 0.5, big, 0.98)  # thinned to 250,000 pairs
    assert wide.low < 0.5 < wide.high and wide.high - wide.low < 0.05


def test_a_baseline_too_short_to_pair_is_not_waited_for() -> None:
    """Pairs grow only while a canary has unpaired intervals from before its update: a
    baseline of one interval per canary against a need of 50 is never filled by time."""
    sample = fleet(8)
    short = [replace(n, baseline_p99_s=n.baseline_p99_s[:1]) for n in sample.canaries]
    gate = judge(replace(sample, canaries=short)).gate("latency_vs_baseline")
    assert gate is not None and gate.outcome == "inconclusive"
    assert gate.reason.endswith("waiting adds none") and gate.numbers["baseline_intervals"] == 3
    assert SHORT_OF_DATA not in gate.numbers
    # Before-intervals still unpaired: time brings pairs, so the stage waits for them.
    early = [replace(n, p99_s=n.p99_s[:5]) for n in sample.canaries]
    gate = judge(replace(sample, canaries=early)).gate("latency_vs_baseline")
    assert gate is not None and gate.outcome == "inconclusive"
    assert gate.numbers[SHORT_OF_DATA] is True
