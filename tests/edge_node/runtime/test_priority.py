"""Background work (loading, self-testing the next version) at lowered CPU priority."""

from __future__ import annotations

import os
import threading

import pytest

from edge_node.runtime.config import SessionConfig
from edge_node.runtime.priority import background_safe, run_in_background


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_work_runs_at_nice_19_in_its_own_thread_and_the_caller_is_untouched() -> None:
    before = own_nice()
    seen = run_in_background(lambda: (threading.get_native_id(), own_nice()))
    assert seen[0] != threading.get_native_id()
    assert seen[1] == 19
    assert own_nice() == before


def test_idle_mode_uses_sched_idle_where_linux_has_it() -> None:
    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("no SCHED_IDLE on this OS")
    assert run_in_background(lambda: os.sched_getscheduler(0), mode="idle") == os.SCHED_IDLE
    assert run_in_background(lambda: own_nice(), mode="normal") == own_nice()


def test_an_exception_reaches_the_caller() -> None:
    def boom() -> None:
        raise ValueError("self-test crashed")

    with pytest.raises(ValueError, match="self-test crashed"):
        run_in_background(boom)


def test_only_a_session_without_a_thread_pool_may_be_built_in_the_background() -> None:
    assert background_safe(SessionConfig())
    assert not background_safe(SessionConfig(intra_op_threads=2))
    assert not background_safe(SessionConfig(execution_mode="parallel"))
