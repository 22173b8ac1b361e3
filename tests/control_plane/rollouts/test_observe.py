"""The inventory's words as the controller's observations: what a node serves, which of
its update statuses speak of the rollout's assignment, when its watchdog has passed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from control_plane.nodes.model import Node, served_target
from control_plane.rollouts.observe import observe, report_of, running_version, watchdog_passed

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
V1 = "models/det/1.0.0/model.onnx"
V2 = "models/det/2.0.0/model.onnx"


def status(phase: str, path: str = V2, sequence: int = 5, **extra: Any) -> dict[str, Any]:
    return {"target_path": path, "phase": phase, "director_sequence": sequence, **extra}


def node(node_id: str, state: dict[str, Any], *, revoked: bool = False) -> Node:
    return Node(
        id=node_id,
        fleet="gates",
        labels={"site": "a"},
        agent_version="0.1.0",
        transport="grpc",
        reported_state=state,
        created_at=NOW,
        last_seen=NOW,
        online=True,
        cert_serial=None,
        cert_expires_at=None,
        revoked_at=NOW if revoked else None,
        public_key_sha256="0" * 64,
    )


def test_what_a_node_serves_is_its_active_target_of_the_model() -> None:
    assert running_version({"active_target": V1}, "det") == "1.0.0"
    assert running_version({"active_target": "models/cls/1.0.0/model.onnx"}, "det") is None
    assert running_version({"active_target": ""}, "det") is None
    assert running_version({}, "det") is None


@pytest.mark.parametrize(
    ("update", "serving"),
    [
        (status("active"), V2),
        (status("reverted", detail=f"watchdog: crashed; serving {V1}"), V1),
        (status("failed", detail="hash-mismatch: bad bytes; serving nothing"), ""),
        (status("failed", detail="self-test: output-mismatch: 'scores' 12 of 1000"), None),
        (status("downloading"), None),
    ],
)
def test_an_update_status_says_what_the_node_serves_when_it_can(
    update: dict[str, Any], serving: str | None
) -> None:
    assert served_target(update) == serving


def test_a_status_counts_only_from_the_rollouts_assignment_on() -> None:
    common: dict[str, Any] = {"model": "det", "version": "2.0.0", "samples": False, "now": NOW}
    assert report_of(status("downloading", sequence=4), since_sequence=5, **common) is None
    assert report_of(status("downloading"), since_sequence=None, **common) is None
    assert report_of(status("downloading", path=V1), since_sequence=5, **common) is None
    assert report_of(status("installing"), since_sequence=5, **common) is None
    found = report_of(status("self-testing", sequence=7), since_sequence=5, **common)
    assert found is not None and found.phase == "activating" and found.at == NOW
    failed = report_of(
        status("reverted", reason="watchdog: errors", detail="..."), since_sequence=5, **common
    )
    assert failed is not None and (failed.phase, failed.reason) == ("failed", "watchdog: errors")


def test_the_watchdog_has_passed_when_the_node_says_so_or_watches_nothing() -> None:
    assert not watchdog_passed(status("active", detail="on watch until 2026-03-01T12:01:00Z"))
    assert not watchdog_passed(
        status("active", detail="the agent restarted in the watchdog window with ...")
    )
    assert watchdog_passed(status("active", detail="watchdog window passed"))
    assert watchdog_passed(status("active", detail=""))
    assert not watchdog_passed(status("downloading"))


def test_observe_leaves_revoked_nodes_out_and_reports_only_for_assigned_ones() -> None:
    fleet = [
        node("n1", {"active_target": V2, "update": status("active")}),
        node("n2", {"active_target": V1, "update": status("downloading")}),
        node("n3", {"active_target": V1}, revoked=True),
    ]
    seen = observe(
        fleet, model="det", version="2.0.0", sequences={"n1": 5}, sampling={"n1"}, now=NOW
    )
    assert [(n.id, n.version) for n in seen.nodes] == [("n1", "2.0.0"), ("n2", "1.0.0")]
    assert set(seen.reports) == {"n1"}
    assert seen.reports["n1"].samples and seen.reports["n1"].watchdog_passed
