"""Why a node's update failed, as the control plane keeps and shows it: the node's reason
code, its detail and the numbers behind it, from the wire to `reported_state`, the REST
node view and `edgefleet nodes show` (issue 12 §4)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from control_plane.cli.commands.nodes import update_lines
from control_plane.cli.main import main
from control_plane.errors import InvalidInputError
from control_plane.link import wire
from control_plane.nodes.model import update_summary
from control_plane.nodes.wiring import NodeServices
from protos.edgefleet.fleet.v1 import link_pb2
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import OPERATOR

MISMATCH = (
    "self-test: output-mismatch: 'scores' 12 of 1000 elements out of tolerance "
    "(max 0.031, atol 1e-4, rtol 1e-3)"
)
FACTS = {"output": "scores", "max_abs_err": "0.031", "atol": "0.0001", "rtol": "0.001"}


def failed_status(phase: str = "failed", **overrides: Any) -> link_pb2.UpdateStatus:
    values: dict[str, Any] = {
        "target_path": "models/det/2.0.0/model.onnx",
        "phase": phase,
        "detail": MISMATCH,
        "director_sequence": 3,
        "reason": "self-test: output-mismatch",
        "facts": FACTS,
    }
    values.update(overrides)
    status = link_pb2.UpdateStatus(**values)
    status.at.FromDatetime(datetime(2026, 3, 1, 12, 5, tzinfo=UTC))
    return status


# ---------------------------------------------------------------------- wire


def test_the_reason_and_the_facts_come_off_the_wire() -> None:
    converted = wire.update_status(failed_status())
    assert converted["reason"] == "self-test: output-mismatch"
    assert converted["facts"] == dict(sorted(FACTS.items()))
    assert converted["detail"] == MISMATCH


def test_an_older_nodes_status_has_neither_and_still_reads() -> None:
    old = link_pb2.UpdateStatus(phase="reverted", detail="hash-mismatch: bad bytes; serving x")
    converted = wire.update_status(old)
    assert (converted["reason"], converted["facts"]) == ("", {})
    assert update_summary(converted) == "reverted — hash-mismatch: bad bytes; serving x"


@pytest.mark.parametrize(
    ("facts", "field"),
    [
        ({f"k{i}": "v" for i in range(33)}, "facts"),
        ({"k" * 65: "v"}, "facts." + "k" * 64),
        ({"value": "v" * 257}, "facts.value"),
        ({"": "v"}, "facts."),
    ],
)
def test_facts_beyond_their_bounds_are_refused_naming_the_field(
    facts: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        wire.update_status(failed_status(facts=facts))
    assert info.value.fields["field"] == field


def test_a_reason_too_long_is_refused() -> None:
    with pytest.raises(InvalidInputError) as info:
        wire.update_status(failed_status(reason="r" * 129))
    assert info.value.fields["field"] == "reason"


def test_the_summary_is_the_phase_and_the_detail() -> None:
    assert update_summary({"phase": "failed", "detail": MISMATCH}) == f"failed — {MISMATCH}"
    assert update_summary({"phase": "active", "detail": ""}) == "active"
    # A reason the detail does not start with is put in front of it.
    assert update_summary({"phase": "failed", "reason": "disk-full", "detail": "x"}) == (
        "failed — disk-full: x"
    )
    assert update_summary({"detail": "no phase"}) is None
    assert update_summary("not a status") is None


# ------------------------------------------------------------------ presence


def enrolled(nodes: NodeServices) -> str:
    token, _ = nodes.tokens.create_bootstrap_token(OPERATOR, "gates", {}, timedelta(hours=1))
    return nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id


def test_the_last_failure_outlives_the_next_hello_and_the_update_does_not(
    nodes: NodeServices, fleets: list[str]
) -> None:
    node_id = enrolled(nodes)
    nodes.presence.record_hello(node_id, "0.1.0", "grpc", {"active_target": "a"})
    reverted = wire.update_status(failed_status("reverted"))
    nodes.presence.record_update_status(node_id, wire.update_status(failed_status()))
    nodes.presence.record_update_status(node_id, reverted)
    state = nodes.inventory.get_node(node_id).reported_state
    assert state["update"] == state["last_failure"] == reverted
    # The node reconnects (its Hello replaces what it reported) and goes on updating.
    nodes.presence.record_hello(node_id, "0.1.0", "grpc", {"active_target": "a"})
    downloading = wire.update_status(link_pb2.UpdateStatus(phase="downloading"))
    nodes.presence.record_update_status(node_id, downloading)
    state = nodes.inventory.get_node(node_id).reported_state
    assert (state["update"], state["last_failure"]) == (downloading, reverted)
    assert state["active_target"] == "a"


def test_a_status_too_large_for_the_state_is_refused_as_a_bad_update_status(
    nodes: NodeServices, fleets: list[str]
) -> None:
    node_id = enrolled(nodes)
    with pytest.raises(InvalidInputError):
        nodes.presence.record_update_status(node_id, {"phase": "failed", "detail": "x" * 70_000})
    assert "last_failure" not in nodes.inventory.get_node(node_id).reported_state


# ------------------------------------------------------------ REST and CLI


def test_the_node_view_and_nodes_show_say_why_the_last_update_failed(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = live_server.services
    with live_server.api() as api:
        api.create_fleet("gates")
    token, _ = services.nodes.tokens.create_bootstrap_token(
        OPERATOR, "gates", {}, timedelta(hours=1)
    )
    node_id = services.nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id
    inbox = services.node_inbox("grpc", auth_cache_s=0.0)
    hello = link_pb2.NodeMessage(protocol_version=1, hello=link_pb2.Hello(agent_version="0.1"))
    inbox.handle(node_id, hello)
    for phase in ("failed", "reverted"):
        detail = MISMATCH if phase == "failed" else f"{MISMATCH}; serving models/det/1.0.0"
        message = link_pb2.NodeMessage(
            protocol_version=1, update_status=failed_status(phase, detail=detail)
        )
        inbox.handle(node_id, message)
    inbox.handle(node_id, hello)  # a reconnect: the status is sent again after it...
    active = link_pb2.UpdateStatus(
        target_path="models/det/1.0.0/model.onnx", phase="active", detail="served again"
    )
    inbox.handle(node_id, link_pb2.NodeMessage(protocol_version=1, update_status=active))

    with live_server.api() as api:
        shown = api.json("GET", f"/v1/nodes/{node_id}")
    assert shown["last_update"]["summary"] == "active — served again"
    failure = shown["last_failure"]
    assert failure["summary"] == f"reverted — {MISMATCH}; serving models/det/1.0.0"
    assert (failure["reason"], failure["facts"]) == ("self-test: output-mismatch", FACTS)
    assert (failure["director_sequence"], failure["target_path"]) == (
        3,
        "models/det/2.0.0/model.onnx",
    )

    monkeypatch.setenv("COLUMNS", "80")  # narrow: the lines are not wrapped all the same
    capsys.readouterr()
    argv = ["--server", live_server.url, "--token", live_server.admin_token]
    assert main([*argv, "nodes", "show", node_id]) == 0
    out = capsys.readouterr().out
    assert "last update: active — served again\n" in out
    assert f"last failure: reverted — {MISMATCH}; serving models/det/1.0.0\n" in out
    assert "det@2.0.0 (models/det/2.0.0/model.onnx); sequence 3; at 2026-03-01 12:05:00" in out
    assert "max_abs_err=0.031" in out
    assert main([*argv, "-o", "json", "nodes", "show", node_id]) == 0
    assert json.loads(capsys.readouterr().out)["last_failure"]["reason"] == failure["reason"]


def test_nodes_show_names_the_failure_once_when_it_is_the_last_update() -> None:
    status = {
        "phase": "failed",
        "summary": f"failed — {MISMATCH}",
        "target_path": "models/det/2.0.0/model.onnx",
        "director_sequence": 3,
        "at": None,
        "facts": {},
    }
    lines = update_lines({"last_update": status, "last_failure": dict(status)})
    assert lines == [
        f"last update: failed — {MISMATCH}",
        "  det@2.0.0 (models/det/2.0.0/model.onnx); sequence 3",
    ]
    assert update_lines({"last_update": None, "last_failure": None}) == []
