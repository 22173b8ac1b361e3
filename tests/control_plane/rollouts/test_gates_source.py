"""The gates fed from the health store: a stage's canaries, controls and baselines read
from stored health points, judged by the real gates (scipy), on both backends."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from control_plane.errors import InvalidInputError
from control_plane.health.report import parse_report
from control_plane.rollouts.evidence import Point, p99_s, stage_samples
from control_plane.rollouts.gates_source import GatesVerdicts
from control_plane.rollouts.spec import parse_rollout_spec
from control_plane.rollouts.state import NodeRecord, RolloutState
from control_plane.storage import create_engine_for, migrate, session_factory
from control_plane.storage.models import HealthPointRow
from protos.bundle.agreement import AgreementTally, compare_raw
from tests.control_plane.health.support import add_nodes

T0 = datetime.fromisoformat("2026-03-01T12:00:00+00:00")  # the canaries' assignment
CANARIES = [f"c{i}" for i in range(5)]
CONTROLS = [f"k{i}" for i in range(5)]
STEP = timedelta(seconds=30)


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine: Engine = create_engine_for(database_url)
    migrate(engine)
    made = session_factory(engine)
    add_nodes(made, *CANARIES, *CONTROLS)
    try:
        yield made
    finally:
        engine.dispose()


def state(**spec: Any) -> RolloutState:
    parsed = parse_rollout_spec(
        fleet="gates", model="det", version="2.0", stages="5,100%", bake="30m", **spec
    )
    nodes = {
        node_id: NodeRecord(
            stage=0 if node_id in CANARIES else 1,
            rank=rank,
            stratum="",
            previous="1.0",
            since=T0 + timedelta(minutes=5) if node_id in CANARIES else T0,
            phase="healthy" if node_id in CANARIES else "queued",
            touched=node_id in CANARIES,
            started_at=T0 if node_id in CANARIES else None,
        )
        for rank, node_id in enumerate([*CANARIES, *CONTROLS])
    }
    base = RolloutState.new("7", parsed, T0)
    return replace(base, status="baking", nodes=nodes, controls=tuple(CONTROLS))


def report(
    node_id: str,
    at: datetime,
    version: str,
    p99_ms: float,
    received_at: datetime | None = None,
    record_id: str | None = None,
) -> HealthPointRow:
    return HealthPointRow(
        node_id=node_id,
        record_id=record_id or f"{node_id}-{at.isoformat()}",
        at=at,
        received_at=received_at or at,
        schema="edgefleet.agent.health/2",
        metrics={
            "frames": 300.0,
            "frames_dropped": 1.0,
            "errors": 0.0,
            "window_s": 30.0,
            "uptime_s": (at - T0).total_seconds() + 7200,
            "rss_bytes": 200e6,
        },
        latency={f"det@{version}": {"end_to_end": {"p99_ms": p99_ms}}},
    )


def seed(sessions: sessionmaker[Session], slowdown: float, until: datetime) -> None:
    """Every node reports every 30 s from an hour before the assignment until `until`;
    the canaries on 2.0 after it, `slowdown` times their old P99."""
    rng = random.Random(4)
    rows = []
    at = T0 - timedelta(hours=1)
    while at <= until:
        for node_id in CANARIES + CONTROLS:
            base = 20.0 * (1 + 0.02 * int(node_id[1:])) * rng.lognormvariate(0, 0.05)
            on_new = node_id in CANARIES and at >= T0 + timedelta(minutes=5)
            if node_id in CANARIES and T0 <= at < T0 + timedelta(minutes=5):
                continue  # updating: no samples of either version
            version, p99 = ("2.0", base * slowdown) if on_new else ("1.0", base)
            rows.append(report(node_id, at, version, p99))
        at += STEP
    with sessions() as session:
        session.add_all(rows)
        session.commit()


def test_a_good_stage_passes_and_a_slow_one_fails_after_three_evaluations(
    sessions: sessionmaker[Session],
) -> None:
    verdicts = GatesVerdicts(sessions)
    now = T0 + timedelta(minutes=40)
    seed(sessions, 1.0, now + timedelta(minutes=10))
    good = verdicts.judge(state(), None, now)
    assert good is not None and good.verdict.outcome == "pass", good.verdict.summary()
    assert {g["name"] for g in good.document["gates"]} >= {"latency_vs_control", "error_rate"}


def test_a_stage_with_no_control_left_is_judged_against_the_baselines(
    sessions: sessionmaker[Session],
) -> None:
    """The last stage of a rollout to 100 % has nobody left on the old version: its
    canaries are judged against their own past, not left inconclusive for want of
    controls (which would pause every such rollout at its last stage)."""
    verdicts = GatesVerdicts(sessions)
    now = T0 + timedelta(minutes=40)
    last = replace(state(), controls=())
    seed(sessions, 1.0, now)
    good = verdicts.judge(last, None, now)
    assert good is not None and good.verdict.outcome == "pass", good.verdict.summary()
    names = {g["name"] for g in good.document["gates"]}
    assert "latency_vs_baseline" in names and "latency_vs_control" not in names
    with sessions() as session:
        session.query(HealthPointRow).delete()
        session.commit()
    seed(sessions, 2.0, now + timedelta(minutes=10))
    # Another history under the same record ids: judged cold (the store never rewrites
    # a point, so what the gates kept of the first one would not be news to them).
    verdicts = GatesVerdicts(sessions)
    previous = None
    for minute in (40, 42, 44):
        slow = verdicts.judge(last, previous, T0 + timedelta(minutes=minute))
        assert slow is not None
        previous = slow.document
    assert slow.verdict.outcome == "fail", slow.verdict.summary()
    (baseline,) = [g for g in slow.document["gates"] if g["name"] == "latency_vs_baseline"]
    assert baseline["outcome"] == "fail"


def test_a_slower_canary_fails_on_the_third_evaluation_in_a_row(
    sessions: sessionmaker[Session],
) -> None:
    verdicts = GatesVerdicts(sessions)
    seed(sessions, 2.0, T0 + timedelta(minutes=45))
    previous = None
    outcomes = []
    for minute in (40, 42, 44):
        judged = verdicts.judge(state(), previous, T0 + timedelta(minutes=minute))
        assert judged is not None
        outcomes.append(judged.verdict.outcome)
        previous = judged.document
    assert outcomes == ["inconclusive", "inconclusive", "fail"]
    latency = next(g for g in previous["gates"] if g["name"] == "latency_vs_control")
    assert latency["consecutive_failures"] == 3


def test_a_warm_judge_gives_the_verdicts_of_a_cold_one_as_points_arrive(
    sessions: sessionmaker[Session],
) -> None:
    """The gates keep each judged node's points between evaluations and read only rows
    received since: every evaluation, with new points arriving (late ones among them, and
    one dated ahead of the clock), a canary joining the stage mid-way and a stage change,
    decides and counts exactly as a judge that reads everything afresh."""
    rng = random.Random(9)
    warm = GatesVerdicts(sessions)
    seed(sessions, 1.3, T0 + timedelta(minutes=20))
    judged = replace(state(), nodes={**state().nodes})
    late = judged.nodes["c4"]
    judged.nodes["c4"] = replace(late, phase="assigned", touched=True)  # joins at 30 min
    previous_warm: Any = None
    previous_cold: Any = None
    documents = []
    ids: list[datetime] = []
    for minute in range(21, 41):
        now = T0 + timedelta(minutes=minute)
        received = now  # as the processor stores them: in received_at order
        with sessions() as session:
            rows = []
            for node_id in CANARIES + CONTROLS:
                for at in (now - STEP, now):
                    if rng.random() < 0.15:
                        at -= timedelta(minutes=4)  # a late resend, stored now
                    on_new = node_id in CANARIES
                    p99 = 20.0 * rng.lognormvariate(0, 0.05) * (1.3 if on_new else 1.0)
                    version = "2.0" if on_new else "1.0"
                    at += timedelta(seconds=1)
                    rows.append(report(node_id, at, version, p99, received, f"r{len(ids)}"))
                    ids.append(at)
            ahead = now + timedelta(minutes=3)  # a node's clock ahead of ours
            rows.append(report("k0", ahead, "1.0", 20.0, received, f"r{len(ids)}"))
            ids.append(ahead)
            session.add_all(rows)
            session.commit()
        if minute == 30:
            judged.nodes["c4"] = late
        if minute == 36:
            judged = replace(judged, stage=1)  # what was kept is for stage 0 only
            previous_warm = previous_cold = None
        hot = warm.judge(judged, previous_warm, now)
        cold = GatesVerdicts(sessions).judge(judged, previous_cold, now)
        assert hot is not None and cold is not None
        assert hot.document == cold.document, minute
        previous_warm, previous_cold = hot.document, cold.document
        documents.append(hot.document)
        with sessions() as session:
            # The processor's next batch of the same instant, stored after this read.
            at = now + timedelta(seconds=2)
            session.add(report("c0", at, "2.0", 30.0, received, f"r{len(ids)}"))
            ids.append(at)
            session.commit()
    assert {d["outcome"] for d in documents} >= {"fail"}  # the judging did something
    held = next(iter(warm._held.values()))
    assert held.stage == 1 and set(held.series) == set(CANARIES + CONTROLS)
    warm.retain([])
    assert not warm._held


def test_a_warm_judge_reads_only_what_arrived(sessions: sessionmaker[Session]) -> None:
    verdicts = GatesVerdicts(sessions)
    now = T0 + timedelta(minutes=40)
    seed(sessions, 1.0, now)
    verdicts.judge(state(), None, now)
    first = verdicts.rows_read
    with sessions() as session:
        session.add_all(report(n, now + STEP, "1.0", 20.0) for n in CONTROLS)
        session.commit()
    verdicts.judge(state(), None, now + timedelta(minutes=1))
    # The newest rows again (those received at the newest instant read) and the new ones.
    assert verdicts.rows_read - first <= 2 * len(CANARIES + CONTROLS)
    assert first > 10 * len(CANARIES + CONTROLS)


def test_thin_data_is_inconclusive_never_a_pass(sessions: sessionmaker[Session]) -> None:
    verdicts = GatesVerdicts(sessions)
    seed(sessions, 1.0, T0 + timedelta(minutes=8))  # three minutes of the candidate
    judged = verdicts.judge(state(), None, T0 + timedelta(minutes=8))
    assert judged is not None and judged.verdict.outcome == "inconclusive"


def test_a_bad_gates_file_is_refused_at_creation(sessions: sessionmaker[Session]) -> None:
    verdicts = GatesVerdicts(sessions)
    with pytest.raises(InvalidInputError) as bad:
        verdicts.check(state(gates={"error_rate": {"max_increase": "lots"}}).spec)
    assert "gates.error_rate.max_increase" in bad.value.message


def test_samples_pair_each_canary_with_its_own_past() -> None:
    points = {
        "c0": [
            Point(T0 - timedelta(minutes=m), {}, {"det@1.0": {"end_to_end": {"p99_ms": 10}}})
            for m in (3, 2, 1)
        ]
        + [
            Point(T0 + timedelta(minutes=5 + m), {}, {"det@2.0": {"compute": {"p99_ms": 30}}})
            for m in (1, 2)
        ]
    }
    samples = stage_samples(
        state(), points, {}, window_start=T0, now=T0 + timedelta(minutes=9), canaries=["c0"]
    )
    (canary,) = samples.canaries
    assert list(canary.p99_s) == [0.03, 0.03]
    assert list(canary.baseline_p99_s) == [0.01, 0.01]  # the two just before the update
    assert samples.window_end == T0 + timedelta(minutes=7)
    assert p99_s(points["c0"][0], "det@2.0") is None


def test_a_shadow_candidate_is_compared_with_its_reference_on_the_same_frames() -> None:
    """The served model's end-to-end P99 (queue and thread pool included) is the baseline
    only for a node that sends no reference; with one, the reference is."""
    spec = parse_rollout_spec(
        fleet="gates", model="det", version="2.0", stages="shadow:1,1,100%", bake="30m"
    )
    record = NodeRecord(
        stage=1,
        rank=0,
        stratum="",
        previous="1.0",
        since=T0,
        phase="healthy",
        track="shadow",
        shadowing=True,
        started_at=T0,
    )
    shadowing = replace(RolloutState.new("7", spec, T0), status="baking", nodes={"c0": record})
    served = {"det@1.0": {"end_to_end": {"p99_ms": 40.0}}}
    points = {
        "c0": [
            Point(T0 + timedelta(minutes=1), {"shadow_p99_ms": 20.0}, served),
            Point(
                T0 + timedelta(minutes=2),
                {"shadow_p99_ms": 20.0, "shadow_reference_p99_ms": 10.0},
                served,
            ),
        ]
    }
    samples = stage_samples(
        shadowing, points, {}, window_start=T0, now=T0 + timedelta(minutes=3), canaries=["c0"]
    )
    (node,) = samples.canaries
    assert list(node.p99_s) == [0.02, 0.02]
    assert list(node.baseline_p99_s) == [0.04, 0.01]


def test_an_agreeing_shadow_candidate_passes_its_stage(sessions: sessionmaker[Session]) -> None:
    """The shadow stage judged on what a shadow node stores: the candidate's P99 beside
    the served model's and how often they agree. Its counters are the candidate's frames
    compared, so the self-test gate has a canary to count (without them it was
    inconclusive, and no shadow stage could ever pass)."""
    spec = parse_rollout_spec(
        fleet="gates", model="det", version="2.0", stages="shadow:1,1,100%", bake="30m"
    )
    shadow = NodeRecord(
        stage=1,
        rank=0,
        stratum="",
        previous="1.0",
        since=T0 + timedelta(minutes=1),
        phase="healthy",
        track="shadow",
        shadowing=True,
        started_at=T0,
    )
    shadowing = replace(RolloutState.new("7", spec, T0), status="baking", nodes={"c0": shadow})
    rng = random.Random(5)
    rows = []
    for step in range(1, 60):
        row = report("c0", T0 + step * STEP, "1.0", 20.0 * rng.lognormvariate(0, 0.05))
        row.metrics = {
            **row.metrics,
            "shadow_running": 1.0,
            "shadow_frames_compared": 30.0 * step,
            "shadow_top1_ratio": 1.0,
            "shadow_p99_ms": 20.0 * rng.lognormvariate(0, 0.05),
        }
        rows.append(row)
    with sessions() as session:
        session.add_all(rows)
        session.commit()

    judged = GatesVerdicts(sessions).judge(shadowing, None, T0 + timedelta(minutes=30))

    assert judged is not None and judged.verdict.outcome == "pass", judged.verdict.summary()
    gates = {g["name"]: g for g in judged.document["gates"]}
    assert set(gates) == {"self_test", "latency_vs_baseline", "output_agreement"}
    assert gates["self_test"]["numbers"]["canary_nodes"] == 1
    assert gates["output_agreement"]["numbers"]["top1"] == 1.0


def _raw_agreement(frames: int, diverging_every: int) -> dict[str, Any]:
    """A node's real agreement figures over raw outputs: every `diverging_every`-th
    frame's candidate output is the reference's negated (cosine -1), the others a hair
    off it (cosine above 0.9999)."""
    rng = np.random.default_rng(3)
    tally = AgreementTally()
    for i in range(frames):
        reference = rng.normal(size=(1, 16)).astype(np.float32)
        off = diverging_every and i % diverging_every == 0
        candidate = -reference if off else reference + np.float32(1e-4)
        tally.add(compare_raw({"logits": reference}, {"logits": candidate}))
    return tally.summary().to_report()


@pytest.mark.parametrize(("diverging_every", "outcome"), [(0, "pass"), (5, "fail")])
def test_a_raw_output_shadow_candidate_is_judged_on_its_cosine(
    sessions: sessionmaker[Session], diverging_every: int, outcome: str
) -> None:
    """A raw model's shadow stage: the node counts frames at fixed cosine levels (its
    report, as the health store flattens it), and the raw agreement gate judges the share
    of frames at the gates' level: agreeing outputs pass, diverging ones (one frame in
    five) fail, where before they were inconclusive either way."""
    spec = parse_rollout_spec(
        fleet="gates",
        model="raw",
        version="2.0",
        stages="shadow:1,1,100%",
        bake="30m",
        gates={"consecutive_failures": 1},
    )
    shadow = NodeRecord(
        stage=1,
        rank=0,
        stratum="",
        previous="1.0",
        since=T0 + timedelta(minutes=1),
        phase="healthy",
        track="shadow",
        shadowing=True,
        started_at=T0,
    )
    shadowing = replace(RolloutState.new("7", spec, T0), status="baking", nodes={"c0": shadow})
    agreement = _raw_agreement(300, diverging_every)
    stored = parse_report(
        json.dumps(
            {
                "schema": "edgefleet.agent.health/2",
                "shadow": {"state": "running", "frames_compared": 300, "agreement": agreement},
            }
        ).encode(),
        created_at=T0,
    )
    rng = random.Random(5)
    rows = []
    for step in range(1, 60):
        row = report("c0", T0 + step * STEP, "1.0", 20.0 * rng.lognormvariate(0, 0.05))
        row.latency = {"raw@1.0": row.latency["det@1.0"]}
        row.metrics = {
            **row.metrics,
            **stored.metrics,
            "shadow_p99_ms": 20.0 * rng.lognormvariate(0, 0.05),
        }
        rows.append(row)
    with sessions() as session:
        session.add_all(rows)
        session.commit()

    judged = GatesVerdicts(sessions).judge(shadowing, None, T0 + timedelta(minutes=30))

    assert judged is not None
    gates = {g["name"]: g for g in judged.document["gates"]}
    agreement_gate = gates["output_agreement"]
    assert agreement_gate["outcome"] == outcome, agreement_gate["reason"]
    assert agreement_gate["numbers"]["raw_cosine_compared"] == 300
    assert agreement_gate["numbers"]["raw_cosine_agreed"] == (300 if not diverging_every else 240)
    assert agreement_gate["reason"].startswith(
        "raw_cosine 100.0% (min 95%" if outcome == "pass" else "raw_cosine 80.0% (min 95%"
    )
