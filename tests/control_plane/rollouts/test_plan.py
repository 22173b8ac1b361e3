"""Planning: which nodes match, how stages spread across label values, control groups,
where late nodes belong, and overlapping rollouts refused."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from control_plane.errors import ConflictError
from control_plane.rollouts.plan import (
    MIN_CONTROLS,
    Candidate,
    FleetNode,
    choose_controls,
    conflicts,
    dry_run,
    refuse_conflicts,
    spread_order,
    stratum_of,
)
from control_plane.rollouts.spec import RolloutSpec, parse_rollout_spec


def spec(**changes: Any) -> RolloutSpec:
    base: dict[str, Any] = {
        "fleet": "plant",
        "model": "detector",
        "version": "2.0",
        "stages": "3,10%,50%,100%",
        "spread": "site",
    }
    return parse_rollout_spec(**{**base, **changes})


def fleet(count: int, sites: str = "abc", **labels: str) -> list[FleetNode]:
    return [
        FleetNode(f"n-{i:03d}", {"site": sites[i % len(sites)], **labels}, "1.0")
        for i in range(count)
    ]


def site_of(nodes: list[FleetNode]) -> dict[str, str]:
    return {n.id: n.labels["site"] for n in nodes}


def test_a_stage_of_three_over_three_sites_takes_one_per_site() -> None:
    # 30 nodes, most of them at site a: a stage taken "from the top" would be all site a.
    nodes = fleet(30, sites="aaaaaaabbc")
    for seed in ("r1", "r2", "r3"):
        plan = dry_run(spec(), nodes, seed=seed)
        first = plan.stages[0]
        assert len(first.nodes) == 3
        assert sorted(site_of(nodes)[n] for n in first.nodes) == ["a", "b", "c"]


def test_spreading_over_two_labels_covers_every_pair_before_repeating() -> None:
    nodes = [
        FleetNode(f"n-{i:03d}", {"site": "abc"[i % 3], "hardware": "xy"[(i // 3) % 2]}, "1.0")
        for i in range(60)
    ]
    order = spread_order(nodes, ("site", "hardware"), "seed")
    labels = {n.id: (n.labels["site"], n.labels["hardware"]) for n in nodes}
    first_six = [labels[n.id] for n in order[:6]]
    assert len(set(first_six)) == 6
    assert Counter(site for site, _ in first_six) == {"a": 2, "b": 2, "c": 2}


def test_the_order_is_deterministic_per_seed_and_prefers_online_nodes() -> None:
    nodes = [FleetNode(f"n-{i}", {"site": "a"}, "1.0", online=i % 2 == 0) for i in range(10)]
    once = [n.id for n in spread_order(nodes, ("site",), "r7")]
    assert once == [n.id for n in spread_order(list(reversed(nodes)), ("site",), "r7")]
    assert all(n.online for n in spread_order(nodes, ("site",), "r7")[:5])
    orders = {tuple(n.id for n in spread_order(nodes, ("site",), seed)) for seed in "abcdef"}
    assert len(orders) > 1  # the seed, not the node ids, decides who goes first


def test_selection_and_nodes_already_on_the_candidate() -> None:
    nodes = [
        *fleet(9),
        FleetNode("n-gate", {"site": "a", "role": "gate"}, "1.0"),
        FleetNode("n-done", {"site": "b"}, "2.0"),
        FleetNode("n-new", {"site": "c"}, None),
    ]
    plan = dry_run(spec(selector="role!=gate"), nodes)
    assert "n-gate" not in plan.order
    assert plan.already == ("n-done",)
    assert "n-new" in plan.order  # a box with no version of the model gets it too
    assert sorted(plan.stage_index) == sorted(plan.order)
    # Each canary stage adds what its size says, on the nodes to update.
    assert [s.target for s in plan.stages] == [3, 3, 5, 10]
    assert [len(s.nodes) for s in plan.stages] == [3, 0, 2, 5]


def test_controls_are_old_nodes_outside_the_stage_in_the_same_strata() -> None:
    nodes = fleet(30)
    plan = dry_run(spec(stages="3,30%,100%"), nodes)
    sites = site_of(nodes)
    for stage in plan.stages:
        taken = {n for s in plan.stages[: stage.index + 1] for n in s.nodes}
        assert not taken & set(stage.controls)
        if stage.target < len(plan.order):
            assert Counter(sites[n] for n in stage.controls) == Counter(sites[n] for n in taken)
    assert plan.stages[-1].controls == ()  # at 100 % nobody is left on the old version
    assert dry_run(spec(control="none"), nodes).stages[0].controls == ()


def test_shadow_nodes_serve_a_version_and_are_the_first_canaries() -> None:
    nodes = [*fleet(12), FleetNode("n-bare", {"site": "a"}, None)]
    plan = dry_run(spec(stages="shadow:50%,1,100%"), nodes)
    shadow = plan.shadow_nodes
    assert len(shadow) == 7  # 50 % of 13, rounded up
    assert "n-bare" not in shadow
    assert plan.stages[1].nodes[0] == plan.order[0]
    assert set(plan.order[:7]) - {"n-bare"} <= set(shadow)


def test_a_node_enrolling_later_belongs_where_the_plan_would_have_put_it() -> None:
    nodes = fleet(30)
    late = FleetNode("n-late", {"site": "b"}, None)
    after = dry_run(spec(), [*nodes, late], seed="r1")
    stage = after.stage_of("n-late")
    assert stage is not None
    rank = after.order.index("n-late")
    assert rank < after.stages[stage].target
    assert stage == 0 or rank >= after.stages[stage - 1].target


def test_a_partial_rollout_leaves_the_rest() -> None:
    plan = dry_run(spec(stages="1,10%", partial=True), fleet(40))
    assert len(plan.outside) == 36
    assert all(plan.stage_of(n) is None for n in plan.outside)
    assert "left on their version (partial)" in plan.summary()


def test_the_summary_names_each_stages_nodes_and_controls() -> None:
    plan = dry_run(spec(stages="shadow:2,3,100%"), fleet(6))
    text = plan.summary()
    lines = text.splitlines()
    assert lines[0].startswith("detector 2.0 to fleet plant")
    assert "matched 6 nodes: 6 to update, 0 already on 2.0" in text
    assert "site=a 2, site=b 2, site=c 2" in text
    shadow_line = next(line for line in lines if line.startswith("shadow (2)"))
    assert all(n in shadow_line for n in plan.shadow_nodes)
    stage_line = next(line for line in lines if line.startswith("stage 1 of 2 (3)"))
    assert all(n in stage_line for n in plan.stages[1].nodes + plan.stages[1].controls)


# ------------------------------------------------------------------- overlaps


def test_an_overlapping_rollout_of_the_same_model_is_refused_by_name() -> None:
    nodes = fleet(9)
    active = {"r-12": spec(selector="site=a", version="1.9"), "r-13": spec(model="other")}
    with pytest.raises(ConflictError) as caught:
        refuse_conflicts(spec(selector="site in (a|b)"), active, nodes)
    assert "rollout r-12" in caught.value.message
    assert "already targets 3 of these nodes" in caught.value.message
    assert caught.value.fields["rollouts"] == ["r-12"]


def test_overlap_counts_nodes_that_could_enrol_later() -> None:
    found = conflicts(spec(selector="site=a"), {"r-1": spec(selector="hardware=x")}, fleet(9))
    assert [c.rollout_id for c in found] == ["r-1"]
    assert found[0].nodes == ()
    assert "enrol later" in found[0].describe()


@pytest.mark.parametrize(
    "other",
    [
        {"selector": "site=b"},  # disjoint labels
        {"model": "other"},  # another model
        {"fleet": "elsewhere"},  # another fleet
    ],
)
def test_rollouts_that_cannot_share_a_node_do_not_conflict(other: dict[str, Any]) -> None:
    refuse_conflicts(spec(selector="site=a"), {"r-1": spec(**other)}, fleet(9))


# ------------------------------------------------------------ small fleets


def one_per_site(*sites: str, **labels: str) -> list[FleetNode]:
    return [FleetNode(f"n-{site}", {"site": site, **labels}, "1.0") for site in sites]


def test_one_node_per_site_still_gets_controls_filled_in_from_other_sites() -> None:
    nodes = one_per_site("east", "west", "north", "south")
    plan = dry_run(spec(stages="shadow:1,1,100%", spread="site,hardware"), nodes)
    canary = plan.stages[1]
    assert len(canary.controls) == MIN_CONTROLS
    assert set(canary.controls) == {n.id for n in nodes} - set(canary.nodes)
    assert canary.filled == canary.controls  # no other node at the canary's site
    assert plan.warnings() == ()
    assert "(all from other strata: none left in the canaries' own)" in plan.summary()
    assert "site=east,hardware=(none) 1" in plan.summary()
    assert "shadow (1): 1 node runs it beside its model: " in plan.summary()


def test_filled_in_controls_prefer_the_same_hardware_and_matched_ones_come_first() -> None:
    nodes = [
        FleetNode("n-a1", {"site": "a", "hardware": "x"}, "1.0"),
        FleetNode("n-a2", {"site": "a", "hardware": "x"}, "1.0"),
        FleetNode("n-a-y", {"site": "a", "hardware": "y"}, "1.0"),
        FleetNode("n-b-x", {"site": "b", "hardware": "x"}, "1.0"),
        FleetNode("n-c-x", {"site": "c", "hardware": "x"}, "1.0"),
        FleetNode("n-c-y", {"site": "c", "hardware": "y"}, "1.0"),
    ]
    canary_strata = {"site=a,hardware=x": 1}
    pool = [
        Candidate(n.id, stratum_of(n.labels, ("site", "hardware")), True, rank)
        for rank, n in enumerate(nodes[1:])
    ]
    chosen = choose_controls(canary_strata, pool)
    assert chosen.matched == ("n-a2",)
    # Same hardware elsewhere (b, c) before another hardware at the same site.
    assert set(chosen.filled) == {"n-b-x", "n-c-x"}
    assert chosen.all == chosen.matched + chosen.filled
    assert choose_controls(canary_strata, list(reversed(pool))) == chosen  # order-free


def test_a_stage_short_of_controls_is_warned_about_with_what_to_do() -> None:
    plan = dry_run(spec(stages="1,100%", spread="site,hardware"), one_per_site("east", "west"))
    (warning,) = plan.warnings()
    assert warning.startswith("warning: stage 1 of 2 (1) has 1 control, fewer than 3")
    assert "--control none" in warning
    assert warning in plan.summary()
    # 100 %: nobody stays behind to compare with, which is no shortage; none asked: none.
    assert not plan.stages[-1].short_of_controls
    assert dry_run(spec(stages="1,100%", control="none"), one_per_site("e", "w")).warnings() == ()
    assert "controls: none (" not in plan.summary()
    one = dry_run(spec(stages="100%"), one_per_site("east"))
    assert "matched 1 node: 1 to update" in one.summary()
