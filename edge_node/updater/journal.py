"""The updater's state journal: which model is active, which is kept for rollback, which
is on trial — durable across SIGKILL and power loss (DESIGN §5).

`JournalState` is a frozen value; the transitions (`begin_trial`, `commit_trial`,
`revert_trial`, `rollback`, `accept_assignment`) are pure functions that return a new
state or raise `IllegalTransitionError`. `Journal` reads and writes the JSON file
atomically (temp file, fsync, rename, fsync dir). Not here: deciding *when* to move —
that is the updater's reconcile loop.

Targets are referenced by TUF path and sha256; the sha256 names the file in the
`ModelStore`. `attempts` counts consecutive failed trials of `failed` (the target of
the last reverted trial), so the updater can stop retrying a target that keeps failing.
`retry_at` is set when that failure may pass (a cut link, a restart, a full disk): the
earliest time a re-delivery may try `failed` again (the updater's backoff, kept across
restarts), and the reason its files stay in the store meanwhile (`referenced_sha256s`).
Without it `failed` failed on its merits: only a new assignment tries it again.
`assigned` is the target of the last assignment accepted (whatever became of it): a
renewal of the director's decision is accepted only for that target (ADR 0032). A journal
without it (an older agent's) reads as None.

`probation` is the watchdog window of the active model after a commit: written in the
same atomic save as the commit, so a restart always knows whether the model it is about
to serve was still being watched (and whether that stop was clean: `paused`). Beside the
journal, `journal.json.watch` is reserved (64 bytes) while a window runs, so that its end
can be recorded *in place* when the disk is too full for a new journal
(`mark_watch_passed`): a restart then does not blame a model that passed its window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from edge_node.clock import Clock, SystemClock
from edge_node.errors import InvalidInputError, StorageError
from edge_node.fsutil import atomic_write

__all__ = [
    "JOURNAL_FORMAT",
    "IllegalTransitionError",
    "Journal",
    "JournalCorruptError",
    "JournalState",
    "JournalVersionError",
    "ModelRef",
    "Phase",
    "Probation",
    "accept_assignment",
    "begin_trial",
    "commit_trial",
    "end_probation",
    "pause_probation",
    "revert_active",
    "revert_trial",
    "rollback",
]

JOURNAL_FORMAT: Final = 1
MAX_JOURNAL_BYTES: Final = 1 << 20
_WATCH_MARK_BYTES: Final = 64
_MAX_PATH: Final = 1024
_MAX_ERROR: Final = 500
_SHA256: Final = re.compile(r"[0-9a-f]{64}")


class IllegalTransitionError(InvalidInputError):
    """The transition makes no sense from this state (e.g. commit without a trial)."""

    title = "illegal journal transition"


class JournalCorruptError(StorageError):
    """The journal file is not a journal; a copy was kept, nothing was deleted."""

    title = "update journal corrupt"


class JournalVersionError(StorageError):
    """The journal was written by a newer agent (unknown format); it is left untouched."""

    title = "update journal format unknown"


class Phase(StrEnum):
    IDLE = "idle"
    """Nothing on trial: `active` runs (or nothing does yet)."""
    TRIAL = "trial"
    """`trial` is installed and being loaded / self-tested; a restart in this phase
    means the trial died with the process: revert it (it counts as a failed attempt)."""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A model target: its TUF path and the sha256 that names it in the store."""

    path: str
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not 0 < len(self.path) <= _MAX_PATH:
            raise InvalidInputError(f"bad target path {str(self.path)[:100]!r}")
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise InvalidInputError("sha256 must be 64 lowercase hex digits")

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Probation:
    """The active model is inside its watchdog window until `until`.

    `paused`: the agent stopped cleanly (SIGTERM) inside the window, so the next start
    watches the model again for a full window. Without it, a start that finds a
    probation means the process died while the model was on watch: the model is blamed.
    """

    until: datetime
    paused: bool = False

    def __post_init__(self) -> None:
        if self.until.tzinfo is None:
            raise InvalidInputError("probation.until must be timezone-aware")

    def to_dict(self) -> dict[str, Any]:
        return {"until": _iso(self.until), "paused": self.paused}


@dataclass(frozen=True, slots=True)
class JournalState:
    """What the node runs and is trying; empty for a fresh node."""

    active: ModelRef | None = None
    previous: ModelRef | None = None
    trial: ModelRef | None = None
    attempts: int = 0
    phase: Phase = Phase.IDLE
    director_sequence: int = 0
    updated_at: datetime | None = None
    failed: ModelRef | None = None
    last_error: str | None = None
    probation: Probation | None = None
    retry_at: datetime | None = None
    assigned: ModelRef | None = None
    director_keyid: str = ""
    """The key that signed the last accepted assignment ("": journals written before)."""

    def __post_init__(self) -> None:
        if self.retry_at is not None and self.retry_at.tzinfo is None:
            raise InvalidInputError("retry_at must be timezone-aware")

    @property
    def retry_pending(self) -> bool:
        """`failed` may be tried again (from `retry_at` on)."""
        return self.failed is not None and self.retry_at is not None

    def referenced_sha256s(self) -> frozenset[str]:
        """The store entries this state needs: never garbage-collect these. A failed
        target that will be retried is kept, so the retry downloads nothing again."""
        kept = [self.active, self.previous, self.trial]
        if self.retry_pending:
            kept.append(self.failed)
        return frozenset(r.sha256 for r in kept if r)

    def to_dict(self) -> dict[str, Any]:
        def ref(value: ModelRef | None) -> dict[str, str] | None:
            return None if value is None else value.to_dict()

        return {
            "format": JOURNAL_FORMAT,
            "active": ref(self.active),
            "previous": ref(self.previous),
            "trial": ref(self.trial),
            "attempts": self.attempts,
            "phase": self.phase.value,
            "director_sequence": self.director_sequence,
            "updated_at": None if self.updated_at is None else _iso(self.updated_at),
            "failed": ref(self.failed),
            "last_error": self.last_error,
            "probation": None if self.probation is None else self.probation.to_dict(),
            "retry_at": None if self.retry_at is None else _iso(self.retry_at),
            "assigned": ref(self.assigned),
            "director_keyid": self.director_keyid,
        }


# ------------------------------------------------------------------ transitions


def begin_trial(state: JournalState, target: ModelRef) -> JournalState:
    """Put `target` (already in the store) on trial; `active` keeps running meanwhile."""
    if state.phase is not Phase.IDLE or state.trial is not None:
        raise IllegalTransitionError(
            f"a trial of {state.trial.path if state.trial else '?'} is already in progress; "
            "commit or revert it first",
            phase=state.phase.value,
        )
    # A target is its path and bytes: another version of the same bytes (another runtime
    # spec) is a new target.
    if state.active == target:
        raise IllegalTransitionError(f"{target.path} is already active", phase=state.phase.value)
    retry = state.failed == target
    return dataclasses.replace(
        state,
        trial=target,
        phase=Phase.TRIAL,
        attempts=state.attempts if retry else 0,
        failed=state.failed if retry else None,
        last_error=state.last_error if retry else None,
        retry_at=None,
    )


def commit_trial(state: JournalState, probation_until: datetime | None = None) -> JournalState:
    """The trial passed: it becomes active, the old active is kept as `previous`.

    With `probation_until` the new active model is on watch until then (`Probation`).
    """
    trial = _require_trial(state, "commit")
    return dataclasses.replace(
        state,
        previous=state.active if state.active is not None else state.previous,
        active=trial,
        trial=None,
        phase=Phase.IDLE,
        attempts=0,
        failed=None,
        last_error=None,
        probation=None if probation_until is None else Probation(probation_until),
        retry_at=None,
    )


def revert_trial(
    state: JournalState,
    reason: str,
    *,
    retry_at: datetime | None = None,
    counted: bool = True,
) -> JournalState:
    """The trial failed (self-test, load, crash): drop it, count the attempt.

    `retry_at`: the failure may pass, and a re-delivery may try it again from then on.
    `counted=False`: the failure is the box's, not the model's (a full disk): it does
    not count as an attempt of the target.
    """
    trial = _require_trial(state, "revert")
    return dataclasses.replace(
        state,
        trial=None,
        phase=Phase.IDLE,
        attempts=state.attempts + 1 if counted else state.attempts,
        failed=trial,
        last_error=str(reason)[:_MAX_ERROR],
        retry_at=retry_at,
    )


def rollback(state: JournalState) -> JournalState:
    """Instantly go back to `previous`; the rolled-back model is no longer kept.

    Nothing is on trial during a rollback: revert the trial first.
    """
    if state.phase is not Phase.IDLE or state.trial is not None:
        raise IllegalTransitionError(
            "cannot roll back during a trial; revert it first", phase=state.phase.value
        )
    if state.previous is None:
        raise IllegalTransitionError("no previous version to roll back to")
    return dataclasses.replace(state, active=state.previous, previous=None, probation=None)


def revert_active(
    state: JournalState, reason: str, *, retry_at: datetime | None = None
) -> JournalState:
    """The active model failed after its commit (watchdog, or the process died while it
    was on watch): `previous` becomes active again — or nothing runs when there is none.

    The reverted model counts as a failed attempt of that target (`failed`, `attempts`,
    `last_error`), exactly like a failed trial: a re-delivery of its assignment retries
    it only within the updater's attempt limit, and only with `retry_at`.
    """
    if state.phase is not Phase.IDLE or state.trial is not None:
        raise IllegalTransitionError(
            "cannot revert the active model during a trial; revert the trial first",
            phase=state.phase.value,
        )
    if state.active is None:
        raise IllegalTransitionError("no active model to revert")
    return dataclasses.replace(
        state,
        active=state.previous,
        previous=None,
        failed=state.active,
        attempts=state.attempts + 1,
        last_error=str(reason)[:_MAX_ERROR],
        probation=None,
        retry_at=retry_at,
    )


def end_probation(state: JournalState) -> JournalState:
    """The watchdog window passed: the active model is trusted from now on."""
    return dataclasses.replace(state, probation=None)


def pause_probation(state: JournalState) -> JournalState:
    """A clean stop inside the watchdog window: the next start watches the model again."""
    if state.probation is None:
        return state
    return dataclasses.replace(state, probation=dataclasses.replace(state.probation, paused=True))


def accept_assignment(
    state: JournalState,
    sequence: int,
    target: ModelRef | None = None,
    *,
    keyid: str | None = None,
    rekeyed: bool = False,
) -> JournalState:
    """Remember the director sequence just accepted (anything not above it is refused),
    the key that signed it and, when given, the target it assigns (`assigned`; a renewal
    keeps it). `rekeyed`: the root replaced the director key, so the sequence starts
    again and may be below the last one (`director.sequence_floor`)."""
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise InvalidInputError("sequence must be an integer")
    if rekeyed and sequence < 1:
        raise InvalidInputError("sequence must be at least 1")
    if sequence <= state.director_sequence and not rekeyed:
        raise IllegalTransitionError(
            f"director sequence {sequence} is not above {state.director_sequence}",
            sequence=sequence,
            director_sequence=state.director_sequence,
        )
    return dataclasses.replace(
        state,
        director_sequence=sequence,
        assigned=state.assigned if target is None else target,
        director_keyid=state.director_keyid if keyid is None else keyid,
    )


def _require_trial(state: JournalState, what: str) -> ModelRef:
    if state.phase is not Phase.TRIAL or state.trial is None:
        raise IllegalTransitionError(f"nothing is on trial to {what}", phase=state.phase.value)
    return state.trial


# ------------------------------------------------------------------------- file


class Journal:
    """The journal file (`journal.json`); every `save` is atomic and durable."""

    def __init__(
        self,
        path: Path,
        clock: Clock | None = None,
        *,
        write: Callable[[Path, bytes], None] | None = None,
    ) -> None:
        """`write(path, data)` replaces the file atomically (default: `fsutil.atomic_write`
        with mode 0600); a seam for tests that fake a full disk."""
        self._path = Path(path)
        self._clock = clock or SystemClock()
        self._write = write or _write_private

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> JournalState:
        """The saved state; an empty one if there is no journal yet.

        A journal that cannot be read as one raises `JournalCorruptError` after a copy
        is kept beside it (`journal.json.corrupt-<time>`); the file itself is left in
        place, because the agent — not this class — decides what to do (for instance
        start empty and re-download what the director assigns).
        """
        try:
            with self._path.open("rb") as f:
                raw = f.read(MAX_JOURNAL_BYTES + 1)
        except FileNotFoundError:
            return JournalState()
        except OSError as exc:
            raise StorageError(
                f"cannot read update journal {self._path}: {exc}", path=str(self._path)
            ) from exc
        try:
            return _parse(raw)
        except JournalVersionError:
            raise
        except (ValueError, TypeError, KeyError, InvalidInputError) as exc:
            copy = self._keep_copy(raw)
            raise JournalCorruptError(
                f"update journal {self._path} is corrupt ({exc}); a copy is in {copy.name}",
                path=str(self._path),
                copy=str(copy),
            ) from exc

    def save(self, state: JournalState) -> JournalState:
        """Write `state` stamped with `updated_at = now`; returns what was written.

        A failure raises StorageError and leaves the previous journal as it was.
        """
        stamped = dataclasses.replace(state, updated_at=self._clock.now())
        data = json.dumps(stamped.to_dict(), indent=2, sort_keys=True).encode() + b"\n"
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._write(self._path, data)
        except OSError as exc:
            # The old journal is intact: the rename either happened or it did not.
            raise StorageError(
                f"cannot write update journal {self._path}: {exc}",
                path=str(self._path),
                errno=exc.errno,
            ) from exc
        self._keep_watch_mark(stamped)
        return stamped

    @property
    def watch_mark_path(self) -> Path:
        return self._path.with_name(f"{self._path.name}.watch")

    def mark_watch_passed(self, until: datetime) -> bool:
        """Record, without a new file or block, that the watchdog window ending at `until`
        passed: for when the journal itself cannot be written (a full disk). Overwrites
        the mark reserved by the save that opened the window; False when it cannot."""
        data = _iso(until).encode()[:_WATCH_MARK_BYTES].ljust(_WATCH_MARK_BYTES, b"\0")
        try:
            fd = os.open(self.watch_mark_path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            return False
        return True

    def watch_passed(self, until: datetime) -> bool:
        """Whether `mark_watch_passed(until)` was recorded."""
        try:
            with self.watch_mark_path.open("rb") as f:
                raw = f.read(_WATCH_MARK_BYTES + 1)
        except OSError:
            return False
        return raw.rstrip(b"\0") == _iso(until).encode()

    def _keep_watch_mark(self, state: JournalState) -> None:
        """Reserve the watch mark while a window runs (there was room: the journal was
        just written), drop it once none does; best effort."""
        path = self.watch_mark_path
        with contextlib.suppress(OSError):
            if state.probation is None:
                path.unlink(missing_ok=True)
            elif not state.probation.paused:
                atomic_write(path, bytes(_WATCH_MARK_BYTES), mode=0o600)

    def _keep_copy(self, raw: bytes) -> Path:
        stamp = self._clock.now().astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        copy = self._path.with_name(f"{self._path.name}.corrupt-{stamp}")
        atomic_write(copy, raw, mode=0o600)
        return copy


def _write_private(path: Path, data: bytes) -> None:
    atomic_write(path, data, mode=0o600)


def _parse(raw: bytes) -> JournalState:
    if len(raw) > MAX_JOURNAL_BYTES:
        raise ValueError(f"over {MAX_JOURNAL_BYTES} bytes")
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise TypeError("not a JSON object")
    fmt = obj["format"]
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise TypeError(f"format {fmt!r} is not a number")
    if fmt != JOURNAL_FORMAT:
        raise JournalVersionError(
            f"journal format {fmt} is unknown to this agent (it reads {JOURNAL_FORMAT})",
            format=fmt,
        )
    state = JournalState(
        active=_ref(obj.get("active")),
        previous=_ref(obj.get("previous")),
        trial=_ref(obj.get("trial")),
        attempts=_count(obj.get("attempts"), "attempts"),
        phase=Phase(str(obj.get("phase"))),
        director_sequence=_count(obj.get("director_sequence"), "director_sequence"),
        updated_at=_time(obj.get("updated_at")),
        failed=_ref(obj.get("failed")),
        last_error=_text(obj.get("last_error")),
        probation=_probation(obj.get("probation")),
        retry_at=_time(obj.get("retry_at"), "retry_at"),
        assigned=_ref(obj.get("assigned")),
        director_keyid=_text(obj.get("director_keyid")) or "",
    )
    if (state.phase is Phase.TRIAL) != (state.trial is not None):
        raise ValueError(f"phase {state.phase.value} does not match the trial")
    if state.probation is not None and state.active is None:
        raise ValueError("a probation without an active model")
    return state


def _ref(value: object) -> ModelRef | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("a target must be an object")
    return ModelRef(path=value["path"], sha256=value["sha256"])


def _probation(value: object) -> Probation | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("probation must be an object")
    until = _time(value.get("until"), "probation.until")
    paused = value.get("paused", False)
    if until is None or not isinstance(paused, bool):
        raise ValueError("probation needs `until` and a boolean `paused`")
    return Probation(until=until, paused=paused)


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _time(value: object, name: str = "updated_at") -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{name} has no time zone")
    return parsed.astimezone(UTC)


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError("last_error must be a string")


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
