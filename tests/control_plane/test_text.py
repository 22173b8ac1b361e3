"""Counted nouns: one, many, and irregular plurals."""

from __future__ import annotations

from control_plane.text import counted


def test_one_takes_the_singular_and_every_other_count_the_plural() -> None:
    assert counted(1, "node") == "1 node"
    assert [counted(n, "node") for n in (0, 2)] == ["0 nodes", "2 nodes"]
    assert counted(1, "canary", "canaries") == "1 canary"
    assert counted(3, "canary", "canaries") == "3 canaries"
