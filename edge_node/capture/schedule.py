"""When to grab the next frame and which file to take: the decisions of capture, no I/O.

What it is for: :class:`FramePacer` (the next capture time at a stream's rate, no burst to
catch up after a stall), :func:`retry_delay` (capped exponential backoff with full jitter
after a failure), :class:`FilePicker` (in a listing of a drop directory, the newest new
file whose writer is done, and the older ones it supersedes) and :class:`CaptureCounters`
(frames taken and failures by reason). Times are passed in, so tests need no sleeping.

What it is not for: reading the directory or the network (``edge_node.capture.sources``).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CaptureCounters",
    "CaptureStats",
    "FileEntry",
    "FilePick",
    "FilePicker",
    "FramePacer",
    "retry_delay",
]


class FramePacer:
    """Capture times on a grid of ``1 / fps``; after a late capture the grid restarts at now.

    ``next_due(now)`` after each capture tells when to capture next; a capture that took
    longer than the interval is followed at once by the next, not by a burst.
    """

    def __init__(self, fps: float) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.interval = 1.0 / fps
        self._due: float | None = None

    def next_due(self, now: float) -> float:
        due = now if self._due is None else self._due + self.interval
        if due < now:  # fell behind: start a new grid rather than catch up
            due = now
        self._due = due
        return due


def retry_delay(
    failures: int, initial_s: float, cap_s: float, rng: Callable[[], float] = random.random
) -> float:
    """Seconds before the next try after ``failures`` (>= 1) failures in a row.

    Full jitter under a ceiling of ``initial_s * 2**(failures-1)`` capped at ``cap_s``, but
    never under half the ceiling: a dead camera is polled at most about once per ceiling/2.
    """
    exponent = min(max(0, failures - 1), 62)
    ceiling = min(cap_s, initial_s * 2.0**exponent)
    return ceiling * (0.5 + 0.5 * rng())


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One regular file seen in a drop directory."""

    name: str
    size: int
    mtime_ns: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.mtime_ns, self.name)


@dataclass(frozen=True, slots=True)
class FilePick:
    """``take``: the file to read now (or None); ``superseded``: older ready files passed
    over for it (latest frame wins)."""

    take: FileEntry | None
    superseded: tuple[FileEntry, ...] = ()


class FilePicker:
    """Remembers what was taken (the newest (mtime, name) so far) and the last sizes seen.

    A file is *ready* when its mtime is at least ``settle_s`` old and its size and mtime
    are what the previous scan saw (the writer is done). Only files newer than the last
    taken are new, so ``keep`` mode needs no growing list of names; a file dropped later
    with an older mtime than one already taken is ignored.
    """

    def __init__(self, settle_s: float) -> None:
        self._settle_ns = int(settle_s * 1e9)
        self._last_taken: tuple[int, str] | None = None
        self._previous: dict[str, tuple[int, int]] = {}

    def pick(self, entries: Iterable[FileEntry], now_ns: int) -> FilePick:
        """``now_ns``: wall-clock time (as the file system's mtimes) in nanoseconds."""
        seen: dict[str, tuple[int, int]] = {}
        ready: list[FileEntry] = []
        for entry in entries:
            seen[entry.name] = (entry.size, entry.mtime_ns)
            if self._last_taken is not None and entry.key <= self._last_taken:
                continue
            stable = self._previous.get(entry.name) == (entry.size, entry.mtime_ns)
            if stable and entry.size > 0 and now_ns - entry.mtime_ns >= self._settle_ns:
                ready.append(entry)
        self._previous = seen
        if not ready:
            return FilePick(None)
        ready.sort(key=lambda e: e.key)
        newest = ready[-1]
        self._last_taken = newest.key
        return FilePick(newest, tuple(ready[:-1]))


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """One stream's capture counters: frames handed to the pipeline, failures by reason,
    files passed over for a newer one, and the failures in a row now."""

    stream: str
    captured: int
    failures: Mapping[str, int]
    superseded: int
    consecutive_failures: int


@dataclass
class CaptureCounters:
    """Thread-safe counters of one stream's capture."""

    stream: str
    captured: int = 0
    superseded: int = 0
    consecutive_failures: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_captured(self) -> None:
        with self._lock:
            self.captured += 1
            self.consecutive_failures = 0

    def count_failure(self, reason: str) -> int:
        """Count one failure; returns the failures in a row so far."""
        with self._lock:
            self.failures[reason] += 1
            self.consecutive_failures += 1
            return self.consecutive_failures

    def count_superseded(self, n: int) -> None:
        with self._lock:
            self.superseded += n

    def snapshot(self) -> CaptureStats:
        with self._lock:
            return CaptureStats(
                self.stream,
                self.captured,
                dict(self.failures),
                self.superseded,
                self.consecutive_failures,
            )
