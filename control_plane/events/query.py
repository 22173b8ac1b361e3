"""What an event query may ask, its keyset cursors, and the retention policy (pure).

Two orders: ``newest`` (by event time, newest first; `since`/`until` bound the event
time) for listing, and ``arrival`` (by the control plane's receipt, oldest first;
`since`/`until` bound the arrival) for following. Both page by keyset on (time, row id),
so rows inserted meanwhile neither shift nor repeat a page. An arrival read sees only
rows received `settle` ago or earlier: a group commit stamps its rows before it commits,
so a younger row may still be joined by an older-stamped one; behind the settle window
(longer than a group takes: bounded in rows, each statement timed out in seconds; ADR
0040) the order is final and a follower does not skip a row.

Not here: running queries (``store``), parsing HTTP (the route) or durations
(``control_plane.durations``).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

from control_plane.durations import DurationError, parse_duration
from control_plane.errors import InvalidInputError

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "EventQuery",
    "EventsConfig",
    "Order",
    "Position",
    "decode_cursor",
    "encode_cursor",
    "time_bound",
]

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
Order = Literal["newest", "arrival"]
_ORDER_TAG: Final[dict[str, str]] = {"newest": "n", "arrival": "a"}
_NODE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_TYPE: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """The event store's settings (validated here, at start)."""

    # Events older than this (by event time, and received as long ago) are deleted.
    retention: timedelta = timedelta(days=30)
    # How far behind now an arrival-ordered read stays (see the module's docstring).
    settle: timedelta = timedelta(seconds=10)
    # How often the server's retention pass runs, and the most rows one pass deletes.
    prune_interval_s: float = 300.0
    prune_chunk: int = 5000
    prune_max_chunks: int = 20

    def __post_init__(self) -> None:
        if self.retention < timedelta(hours=1):
            raise InvalidInputError(
                f"event retention must be at least 1 h, got {self.retention}", field="retention"
            )
        if not timedelta(0) <= self.settle <= timedelta(minutes=5):
            raise InvalidInputError(
                f"the events' settle window must be in [0, 5 min], got {self.settle}",
                field="settle",
            )
        if self.prune_interval_s <= 0 or self.prune_chunk < 1 or self.prune_max_chunks < 1:
            raise InvalidInputError("event pruning needs a positive interval, chunk and count")


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A row's place in its order: the order's time, then the row id."""

    at: datetime
    row_id: int


def encode_cursor(order: Order, position: Position) -> str:
    micros = (position.at - _EPOCH) // timedelta(microseconds=1)
    raw = f"{_ORDER_TAG[order]}:{micros}:{position.row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: Order) -> Position:
    """The position a cursor of `order` names; InvalidInputError (``bad-cursor``) for
    anything else, a cursor of the other order included."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        tag, micros, row_id = raw.split(":")
        position = Position(_EPOCH + timedelta(microseconds=int(micros)), int(row_id))
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise InvalidInputError("not an events cursor", reason="bad-cursor") from None
    if tag != _ORDER_TAG[order]:
        raise InvalidInputError(f"the cursor is not one of {order} order", reason="bad-cursor")
    return position


def time_bound(text: str, now: datetime, name: str) -> datetime:
    """`since`/`until` as given: an ISO 8601 time with a UTC offset, or a duration back
    from now (``90s``, ``1h``, ``7d``); InvalidInputError (``bad-<name>``) otherwise."""
    try:
        return now - parse_duration(text)
    except DurationError:
        pass
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise InvalidInputError(
            f"{name} {text!r}: give a duration back from now (1h, 7d) or an ISO 8601 time "
            "with a UTC offset",
            reason=f"bad-{name}",
        )
    return at.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class EventQuery:
    """One page's question, checked (`EventQuery.parse` builds one from text)."""

    fleet: str
    order: Order = "newest"
    node: str | None = None
    type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT
    after: Position | None = None

    @classmethod
    def parse(
        cls,
        fleet: str,
        *,
        now: datetime,
        order: str = "newest",
        node: str | None = None,
        type: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> EventQuery:
        if order not in _ORDER_TAG:
            raise InvalidInputError(
                f"order must be newest or arrival, got {order!r}", reason="bad-order"
            )
        checked: Order = "newest" if order == "newest" else "arrival"
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(
                f"limit must be in [1, {MAX_LIMIT}], got {limit}", reason="bad-limit"
            )
        if node is not None and not _NODE.match(node):
            raise InvalidInputError(f"node {node!r} is not a node id", reason="bad-node")
        if type is not None and not _TYPE.match(type):
            raise InvalidInputError(f"type {type!r} is not an event type", reason="bad-type")
        start = None if since is None else time_bound(since, now, "since")
        end = None if until is None else time_bound(until, now, "until")
        if start is not None and end is not None and end <= start:
            raise InvalidInputError("until must be later than since", reason="bad-until")
        after = None if cursor is None else decode_cursor(cursor, checked)
        return cls(fleet, checked, node, type, start, end, limit, after)
