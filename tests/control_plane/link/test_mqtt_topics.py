"""The MQTT topic tree: building, parsing, and refusing anything that is not a plain name."""

from __future__ import annotations

import pytest

from control_plane.errors import InvalidInputError
from control_plane.link.mqtt_topics import (
    DOWNLINK_LEAVES,
    UPLINK_LEAVES,
    Leaf,
    NodeTopic,
    TopicError,
    node_topic,
    parse_topic,
    shared_filters,
)


def test_topics_round_trip() -> None:
    for leaf in Leaf:
        topic = node_topic("gates", "n-0a1b2c3d4e5f", leaf)
        assert topic == f"edgefleet/v1/gates/n-0a1b2c3d4e5f/{leaf.value}"
        assert parse_topic(topic) == NodeTopic("gates", "n-0a1b2c3d4e5f", leaf)
        assert str(parse_topic(topic)) == topic


def test_the_leaves_split_into_uplink_and_downlink() -> None:
    assert {leaf.value for leaf in UPLINK_LEAVES} == {"status", "health", "events"}
    assert {leaf.value for leaf in DOWNLINK_LEAVES} == {"desired", "ack", "cmd"}
    assert set(UPLINK_LEAVES) | set(DOWNLINK_LEAVES) == set(Leaf)


def test_shared_filters_cover_the_uplink_for_every_fleet_and_node() -> None:
    assert shared_filters() == [
        "$share/edgefleet-cp/edgefleet/v1/+/+/status",
        "$share/edgefleet-cp/edgefleet/v1/+/+/health",
        "$share/edgefleet-cp/edgefleet/v1/+/+/events",
    ]
    assert shared_filters("blue")[0].startswith("$share/blue/")
    with pytest.raises(TopicError):
        shared_filters("a/b")


@pytest.mark.parametrize(
    "topic",
    [
        "edgefleet/v1/gates/n-1/telemetry",  # unknown leaf
        "edgefleet/v2/gates/n-1/events",  # another version
        "edgefleet/v1/gates/events",  # too short
        "edgefleet/v1/gates/n-1/events/extra",  # too long
        "edgefleet/v1//n-1/events",  # empty fleet
        "edgefleet/v1/gates/+/events",  # a wildcard is not a node
        "edgefleet/v1/#/n-1/events",
        "edgefleet/v1/gates/bad!id/events",
        "edgefleet/v1/gates/-leading-dash/events",
        "edgefleet/v1/gates/" + "n" * 65 + "/events",
        "",
    ],
)
def test_parse_refuses_what_is_not_a_node_topic(topic: str) -> None:
    with pytest.raises(TopicError) as info:
        parse_topic(topic)
    assert isinstance(info.value, InvalidInputError)
    assert info.value.fields["reason"] == "bad-topic"


@pytest.mark.parametrize(
    ("fleet", "node"),
    [("ga+tes", "n-1"), ("gates", "n/1"), ("gates", "#"), ("", "n-1"), ("gates", "n 1")],
)
def test_builders_refuse_wildcards_and_separators(fleet: str, node: str) -> None:
    with pytest.raises(TopicError):
        node_topic(fleet, node, Leaf.EVENTS)


def test_builders_refuse_unknown_leaves() -> None:
    with pytest.raises(TopicError):
        node_topic("gates", "n-1", "telemetry")
