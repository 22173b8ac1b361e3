"""The event store on SQLite and PostgreSQL, fed through the record ingest: each event
once per fleet however often it is sent, keyset pages stable under inserts, arrival
order behind the settle window, retention."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.clock import ManualClock
from control_plane.errors import NotFoundError
from control_plane.events.query import EventQuery, EventsConfig, Position, decode_cursor
from control_plane.events.store import EventStore
from control_plane.link.ingest import LoopGroupCommit, RecordIngest
from control_plane.nodes.wiring import NodeServices
from control_plane.storage.models import FleetEventRow
from tests.control_plane.events.support import T0, event, event_record
from tests.control_plane.link.test_ingest import node_id_of, record

SETTLE = timedelta(seconds=10)


@pytest.fixture
def ingest(sessions: sessionmaker[Session], clock: ManualClock) -> Iterator[RecordIngest]:
    ingest = RecordIngest(sessions, clock)
    yield ingest
    ingest.close()


@pytest.fixture
def store(sessions: sessionmaker[Session], clock: ManualClock) -> EventStore:
    return EventStore(sessions, clock, EventsConfig(settle=SETTLE, retention=timedelta(days=1)))


def rows(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(FleetEventRow)) or 0)


def ids(page_events: list[object]) -> list[str]:
    return [e.event_id for e in page_events]  # type: ignore[attr-defined]


def test_an_event_is_stored_once_however_often_it_is_sent(
    ingest: RecordIngest, store: EventStore, sessions: sessionmaker[Session], nodes: NodeServices
) -> None:
    node = node_id_of(nodes)
    first = event_record(1, event(1))
    batch = [first, record(2, "health"), event_record(3, event(2)), event_record(4, b"\x00")]
    assert set(ingest.store(node, batch)) == {r.id for r in batch}
    assert ingest.count(node, "event") == 3  # raw history keeps every event record as sent
    assert ingest.count(node, "health") == 1
    assert rows(sessions) == 2  # the unreadable one is left out of the event store

    # A resend after a lost ack, and the same event raised again in a new record (a
    # replayed input): acked, never a second event.
    assert ingest.store(node, [first]) == [first.id]
    again = event_record(5, event(1))
    assert ingest.store(node, [again]) == [again.id]
    assert rows(sessions) == 2

    # Both group commits store them too; the event's first record is the one kept.
    assert ingest.submit(node, [event_record(6, event(3))]).result(timeout=30)

    async def on_the_loop() -> list[str]:
        return await LoopGroupCommit(ingest).store(node, [event_record(7, event(4)), first])

    assert len(asyncio.run(on_the_loop())) == 2
    page = store.page(EventQuery("gates"))
    assert ids(page.events) == [event(n).event_id for n in (4, 3, 2, 1)]
    assert page.events[-1].record_id == first.id
    assert page.events[0].document["values"] == {"count": 1.0}
    assert page.next_cursor is None


def test_the_same_event_id_in_two_fleets_is_two_events(
    ingest: RecordIngest, store: EventStore, nodes: NodeServices
) -> None:
    from tests.control_plane.identity.helpers import make_csr
    from tests.control_plane.nodes.conftest import OPERATOR

    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, "yards", {}, timedelta(hours=1))
    yard = nodes.enrollment.enroll(token, make_csr(), agent_version="0.1.0").node_id
    gate = node_id_of(nodes)
    ingest.store(gate, [event_record(1, event(1))])
    ingest.store(yard, [event_record(1, event(1))])
    assert [e.node_id for e in store.page(EventQuery("gates")).events] == [gate]
    assert [e.node_id for e in store.page(EventQuery("yards")).events] == [yard]
    with pytest.raises(NotFoundError):
        store.page(EventQuery("nowhere"))


def test_newest_first_pages_are_stable_under_inserts_and_filters_apply(
    ingest: RecordIngest, store: EventStore, nodes: NodeServices
) -> None:
    a, b = node_id_of(nodes), node_id_of(nodes)
    ingest.store(a, [event_record(n, event(n)) for n in range(1, 6)])
    ingest.store(b, [event_record(1, event(6, type_="zone.intrusion", rule="yard-zone"))])

    first = store.page(EventQuery("gates", limit=2))
    assert ids(first.events) == [
        event(6, type_="zone.intrusion", rule="yard-zone").event_id,
        event(5).event_id,
    ]
    # Newer events and one tied on time arrive between two pages: the next page is
    # still exactly what followed the first.
    ingest.store(a, [event_record(10, event(9)), event_record(11, event(8))])
    second = store.page(EventQuery("gates", limit=2, after=_after(first.next_cursor)))
    assert ids(second.events) == [event(4).event_id, event(3).event_id]
    third = store.page(EventQuery("gates", limit=2, after=_after(second.next_cursor)))
    fourth = store.page(EventQuery("gates", limit=2, after=_after(third.next_cursor)))
    assert ids(third.events) + ids(fourth.events) == [event(2).event_id, event(1).event_id]
    assert fourth.next_cursor is None

    now = T0 + timedelta(hours=1)
    by = {
        "node": EventQuery.parse("gates", now=now, node=b),
        "type": EventQuery.parse("gates", now=now, type="line.crossed", limit=1000),
        "since": EventQuery.parse(
            "gates", now=now, since="2026-12-01T09:00:04Z", until="2026-12-01T09:00:06Z"
        ),
    }
    assert [e.node_id for e in store.page(by["node"]).events] == [b]
    assert len(store.page(by["type"]).events) == 7
    assert [e.occurred_at for e in store.page(by["since"]).events] == [
        T0 + timedelta(seconds=5),
        T0 + timedelta(seconds=4),
    ]


def _after(cursor: str | None) -> Position:
    assert cursor is not None
    return decode_cursor(cursor, "newest")


def test_arrival_order_follows_what_settled_and_never_skips_or_repeats(
    ingest: RecordIngest, store: EventStore, nodes: NodeServices, clock: ManualClock
) -> None:
    node = node_id_of(nodes)
    ingest.store(node, [event_record(1, event(1)), event_record(2, event(2))])
    tail = EventQuery.parse("gates", now=clock.now(), order="arrival", since="0s")
    page = store.page(tail)
    assert page.events == [] and page.next_cursor  # not settled yet: nothing shown

    clock.advance(SETTLE)
    page = store.page(
        EventQuery.parse("gates", now=clock.now(), order="arrival", cursor=page.next_cursor)
    )
    assert ids(page.events) == [event(1).event_id, event(2).event_id]

    # A late event (old event time) arrives: followed by arrival, not by event time.
    ingest.store(node, [event_record(3, event(3, at=T0 - timedelta(days=1)))])
    cursor = page.next_cursor
    page = store.page(EventQuery.parse("gates", now=clock.now(), order="arrival", cursor=cursor))
    assert page.events == []  # within the settle window
    clock.advance(SETTLE)
    page = store.page(
        EventQuery.parse("gates", now=clock.now(), order="arrival", cursor=page.next_cursor)
    )
    assert ids(page.events) == [event(3, at=T0 - timedelta(days=1)).event_id]
    again = store.page(
        EventQuery.parse("gates", now=clock.now(), order="arrival", cursor=page.next_cursor)
    )
    assert again.events == []

    # A tail started now (`since=0s`) never shows what arrived before it started, even
    # what was still inside the settle window then.
    ingest.store(node, [event_record(4, event(4))])
    clock.advance(timedelta(seconds=1))
    start = store.page(EventQuery.parse("gates", now=clock.now(), order="arrival", since="0s"))
    ingest.store(node, [event_record(5, event(5))])
    clock.advance(SETTLE)
    later = store.page(
        EventQuery.parse("gates", now=clock.now(), order="arrival", cursor=start.next_cursor)
    )
    assert (start.events, ids(later.events)) == ([], [event(5).event_id])


def test_retention_deletes_old_events_but_keeps_late_arrivals_a_full_span(
    ingest: RecordIngest,
    store: EventStore,
    sessions: sessionmaker[Session],
    nodes: NodeServices,
    clock: ManualClock,
) -> None:
    node = node_id_of(nodes)
    ingest.store(node, [event_record(1, event(1, at=clock.now() - timedelta(hours=2)))])
    clock.advance(timedelta(days=1, hours=1))
    # Arrives now with an event time two days old: it stays a day from now.
    ingest.store(node, [event_record(2, event(2, at=clock.now() - timedelta(days=2)))])
    assert store.apply_retention() == 1
    assert rows(sessions) == 1
    assert store.apply_retention() == 0
    clock.advance(timedelta(days=1, seconds=1))
    assert store.apply_retention() == 1
    assert rows(sessions) == 0


def test_events_at_the_same_time_page_by_row_id_without_loss_or_repeat(
    ingest: RecordIngest, store: EventStore, nodes: NodeServices
) -> None:
    node = node_id_of(nodes)
    same = [event(n, at=T0) for n in range(1, 4)]
    ingest.store(node, [event_record(n, e) for n, e in enumerate(same, 1)])
    seen: list[str] = []
    query = EventQuery("gates", limit=1)
    for _ in range(5):  # bounded: three pages
        page = store.page(query)
        seen += ids(page.events)
        if page.next_cursor is None:
            break
        query = EventQuery("gates", limit=1, after=_after(page.next_cursor))
    assert seen == [e.event_id for e in reversed(same)]
