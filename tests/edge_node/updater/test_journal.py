"""The update journal: pure transitions (legal and illegal) and crash-safe persistence."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from edge_node.clock import ManualClock
from edge_node.errors import InvalidInputError, StorageError
from edge_node.updater.journal import (
    IllegalTransitionError,
    Journal,
    JournalCorruptError,
    JournalState,
    JournalVersionError,
    ModelRef,
    Phase,
    Probation,
    accept_assignment,
    begin_trial,
    commit_trial,
    end_probation,
    pause_probation,
    revert_active,
    revert_trial,
    rollback,
)

START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def ref(name: str) -> ModelRef:
    return ModelRef(f"models/det/{name}/model.onnx", hashlib.sha256(name.encode()).hexdigest())


A, B, C = ref("1.0.0"), ref("1.1.0"), ref("1.2.0")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def journal(tmp_path: Path, clock: ManualClock) -> Journal:
    return Journal(tmp_path / "state" / "journal.json", clock)


# ------------------------------------------------------------------ transitions


def test_first_install_then_upgrade_keeps_the_previous() -> None:
    state = begin_trial(JournalState(), A)
    assert (state.phase, state.trial, state.active) == (Phase.TRIAL, A, None)
    state = commit_trial(state)
    assert (state.active, state.previous, state.trial, state.phase) == (A, None, None, Phase.IDLE)
    state = commit_trial(begin_trial(state, B))
    assert (state.active, state.previous) == (B, A)
    state = commit_trial(begin_trial(state, C))
    assert (state.active, state.previous) == (C, B)
    assert state.referenced_sha256s() == {C.sha256, B.sha256}


def test_a_reverted_trial_leaves_active_alone_and_counts_attempts() -> None:
    state = commit_trial(begin_trial(JournalState(), A))
    state = revert_trial(begin_trial(state, B), "self-test: output differs")
    assert (state.active, state.trial, state.phase) == (A, None, Phase.IDLE)
    assert (state.attempts, state.failed, state.last_error) == (1, B, "self-test: output differs")
    state = revert_trial(begin_trial(state, B), "crashed during load")
    assert state.attempts == 2
    # another target starts counting afresh; a success clears the count
    state = begin_trial(state, C)
    assert (state.attempts, state.failed) == (0, None)
    assert commit_trial(state).attempts == 0


def test_the_trial_is_referenced_while_it_runs() -> None:
    state = begin_trial(commit_trial(begin_trial(JournalState(), A)), B)
    assert state.referenced_sha256s() == {A.sha256, B.sha256}


def test_rollback_makes_previous_active() -> None:
    state = commit_trial(begin_trial(commit_trial(begin_trial(JournalState(), A)), B))
    rolled = rollback(state)
    assert (rolled.active, rolled.previous) == (A, None)
    assert rolled.referenced_sha256s() == {A.sha256}


def test_a_commit_with_a_window_puts_the_new_model_on_watch() -> None:
    until = START + timedelta(minutes=1)
    state = commit_trial(begin_trial(commit_trial(begin_trial(JournalState(), A)), B), until)
    assert state.probation == Probation(until)
    # A trial of another model leaves the watch of the active one as it is...
    trial = begin_trial(state, C)
    assert trial.probation == Probation(until)
    assert revert_trial(trial, "boom").probation == Probation(until)
    # ...its commit replaces it; ending, pausing and rolling back close or mark it.
    assert commit_trial(trial).probation is None
    assert end_probation(state).probation is None
    assert pause_probation(state).probation == Probation(until, paused=True)
    assert pause_probation(JournalState()) == JournalState()
    assert rollback(state).probation is None


def test_reverting_the_active_model_counts_as_a_failed_attempt() -> None:
    until = START + timedelta(minutes=1)
    state = commit_trial(begin_trial(commit_trial(begin_trial(JournalState(), A)), B), until)
    reverted = revert_active(state, "watchdog-errors: 12 inference errors")
    assert (reverted.active, reverted.previous, reverted.probation) == (A, None, None)
    assert (reverted.failed, reverted.attempts) == (B, 1)
    assert reverted.last_error == "watchdog-errors: 12 inference errors"
    assert reverted.referenced_sha256s() == {A.sha256}
    # Without a previous model nothing runs afterwards (rather than a crash loop).
    alone = revert_active(commit_trial(begin_trial(JournalState(), A), until), "died")
    assert (alone.active, alone.failed) == (None, A)


def test_a_probation_must_be_timezone_aware() -> None:
    with pytest.raises(InvalidInputError):
        Probation(datetime(2026, 5, 1))


def test_states_are_frozen() -> None:
    state = JournalState()
    with pytest.raises(AttributeError):
        state.attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "step",
    [
        lambda s: commit_trial(JournalState()),
        lambda s: revert_trial(JournalState(), "x"),
        lambda s: rollback(JournalState()),
        lambda s: begin_trial(begin_trial(JournalState(), A), B),
        lambda s: rollback(begin_trial(commit_trial(begin_trial(JournalState(), A)), B)),
        lambda s: begin_trial(commit_trial(begin_trial(JournalState(), A)), A),
        lambda s: accept_assignment(accept_assignment(JournalState(), 3), 3),
        lambda s: accept_assignment(accept_assignment(JournalState(), 3), 2),
        lambda s: revert_active(JournalState(), "x"),
        lambda s: revert_active(begin_trial(commit_trial(begin_trial(JournalState(), A)), B), "x"),
    ],
    ids=[
        "commit-without-trial",
        "revert-without-trial",
        "rollback-without-previous",
        "second-trial",
        "rollback-during-trial",
        "trial-of-the-active",
        "same-sequence",
        "lower-sequence",
        "revert-without-active",
        "revert-active-during-trial",
    ],
)
def test_illegal_transitions_raise(step: object) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        step(None)  # type: ignore[operator]
    assert isinstance(info.value, InvalidInputError)


def test_accepted_director_sequences_only_rise() -> None:
    assert accept_assignment(JournalState(), 1).director_sequence == 1
    assert accept_assignment(JournalState(director_sequence=7), 9).director_sequence == 9


def test_model_refs_are_checked() -> None:
    with pytest.raises(InvalidInputError):
        ModelRef("models/det/1/model.onnx", "ABC")
    with pytest.raises(InvalidInputError):
        ModelRef("", A.sha256)


# -------------------------------------------------------------------------- file


def test_a_missing_journal_is_an_empty_state(journal: Journal) -> None:
    assert journal.load() == JournalState()


def test_save_and_load_round_trip(journal: Journal, clock: ManualClock) -> None:
    state = revert_trial(begin_trial(commit_trial(begin_trial(JournalState(), A)), B), "boom")
    state = begin_trial(accept_assignment(state, 12), C)
    saved = journal.save(state)
    assert saved.updated_at == START
    assert journal.load() == saved
    assert (journal.path.stat().st_mode & 0o777) == 0o600
    on_disk = json.loads(journal.path.read_text())
    assert on_disk["format"] == 1
    assert on_disk["active"] == {"path": A.path, "sha256": A.sha256}
    assert on_disk["phase"] == "trial"
    assert on_disk["director_sequence"] == 12
    assert on_disk["probation"] is None
    clock.advance(timedelta(minutes=5))
    assert journal.save(commit_trial(saved)).updated_at == START + timedelta(minutes=5)


def test_a_probation_survives_the_round_trip(journal: Journal) -> None:
    until = START + timedelta(seconds=90)
    state = pause_probation(commit_trial(begin_trial(JournalState(), A), until))
    saved = journal.save(state)
    assert journal.load() == saved
    on_disk = json.loads(journal.path.read_text())
    assert on_disk["probation"] == {"until": "2026-05-01T12:01:30Z", "paused": True}


def test_a_journal_without_the_probation_key_reads_as_none(journal: Journal) -> None:
    """Journals written before the watchdog existed load unchanged."""
    saved = journal.save(commit_trial(begin_trial(JournalState(), A)))
    on_disk = json.loads(journal.path.read_text())
    del on_disk["probation"]
    journal.path.write_text(json.dumps(on_disk))
    assert journal.load() == saved


def test_a_crash_during_save_leaves_the_old_journal(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = journal.save(commit_trial(begin_trial(JournalState(), A)))
    before = journal.path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("power lost")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StorageError, match="power lost") as info:
        journal.save(begin_trial(old, B))
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()

    assert journal.path.read_bytes() == before
    assert journal.load() == old
    assert [p.name for p in journal.path.parent.iterdir()] == ["journal.json"]  # no temp left


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"format": 1, "phase": "idle"}',
        b'{"format": 1, "active": null, "previous": null, "trial": null, "attempts": -1, '
        b'"phase": "idle", "director_sequence": 0}',
        b'{"format": 1, "active": null, "previous": null, "trial": null, "attempts": 0, '
        b'"phase": "trial", "director_sequence": 0}',
        b'{"format": 1, "active": {"path": "p", "sha256": "nope"}, "attempts": 0, '
        b'"phase": "idle", "director_sequence": 0}',
        b"",
        b'{"format": 1, "active": null, "previous": null, "trial": null, "attempts": 0, '
        b'"phase": "idle", "director_sequence": 0, '
        b'"probation": {"until": "2026-05-01T12:00:00Z", "paused": false}}',
        b'{"format": 1, "active": null, "previous": null, "trial": null, "attempts": 0, '
        b'"phase": "idle", "director_sequence": 0, "probation": {"paused": "yes"}}',
    ],
    ids=[
        "syntax",
        "list",
        "missing",
        "negative",
        "trial-mismatch",
        "bad-sha",
        "empty",
        "probation-without-active",
        "bad-probation",
    ],
)
def test_a_corrupt_journal_is_kept_and_reported(journal: Journal, content: bytes) -> None:
    journal.path.parent.mkdir(parents=True)
    journal.path.write_bytes(content)
    with pytest.raises(JournalCorruptError) as info:
        journal.load()
    assert isinstance(info.value, StorageError)
    copy = Path(info.value.fields["copy"])
    assert copy.name.startswith("journal.json.corrupt-20260501T120000")
    assert copy.read_bytes() == content
    assert journal.path.read_bytes() == content  # the agent decides, nothing is deleted


def test_a_journal_from_a_newer_agent_is_left_alone(journal: Journal) -> None:
    journal.path.parent.mkdir(parents=True)
    journal.path.write_text('{"format": 2}')
    with pytest.raises(JournalVersionError):
        journal.load()
    assert [p.name for p in journal.path.parent.iterdir()] == ["journal.json"]
