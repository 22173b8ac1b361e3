"""Revocation as a rollout (ADR 0035): which nodes a raised floor leaves on a forbidden
version, and which version they move to.

Pure: takes a model's floor, its releases and the nodes' current assignments, returns the
plan. Not here: locking, signing and storing the new assignments (`DirectorService.
move_off_revoked`), delivering them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from control_plane.errors import InvalidInputError

__all__ = ["Release", "RevocationPlan", "plan_revocation", "replacement"]


@dataclass(frozen=True, slots=True)
class Release:
    """One published version of a model and its release counter."""

    version: str
    release_counter: int


@dataclass(frozen=True, slots=True)
class RevocationPlan:
    """The nodes whose current assignment is below `floor` (`affected`, sorted) and the
    version they move to: the newest at or above the floor, or None (they are left on a
    revoked version until a good one is pushed)."""

    model: str
    floor: int
    to: Release | None
    affected: tuple[str, ...]

    @property
    def left(self) -> tuple[str, ...]:
        """The affected nodes that have nowhere to go."""
        return self.affected if self.to is None else ()


def replacement(releases: Iterable[Release], floor: int) -> Release | None:
    """The newest release (by release counter) at or above `floor`; None if there is none."""
    allowed = [r for r in releases if r.release_counter >= floor]
    return max(allowed, key=lambda r: r.release_counter, default=None)


def plan_revocation(
    model: str, floor: int, releases: Iterable[Release], current: Mapping[str, int]
) -> RevocationPlan:
    """`current` maps each node to the release counter of its current assignment (of
    `model`); the nodes below `floor` move, or are left when no release is allowed."""
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
        raise InvalidInputError(
            f"floor must be a non-negative integer, got {floor!r}", field="floor"
        )
    affected = tuple(sorted(node for node, counter in current.items() if counter < floor))
    return RevocationPlan(model, floor, replacement(releases, floor), affected)
