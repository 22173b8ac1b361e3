"""The node's clocks: a `ManualClock` sleep ends exactly when the test moves time past it,
or moves time itself with `sleeps_advance`; monotonic time never goes back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

from edge_node.clock import ManualClock, SystemClock, TaskClock

pytestmark = pytest.mark.anyio

START = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_sleep_ends_when_the_clock_is_moved_past_it() -> None:
    clock = ManualClock(START)
    woke: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(10)
        woke.append(clock.monotonic())

    async with anyio.create_task_group() as group:
        group.start_soon(sleeper)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        clock.advance(timedelta(seconds=9.5))
        await anyio.wait_all_tasks_blocked()
        assert woke == []  # not yet: half a second to go
        clock.advance(timedelta(seconds=0.5))
    assert woke == [10.0]
    assert clock.sleepers == 0
    assert clock.now() == START + timedelta(seconds=10)


async def test_a_cancelled_sleep_is_forgotten() -> None:
    clock = ManualClock(START)
    with anyio.move_on_after(0.01):
        await clock.sleep(60)
    assert clock.sleepers == 0
    clock.advance(timedelta(seconds=120))  # wakes nothing, raises nothing


async def test_sleeps_that_advance_move_the_clock_themselves() -> None:
    clock = ManualClock(START, sleeps_advance=True)
    with anyio.fail_after(5):
        await clock.sleep(30)
        await clock.sleep(0)
        await clock.sleep(-1)
    assert clock.monotonic() == 30.0
    assert clock.now() == START + timedelta(seconds=30)


def test_monotonic_time_does_not_follow_the_wall_clock_back() -> None:
    clock = ManualClock(START)
    clock.advance(timedelta(seconds=5))
    clock.advance(timedelta(hours=-1))  # the wall clock is set back
    assert clock.now() == START + timedelta(seconds=5) - timedelta(hours=1)
    assert clock.monotonic() == 5.0


async def test_the_system_clock_is_a_task_clock() -> None:
    clock: TaskClock = SystemClock()
    before = clock.monotonic()
    with anyio.fail_after(5):
        await clock.sleep(0)
        await clock.sleep(-3)
    assert clock.monotonic() >= before
    assert clock.now().tzinfo is UTC
