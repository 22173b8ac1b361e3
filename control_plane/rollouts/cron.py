"""A five-field cron matcher (`M H DoM Mon DoW`, UTC) for rollout maintenance windows.

What it is for: "does a window that opens at every match and lasts `duration` hold
`now`?", and when the next one opens. The subset: `*`, numbers, lists (`1,15`), ranges
(`1-5`) and steps (`*/15`, `0-30/10`, `5/20`); day of week 0-7 (0 and 7 are Sunday). As
in Vixie cron, when both day fields are restricted a day matches either. What it is not
for: names (`mon`, `jan`), `@daily`, seconds, time zones other than UTC. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Final

from control_plane.errors import InvalidInputError
from protos.fields import Fields

__all__ = ["CronSchedule", "parse_cron"]

# (name, low, high) of the five fields, in order.
_FIELDS: Final = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
# The most days a month can have (February: in leap years), to refuse `0 0 31 2 *`.
_MONTH_DAYS: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MAX_TEXT: Final = 200
_F: Final = Fields(InvalidInputError)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """The parsed schedule; `text` is what the operator wrote (normalised blanks)."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    def __str__(self) -> str:
        return self.text

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def matches(self, at: datetime) -> bool:
        at = _utc(at)
        return at.minute in self.minutes and at.hour in self.hours and self.day_matches(at.date())

    def latest_at_or_before(self, at: datetime, not_before: datetime) -> datetime | None:
        """The latest matching minute in [not_before, at], or None."""
        at, not_before = _utc(at), _utc(not_before)
        day = at.date()
        while day >= not_before.date():
            if self.day_matches(day):
                for hour in reversed(self.hours):
                    for minute in reversed(self.minutes):
                        moment = datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                        if not_before <= moment <= at:
                            return moment
                        if moment < not_before:
                            return None
            day -= timedelta(days=1)
        return None

    def next_after(self, at: datetime, within: timedelta) -> datetime | None:
        """The first matching minute after `at` and at most `within` later, or None."""
        at = _utc(at)
        end = at + within
        for day in _days(at.date(), end.date()):
            if not self.day_matches(day):
                continue
            for hour in self.hours:
                for minute in self.minutes:
                    moment = datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                    if moment > end:
                        return None
                    if moment > at:
                        return moment
        return None


def _days(first: date, last: date) -> Iterator[date]:
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def _utc(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise InvalidInputError(f"{at!r} has no time zone; cron times are UTC", field="now")
    return at.astimezone(UTC)


def parse_cron(text: str, *, field_name: str = "window") -> CronSchedule:
    """`M H DoM Mon DoW` (a leading `cron ` is allowed). Refused, naming `field_name`: a
    wrong field count, a value out of range, a bad range or step, or a schedule that
    never matches (`0 0 31 2 *`)."""
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise _F.fail(field_name, "must be a cron text of 5 fields (M H DoM Mon DoW)", text)
    parts = text.split()
    if parts[:1] == ["cron"]:
        parts = parts[1:]
    if len(parts) != len(_FIELDS):
        raise _F.fail(field_name, "must have 5 cron fields (M H DoM Mon DoW)", text)
    values = [
        _field(field_name, name, part, low, high)
        for part, (name, low, high) in zip(parts, _FIELDS, strict=True)
    ]
    weekdays = tuple(sorted({d % 7 for d in values[4]}))
    schedule = CronSchedule(
        text=" ".join(parts),
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        any_day=parts[2] == "*",
        any_weekday=parts[4] == "*",
    )
    only_days = schedule.any_weekday and not schedule.any_day
    fits = any(d <= _MONTH_DAYS[m - 1] for m in schedule.months for d in schedule.days)
    if only_days and not fits:
        raise _F.fail(field_name, "never matches (no such day in those months)", text)
    return schedule


def _field(field_name: str, name: str, part: str, low: int, high: int) -> tuple[int, ...]:
    chosen: set[int] = set()
    for item in part.split(","):
        body, slash, step_text = item.partition("/")
        step = _number(field_name, name, step_text, 1, high - low + 1) if slash else 1
        if body == "*":
            first, last = low, high
        elif "-" in body:
            start, _, end = body.partition("-")
            first = _number(field_name, name, start, low, high)
            last = _number(field_name, name, end, low, high)
            if first > last:
                raise _F.fail(field_name, f"{name} range {body!r} runs backwards", part)
        else:
            first = _number(field_name, name, body, low, high)
            last = high if slash else first
        chosen.update(range(first, last + 1, step))
    return tuple(sorted(chosen))


def _number(field_name: str, name: str, text: str, low: int, high: int) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 2) or not low <= int(text) <= high:
        raise _F.fail(field_name, f"{name} must be a number in [{low}, {high}]", text)
    return int(text)
