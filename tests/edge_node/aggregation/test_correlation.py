"""Cross-camera correlation: "entered A, left B after Δt" and "not seen leaving within T",
by plate (normalised) or by a shared track id; overdue by event time; bounded."""

from __future__ import annotations

from edge_node.aggregation.model import Detection
from edge_node.aggregation.rules.correlation import Correlation, CorrelationConfig
from tests.edge_node.aggregation.builders import PROV, PROV_V2, T0, det, run, sighting


def rule(**kw: object) -> Correlation:
    config = {
        "entry": frozenset({"gate-a"}),
        "exit": frozenset({"gate-b"}),
        "within_s": 1800.0,
        **kw,
    }
    return Correlation(CorrelationConfig("transit", **config))  # type: ignore[arg-type]


def car(plate: str | None, track: str | None = None) -> Detection:
    return det(0.5, 0.5, track, "vehicle", attributes={"plate_text": plate} if plate else None)


def test_entered_at_a_left_at_b_after_delta() -> None:
    frames = [
        sighting("gate-a", 1, T0, car("AB 123-CD")),
        sighting("gate-a", 2, T0 + 0.2, car("AB123CD")),
        sighting("gate-b", 1, T0 + 840, car("ab123cd"), prov=PROV_V2),
        sighting("gate-b", 2, T0 + 840.2, car("AB123CD")),
    ]
    r = rule()
    (event,) = run(r, frames, until=T0 + 4000)
    assert event.type == "transit.completed"
    assert event.values["delta_s"] == 840
    assert event.at == T0 + 840
    assert event.entities[0].kind == "plate"
    assert event.entities[0].id == "AB123CD"
    assert [e.camera for e in event.evidence] == ["gate-a", "gate-b"]
    assert event.provenance == (PROV, PROV_V2)
    assert r.state_size() == 0


def test_not_seen_leaving_within_t_is_overdue_at_entry_plus_t() -> None:
    r = rule(within_s=600.0)
    events = run(r, [sighting("gate-a", 1, T0, car("XY9"))], until=T0 + 599)
    assert events == []
    (event,) = r.advance(T0 + 700)
    assert event.type == "transit.overdue"
    assert event.at == T0 + 600
    # Seen at B afterwards: the journey is closed already, nothing more.
    assert run(r, [sighting("gate-b", 1, T0 + 800, car("XY9"))]) == []


def test_exit_before_the_deadline_wins_over_overdue_in_event_time() -> None:
    r = rule(within_s=600.0)
    events = run(
        r,
        [sighting("gate-a", 1, T0, car("XY9")), sighting("gate-b", 1, T0 + 599, car("XY9"))],
        until=T0 + 10_000,
    )
    assert [e.type for e in events] == ["transit.completed"]


def test_by_shared_track_id_and_without_a_key_nothing_happens() -> None:
    r = rule(match_by="track")
    events = run(
        r,
        [
            sighting("gate-a", 1, T0, car(None, "77"), car(None, None)),
            sighting("gate-b", 1, T0 + 5, car(None, "77")),
        ],
    )
    assert [(e.type, e.entities[0].kind, e.entities[0].id) for e in events] == [
        ("transit.completed", "track", "77")
    ]


def test_a_second_journey_after_one_completed_has_its_own_id() -> None:
    frames = [
        sighting("gate-a", 1, T0, car("P1")),
        sighting("gate-b", 1, T0 + 60, car("P1")),
        sighting("gate-a", 2, T0 + 3600, car("P1")),
        sighting("gate-b", 2, T0 + 3700, car("P1")),
    ]
    events = run(rule(), frames)
    assert [e.values["delta_s"] for e in events] == [60, 100]
    assert events[0].event_id != events[1].event_id


def test_pending_journeys_are_bounded() -> None:
    r = rule(max_pending=100)
    run(r, [sighting("gate-a", i, T0 + i, car(f"P{i}")) for i in range(1000)])
    assert r.state_size() == 100
    assert r.dropped == 900


def test_deadlines_of_completed_journeys_do_not_pile_up() -> None:
    r = rule(max_pending=10, within_s=1e6)
    frames = []
    for i in range(500):
        frames += [
            sighting("gate-a", i, T0 + i, car(f"P{i}")),
            sighting("gate-b", i, T0 + i + 0.5, car(f"P{i}")),
        ]
    events = run(r, frames)
    assert len(events) == 500
    assert len(r._due) <= 20
