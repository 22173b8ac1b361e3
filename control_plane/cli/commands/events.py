"""`edgefleet events list|tail`: a fleet's aggregation events from the event store.

`list` reads newest first by event time (GET /v1/fleets/{fleet}/events, page by page up
to `--limit`); `tail` follows what arrives by polling the same route in arrival order
with the cursor each answer gives, until `--max` events or `--timeout` seconds.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from control_plane.cli.commands.nodes import _precise_time, _table
from control_plane.cli.context import CliContext, cli_context

events_app = typer.Typer(help="Aggregation events: list and follow.", no_args_is_help=True)

EVENT_COLUMNS = ["time", "node", "type", "rule", "about", "facts", "models"]
# One page of `list` asks for at most this many (the server's own bound is 1000).
_PAGE = 500

FleetOption = Annotated[str, typer.Option("--fleet", "-f", help="the fleet's events")]
NodeOption = Annotated[str | None, typer.Option("--node", help="only this node's events")]
TypeOption = Annotated[
    str | None,
    typer.Option(
        "--type",
        help="only this type: zone.intrusion, line.crossed, zone.loitering, "
        "count.interval, transit.completed, transit.overdue, ...",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON (same as -o json)")]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _row(event: dict[str, Any]) -> dict[str, Any]:
    about = ", ".join(
        f"{e.get('kind')}:{e.get('id')}" + (f" ({e['class_name']})" if e.get("class_name") else "")
        for e in event.get("entities", [])
    )
    facts = [f"{k}={v}" for k, v in sorted(event.get("attributes", {}).items())]
    facts += [f"{k}={_number(v)}" for k, v in sorted(event.get("values", {}).items())]
    models = sorted(
        {
            f"{p.get('model')}@{p.get('model_version')}" if p.get("model_version") else p["model"]
            for p in event.get("provenance", [])
            if p.get("model")
        }
    )
    return {
        "time": _precise_time(event.get("occurred_at")),
        "node": event.get("node"),
        "type": event.get("type"),
        "rule": event.get("rule_id"),
        "about": about or None,
        "facts": " ".join(facts) or None,
        "models": ", ".join(models) or None,
    }


def _filters(node: str | None, type_: str | None, since: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if node:
        params["node"] = node
    if type_:
        params["type"] = type_
    if since:
        params["since"] = since
    return params


def _as_json(cli: CliContext, flag: bool) -> bool:
    return flag or cli.output == "json"


@events_app.command("list")
def events_list(
    ctx: typer.Context,
    fleet: FleetOption,
    node: NodeOption = None,
    type_: TypeOption = None,
    since: Annotated[
        str | None, typer.Option(help="event time from (1h, 7d, or an ISO 8601 time)")
    ] = None,
    until: Annotated[str | None, typer.Option(help="event time before (like --since)")] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=100_000, help="newest events to show at most")
    ] = 50,
    as_json: JsonOption = False,
) -> None:
    """The fleet's events, newest first by event time, with who they are about, their
    facts and the models behind them."""
    cli = cli_context(ctx)
    params = _filters(node, type_, since)
    if until:
        params["until"] = until
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    with cli.client() as api:
        while len(events) < limit:
            page_params = {**params, "limit": min(_PAGE, limit - len(events))}
            if cursor:
                page_params["cursor"] = cursor
            page = api.json("GET", f"/v1/fleets/{fleet}/events", params=page_params)
            events.extend(page["events"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    if _as_json(cli, as_json):
        typer.echo(json.dumps(events, indent=2, sort_keys=True))
        return
    if not events:
        cli.console.print(f"no events in fleet {fleet}" + (" that match" if params else ""))
        return
    _table(cli, [_row(e) for e in events], EVENT_COLUMNS)
    if cursor is not None:
        cli.console.print(f"(the newest {len(events)}; --limit shows more)")


@events_app.command("tail")
def events_tail(
    ctx: typer.Context,
    fleet: FleetOption,
    node: NodeOption = None,
    type_: TypeOption = None,
    since: Annotated[
        str, typer.Option(help="start with what arrived this long ago (0s: from now)")
    ] = "0s",
    interval: Annotated[float, typer.Option(min=0.05, max=60, help="seconds between polls")] = 2.0,
    max_events: Annotated[
        int | None, typer.Option("--max", min=1, help="stop after this many events")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="stop after this many seconds")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Follow the fleet's events as they arrive (one line each; --json: one JSON object
    a line). The server shows an event once it is settled, seconds after it arrived."""
    cli = cli_context(ctx)
    json_lines = _as_json(cli, as_json)
    params = {**_filters(node, type_, since), "order": "arrival", "limit": _PAGE}
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = 0
    with cli.client() as api:
        while True:
            page = api.json("GET", f"/v1/fleets/{fleet}/events", params=params)
            # The cursor carries the start from now on (`since` would bound it again).
            params = {k: v for k, v in params.items() if k != "since"}
            params["cursor"] = page["next_cursor"]
            for event in page["events"]:
                if json_lines:
                    typer.echo(json.dumps(event, sort_keys=True))
                else:
                    row = _row(event)
                    typer.echo("  ".join(str(row[c]) for c in EVENT_COLUMNS if row[c] is not None))
                shown += 1
                if max_events is not None and shown >= max_events:
                    return
            if len(page["events"]) >= _PAGE:
                continue  # a backlog: read on before waiting
            if deadline is not None and time.monotonic() + interval > deadline:
                return
            time.sleep(interval)
