"""The rollout controller against a simulated fleet on an injected clock: stages, verdicts,
deadlines, the failure budget, windows, rate limits, late nodes, operator commands and a
reload of the state between every step."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control_plane.errors import ConflictError, InvalidInputError
from control_plane.rollouts.machine import (
    Action,
    Assign,
    AssignShadow,
    Command,
    EndShadow,
    NodeReport,
    Notify,
    Observations,
    Record,
    Rollback,
    Verdict,
    apply_command,
    step,
)
from control_plane.rollouts.plan import FleetNode, dry_run
from control_plane.rollouts.simulation import (
    Behaviour,
    SimulatedFleet,
    SimulatedNode,
    StaticVerdict,
    drive,
)
from control_plane.rollouts.spec import RolloutSpec, parse_rollout_spec
from control_plane.rollouts.state import RolloutState

T0 = datetime(2026, 3, 2, tzinfo=UTC)
RID = "r-1"
PASS = StaticVerdict("pass", "every gate passes", {"p99_ratio": 1.01})
FAIL = StaticVerdict("fail", "p99 +38 % vs control", {"p99_ratio": 1.38})
UNSURE = StaticVerdict("inconclusive", "12 of 50 samples for p99", {"samples": 12})
History = list[tuple[datetime, tuple[Action, ...]]]
Verdicts = Callable[[RolloutState, datetime], Verdict | None]


def make_spec(**changes: Any) -> RolloutSpec:
    base: dict[str, Any] = {
        "fleet": "plant",
        "model": "detector",
        "version": "2.0",
        "stages": "shadow:3,1,10%,50%,100%",
        "bake": "30m",
        "spread": "site",
    }
    return parse_rollout_spec(**{**base, **changes})


def make_fleet(count: int = 30, behaviours: dict[str, Behaviour] | None = None) -> SimulatedFleet:
    behaviours = behaviours or {}
    ids = [f"n-{i:03d}" for i in range(count)]
    return SimulatedFleet(
        SimulatedNode(node_id, {"site": "abc"[i % 3]}, "1.0", behaviours.get(node_id, "good"))
        for i, node_id in enumerate(ids)
    )


def plan_for(spec: RolloutSpec, fleet: SimulatedFleet) -> Any:
    """What `--dry-run` shows for this fleet (the spec's seed, as the rollout's)."""
    return dry_run(spec, fleet.observe(T0).nodes)


def always(verdict: Verdict | None) -> Verdicts:
    return lambda state, now: verdict


def at_stage(index: int, verdict: Verdict, otherwise: Verdict | None = PASS) -> Verdicts:
    return lambda state, now: verdict if state.stage == index else otherwise


def run(
    spec: RolloutSpec,
    fleet: SimulatedFleet,
    verdicts: Verdicts = always(PASS),
    state: RolloutState | None = None,
    start: datetime = T0,
    **options: Any,
) -> tuple[RolloutState, History]:
    state = state if state is not None else RolloutState.new(RID, spec, start)
    return drive(state, fleet, verdicts, start, **options)


def of(history: History, kind: type) -> list[tuple[datetime, Any]]:
    return [(now, a) for now, actions in history for a in actions if isinstance(a, kind)]


def decisions(history: History, kind: str) -> list[Any]:
    return [a.decision for _, a in of(history, Record) if a.decision.kind == kind]


def reload(state: RolloutState, now: datetime) -> RolloutState:
    return RolloutState.from_dict(json.loads(json.dumps(state.to_dict())))


# ------------------------------------------------------------------- the good path


def test_a_good_model_completes_every_stage_in_order() -> None:
    spec, fleet = make_spec(), make_fleet()
    plan = plan_for(spec, fleet)
    state, history = run(spec, fleet)
    assert state.status == "done"
    assert {n.version for n in fleet.nodes.values()} == {"2.0"}
    assigned = [a.node_id for _, a in of(history, Assign)]
    assert sorted(assigned) == sorted(fleet.nodes)  # each node exactly once
    assert len(of(history, AssignShadow)) == 3
    assert of(history, Rollback) == []
    # A stage passes only once its nodes were started; the next starts only after.
    passed = [d.at for d in decisions(history, "stage-passed")]
    assert len(passed) == 5
    for stage, at in zip(plan.stages[1:], passed[1:], strict=True):
        assert sum(1 for t, _ in of(history, Assign) if t < at) == stage.target
    assert any(n.kind == "done" for _, n in of(history, Notify))
    assert state.counts() == {"healthy": 30}


def test_the_rollout_takes_the_nodes_its_dry_run_showed_in_that_order() -> None:
    spec, fleet = make_spec(), make_fleet()
    plan = plan_for(spec, fleet)
    _, history = run(spec, fleet)
    assert [a.node_id for _, a in of(history, AssignShadow)] == list(plan.shadow_nodes)
    assert [a.node_id for _, a in of(history, Assign)] == [
        n for s in plan.stages for n in s.nodes if not s.shadow
    ]
    other = RolloutState.new(RID, spec, T0, seed="another seed")
    _, history = run(spec, make_fleet(), state=other)
    assert [a.node_id for _, a in of(history, Assign)] != list(plan.order)


def test_a_stage_bakes_only_when_its_nodes_are_healthy_and_for_the_bake_time() -> None:
    spec, fleet = make_spec(stages="1,100%", bake="2h"), make_fleet(6)
    _, history = run(spec, fleet)
    started, baking, passed = (
        decisions(history, k)[0] for k in ("nodes-started", "baking", "stage-passed")
    )
    # The simulated node needs four phases of a minute each to be healthy.
    assert baking.at - started.at == timedelta(minutes=4)
    assert passed.at - baking.at == timedelta(hours=2)


# --------------------------------------------------------------- verdicts decide


def test_a_failing_verdict_rolls_back_every_touched_node_and_nobody_else_gets_it() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, at_stage(3, FAIL))
    assert state.status == "rolled-back"
    rollbacks = of(history, Rollback)
    first_rollback = rollbacks[0][0]
    assigned = {a.node_id for _, a in of(history, Assign)}
    assert {a.node_id for _, a in rollbacks} == assigned
    assert {a.previous for _, a in rollbacks} == {"1.0"}
    assert all(t <= first_rollback for t, _ in of(history, Assign))
    assert len(assigned) == plan_for(spec, fleet).stages[3].target
    assert {n.version for n in fleet.nodes.values()} == {"1.0"}
    (decision,) = decisions(history, "rolling-back")
    assert decision.numbers["verdict"]["p99_ratio"] == 1.38
    assert any("p99 +38 % vs control" in n.text for _, n in of(history, Notify))


def test_a_failing_shadow_stops_the_candidate_before_any_node_serves_it() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, at_stage(0, FAIL))
    assert state.status == "rolled-back"
    assert of(history, Assign) == []
    shadows = [a.node_id for _, a in of(history, AssignShadow)]
    assert sorted(a.node_id for _, a in of(history, EndShadow)) == sorted(shadows)
    assert {n.version for n in fleet.nodes.values()} == {"1.0"}


def test_inconclusive_pauses_with_its_reason_and_never_decides_by_itself() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, at_stage(2, UNSURE), until=lambda s: s.status == "paused")
    assert state.pause is not None and state.pause.kind == "inconclusive"
    assert "12 of 50 samples" in state.label
    assert any(n.kind == "paused" for _, n in of(history, Notify))
    # Days of further verdicts change nothing: neither a pass nor more doubt.
    now = history[-1][0]
    assigned_before = len(of(history, Assign))
    for verdict in (UNSURE, PASS):
        state, later = run(spec, fleet, always(verdict), state, now, max_steps=300)
        now = later[-1][0]
        assert state.status == "paused"
        assert of(later, Assign) == [] and of(later, Rollback) == []
    assert len(of(history, Assign)) == assigned_before
    # Resumed, the stage bakes again and a pass moves on.
    state, _ = apply_command(state, Command("resume", "alice"), now)
    assert state.status == "baking" and state.bake_started == now
    state, _ = run(spec, fleet, always(PASS), state, now)
    assert state.status == "done"


def test_a_failing_verdict_still_rolls_back_a_paused_rollout() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, at_stage(2, UNSURE), until=lambda s: s.status == "paused")
    state, later = run(spec, fleet, always(FAIL), state, history[-1][0])
    assert state.status == "rolled-back"
    assert of(later, Rollback)


def test_no_verdict_after_the_bake_pauses_once_the_verdict_deadline_passes() -> None:
    spec, fleet = make_spec(stages="1,100%", deadlines="verdict=20m"), make_fleet(6)
    state, history = run(spec, fleet, always(None), until=lambda s: s.status == "paused")
    assert state.pause is not None and state.pause.kind == "no-verdict"
    (baking,) = decisions(history, "baking")
    assert history[-1][0] - baking.at == timedelta(minutes=30 + 20)


SHORT = StaticVerdict(
    "inconclusive",
    "output_agreement: too few shadow frames: 59 (need 200)",
    waiting_for_data="output_agreement: too few shadow frames: 59 (need 200)",
)


def test_short_of_data_keeps_baking_and_asks_again_until_the_data_is_there() -> None:
    spec, fleet = make_spec(stages="1,100%", deadlines="verdict=20m"), make_fleet(6)
    state, history = run(spec, fleet, always(SHORT), until=lambda s: s.status == "baking")
    baked = history[-1][0] + spec.bake
    # The bake is over, the data is short: the stage bakes on and says why.
    state, later = run(spec, fleet, always(SHORT), state, baked, max_steps=5)
    assert state.status == "baking" and state.pause is None
    assert state.label == (
        "stage 1 of 2 (1) baking (waiting for data: output_agreement: too few shadow "
        "frames: 59 (need 200))"
    )
    assert len(decisions(later, "waiting-for-data")) == 1  # once, not every evaluation
    # A step without a verdict keeps the wait; a restart keeps it too.
    now = later[-1][0] + timedelta(minutes=1)
    state, _ = run(spec, fleet, always(None), state, now, max_steps=1, between=reload)
    assert reload(state, now).label.endswith("(need 200))")
    # The data arrives: the stage passes on its verdict, never on the wait.
    state, after = run(spec, fleet, always(PASS), state, now + timedelta(minutes=1), max_steps=1)
    assert state.stage == 1 and [d.kind for d in decisions(after, "stage-passed")]


def test_short_of_data_pauses_at_the_verdict_deadline_and_never_passes() -> None:
    spec, fleet = make_spec(stages="1,100%", deadlines="verdict=20m"), make_fleet(6)
    state, history = run(spec, fleet, always(SHORT), until=lambda s: s.status == "paused")
    assert state.pause is not None and state.pause.kind == "inconclusive"
    assert state.pause.reason == (
        "inconclusive (still 20m after the bake): output_agreement: too few shadow "
        "frames: 59 (need 200)"
    )
    (baking,) = decisions(history, "baking")
    assert history[-1][0] - baking.at == timedelta(minutes=30 + 20)
    assert not decisions(history, "stage-passed") and state.stage == 0


def test_an_inconclusive_verdict_not_short_of_data_pauses_at_the_end_of_the_bake() -> None:
    spec, fleet = make_spec(stages="1,100%", deadlines="verdict=20m"), make_fleet(6)
    state, history = run(spec, fleet, always(UNSURE), until=lambda s: s.status == "paused")
    assert (
        state.pause is not None and state.pause.reason == "inconclusive: 12 of 50 samples for p99"
    )
    (baking,) = decisions(history, "baking")
    assert history[-1][0] - baking.at == timedelta(minutes=30)
    assert not decisions(history, "waiting-for-data")


def test_a_failing_verdict_while_waiting_for_data_rolls_back() -> None:
    spec, fleet = make_spec(stages="1,100%"), make_fleet(6)
    state, history = run(spec, fleet, always(SHORT), until=lambda s: s.status == "baking")
    state, _ = run(spec, fleet, always(SHORT), state, history[-1][0] + spec.bake, max_steps=3)
    assert state.hold.startswith("waiting for data")
    state, _ = run(spec, fleet, always(FAIL), state, history[-1][0] + spec.bake * 2)
    assert state.status == "rolled-back"


def test_done_after_promotions_says_what_passed_and_what_was_promoted() -> None:
    spec, fleet = make_spec(stages="shadow:1,1,100%", bake="1m"), make_fleet(4)
    state, now = RolloutState.new(RID, spec, T0), T0
    for _ in range(2):  # shadow and stage 1: paused inconclusive, promoted by a person
        state, history = run(
            spec, fleet, always(UNSURE), state, now, until=lambda s: s.status == "paused"
        )
        now = history[-1][0]
        state, _ = apply_command(state, Command("promote", "alice"), now)
    state, history = run(spec, fleet, always(PASS), state, now)
    assert state.status == "done"
    (done,) = decisions(history, "done")
    assert done.text == "1 stage passed, 2 promoted without a verdict; 4 nodes healthy"
    assert [n.text for _, n in of(history, Notify) if n.kind == "done"] == [
        "rollout r-1: detector 2.0: 1 stage passed, 2 promoted without a verdict"
    ]
    assert reload(state, now).ended == ("promoted", "promoted", "passed")


def test_messages_count_one_node_in_the_singular() -> None:
    spec, fleet = make_spec(stages="1,100%"), make_fleet(2)
    state, history = run(spec, fleet)
    assert state.status == "done"
    texts = [d.text for d in decisions(history, "nodes-started") + decisions(history, "baking")]
    assert texts[0] == "1 node started"
    assert "1 node healthy" in texts[-1] or "1 node healthy" in texts[-2]
    assert all("1 nodes" not in t for t in texts)
    (done,) = decisions(history, "done")
    assert done.text == "every stage passed; 2 nodes healthy"


def test_promote_takes_the_next_stage_without_a_verdict_and_is_recorded() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, at_stage(1, UNSURE), until=lambda s: s.status == "paused")
    now = history[-1][0]
    state, _ = apply_command(state, Command("promote", "alice", "checked by hand"), now)
    state, later = run(spec, fleet, at_stage(1, UNSURE), state, now, max_steps=1)
    assert state.stage == 2 and state.status == "running"
    assert [d.text for d in decisions(later, "promoted")] == [
        "stage 1 of 4 (1) promoted by alice without a verdict"
    ]
    assert of(later, Assign)  # the next stage starts in the same step


# ---------------------------------------------------- deadlines and the budget


def test_a_silent_node_times_out_and_counts_against_the_budget() -> None:
    spec = make_spec(failure_budget="1")
    silent = plan_for(spec, make_fleet()).stages[3].nodes[0]
    fleet = make_fleet(behaviours={silent: "silent"})
    state, history = run(spec, fleet)
    (assigned_at,) = [t for t, a in of(history, Assign) if a.node_id == silent]
    (timeout,) = decisions(history, "node-timed-out")
    assert timeout.numbers["node"] == silent and "did not start within 15m" in timeout.text
    assert timeout.at - assigned_at == timedelta(minutes=16)  # the first step past 15 min
    assert state.status == "done"  # one failure is within a budget of one
    assert state.nodes[silent].phase == "timed-out"


def test_two_silent_nodes_exceed_a_budget_of_one_and_roll_back() -> None:
    spec = make_spec(failure_budget="1")
    silent = plan_for(spec, make_fleet()).stages[3].nodes[:2]
    fleet = make_fleet(behaviours=dict.fromkeys(silent, "silent"))
    state, history = run(spec, fleet)
    assert state.status == "rolled-back"
    (decision,) = decisions(history, "rolling-back")
    assert decision.numbers["why"] == "budget" and decision.numbers["failed"] == 2
    assert "failure budget 1 exceeded" in decision.text
    assert {n.version for n in fleet.nodes.values()} == {"1.0"}


def test_a_rollback_a_node_never_confirms_is_recorded_and_the_rollout_still_ends() -> None:
    spec, fleet = make_spec(stages="3,100%"), make_fleet(9)
    state, history = run(spec, fleet, until=until_at(0, "baking"))
    unplugged = next(a.node_id for _, a in of(history, Assign))
    fleet.nodes[unplugged].online = False  # it serves 2.0 and hears nothing more
    now = history[-1][0]
    state, actions = apply_command(state, Command("rollback", "erin"), now)
    fleet.apply(actions, now)
    state, later = run(spec, fleet, state=state, start=now)
    assert state.status == "rolled-back"
    (timeout,) = decisions(later, "node-timed-out")
    assert timeout.numbers["node"] == unplugged
    assert timeout.at - now == timedelta(minutes=15 + 60 + 15 + 1)  # start+download+activate
    assert "1 node did not confirm" in decisions(later, "rolled-back")[0].text


def test_failed_self_tests_beyond_the_budget_share_roll_back() -> None:
    spec = make_spec()  # 2 % of the nodes started
    bad = plan_for(spec, make_fleet()).stages[3].nodes[:2]
    fleet = make_fleet(behaviours=dict.fromkeys(bad, "fails-self-test"))
    state, history = run(spec, fleet)
    assert state.status == "rolled-back"
    failed = decisions(history, "node-failed")
    assert {d.numbers["node"] for d in failed} <= set(bad)
    assert "self-test: output-mismatch" in failed[0].text
    assert {n.version for n in fleet.nodes.values()} == {"1.0"}


def test_installed_is_not_updated_a_node_without_samples_never_counts_healthy() -> None:
    spec = make_spec(failure_budget="1", stages="3,100%")
    node = plan_for(spec, make_fleet()).stages[0].nodes[0]
    fleet = make_fleet(behaviours={node: "never-healthy"})
    state, history = run(spec, fleet, until=lambda s: s.status == "baking")
    (assigned_at,) = [t for t, a in of(history, Assign) if a.node_id == node]
    # The stage waits for it: active at +3 min, then the report deadline of 15 minutes.
    assert history[-1][0] - assigned_at == timedelta(minutes=3 + 16)
    assert state.nodes[node].phase == "timed-out"
    assert "not healthy (watchdog passed and samples of 2.0)" in state.nodes[node].reason


def test_a_healthy_node_that_goes_silent_times_out_during_the_bake() -> None:
    spec = make_spec(failure_budget="1", stages="3,100%", bake="1h")
    node = plan_for(spec, make_fleet()).stages[0].nodes[0]
    fleet = make_fleet(behaviours={node: "goes-silent"})
    state, history = run(spec, fleet)
    (timeout,) = decisions(history, "node-timed-out")
    assert timeout.numbers == {
        "node": node,
        "phase": "active-unhealthy",
        "reason": "not healthy (watchdog passed and samples of 2.0) within 15m",
        "track": "candidate",
    }
    assert state.status == "done"


def test_a_report_from_before_the_assignment_is_ignored() -> None:
    spec = make_spec(stages="1,100%")
    nodes = [FleetNode("n-1", {"site": "a"}, "1.0"), FleetNode("n-2", {"site": "b"}, "1.0")]
    state, actions = step(RolloutState.new(RID, spec, T0), Observations(nodes), None, T0)
    (assign,) = [a for a in actions if isinstance(a, Assign)]
    stale = NodeReport("2.0", "failed", T0 - timedelta(days=1), reason="from last week")
    later = T0 + timedelta(minutes=1)
    state, _ = step(state, Observations(nodes, {assign.node_id: stale}), None, later)
    assert state.nodes[assign.node_id].phase == "assigned"
    fresh = NodeReport("2.0", "failed", later, reason="hash-mismatch")
    state, _ = step(state, Observations(nodes, {assign.node_id: fresh}), None, later)
    assert state.status == "rolling-back"  # the first canary failed: 2 % of 1 is 0


# -------------------------------------------------------------- operator commands

STAGES = range(5)  # shadow, then the four canary stages


def until_at(stage: int, status: str) -> Callable[[RolloutState], bool]:
    return lambda s: s.stage == stage and s.status == status


@pytest.mark.parametrize("status", ["running", "baking"])
@pytest.mark.parametrize("stage", STAGES)
def test_pause_holds_every_stage_and_resume_finishes_it(stage: int, status: str) -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, until=until_at(stage, status))
    now = history[-1][0]
    state, actions = apply_command(state, Command("pause", "alice", "looking at the plots"), now)
    fleet.apply(actions, now)
    assert state.status == "paused" and "paused by alice: looking at the plots" in state.label
    state, held = run(spec, fleet, state=state, start=now, max_steps=120)
    assert state.status == "paused"
    assert of(held, Assign) == [] and of(held, AssignShadow) == []
    now = held[-1][0]
    state, _ = apply_command(state, Command("resume", "alice"), now)
    assert state.status == status
    state, _ = run(spec, fleet, state=state, start=now)
    assert state.status == "done"
    assert {n.version for n in fleet.nodes.values()} == {"2.0"}


@pytest.mark.parametrize("stage", STAGES)
def test_abort_stops_starting_nodes_and_leaves_touched_ones_alone(stage: int) -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, until=until_at(stage, "running"))
    now = history[-1][0]
    touched = {a.node_id for _, a in of(history, Assign)}
    state, actions = apply_command(state, Command("abort", "bob"), now)
    fleet.apply(actions, now)
    assert state.status == "aborted"
    shadowing = {a.node_id for _, a in of(history, AssignShadow)} - touched
    if stage == 0:
        assert {a.node_id for a in actions if isinstance(a, EndShadow)} == shadowing
    state, later = run(spec, fleet, state=state, start=now, max_steps=60, until=lambda s: False)
    assert [a for _, acts in later for a in acts] == []
    assert {i for i, n in fleet.nodes.items() if n.version == "2.0"} == touched


@pytest.mark.parametrize("status", ["running", "baking"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_manual_rollback_in_every_stage_undoes_every_touched_node(
    stage: int, status: str
) -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, until=until_at(stage, status))
    now = history[-1][0]
    state, actions = apply_command(state, Command("rollback", "carol", "customer report"), now)
    fleet.apply(actions, now)
    assigned = {a.node_id for _, a in of(history, Assign)}
    assert {a.node_id for a in actions if isinstance(a, Rollback)} == assigned
    state, later = run(spec, fleet, state=state, start=now)
    assert state.status == "rolled-back"
    assert of(later, Assign) == []
    assert {n.version for n in fleet.nodes.values()} == {"1.0"}
    assert state.last is not None and state.last.kind == "rolled-back"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("running", "resume"),
        ("running", "promote"),
        ("done", "pause"),
        ("done", "resume"),
        ("rolled-back", "rollback"),
        ("rolled-back", "abort"),
    ],
)
def test_a_command_that_does_not_apply_is_refused_naming_the_status(status: str, kind: str) -> None:
    spec, fleet = make_spec(), make_fleet(6)
    verdicts = always(FAIL) if status == "rolled-back" else always(PASS)
    state, history = run(spec, fleet, verdicts, until=lambda s: s.status == status)
    with pytest.raises(ConflictError) as caught:
        apply_command(state, Command(kind, "dave"), history[-1][0])  # type: ignore[arg-type]
    assert caught.value.fields == {"rollout": RID, "status": status, "command": kind}


# ------------------------------------------------------------- window and rate


def test_a_window_closing_mid_stage_holds_starting_and_resumes_when_it_opens() -> None:
    spec = make_spec(
        stages="1,100%", window=("cron 0 2 * * *", "10m"), max_rate="2/min", bake="10m"
    )
    fleet = make_fleet(30)
    start = T0.replace(hour=1, minute=50)
    state, history = run(spec, fleet, start=start)
    assert state.status == "done"
    assert of(history, Rollback) == [] and decisions(history, "node-timed-out") == []
    for t, _ in of(history, Assign):
        assert spec.window is not None and spec.window.is_open(t)
    # Stage 1 takes the first night; stage 2 (29 nodes at 2 a minute) needs two windows.
    days = {t.date() for t, _ in of(history, Assign)}
    assert len(days) == 3
    closed = decisions(history, "window-closed")
    assert closed and "it opens at" in closed[0].text
    assert decisions(history, "window-open")


@pytest.mark.parametrize(("rate", "tick"), [("5/min", 10), ("1/s", 5)])
def test_the_rate_limit_holds_in_every_window(rate: str, tick: int) -> None:
    spec = make_spec(stages="1,100%", max_rate=rate, bake="5m")
    fleet = make_fleet(150)
    state, history = run(spec, fleet, tick=timedelta(seconds=tick))
    assert state.status == "done"
    limit = spec.max_rate.per_window
    times = [t for t, _ in of(history, Assign)]
    in_window = [sum(1 for u in times if t - spec.max_rate.window < u <= t) for t in times]
    assert max(in_window) == min(limit, 149)  # the limit binds, and holds
    assert any("rate limit" in d.text for d in decisions(history, "nodes-started"))


# ------------------------------------------------------------------ late nodes


def test_a_node_enrolling_mid_rollout_joins_the_stage_it_would_have_been_in() -> None:
    spec, fleet = make_spec(), make_fleet()
    state, history = run(spec, fleet, until=until_at(2, "baking"))
    now = history[-1][0]
    late = [SimulatedNode(f"n-late{i}", {"site": "abc"[i % 3]}, None) for i in range(6)]
    for node in late:
        fleet.add(node)
    expected = dry_run(spec, fleet.observe(now).nodes, seed=state.seed)
    stages: dict[datetime, int] = {}

    def note(state: RolloutState, now: datetime) -> RolloutState:
        stages[now - timedelta(minutes=1)] = state.stage  # the stage after that step
        return state

    state, later = run(spec, fleet, state=state, start=now, between=note)
    assert state.status == "done"
    for node in late:
        placed = state.nodes[node.id].stage
        assert placed == expected.stage_of(node.id)
        (assigned_at,) = [t for t, a in of(later, Assign) if a.node_id == node.id]
        assert stages.get(assigned_at, 2) >= max(placed or 0, 2)
    assert {fleet.nodes[n.id].version for n in late} == {"2.0"}
    assert decisions(later, "nodes-joined")


def test_a_node_enrolling_after_the_rollout_is_done_gets_the_candidate() -> None:
    spec, fleet = make_spec(), make_fleet(9)
    state, history = run(spec, fleet)
    fleet.add(SimulatedNode("n-late", {"site": "b"}, "1.0"))
    state, later = run(
        spec, fleet, state=state, start=history[-1][0], max_steps=10, until=lambda s: False
    )
    assert [a.node_id for _, a in of(later, Assign)] == ["n-late"]
    assert state.status == "done" and state.nodes["n-late"].phase == "healthy"


def test_a_queued_node_that_stops_matching_leaves_the_rollout() -> None:
    spec, fleet = make_spec(selector="site!=c"), make_fleet()
    state, history = run(spec, fleet, until=until_at(1, "baking"))
    last = plan_for(spec, fleet).stages[4].nodes[0]
    fleet.nodes[last].labels["site"] = "c"
    state, later = run(spec, fleet, state=state, start=history[-1][0])
    assert state.nodes[last].phase == "left"
    assert last not in {a.node_id for _, a in of(later, Assign)}
    assert state.status == "done"


# ----------------------------------------------------------- controls and start


def test_each_stage_compares_with_old_nodes_of_the_same_sites() -> None:
    spec, fleet = make_spec(stages="3,30%,100%"), make_fleet()
    sites = {i: n.labels["site"] for i, n in fleet.nodes.items()}
    seen: list[tuple[int, tuple[str, ...]]] = []

    def note(state: RolloutState, now: datetime) -> RolloutState:
        if state.status == "baking" and (state.stage, state.controls) not in seen:
            seen.append((state.stage, state.controls))
        return state

    end, _ = run(spec, fleet, between=note)
    assert [stage for stage, _ in seen] == [0, 1, 2]
    # 3 canaries then 9: one, then three per site; compared with as many old nodes there.
    for (stage, controls), per_site in zip(seen[:2], (1, 3), strict=True):
        taken = {i for i, r in end.nodes.items() if r.stage is not None and r.stage <= stage}
        assert not taken & set(controls)
        assert {s: sum(1 for c in controls if sites[c] == s) for s in "abc"} == dict.fromkeys(
            "abc", per_site
        )
    assert seen[2][1] == ()  # at 100 % nobody is left on the old version


def test_a_selector_matching_nobody_pauses_and_a_fleet_already_on_it_is_done() -> None:
    spec = make_spec(selector="site=z")
    state, _ = step(RolloutState.new(RID, spec, T0), make_fleet(3).observe(T0), None, T0)
    assert state.status == "paused" and state.pause is not None
    assert state.pause.kind == "no-nodes"
    on_it = [FleetNode("n-1", {"site": "a"}, "2.0")]
    state, actions = step(RolloutState.new(RID, make_spec(), T0), Observations(on_it), None, T0)
    assert state.status == "done" and not any(isinstance(a, Assign) for a in actions)


# ------------------------------------------------------------------- restarts


SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Behaviour], Verdicts]] = {
    "completes": (
        {"failure_budget": "2"},
        {"n-004": "silent", "n-011": "never-healthy"},
        always(PASS),
    ),
    "rolls back": ({}, {"n-013": "crashes"}, at_stage(3, FAIL)),
    "pauses": ({"window": ("*/20 * * * *", "5m"), "max_rate": "3/min"}, {}, at_stage(2, UNSURE)),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_state_reloaded_before_every_step_continues_identically(scenario: str) -> None:
    changes, behaviours, verdicts = SCENARIOS[scenario]
    spec = make_spec(**changes)
    kept, kept_history = run(spec, make_fleet(30, behaviours), verdicts, max_steps=600)
    reloaded, reloaded_history = run(
        spec, make_fleet(30, behaviours), verdicts, max_steps=600, between=reload
    )
    assert reloaded_history == kept_history
    assert reloaded.to_dict() == kept.to_dict()
    assert len(kept_history) > 10


def test_a_damaged_stored_state_is_refused_naming_the_field() -> None:
    spec, fleet = make_spec(), make_fleet(6)
    state, _ = run(spec, fleet, until=until_at(1, "baking"))
    stored = json.loads(json.dumps(state.to_dict()))
    node = next(iter(stored["nodes"]))
    stored["nodes"][node]["phase"] = "installed"
    with pytest.raises(InvalidInputError) as caught:
        RolloutState.from_dict(stored)
    assert caught.value.fields["field"] == f"rollout_state.nodes.{node}.phase"
    stored = json.loads(json.dumps(state.to_dict()))
    stored["stage"] = 9
    with pytest.raises(InvalidInputError, match=r"rollout_state\.stage"):
        RolloutState.from_dict(stored)


def test_now_must_carry_a_time_zone() -> None:
    with pytest.raises(InvalidInputError, match="now"):
        step(RolloutState.new(RID, make_spec(), T0), Observations(()), None, datetime(2026, 1, 1))
