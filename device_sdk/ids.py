"""Message ids: RFC 9562 UUIDv7 strings (time-ordered, 74 random bits), made by the SDK
for every message so that a resend is recognisable. Not a UUID library."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable

__all__ = ["uuid7"]


def uuid7(unix_s: float, randbits: Callable[[int], int] = secrets.randbits) -> str:
    """A UUIDv7 for the instant `unix_s` (seconds since the epoch)."""
    ms = max(0, int(unix_s * 1000)) & ((1 << 48) - 1)
    value = ms << 80 | 0x7 << 76 | randbits(12) << 64 | 0b10 << 62 | randbits(62)
    return str(uuid.UUID(int=value))
