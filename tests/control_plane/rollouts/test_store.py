"""The stored decisions stay bounded: routine ones (nodes started, joined, a window opening
or closing, failed actions) keep only their newest per kind; every decision that changed
the rollout's state, and every command, is kept (both backends)."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select

from control_plane.rollouts.machine import Record
from control_plane.rollouts.state import Decision
from control_plane.rollouts.store import ROUTINE_DECISIONS, ROUTINE_KEPT, load_state, save_step
from control_plane.storage.models import RolloutDecisionRow, RolloutRow
from tests.control_plane.rollouts.conftest import RELEASE, TICK, World, request

KEPT_FOR_GOOD = ("stage-started", "paused", "resumed", "node-failed", "stage-passed", "done")


def store_decisions(world: World, number: int, kinds: list[str]) -> list[tuple[str, str]]:
    """One step per decision, as the controller stores them; what was stored, in order."""
    made = []
    for kind in kinds:
        world.clock.advance(TICK)
        now = world.clock.now()
        with world.sessions() as session:
            row = session.get(RolloutRow, number)
            assert row is not None
            state = load_state(session, row)
            decision = Decision(now, str(number), kind, row.stage, f"{kind} at {now:%H:%M}")
            save_step(
                session, row, state, state, [Record(decision)], now, expected_revision=row.revision
            )
            session.commit()
        made.append((kind, decision.text))
    return made


def stored(world: World, number: int) -> list[tuple[str, str]]:
    with world.sessions() as session:
        rows = session.scalars(
            select(RolloutDecisionRow)
            .where(RolloutDecisionRow.rollout_id == number)
            .order_by(RolloutDecisionRow.id)
        )
        return [(r.kind, r.text) for r in rows]


def test_routine_decisions_keep_their_newest_and_state_changes_are_all_kept(
    world: World,
) -> None:
    world.add_node({"site": "a"})
    service = world.service()
    created = service.create(RELEASE, "gates", request(stages="100%"))
    number = int(created.id)
    # A long rollout: two routine kinds well past the bound, one under it, and the state
    # changes and commands among them.
    kinds: list[str] = []
    for i in range(ROUTINE_KEPT + 10):
        kinds += ["nodes-started", "nodes-joined"]
        if i < ROUTINE_KEPT - 5:
            kinds.append("window-open")
        if i % 10 == 0:
            kinds += KEPT_FOR_GOOD
    made = stored(world, number) + store_decisions(world, number, kinds)

    newest = {kind: [m for m in made if m[0] == kind][-ROUTINE_KEPT:] for kind in ROUTINE_DECISIONS}
    expected = [m for m in made if m[0] not in ROUTINE_DECISIONS or m in newest[m[0]]]
    left = stored(world, number)
    assert left == expected
    assert Counter(kind for kind, _ in left) == {
        "nodes-started": ROUTINE_KEPT,
        "nodes-joined": ROUTINE_KEPT,
        "window-open": ROUTINE_KEPT - 5,
        **dict.fromkeys(KEPT_FOR_GOOD, 6),
    }
    # What `rollout status` shows, the newest decisions, is all there.
    shown = service.get(created.id, decisions=5).decisions
    assert [(d.kind, d.text) for d in shown] == made[-5:]


def test_another_rollouts_decisions_are_its_own(world: World) -> None:
    world.add_node({"site": "a"})
    service = world.service()
    first = service.create(RELEASE, "gates", request(stages="100%"))
    service.command(RELEASE, first.id, "abort")
    second = service.create(RELEASE, "gates", request(stages="100%"))
    few = store_decisions(world, int(second.id), ["nodes-started"] * 3)
    before = stored(world, int(first.id))
    store_decisions(world, int(first.id), ["nodes-started"] * (ROUTINE_KEPT + 1))
    assert [m for m in stored(world, int(second.id)) if m[0] == "nodes-started"] == few
    assert len(stored(world, int(first.id))) == len(before) + ROUTINE_KEPT
