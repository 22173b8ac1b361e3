"""`edgefleet alerts list|clear`: health alerts raised by the control plane."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from control_plane.cli.commands.nodes import _table, _time_text
from control_plane.cli.context import cli_context

alerts_app = typer.Typer(help="Health alerts: list and clear.", no_args_is_help=True)

ALERT_COLUMNS = ["id", "node_id", "kind", "since", "cleared_at", "cleared_by", "details"]


def _value(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value) if isinstance(value, bool | None) else str(value)


def _row(alert: dict[str, Any]) -> dict[str, Any]:
    details = alert.get("details") or {}
    return {
        **alert,
        "since": _time_text(alert.get("since")),
        "cleared_at": _time_text(alert.get("cleared_at")),
        "details": " ".join(f"{k}={_value(v)}" for k, v in details.items() if v is not None),
    }


@alerts_app.command("list")
def alerts_list(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option(help="only this node's alerts")] = None,
    kind: Annotated[
        str | None,
        typer.Option(
            help="node_offline, drift, leak_suspected, memory_headroom_low, throttling, "
            "outbox_near_budget"
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="cleared ones too")] = False,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 200,
) -> None:
    """Open alerts (newest first), with the numbers behind each."""
    cli = cli_context(ctx)
    params: dict[str, Any] = {"include_cleared": all_, "limit": limit}
    if node:
        params["node"] = node
    if kind:
        params["kind"] = kind
    with cli.client() as api:
        alerts = api.json("GET", "/v1/alerts", params=params)
    if cli.output == "json":
        cli.emit(alerts)
        return
    _table(cli, [_row(a) for a in alerts], ALERT_COLUMNS)


@alerts_app.command("clear")
def alerts_clear(ctx: typer.Context, alert_id: int) -> None:
    """Clear an alert (operator; audited). It stays quiet until its condition ends."""
    cli = cli_context(ctx)
    with cli.client() as api:
        alert = api.json("POST", f"/v1/alerts/{alert_id}/clear")
    if cli.output == "json":
        cli.emit(alert)
        return
    _table(cli, [_row(alert)], ALERT_COLUMNS)
