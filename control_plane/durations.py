"""One parser for the durations people type (`3600`, `90s`, `30m`, `6h`, `7d`, `2w`, `1h30m`).

Used by the CLI's options and the API's query parameters alike, so both accept the same
text. Pure: no I/O, no framework; deciding whether a duration is allowed is the caller's job.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

__all__ = ["DurationError", "format_duration", "parse_duration"]

UNITS: Final = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART: Final = re.compile(r"([0-9]{1,9})([smhdw])")
# Bare seconds are capped like each unit part, so a typo cannot ask for a billion years.
_MAX_BARE_DIGITS: Final = 10


class DurationError(ValueError):
    """The text is not a duration; the message says what would be."""

    def __init__(self, text: str) -> None:
        super().__init__(
            f"{text!r} is not a duration: give seconds (3600) or a number with a unit "
            "s, m, h, d or w (90m, 6h, 7d, 1h30m)"
        )
        self.text = text


def parse_duration(text: str) -> timedelta:
    """Bare seconds (``600``) or unit parts (``90s``, ``30m``, ``6h``, ``7d``, ``2w``,
    combined like ``1h30m``); case and surrounding blanks do not matter.

    Raises `DurationError` (a `ValueError`) for anything else: signs, fractions,
    blanks inside, unknown units, or more than `timedelta` can hold.
    """
    cleaned = text.strip().lower()
    if cleaned.isascii() and cleaned.isdigit() and len(cleaned) <= _MAX_BARE_DIGITS:
        return timedelta(seconds=int(cleaned))
    if not cleaned or _PART.sub("", cleaned):
        raise DurationError(text)
    seconds = sum(int(n) * UNITS[unit] for n, unit in _PART.findall(cleaned))
    try:
        return timedelta(seconds=seconds)
    except OverflowError as exc:
        raise DurationError(text) from exc


def format_duration(span: timedelta) -> str:
    """The shortest unit text for a whole, non-negative number of seconds (``1h30m``,
    ``0s``); `parse_duration` reads it back to the same `timedelta`.
    """
    if span < timedelta(0) or span.microseconds:
        raise ValueError(f"{span!r} is not a whole, non-negative number of seconds")
    left = span // timedelta(seconds=1)
    parts: list[str] = []
    for unit, size in UNITS.items():
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
