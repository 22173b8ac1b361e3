"""The reconcile's plan (pure): what a pass removes, repairs and can only report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.link.broker_accounts import (
    BrokerLogin,
    FileExportAccounts,
    node_role,
    plan_reconcile,
)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def login(node_id: str, **fields: object) -> BrokerLogin:
    values: dict[str, object] = {
        "node_id": node_id,
        "fleet": "gates",
        "clientid": node_id,
        "roles": (node_role(node_id),),
        "created_at": NOW - timedelta(days=1),
    }
    return BrokerLogin(**(values | fields))  # type: ignore[arg-type]


def test_revoked_and_old_unknown_logins_go_young_ones_stay() -> None:
    present = {
        "n-kept": login("n-kept"),
        "n-revoked": login("n-revoked"),
        "n-orphan": login("n-orphan", created_at=NOW - timedelta(minutes=11)),
        "n-young": login("n-young", created_at=NOW - timedelta(minutes=9)),
        "n-undated": login("n-undated", created_at=None),
    }
    plan = plan_reconcile({"n-kept": "gates"}, {"n-revoked"}, present, NOW)
    assert plan.remove == ("n-orphan", "n-revoked", "n-undated")
    assert not plan.repair and not plan.missing


def test_unbound_logins_are_repaired_and_lost_ones_reported() -> None:
    enrolled = {n: "gates" for n in ("n-a", "n-b", "n-c", "n-d", "n-lost")}
    present = {
        "n-a": login("n-a"),
        "n-b": login("n-b", clientid=None),
        "n-c": login("n-c", roles=()),
        "n-d": login("n-d", disabled=True),
    }
    plan = plan_reconcile(enrolled, set(), present, NOW)
    assert dict(plan.repair) == {"n-b": "gates", "n-c": "gates", "n-d": "gates"}
    assert plan.missing == ("n-lost",)
    assert plan.remove == ()
    assert plan_reconcile({"n-a": "gates"}, set(), {"n-a": login("n-a")}, NOW).empty


def test_the_file_export_has_nothing_to_call() -> None:
    accounts = FileExportAccounts()
    assert not accounts.manages_logins
    accounts.add_node("n-a", "gates", "pw", now=NOW)
    accounts.remove_node("n-a")
    assert accounts.logins() == {} and not accounts.ensure_control_plane()
