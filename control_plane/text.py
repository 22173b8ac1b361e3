"""Counted nouns in operator-facing text: `counted(1, "node")` → `1 node`, `counted(3,
"canary", "canaries")` → `3 canaries`. Pure: no I/O, no framework."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, one: str, many: str | None = None) -> str:
    """`count` and the noun it takes: `one` for exactly 1, else `many` (`one` + "s")."""
    return f"{count} {one if count == 1 else (many if many is not None else one + 's')}"
