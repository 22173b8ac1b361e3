"""Work beside the frames at background CPU priority: loading and self-testing the next version.

What it is for: a hot swap loads the next model and self-tests it (runs it on its reference
input) while the current one serves, on the same cores. At the same priority the two share a
core and every frame in the swap window takes up to twice as long; at background priority
the frames preempt that work whenever they need the core, and it takes the time they leave
idle. :func:`run_in_background` runs one function in a fresh thread whose priority is
lowered for its whole life (an unprivileged thread can lower its priority but never raise it
back, so a pool thread must not be used), and waits for it.

What it is not for: anything that starts threads that must run at normal priority later —
they inherit the low priority. An ONNX Runtime session built there with ``intra_op_threads``
above 1 (or a parallel inter-op pool) creates its thread pool there: build a *serving*
session in the background only with one intra-op thread (:func:`background_safe`).

Under a CPU the frames keep saturated, background work still gets a small share (nice 19:
about 1.5 % of a core against a nice-0 thread), so it finishes, late; ``SCHED_IDLE`` would
give it almost nothing, so it is not the default.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final, Literal, TypeVar

from edge_node.runtime.config import SessionConfig

__all__ = [
    "BACKGROUND_NICE",
    "Background",
    "background_safe",
    "lower_this_thread",
    "run_in_background",
    "work_time",
]

T = TypeVar("T")
Background = Literal["nice", "idle", "normal"]
BACKGROUND_NICE: Final = 19

_lowered = threading.local()


def work_time() -> float:
    """Seconds, for timing work done in the calling thread: its CPU time in a thread
    lowered by :func:`lower_this_thread` (the frames preempt it, so its wall time says how
    busy the node is, not how fast the work is), wall time (``perf_counter``) elsewhere.
    Right only for work that runs in the calling thread: an ONNX Runtime session with one
    intra-op thread, sequential (:func:`background_safe`)."""
    return time.thread_time() if getattr(_lowered, "mode", None) else time.perf_counter()


def lower_this_thread(mode: Background = "nice") -> str:
    """Lower the calling thread's CPU priority for the rest of its life (Linux: per thread);
    returns what was applied (``"nice 19"``, ``"SCHED_IDLE"`` or ``"unchanged"``)."""
    if mode == "normal":
        return "unchanged"
    if mode == "idle" and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            _lowered.mode = "SCHED_IDLE"
            return "SCHED_IDLE"
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (OSError, AttributeError):
        return "unchanged"
    applied = f"nice {BACKGROUND_NICE}"
    _lowered.mode = applied
    return applied


def run_in_background(
    fn: Callable[[], T], *, name: str = "edgefleet-background", mode: Background = "nice"
) -> T:
    """``fn()`` in a new thread at background priority; its result, or its exception."""
    result: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        lower_this_thread(mode)
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller, re-raised there
            error.append(exc)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def background_safe(config: SessionConfig) -> bool:
    """Whether a session with ``config`` may be built in a background thread and then serve:
    only when ONNX Runtime starts no thread pool for it (one intra-op thread, sequential)."""
    return config.intra_op_threads == 1 and config.execution_mode == "sequential"
