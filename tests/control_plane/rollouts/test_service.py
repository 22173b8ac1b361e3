"""The rollout service on both backends, with real nodes reporting through the inventory
and the health store, real director pins, and a manual clock (no bake is slept through)."""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event, func, select

from control_plane.access.service import AccessService
from control_plane.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    PolicyError,
)
from control_plane.registry.release_check import build_release_check
from control_plane.rollouts import service as service_module
from control_plane.rollouts.service import RolloutService, TickReport
from control_plane.rollouts.state import RolloutState
from control_plane.rollouts.store import load_state, node_sequences
from control_plane.storage.models import (
    ModelVersionRow,
    RolloutActionRow,
    RolloutNodeRow,
    RolloutRow,
)
from tests.control_plane.nodes.conftest import OPERATOR
from tests.control_plane.rollouts.conftest import FAIL, PASS, RELEASE, TICK, World, request


def make_fleet(world: World, count: int = 6, **behaviours: Any) -> list[str]:
    return [
        world.add_node({"site": "abc"[i % 3]}, behaviours.get(f"n{i}", "good"))
        for i in range(count)
    ]


def status(rollout_id: str, *wanted: str) -> Any:
    return lambda service: service.get(rollout_id).state.status in wanted


def test_a_good_rollout_completes_and_each_node_gets_the_candidate_once(world: World) -> None:
    make_fleet(world)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    assert created.state.status == "pending"
    assert created.created_by == "rita"

    world.run(service, until=status(created.id, "done"))

    info = service.get(created.id, decisions=200)
    assert info.counts == {"healthy": 6}
    assert set(world.fleet.serving().values()) == {"1.1.0"}
    assert set(world.candidate_pins().values()) == {1}  # no node pinned twice
    kinds = [d.kind for d in info.decisions]
    assert kinds.count("stage-passed") == 3
    assert kinds[-1] == "done"
    assert info.pending_actions == 0
    # The webhook events: each stage passed, then done, all about this rollout.
    assert [e["kind"] for e in world.events.events] == [
        "stage-passed",
        "stage-passed",
        "stage-passed",
        "done",
    ]
    assert {e["rollout"] for e in world.events.events} == {created.id}
    # What the gates keep is for the rollouts still judged here: this one while it ran,
    # none once it was done.
    assert [created.id] in world.verdicts.retained
    assert world.verdicts.retained[-1] == []


def test_a_failing_verdict_rolls_back_through_real_director_pins(world: World) -> None:
    ids = make_fleet(world)
    world.verdicts.decide = lambda state: FAIL if state.stage == 1 else PASS
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="1,50%,100%"))

    world.run(service, until=status(created.id, "rolled-back"))

    state = service.state(created.id)
    touched = {n for n, r in state.nodes.items() if r.touched}
    assert len(touched) == 3  # stage 1 (1 node) and stage 2 (50 %) started, then it failed
    pins = world.candidate_pins()
    assert {n for n, count in pins.items() if count} == touched  # nobody else got it
    for node_id in ids:
        latest = world.director.latest(node_id)
        assert latest is not None and latest.version == "1.0.0"
        if node_id in touched:
            assert latest.created_by == f"rollout:{created.id}"
    assert set(world.fleet.serving().values()) == {"1.0.0"}
    decisions = service.get(created.id, decisions=200).decisions
    rolling = next(d for d in decisions if d.kind == "rolling-back")
    assert rolling.numbers["verdict"]["p99_ratio"] == 1.38
    assert "p99 +38 % vs control" in rolling.text
    alert = next(e for e in world.events.events if e["kind"] == "rolling-back")
    assert "p99 +38 % vs control" in alert["text"]
    assert alert["numbers"]["why"] == "verdict"


def test_a_failing_self_test_spends_the_budget_and_rolls_back(world: World) -> None:
    make_fleet(world, 6)
    service = world.service()
    created = service.create(RELEASE, "gates", request(failure_budget="0"))
    first = None

    def started(service: RolloutService) -> bool:
        nonlocal first
        state = service.state(created.id)
        first = next((n for n, r in state.nodes.items() if r.started_at), None)
        return first is not None

    world.run(service, until=started)
    assert first is not None
    world.fleet.agents[first].behaviour = "fails-self-test"
    world.run(service, until=status(created.id, "rolled-back"))

    record = service.state(created.id).nodes[first]
    assert record.phase == "rolled-back"
    budget = next(
        d for d in service.get(created.id, decisions=200).decisions if d.kind == "rolling-back"
    )
    assert budget.numbers["why"] == "budget"
    assert "self-test: output-mismatch" in budget.numbers["nodes"][first]
    assert sum(world.candidate_pins().values()) == 1


def test_pause_resume_abort_with_roles_and_audit(world: World) -> None:
    make_fleet(world)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    world.run(service, until=status(created.id, "running", "baking"))

    paused = service.command(OPERATOR, created.id, "pause", "looks odd")
    assert paused.state.status == "paused"
    assert paused.state.pause is not None and "alice: looks odd" in paused.state.pause.reason
    started = sum(world.candidate_pins().values())
    for _ in range(5):  # paused: nobody new starts
        service.tick()
        world.fleet.step(world.clock.now())
        world.clock.advance(TICK)
    assert sum(world.candidate_pins().values()) == started

    with pytest.raises(PermissionDeniedError):
        service.command(OPERATOR, created.id, "resume")
    resumed = service.command(RELEASE, created.id, "resume")
    assert resumed.state.status in ("running", "baking")
    with pytest.raises(ConflictError, match="resume does not apply"):
        service.command(RELEASE, created.id, "resume")

    aborted = service.command(RELEASE, created.id, "abort", "enough")
    assert aborted.state.status == "aborted"
    service.tick()
    assert service.list(active=True) == []

    audit = AccessService(world.sessions, world.clock).list_audit(RELEASE, limit=50)
    rollout_entries = [
        (e.action, e.outcome, e.actor) for e in audit if e.action.startswith("rollout.")
    ]
    assert ("rollout.create", "ok", "rita") in rollout_entries
    assert ("rollout.pause", "ok", "alice") in rollout_entries
    assert ("rollout.resume", "refused", "alice") in rollout_entries
    assert ("rollout.resume", "ok", "rita") in rollout_entries
    assert ("rollout.abort", "ok", "rita") in rollout_entries
    pins = [e for e in audit if e.action == "node.pin_many" and e.actor == f"rollout:{created.id}"]
    assert pins  # the controller's pins are audited, by the rollout's name


def test_an_operator_rolls_back_by_hand(world: World) -> None:
    make_fleet(world)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    world.run(service, until=status(created.id, "baking"))
    back = service.command(OPERATOR, created.id, "rollback", "pager")
    assert back.state.status == "rolling-back"
    assert back.pending_actions == 0  # carried out at once: this replica took the lease
    world.run(service, until=status(created.id, "rolled-back"))
    assert set(world.fleet.serving().values()) == {"1.0.0"}


def test_a_restarted_service_continues_the_rollout(world: World) -> None:
    make_fleet(world)
    first = world.service("a")
    created = first.create(RELEASE, "gates", request())
    world.run(first, until=status(created.id, "baking"))
    stage = first.get(created.id).state.stage

    # The replica stops without a word (no release): another one waits out its lease,
    # then carries on from the stored state.
    second = world.service("b")
    assert second.tick().elsewhere == [created.id]
    world.clock.advance(second.config.lease + TICK)
    world.run(second, until=status(created.id, "done"))

    assert second.get(created.id).state.stage >= stage
    assert set(world.candidate_pins().values()) == {1}


def test_an_action_done_before_a_crash_is_not_done_twice(world: World) -> None:
    make_fleet(world)
    first = world.service("a")
    created = first.create(RELEASE, "gates", request())

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed after the pins, before marking them done")

    first._settle = crash  # type: ignore[method-assign]
    report = first.tick()
    assert created.id in report.failed
    pinned = world.candidate_pins()
    assert sum(pinned.values()) == 1  # the first canary was pinned

    second = world.service("b")
    world.clock.advance(second.config.lease + TICK)
    second.tick()
    assert world.candidate_pins() == pinned  # found in the director, not pinned again
    with world.sessions() as session:
        outcomes = session.scalars(
            select(RolloutActionRow.outcome).where(RolloutActionRow.kind == "assign")
        ).all()
    assert outcomes == ["skipped"]
    world.run(second, until=status(created.id, "done"))
    assert set(world.candidate_pins().values()) == {1}


def test_create_refuses_bad_specs_unknown_versions_and_overlaps(world: World) -> None:
    make_fleet(world, 3)
    service = world.service()
    with pytest.raises(InvalidInputError) as bad:
        service.create(RELEASE, "gates", request(bake="forever"))
    assert bad.value.fields["field"] == "bake"
    with pytest.raises(NotFoundError, match=r"no version '9\.9\.9'"):
        service.create(RELEASE, "gates", request(version="9.9.9"))
    with pytest.raises(PermissionDeniedError):
        service.create(OPERATOR, "gates", request())

    first = service.create(RELEASE, "gates", request(selector="site=a"))
    with pytest.raises(ConflictError, match=f"rollout {first.id} ") as clash:
        service.create(RELEASE, "gates", request())
    assert clash.value.fields["rollouts"] == [first.id]
    other = service.create(RELEASE, "gates", request(selector="site=b"))  # disjoint: fine
    assert other.id != first.id
    assert {s.id for s in service.list(fleet="gates")} == {first.id, other.id}


def test_a_dry_run_shows_the_plan_and_stores_nothing(world: World) -> None:
    ids = make_fleet(world, 6)
    service = world.service()
    planned = service.dry_run(OPERATOR, "gates", request())
    assert sorted(planned.plan.order) == sorted(ids)
    assert [len(s.nodes) for s in planned.plan.stages] == [1, 2, 3]
    assert planned.conflicts == ()
    assert service.list() == []

    created = service.create(RELEASE, "gates", request())
    world.run(service, until=status(created.id, "running"))
    state = service.state(created.id)
    first = [n for n, r in state.nodes.items() if r.stage == 0]
    assert first == list(planned.plan.stages[0].nodes)  # the dry run's canary is the one
    again = service.dry_run(OPERATOR, "gates", request(version="1.1.0"))
    assert [c.rollout_id for c in again.conflicts] == [created.id]


def test_a_node_enrolling_mid_rollout_is_taken_in(world: World) -> None:
    make_fleet(world, 3)
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="1,100%"))
    world.run(service, until=status(created.id, "baking"))
    late = world.add_node({"site": "a"})
    world.run(service, until=status(created.id, "done"))
    world.run(service, until=lambda s: world.fleet.agents[late].serving == "1.1.0")
    assert service.state(created.id).nodes[late].touched


def test_stored_state_reads_back_equal(world: World) -> None:
    make_fleet(world, 4)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    world.run(service, until=status(created.id, "baking"))
    state = service.state(created.id)
    assert RolloutState.from_dict(state.to_dict()) == state
    with world.sessions() as session:
        assert session.scalar(select(func.count()).select_from(RolloutActionRow)) == 1


def test_two_replicas_ticking_at_once_step_each_rollout_once(world: World) -> None:
    """Two services on one database tick together every round, each round after the
    leases lapsed: one of them steps each rollout, never both, and no node is pinned
    twice."""
    make_fleet(world, 6)
    replicas = [world.service("a"), world.service("b")]
    first = replicas[0].create(RELEASE, "gates", request(selector="site=a"))
    second = replicas[0].create(RELEASE, "gates", request(selector="site=b,site!=a"))
    barrier = threading.Barrier(2)

    def tick(service: RolloutService) -> TickReport:
        barrier.wait(timeout=30)
        return service.tick()

    won: dict[str, set[str]] = {"a": set(), "b": set()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(60):
            reports = list(pool.map(tick, replicas))
            for rollout in (first.id, second.id):
                steppers = [r for r in reports if rollout in r.stepped]
                assert len(steppers) == 1, reports
            for name, report in zip("ab", reports, strict=True):
                assert report.failed == {}
                won[name].update(report.stepped)
            world.fleet.step(world.clock.now())
            world.clock.advance(replicas[0].config.lease + TICK)
            if all(replicas[0].get(r).state.status == "done" for r in (first.id, second.id)):
                break
    assert {replicas[0].get(r).state.status for r in (first.id, second.id)} == {"done"}
    pins = world.candidate_pins()
    assert sorted(pins.values()) == [0, 0, 1, 1, 1, 1]  # sites a and b once each, c never
    assert won["a"] and won["b"]  # both replicas took turns


def test_a_done_rollout_steps_only_for_nodes_that_come_later(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once done, the rollout's healthy nodes are final (no rollback after done; health
    alerts cover them): a tick with no newcomer does not even load its state, so nodes
    that go quiet stay healthy and the revision does not move. A node that enrols later
    and matches is taken in and followed until healthy."""
    make_fleet(world, 3)
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="1,100%"))
    world.run(service, until=status(created.id, "done"))
    service.tick()
    loads: list[int] = []
    real_load = service_module.load_state

    def counting(session: Any, row: RolloutRow, *args: Any) -> RolloutState:
        loads.append(row.id)
        return real_load(session, row, *args)

    monkeypatch.setattr(service_module, "load_state", counting)
    with world.sessions() as session:
        revision = session.get(RolloutRow, int(created.id)).revision  # type: ignore[union-attr]
    for agent in world.fleet.agents.values():
        agent.behaviour = "silent"  # no more samples: a watched node would turn unhealthy
    for _ in range(15):  # past the 10 min sample freshness
        assert created.id in service.tick().stepped
        world.clock.advance(TICK)
    assert loads == []
    with world.sessions() as session:
        assert session.get(RolloutRow, int(created.id)).revision == revision  # type: ignore[union-attr]
    assert {r.phase for r in service.state(created.id).nodes.values()} == {"healthy"}

    late = world.add_node({"site": "a"})
    world.run(service, until=lambda s: s.state(created.id).nodes.get(late) is not None)
    assert loads  # stepped for the newcomer
    world.run(service, until=lambda s: s.state(created.id).nodes[late].phase == "healthy")
    assert world.fleet.agents[late].serving == "1.1.0"
    assert service.get(created.id).state.status == "done"
    assert {r.phase for r in service.state(created.id).nodes.values()} == {"healthy"}


def test_a_shadow_stage_runs_the_candidate_beside_then_the_canaries_take_it(
    world: World,
) -> None:
    make_fleet(world, 4)
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="shadow:1,1,100%"))
    world.run(service, until=status(created.id, "done"))

    decisions = [d.kind for d in service.get(created.id, decisions=200).decisions]
    assert decisions.count("stage-passed") == 3  # the shadow stage, then both canary stages
    state = service.state(created.id)
    (shadowed,) = [n for n, r in state.nodes.items() if r.rank == 0]
    with world.sessions() as session:
        kinds = session.scalars(
            select(RolloutActionRow.kind).where(RolloutActionRow.node_id == shadowed)
        ).all()
    assert kinds[0] == "assign-shadow"
    assert "assign" in kinds
    assert set(world.fleet.serving().values()) == {"1.1.0"}
    assert set(world.candidate_pins().values()) == {1}


def test_the_shadow_nodes_reports_are_read_in_one_query(world: World) -> None:
    """What the shadow nodes say of the candidate comes from their newest processed
    report's `shadow` section (`health_latest`), all of them in one statement; a report
    made before a node's shadow assignment says nothing."""
    make_fleet(world, 4)
    world.verdicts.decide = lambda state: None  # the shadow stage stays
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="shadow:3,100%"))
    world.run(service, until=lambda s: _running_shadows(world, s, created.id) == 3, steps=20)
    state = service.state(created.id)
    engine = world.sessions.kw["bind"]
    statements: list[str] = []

    def count(*args: Any) -> None:
        if str(args[2]).lstrip().upper().startswith("SELECT"):
            statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        reports = service._shadow_reports(state, world.clock.now())
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 1, statements
    assert "health_latest" in statements[0]
    assert len(reports) == 3
    assert all(r.shadow and r.phase == "active" and r.samples for r in reports.values())
    later = world.clock.now() + TICK
    assigned_later = replace(
        state,
        nodes={n: replace(r, started_at=later) for n, r in state.nodes.items()},
    )
    assert service._shadow_reports(assigned_later, later) == {}


def _running_shadows(world: World, service: RolloutService, rollout_id: str) -> int:
    state = service.state(rollout_id)
    shadows = sorted(n for n, r in state.nodes.items() if r.track == "shadow")
    latest = world.health.queries.latest(shadows)
    return sum(
        1 for h in latest.values() if h.shadow is not None and h.shadow.get("state") == "running"
    )


def test_a_failing_shadow_candidate_never_reaches_a_box(world: World) -> None:
    make_fleet(world, 4)
    world.verdicts.decide = lambda state: FAIL if state.stage == 0 else PASS
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="shadow:1,1,100%"))
    world.run(service, until=status(created.id, "rolled-back"))
    assert sum(world.candidate_pins().values()) == 0
    assert set(world.fleet.serving().values()) == {"1.0.0"}
    latest = [world.director.latest(n) for n in world.fleet.agents]
    assert all(a is not None and a.shadow is None for a in latest)  # the shadows ended


def test_the_stored_state_reads_back_every_node_field_in_rank_order(world: World) -> None:
    """`load_state` reads plain rows (not ORM objects): every column of a node's record
    comes back, and the records keep the rank order the machine gave them."""
    make_fleet(world)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    service.tick()  # begin: every node gets its record, the first stage starts
    world.fleet.step(world.clock.now())
    world.clock.advance(TICK)
    service.tick()  # the started node has moved on: its record differs from the queued ones

    state = service.state(created.id)

    with world.sessions() as session:
        rows = session.scalars(
            select(RolloutNodeRow).where(RolloutNodeRow.rollout_id == int(created.id))
        ).all()
    assert list(state.nodes) == [r.node_id for r in sorted(rows, key=lambda r: r.rank)]
    assert len(state.nodes) == 6
    for row in rows:
        record = state.nodes[row.node_id]
        assert (record.stage, record.rank, record.stratum, record.previous) == (
            row.stage,
            row.rank,
            row.stratum,
            row.previous,
        )
        assert (record.phase, record.track, record.shadowing, record.touched) == (
            row.phase,
            row.track,
            row.shadowing,
            row.touched,
        )
        assert record.reason == row.reason
        assert record.since.replace(tzinfo=None) == row.since.replace(tzinfo=None)
        assert (record.started_at is None) == (row.started_at is None)
    assert {r.phase for r in state.nodes.values()} >= {"queued"}
    assert any(r.started_at is not None for r in state.nodes.values())
    with world.sessions() as session:
        row = session.get(RolloutRow, int(created.id))
        assert row is not None
        sequences: dict[str, int | None] = {}
        assert load_state(session, row, sequences) == state
        assert sequences == node_sequences(session, int(created.id))
    assert any(s is not None for s in sequences.values())
    assert any(s is None for s in sequences.values())


def test_a_stored_node_record_with_an_unknown_phase_is_refused_by_name(world: World) -> None:
    make_fleet(world)
    service = world.service()
    created = service.create(RELEASE, "gates", request())
    service.tick()
    with world.sessions() as session:
        row = session.scalars(
            select(RolloutNodeRow).where(RolloutNodeRow.rollout_id == int(created.id))
        ).first()
        assert row is not None
        row.phase, node_id = "sideways", row.node_id
        session.commit()
    with pytest.raises(InvalidInputError) as bad:
        service.state(created.id)
    assert bad.value.fields["field"] == f"rollout {created.id}.nodes.{node_id}.phase"
    assert "'sideways'" in bad.value.message


def _release_check(world: World, version: str, report: dict[str, Any] | None) -> None:
    """Give det `version` a signed `custom.release_check` (as `model push --baseline`)."""
    with world.sessions() as session:
        row = session.scalars(
            select(ModelVersionRow).where(
                ModelVersionRow.model == "det", ModelVersionRow.version == version
            )
        ).one()
        custom = {k: v for k, v in row.custom.items() if k != "release_check"}
        row.custom = custom if report is None else {**custom, "release_check": report}
        session.commit()


def _check(value: float, *, forced: bool = False) -> dict[str, Any]:
    comparison = {
        "samples": 20,
        "outputs": [{"output": "scores", "max_abs": 0.01, "mean_abs": 0.001,
                     "cosine_min": 0.999, "cosine_p5": 0.9995, "sqnr_db_p5": 31.5}],
        "decoded": {"kind": "classification", "frames": 20, "top1_ratio": value,
                    "topk_overlap": 1.0},
        "latency": {"cpu": {"machine": "x86_64", "int8_features": ["avx2"]}},
    }  # fmt: skip
    return build_release_check(
        comparison,
        baseline_sha256="ab" * 32,
        data="images",
        coverage=None,
        onnxruntime="1.23.0",
        forced=forced,
    ).to_dict()


def test_gates_may_require_a_passed_release_check(world: World) -> None:
    make_fleet(world, 3)
    service = world.service()
    gates = {"require_release_check": True}
    with pytest.raises(PolicyError, match="was pushed without one; push a new version"):
        service.create(RELEASE, "gates", request(gates=gates))
    _release_check(world, "1.1.0", _check(0.5, forced=True))
    with pytest.raises(PolicyError) as forced:
        service.create(RELEASE, "gates", request(gates=gates))
    assert "1.1.0's failed and was forced through: top1_ratio 0.5 against the threshold 0.99" in (
        forced.value.message
    )
    with pytest.raises(InvalidInputError) as bad:
        service.create(RELEASE, "gates", request(gates={"require_release_check": "yes"}))
    assert bad.value.fields["field"] == "gates.require_release_check"
    _release_check(world, "1.1.0", _check(1.0))
    assert service.create(RELEASE, "gates", request(gates=gates)).state.status == "pending"
