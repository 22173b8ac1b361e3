"""The rollout spec: what operators type, what is refused (naming the field), the stored
form, and the maintenance window's cron matcher."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control_plane.errors import InvalidInputError
from control_plane.rollouts.cron import parse_cron
from control_plane.rollouts.spec import (
    Deadlines,
    RolloutSpec,
    Share,
    parse_failure_budget,
    parse_rate,
    parse_rollout_spec,
    parse_stages,
    parse_window,
)

BASE: dict[str, Any] = {"fleet": "plant", "model": "detector", "version": "2.0", "stages": "1,100%"}


def spec(**changes: Any) -> RolloutSpec:
    return parse_rollout_spec(**{**BASE, **changes})


def test_the_issue_example_parses_into_its_parts() -> None:
    s = spec(
        selector="site=a,role!=gate",
        stages="shadow:5,1,10%,50%,100%",
        bake="30m",
        max_rate="200/min",
        failure_budget="2%",
        window=("cron 0 2 * * *", "3h"),
        control="auto",
        gates={"p99": {"max_ratio": 1.2}},
    )
    assert str(s.selector) == "site=a,role!=gate"
    assert s.stages.shadow == Share(count=5)
    assert [str(x) for x in s.stages.steps] == ["1", "10%", "50%", "100%"]
    assert s.stages.count == 5 and s.stages.is_shadow(0) and not s.stages.is_shadow(1)
    assert s.bake == timedelta(minutes=30)
    assert (s.max_rate.count, s.max_rate.unit) == (200, "min")
    assert s.failure_budget.size == Share(basis_points=200)
    assert s.window is not None and s.window.duration == timedelta(hours=3)
    assert s.gates["p99"]["max_ratio"] == 1.2
    assert s.deadlines == Deadlines()


def test_the_stored_form_reads_back_to_the_same_spec() -> None:
    s = spec(
        selector="site in (a|b),gpu",
        stages="shadow:10%,1,12.5%,100%",
        window=("30 1 * * 1-5", "90m"),
        gates={"p99": {"max_ratio": 1.2, "metrics": ["a", "b"]}},
        deadlines="download=2h",
        spread="hardware",
    )
    stored = json.loads(json.dumps(s.to_dict()))
    assert RolloutSpec.from_dict(stored) == s
    assert stored["stages"] == "shadow:10%,1,12.5%,100%"
    assert stored["deadlines"]["download"] == "2h"


def test_a_partial_rollout_may_stop_short_of_100_percent() -> None:
    s = spec(stages="1,10%", partial=True)
    assert RolloutSpec.from_dict(s.to_dict()) == s
    assert s.stages.targets(50) == (1, 5)


def test_stage_targets_are_cumulative_round_up_and_never_shrink() -> None:
    stages = parse_stages("5,10%,50%,100%")
    assert stages.targets(20) == (5, 5, 10, 20)  # 10 % of 20 is 2: the stage adds nobody
    assert stages.targets(3) == (3, 3, 3, 3)
    assert parse_stages("1,33%,100%").targets(10) == (1, 4, 10)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fleet": "Plant!"}, "fleet"),
        ({"model": "Bad Name"}, "model"),
        ({"version": "-1"}, "version"),
        ({"selector": "site=a,,b"}, "selector"),
        ({"selector": "site in ()"}, "selector"),
        ({"stages": ""}, "stages"),
        ({"stages": "1,10%"}, "stages"),  # does not reach 100 %
        ({"stages": "10%,5,100%"}, "stages"),  # a count after a percentage
        ({"stages": "5,5,100%"}, "stages"),  # not growing
        ({"stages": "50%,10%,100%"}, "stages"),
        ({"stages": "0,100%"}, "stages"),
        ({"stages": "1,150%"}, "stages"),
        ({"stages": "1,shadow:5,100%"}, "stages"),
        ({"stages": "shadow:0,100%"}, "stages"),
        ({"stages": "1,10.555%,100%"}, "stages"),
        ({"bake": "0s"}, "bake"),
        ({"bake": "soon"}, "bake"),
        ({"bake": "40d"}, "bake"),
        ({"max_rate": "200"}, "max_rate"),
        ({"max_rate": "0/min"}, "max_rate"),
        ({"max_rate": "5/day"}, "max_rate"),
        ({"failure_budget": "-1"}, "failure_budget"),
        ({"failure_budget": "101%"}, "failure_budget"),
        ({"window": ("0 2 * *", "1h")}, "window"),
        ({"window": ("61 2 * * *", "1h")}, "window"),
        ({"window": ("0 2 31 2 *", "1h")}, "window"),  # never: 31 February
        ({"window": ("0 5-2 * * *", "1h")}, "window"),
        ({"window": ("*/0 * * * *", "1h")}, "window"),
        ({"window": ("0 2 * * *", "8d")}, "window"),
        ({"control": "manual"}, "control"),
        ({"gates": {"p99": float("nan")}}, "gates.p99"),
        ({"gates": {"p99": object()}}, "gates.p99"),
        ({"deadlines": "start=0s"}, "deadlines.start"),
        ({"deadlines": "boot=5m"}, "deadlines"),
        ({"deadlines": "start=5m,start=6m"}, "deadlines"),
        ({"spread": "site,site"}, "spread"),
        ({"spread": "a b"}, "spread"),
    ],
)
def test_every_refusal_names_its_field_and_value(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        spec(**changes)
    assert caught.value.fields["field"] == field
    assert caught.value.message.startswith(f"{field}:") or field in ("model", "version")


def test_stored_form_refusals_name_the_stored_field() -> None:
    stored = spec().to_dict()
    for key, bad in [("bake", "0m"), ("stages", "1,10%"), ("max_rate", 7), ("colour", "red")]:
        with pytest.raises(InvalidInputError) as caught:
            RolloutSpec.from_dict({**stored, key: bad})
        assert caught.value.fields["field"] == f"rollout.{key}"
    with pytest.raises(InvalidInputError, match="format"):
        RolloutSpec.from_dict({**stored, "format": 99})


def test_rates_are_enforced_per_minute_even_per_second() -> None:
    per_second = parse_rate("10/s")
    assert per_second.window == timedelta(minutes=1) and per_second.per_window == 600
    per_hour = parse_rate("30 / hour")
    assert per_hour.window == timedelta(hours=1) and per_hour.per_window == 30
    assert str(parse_rate("200/m")) == "200/min"


@pytest.mark.parametrize(
    ("budget", "failures", "started", "exceeded"),
    [
        ("2%", 1, 1, True),  # the first canary failing rolls back
        ("2%", 2, 100, False),
        ("2%", 3, 100, True),
        ("0", 1, 1000, True),
        ("0", 0, 1000, False),
        ("3", 3, 5, False),
        ("3", 4, 1000, True),
    ],
)
def test_the_failure_budget_counts_failures_among_started_nodes(
    budget: str, failures: int, started: int, exceeded: bool
) -> None:
    assert parse_failure_budget(budget).exceeded(failures, started) is exceeded


# ------------------------------------------------------------------------ cron

T = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("cron", "moment", "matches"),
    [
        ("* * * * *", T, True),
        ("0 2 * * *", T.replace(hour=2), True),
        ("0 2 * * *", T.replace(hour=2, minute=1), False),
        ("*/15 * * * *", T.replace(minute=45), True),
        ("*/15 * * * *", T.replace(minute=50), False),
        ("0-30/10 * * * *", T.replace(minute=20), True),
        ("5/20 * * * *", T.replace(minute=45), True),
        ("0 0 * * 1", T, True),  # Monday
        ("0 0 * * 0", T, False),
        ("0 0 * * 7", T + timedelta(days=6), True),  # 7 is Sunday too
        ("0 0 1,15 * *", T, False),
        ("0 0 2 3 *", T, True),
        ("0 0 2 4 *", T, False),
        ("0 0 15 * 1", T, True),  # both day fields restricted: either matches
        ("0 0 15 * 2", T, False),
    ],
)
def test_cron_matches_the_five_field_subset(cron: str, moment: datetime, matches: bool) -> None:
    assert parse_cron(cron).matches(moment) is matches


def test_a_window_is_open_from_each_match_for_its_duration() -> None:
    window = parse_window("cron 0 22 * * *", "3h")  # 22:00 to 01:00, across midnight
    assert not window.is_open(T.replace(hour=21, minute=59))
    assert window.is_open(T.replace(hour=22))
    assert window.is_open(T.replace(hour=23, minute=59) + timedelta(minutes=60))  # 00:59
    assert not window.is_open(T + timedelta(days=1, hours=1))  # 01:00 the next day
    assert window.next_open(T.replace(hour=12)) == T.replace(hour=22)
    assert window.next_open(T.replace(hour=22, minute=30)) == T.replace(hour=22, minute=30)


def test_a_rare_window_is_found_years_ahead() -> None:
    window = parse_window("0 0 29 2 *", "1h")
    assert window.next_open(T) == datetime(2028, 2, 29, tzinfo=UTC)


def test_cron_refuses_naive_times() -> None:
    with pytest.raises(InvalidInputError, match="time zone"):
        parse_cron("* * * * *").matches(datetime(2026, 1, 1))
