"""The updater tests' fleet: `edge_node.testing.update_world` with two releases, and the
checks and crash the reconciler tests share."""

from __future__ import annotations

from pathlib import Path

from edge_node.testing.update_world import Release, UpdateWorld
from edge_node.updater.journal import JournalState, Phase
from edge_node.updater.reconciler import OutcomeKind


class Crash(BaseException):
    """Stands for SIGKILL: not an Exception, so no revert runs."""


def make_world(tmp_path: Path) -> UpdateWorld:
    """Two releases of `det` (1.0.0, 1.1.0), published; the node's dir is tmp/node."""
    return UpdateWorld.create(tmp_path, versions=("1.0.0", "1.1.0"))


def assert_consistent(w: UpdateWorld, state: JournalState) -> None:
    assert state.phase is Phase.IDLE and state.trial is None
    store = w.store
    for ref in (state.active, state.previous):
        if ref is not None:
            assert store.verify(ref.sha256), ref
    assert store.installed() <= state.referenced_sha256s()


async def install_first(w: UpdateWorld) -> Release:
    rel = w.releases["1.0.0"]
    outcome = await w.reconciler().apply(w.assign(rel))
    assert outcome.kind is OutcomeKind.APPLIED, outcome
    return rel
