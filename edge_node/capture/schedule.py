"""When to grab the next frame and which file to take: the decisions of capture, no I/O.

What it is for: :class:`FramePacer` (the next capture time at a stream's rate, no burst to
catch up after a stall), :func:`retry_delay` (capped exponential backoff with full jitter
after a failure), :class:`FilePicker` (in a listing of a drop directory, the newest new
file whose writer is done, the older ones it supersedes, and the files to set aside unread:
empty ones and ones older than a frame already taken) and :class:`CaptureCounters` (frames
taken, failures by reason, files passed over by reason). Times are passed in, so tests need
no sleeping.

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
    over for it (latest frame wins); ``stale``: settled files older than a frame already
    taken (dropped late, or copied with their old mtime); ``empty``: files that stayed 0
    bytes for ``empty_after_s``. Each file is in a pick once."""

    take: FileEntry | None
    superseded: tuple[FileEntry, ...] = ()
    stale: tuple[FileEntry, ...] = ()
    empty: tuple[FileEntry, ...] = ()

    @property
    def done(self) -> tuple[FileEntry, ...]:
        """Every file this pick dealt with: read, superseded or set aside."""
        taken = () if self.take is None else (self.take,)
        return (*self.superseded, *taken, *self.stale, *self.empty)


class FilePicker:
    """Remembers what was taken (the newest (mtime, name) so far), the last sizes seen, and
    which files of the listing it has dealt with.

    A file is *ready* when its mtime is at least ``settle_s`` old and its size and mtime
    are what the previous scan saw (the writer is done). Only files newer than the last
    taken are new; a ready file dropped later with an older mtime than one already taken is
    *stale*. A file that stays 0 bytes is *empty* once its mtime is ``empty_after_s`` (at
    least ``settle_s``) old and it held across two scans: a camera may create the file
    before it writes, so an empty file is given that long to fill (it is then new, and
    read as any other). Each file is reported once: the names dealt with are remembered
    while they are in the listing (so ``keep`` mode, where they stay, does not count them
    again), and a file whose size or mtime changes afterwards is looked at afresh.
    """

    def __init__(self, settle_s: float, empty_after_s: float = 0.0) -> None:
        self._settle_ns = int(settle_s * 1e9)
        self._empty_ns = int(max(settle_s, empty_after_s) * 1e9)
        self._last_taken: tuple[int, str] | None = None
        self._previous: dict[str, tuple[int, int]] = {}
        self._done: dict[str, tuple[int, int]] = {}

    def pick(self, entries: Iterable[FileEntry], now_ns: int) -> FilePick:
        """``now_ns``: wall-clock time (as the file system's mtimes) in nanoseconds."""
        seen: dict[str, tuple[int, int]] = {}
        ready: list[FileEntry] = []
        stale: list[FileEntry] = []
        empty: list[FileEntry] = []
        for entry in entries:
            state = (entry.size, entry.mtime_ns)
            seen[entry.name] = state
            if self._done.get(entry.name) == state:
                continue
            stable = self._previous.get(entry.name) == state
            age_ns = now_ns - entry.mtime_ns
            if not stable:
                continue
            if entry.size == 0:
                if age_ns >= self._empty_ns:
                    empty.append(entry)
            elif age_ns < self._settle_ns:
                continue
            elif self._last_taken is not None and entry.key <= self._last_taken:
                stale.append(entry)
            else:
                ready.append(entry)
        self._previous = seen
        # What was dealt with and is gone (deleted, moved) need not be remembered.
        self._done = {name: state for name, state in self._done.items() if name in seen}
        ready.sort(key=lambda e: e.key)
        pick = FilePick(ready[-1] if ready else None, tuple(ready[:-1]), tuple(stale), tuple(empty))
        if pick.take is not None:
            self._last_taken = pick.take.key
        for entry in pick.done:
            self._done[entry.name] = (entry.size, entry.mtime_ns)
        return pick


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """One stream's capture counters: frames handed to the pipeline, failures by reason,
    files passed over for a newer one, the failures in a row now, and files set aside
    unread by reason (``empty``, ``stale``; see :class:`FilePicker`)."""

    stream: str
    captured: int
    failures: Mapping[str, int]
    superseded: int
    consecutive_failures: int
    discarded: Mapping[str, int] = field(default_factory=dict)


@dataclass
class CaptureCounters:
    """Thread-safe counters of one stream's capture."""

    stream: str
    captured: int = 0
    superseded: int = 0
    consecutive_failures: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    discarded: Counter[str] = field(default_factory=Counter)
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

    def count_discarded(self, reason: str, n: int) -> None:
        """Files set aside unread (``empty``, ``stale``): not failures, no backoff."""
        with self._lock:
            self.discarded[reason] += n

    def snapshot(self) -> CaptureStats:
        with self._lock:
            return CaptureStats(
                self.stream,
                self.captured,
                dict(self.failures),
                self.superseded,
                self.consecutive_failures,
                dict(self.discarded),
            )
