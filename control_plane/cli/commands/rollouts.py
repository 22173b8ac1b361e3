"""`edgefleet rollout create|list|status|watch|pause|resume|abort|rollback|promote`.

Thin over the REST API (`/v1/fleets/{fleet}/rollouts`, `/v1/rollouts/{id}`): the
options go to the server as the operator typed them, and the server names a bad one.
`watch` redraws the rollout every few seconds (rich Live) until it ends, or, when stdout
is not a terminal, prints a line per change; `--once` prints one frame. Heavy imports
(rich tables, yaml) load inside the commands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from control_plane.cli.commands.nodes import _time_text
from control_plane.cli.context import CliContext, cli_context
from control_plane.errors import InvalidInputError

if TYPE_CHECKING:
    from rich.console import Group

rollout_app = typer.Typer(
    help="Canary rollouts: create, follow, pause, resume, abort, roll back, promote.",
    no_args_is_help=True,
)

LIST_COLUMNS = ["id", "fleet", "model", "version", "status", "nodes", "updated_at"]
ENDED: Final = frozenset({"done", "aborted", "rolled-back"})
_MAX_WATCH_S: Final = 7 * 24 * 3600
_sleep = time.sleep  # `watch` between polls (tests step the controller instead)


def _counts_text(counts: dict[str, int]) -> str:
    """`queued=3 healthy=2`, in the server's order (the order a node moves through)."""
    return " ".join(f"{p}={n}" for p, n in counts.items() if n) or "-"


def _duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _gates_file(path: Path) -> dict[str, Any]:
    import yaml  # only `create --gates` needs it

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read the gates file {path}: {exc}", field="gates") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise InvalidInputError(f"{path}: the gates file must be a mapping", field="gates")
    return loaded


@rollout_app.command("create")
def rollout_create(
    ctx: typer.Context,
    fleet: Annotated[str, typer.Option(help="the fleet")],
    model: Annotated[str, typer.Option(help="model name")],
    version: Annotated[str, typer.Option(help="the version to roll out")],
    stages: Annotated[
        str, typer.Option(help="shadow:5,1,10%,50%,100%: counts, then percentages")
    ] = "1,10%,50%,100%",
    selector: Annotated[str, typer.Option(help="labels: site=a,role!=gate")] = "",
    bake: Annotated[str, typer.Option(help="healthy time before a stage's verdict")] = "30m",
    max_rate: Annotated[str, typer.Option(help="nodes started per unit: 200/min")] = "200/min",
    failure_budget: Annotated[
        str, typer.Option(help="failed or timed-out nodes tolerated: 2% of started, or 3")
    ] = "2%",
    window: Annotated[
        tuple[str, str] | None,
        typer.Option(help="maintenance window: 'cron 0 2 * * *' 3h (UTC)", show_default=False),
    ] = None,
    control: Annotated[str, typer.Option(help="auto | none: compare with control nodes")] = "auto",
    gates: Annotated[
        Path | None, typer.Option(help="gates.yaml: thresholds over the defaults")
    ] = None,
    deadlines: Annotated[
        str, typer.Option(help="start=15m,download=1h,activate=15m,report=15m,verdict=15m")
    ] = "",
    spread: Annotated[str, typer.Option(help="labels a stage is spread across")] = "site,hardware",
    partial: Annotated[bool, typer.Option(help="stages need not end at 100%")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the plan: the nodes each stage takes")
    ] = False,
) -> None:
    """Roll a model version out in stages; `--dry-run` shows which nodes each stage takes
    and which control nodes it compares them with, and stores nothing."""
    cli = cli_context(ctx)
    body: dict[str, Any] = {
        "model": model,
        "version": version,
        "stages": stages,
        "selector": selector,
        "bake": bake,
        "max_rate": max_rate,
        "failure_budget": failure_budget,
        "window": None if window is None else {"cron": window[0], "duration": window[1]},
        "control": control,
        "gates": None if gates is None else _gates_file(gates),
        "deadlines": deadlines,
        "spread": spread,
        "partial": partial,
        "dry_run": dry_run,
    }
    with cli.client() as api:
        result = api.json("POST", f"/v1/fleets/{fleet}/rollouts", json=body)
    if cli.output == "json":
        cli.emit(result)
    elif dry_run:
        cli.console.print(result["summary"], markup=False, highlight=False)
        for conflict in result["conflicts"]:
            cli.console.print(f"conflict: {conflict['text']}", markup=False, highlight=False)
    else:
        _status(cli, result)
        for warning in result.get("warnings") or []:
            cli.console.print(warning, markup=False, highlight=False)


@rollout_app.command("list")
def rollout_list(
    ctx: typer.Context,
    fleet: Annotated[str | None, typer.Option(help="only this fleet's")] = None,
    active: Annotated[bool, typer.Option("--active", help="only those in progress")] = False,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 100,
) -> None:
    """Rollouts, newest first, with their nodes per phase."""
    cli = cli_context(ctx)
    path = f"/v1/fleets/{fleet}/rollouts" if fleet else "/v1/rollouts"
    with cli.client() as api:
        found = api.json("GET", path, params={"active": active, "limit": limit})
    if cli.output == "json":
        cli.emit(found)
        return
    from rich.table import Table

    table = Table()
    for column in LIST_COLUMNS:
        wrap = column in ("id", "status", "version")
        table.add_column(column.replace("_", " "), no_wrap=wrap, overflow="fold")
    for r in found:
        row = {**r, "nodes": _counts_text(r["counts"]), "updated_at": _time_text(r["updated_at"])}
        table.add_row(*[str(row.get(c, "-")) for c in LIST_COLUMNS])
    cli.console.print(table)


@rollout_app.command("status")
def rollout_status(
    ctx: typer.Context,
    rollout_id: str,
    decisions: Annotated[int, typer.Option(help="recent decisions shown")] = 10,
) -> None:
    """Where a rollout is: its stage, nodes per phase, the gates, the last decisions."""
    cli = cli_context(ctx)
    with cli.client() as api:
        found = api.json("GET", f"/v1/rollouts/{rollout_id}", params={"decisions": decisions})
    if cli.output == "json":
        cli.emit(found)
        return
    _status(cli, found)


def _status(cli: CliContext, rollout: dict[str, Any]) -> None:
    cli.console.print(_frame(rollout))


def _pause_text(pause: dict[str, Any]) -> str:
    """`at 2026-12-14 10:13:00 because …`: the reason is the one of when it paused (the
    gates table below may show newer numbers)."""
    if not pause.get("reason"):
        return "-"
    since = pause.get("since")
    return f"at {_time_text(since)} because {pause['reason']}" if since else pause["reason"]


def _frame(rollout: dict[str, Any]) -> Group:
    """One view of a rollout: what `status` prints and `watch` redraws."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    last = rollout.get("last") or {}
    pause = rollout.get("pause") or {}
    for key, value in (
        (
            "rollout",
            f"{rollout['id']}: {rollout['model']} {rollout['version']} to fleet {rollout['fleet']}",
        ),
        ("status", rollout["label"]),
        ("stages", " → ".join(rollout["stages"])),
        ("nodes", _counts_text(rollout["counts"])),
        ("bake left", _duration_text(rollout.get("bake_left_s"))),
        ("waiting", rollout.get("hold") or "-"),
        ("paused", _pause_text(pause)),
        ("controls", " ".join(rollout.get("controls") or []) or "-"),
        (
            "last decision",
            f"{_time_text(last.get('at'))} {last.get('kind')}: {last.get('text')}" if last else "-",
        ),
        ("pending actions", str(rollout.get("pending_actions", 0))),
    ):
        head.add_row(key, Text(str(value)))
    parts: list[Any] = [head]
    labels = rollout["stages"]
    if rollout.get("stage_counts"):
        stages = Table(title="nodes per stage", title_justify="left")
        stages.add_column("stage")
        stages.add_column("nodes", overflow="fold")
        for key, counts in sorted(rollout["stage_counts"].items()):
            label = labels[int(key)] if key.isdigit() and int(key) < len(labels) else key
            stages.add_row(label, _counts_text(counts))
        parts.append(stages)
    if rollout.get("shadow_nodes"):
        shadows = Table(title="shadow nodes", title_justify="left")
        for column in ("node", "phase", "shadow", "frames compared", "reason"):
            shadows.add_column(column, overflow="fold")
        for n in rollout["shadow_nodes"]:
            compared = n.get("frames_compared")
            shadows.add_row(
                str(n["node_id"]),
                str(n["phase"]),
                str(n.get("state") or "-"),
                "-" if compared is None else str(compared),
                Text(str(n.get("reason") or "")),
            )
        parts.append(shadows)
    verdict = rollout.get("verdict")
    if verdict:
        stage = verdict.get("stage")
        where = labels[stage] if isinstance(stage, int) and 0 <= stage < len(labels) else "?"
        parts.append(_verdict_table(verdict, where))
    decisions = rollout.get("decisions") or []
    if decisions:
        table = Table(title="decisions", title_justify="left")
        table.add_column("at", no_wrap=True)
        table.add_column("kind")
        table.add_column("why", overflow="fold")
        for d in decisions:
            table.add_row(_time_text(d["at"]), d["kind"], Text(d["text"]))
        parts.append(table)
    return Group(*parts)


def _verdict_table(verdict: dict[str, Any], where: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    document = verdict.get("document") or {}
    gates = document.get("gates") or []
    title = (
        f"gates of {where} at {_time_text(verdict.get('evaluated_at'))}: "
        f"{verdict.get('outcome')} — {verdict.get('summary')}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("gate")
    table.add_column("outcome")
    table.add_column("failing in a row")
    table.add_column("value against threshold", overflow="fold")
    for gate in gates:
        table.add_row(
            str(gate.get("name")),
            str(gate.get("outcome")),
            f"{gate.get('consecutive_failures', 0)} of {gate.get('required_failures', '-')}",
            Text(str(gate.get("reason", ""))),
        )
    return table


@rollout_app.command("watch")
def rollout_watch(
    ctx: typer.Context,
    rollout_id: str,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    timeout: Annotated[float, typer.Option(help="stop watching after this many seconds")] = 24
    * 3600.0,
) -> None:
    """Follow a rollout live until it ends (done, aborted, rolled back): stage, nodes per
    phase, each gate against its threshold, bake time left, the last decision and why."""
    cli = cli_context(ctx)
    if not 0.2 <= interval <= 3600:
        raise typer.BadParameter("--interval must be 0.2-3600 seconds")
    if not 0 < timeout <= _MAX_WATCH_S:
        raise typer.BadParameter("--timeout must be up to 7 days")
    path = f"/v1/rollouts/{rollout_id}"
    with cli.client() as api:
        found = api.json("GET", path, params={"decisions": 5})
        if once or cli.output == "json" or found["status"] in ENDED:
            if cli.output == "json":
                cli.emit(found)
            else:
                _status(cli, found)
            return
        deadline = time.monotonic() + timeout
        if not cli.console.is_terminal:
            _watch_lines(
                cli,
                found,
                lambda: api.json("GET", path, params={"decisions": 5}),
                interval,
                deadline,
            )
            return
        from rich.live import Live

        with Live(_frame(found), console=cli.console, refresh_per_second=4) as live:
            while found["status"] not in ENDED and time.monotonic() < deadline:
                _sleep(interval)
                found = api.json("GET", path, params={"decisions": 5})
                live.update(_frame(found))


def _watch_line(rollout: dict[str, Any]) -> str:
    """`watch` to a file or pipe, one line: status, nodes per phase, the last decision."""
    last = rollout.get("last") or {}
    decision = f"{last.get('kind')}: {last.get('text')}" if last else "-"
    return f"{rollout['label']} | nodes {_counts_text(rollout['counts'])} | last {decision}"


def _watch_lines(
    cli: CliContext,
    found: dict[str, Any],
    poll: Callable[[], dict[str, Any]],
    interval: float,
    deadline: float,
) -> None:
    """A line, stamped with the rollout's `updated_at`, each time it reads differently,
    flushed at once (a log file or `| tee` shows progress as it happens)."""
    shown = ""
    while True:
        line = _watch_line(found)
        if line != shown:
            stamp = _time_text(found.get("updated_at"))
            cli.console.file.write(f"{stamp} {line}\n")
            cli.console.file.flush()
            shown = line
        if found["status"] in ENDED or time.monotonic() >= deadline:
            return
        _sleep(interval)
        found = poll()


def _command(ctx: typer.Context, rollout_id: str, command: str, note: str) -> None:
    cli = cli_context(ctx)
    with cli.client() as api:
        found = api.json("POST", f"/v1/rollouts/{rollout_id}/{command}", json={"note": note})
    if cli.output == "json":
        cli.emit(found)
    else:
        _status(cli, found)


NOTE = Annotated[str, typer.Option(help="why: kept in the decision and the audit log")]


@rollout_app.command("pause")
def rollout_pause(ctx: typer.Context, rollout_id: str, note: NOTE = "") -> None:
    """Stop starting nodes (operator); started nodes carry on, a failing verdict still
    rolls back."""
    _command(ctx, rollout_id, "pause", note)


@rollout_app.command("resume")
def rollout_resume(ctx: typer.Context, rollout_id: str, note: NOTE = "") -> None:
    """Go on from a pause (release-manager); after an inconclusive verdict the stage bakes
    again."""
    _command(ctx, rollout_id, "resume", note)


@rollout_app.command("abort")
def rollout_abort(ctx: typer.Context, rollout_id: str, note: NOTE = "") -> None:
    """Stop for good (release-manager): nobody new starts, started nodes keep what they
    run, shadows end."""
    _command(ctx, rollout_id, "abort", note)


@rollout_app.command("rollback")
def rollout_rollback(ctx: typer.Context, rollout_id: str, note: NOTE = "") -> None:
    """Give every touched node its previous version back (operator)."""
    _command(ctx, rollout_id, "rollback", note)


@rollout_app.command("promote")
def rollout_promote(ctx: typer.Context, rollout_id: str, note: NOTE = "") -> None:
    """Pass the baking (or inconclusive) stage without a verdict (release-manager)."""
    _command(ctx, rollout_id, "promote", note)
