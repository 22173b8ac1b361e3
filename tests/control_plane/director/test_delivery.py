"""The director's delivery port: a pin goes out after its commit, a failing transport
never undoes a pin, and the fan-out tries every transport (both database backends)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from control_plane.clock import ManualClock
from control_plane.director.delivery import FanOutDelivery
from control_plane.director.service import DirectorService
from control_plane.nodes.wiring import NodeServices
from protos.edgefleet.fleet.v1.director_pb2 import SignedDirectorAssignment
from tests.control_plane.director.conftest import TTL, Version, enroll
from tests.control_plane.nodes.conftest import OPERATOR


class Recorder:
    """A transport that takes everything (or nothing), and remembers what it was given."""

    def __init__(self, name: str, *, reaches: bool = True) -> None:
        self.name = name
        self.reaches = reaches
        self.got: list[tuple[str, str, SignedDirectorAssignment]] = []

    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        self.got.append((node_id, fleet, signed))
        return (self.name,) if self.reaches else ()


class Broken:
    def deliver(
        self, node_id: str, fleet: str, signed: SignedDirectorAssignment
    ) -> tuple[str, ...]:
        raise RuntimeError("transport bug")


def test_a_pin_is_delivered_after_its_commit_with_the_stored_bytes(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeServices,
    versions: dict[str, Version],
) -> None:
    director, fan_out = with_delivery
    grpc, mqtt = Recorder("grpc"), Recorder("mqtt", reaches=False)
    fan_out.attach(grpc)
    fan_out.attach(mqtt)
    node_id = enroll(nodes)

    pinned = director.pin(OPERATOR, node_id, "det", "1.1.0")

    [(to, fleet, signed)] = grpc.got
    assert (to, fleet) == (node_id, "gates")
    # Exactly what is stored, so what the node gets is what `current` answers later.
    assert signed.SerializeToString(deterministic=True) == pinned.signed
    assert director.current(node_id) == signed
    assert len(mqtt.got) == 1


def test_a_failing_transport_neither_fails_the_pin_nor_stops_the_others(
    with_delivery: tuple[DirectorService, FanOutDelivery],
    nodes: NodeServices,
    versions: dict[str, Version],
    caplog: pytest.LogCaptureFixture,
) -> None:
    director, fan_out = with_delivery
    after = Recorder("mqtt")
    fan_out.attach(Broken())
    fan_out.attach(after)
    node_id = enroll(nodes)

    with caplog.at_level(logging.ERROR):
        pinned = director.pin(OPERATOR, node_id, "det", "1.0.0")

    assert pinned.sequence == 1
    assert len(after.got) == 1
    assert "transport bug" in caplog.text
    assert director.latest(node_id) == pinned


def test_without_a_transport_the_node_waits_for_its_next_hello(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    caplog: pytest.LogCaptureFixture,
) -> None:
    node_id = enroll(nodes)
    with caplog.at_level(logging.INFO, logger="control_plane.director.delivery"):
        director.pin(OPERATOR, node_id, "det", "1.0.0")
    assert "gets its assignment at its next Hello" in caplog.text
    assert director.current(node_id) is not None


def test_an_expired_assignment_is_not_current(
    director: DirectorService,
    nodes: NodeServices,
    versions: dict[str, Version],
    clock: ManualClock,
) -> None:
    node_id = enroll(nodes)
    pinned = director.pin(OPERATOR, node_id, "det", "1.0.0")
    clock.advance(TTL - timedelta(seconds=1))
    assert director.current(node_id) == pinned.signed_message()
    clock.advance(timedelta(seconds=1))
    # Kept (and shown to operators), but no longer sent: the node would refuse it.
    assert director.current(node_id) is None
    assert director.latest(node_id) == pinned


def test_the_fan_out_attaches_and_detaches_by_identity() -> None:
    fan_out = FanOutDelivery()
    first, second = Recorder("grpc"), Recorder("grpc")
    fan_out.attach(first)
    fan_out.attach(second)
    signed = SignedDirectorAssignment(assignment=b"x", keyid="k", signature=b"s")
    assert fan_out.deliver("n-1", "gates", signed) == ("grpc", "grpc")
    fan_out.detach(first)
    fan_out.detach(first)  # a no-op the second time
    assert fan_out.attached == 1
    assert fan_out.deliver("n-1", "gates", signed) == ("grpc",)
    assert (len(first.got), len(second.got)) == (1, 2)
