"""`edgefleet node ...` (bootstrap tokens, revocation) and `edgefleet nodes ...` (inventory)."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from control_plane.cli.context import CliContext, cli_context
from control_plane.cli.global_options import agent_argv
from control_plane.durations import DurationError, parse_duration
from control_plane.text import counted

node_app = typer.Typer(
    help="Enroll nodes (bootstrap tokens), revoke them, and run the node agent.",
    no_args_is_help=True,
)
node_token_app = typer.Typer(help="Single-use bootstrap tokens.", no_args_is_help=True)
node_app.add_typer(node_token_app, name="token")
nodes_app = typer.Typer(help="The node inventory.", no_args_is_help=True)

NODE_COLUMNS = [
    "id",
    "fleet",
    "labels",
    "agent_version",
    "transport",
    "online",
    "last_seen",
    "cert_expires_at",
    "revoked",
]
NODE_DETAIL_COLUMNS = [
    *NODE_COLUMNS[:-1],
    "active",
    "created_at",
    "cert_serial",
    "revoked_at",
    "reported_state",
]
TOKEN_COLUMNS = ["id", "fleet", "labels", "state", "expires_at", "created_by", "node_id"]
# `nodes list`: the inventory with each node's health at a glance (GET /v1/health/nodes).
NODE_HEALTH_COLUMNS = [
    "id",
    "fleet",
    "labels",
    "status",
    "active",
    "p99_ms",
    "drift",
    "rss_mb",
    "slope_mb_h",
    "headroom",
    "alerts",
    "agent_version",
    "last_seen",
]
# `nodes results`: what the node's model saw (GET /v1/nodes/{id}/results).
_LATENCY_SPLIT = "queue/pre/infer/decode_ms"
RESULT_COLUMNS = ["time", "stream", "model", "kind", "detections", _LATENCY_SPLIT]
# Top detections shown per result (the JSON output has all the node sent).
_SHOWN_DETECTIONS = 3
SERIES_COLUMNS = [
    "at",
    "reports",
    "p99_ms",
    "drift",
    "rss_mb",
    "slope_mb_h",
    "headroom",
    "cpu_percent",
    "frames_per_s",
    "dropped",
    "bad",
    "capture_failed",
    "superseded",
    "discarded",
]


def duration_param(text: str) -> timedelta:
    """A duration option read by the one parser the server uses too (`3600`, `30m`, `1h30m`)."""
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


def _time_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def _table_row(item: dict[str, Any]) -> dict[str, Any]:
    """Labels as `k=v,...` and times to the second in tables; JSON output stays untouched."""
    row = {k: _time_text(v) if k.endswith(("_at", "_seen")) else v for k, v in item.items()}
    row["labels"] = _labels_text(item.get("labels") or {})
    return row


def _emit(cli: CliContext, data: Any, columns: list[str]) -> None:
    if cli.output == "json":
        cli.emit(data)
    elif isinstance(data, list):
        _table(cli, [_table_row(d) for d in data], columns)
    else:
        cli.emit(_table_row(data), columns)


def _table(cli: CliContext, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Like `CliContext.emit`, but ids are never cut short on a narrow terminal."""
    from rich.table import Table  # here, not at import: keeps `edgefleet --help` fast

    table = Table()
    for col in columns:
        header = col.replace("_", " ")  # lets rich wrap headers between words
        if col in {"id", "node_id"}:
            table.add_column(header, no_wrap=True, min_width=14)
        else:
            table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*["-" if row.get(c) is None else str(row.get(c)) for c in columns])
    cli.console.print(table)


# ------------------------------------------------------------- node token


@node_token_app.command("create")
def token_create(
    ctx: typer.Context,
    fleet: Annotated[str, typer.Option(help="fleet the node joins")],
    labels: Annotated[str, typer.Option(help="labels the node gets, e.g. site=a,role=gate")] = "",
    ttl: Annotated[
        str, typer.Option(help="lifetime: 30m, 1h, 7d, or seconds (1 minute to 30 days)")
    ] = "1h",
) -> None:
    """Create a single-use, expiring bootstrap token; it is shown once."""
    from control_plane.identity.bootstrap import parse_labels

    cli = cli_context(ctx)
    body = {"labels": parse_labels(labels), "ttl_s": int(duration_param(ttl).total_seconds())}
    with cli.client() as api:
        created = api.json("POST", f"/v1/fleets/{fleet}/node-tokens", json=body)
    if cli.output == "json":
        cli.emit(created)
        return
    _emit(cli, created, ["id", "fleet", "labels", "expires_at"])
    cli.console.print(f"bootstrap token (shown once): [bold]{created['token']}[/bold]")


@node_token_app.command("list")
def token_list(
    ctx: typer.Context,
    fleet: Annotated[str | None, typer.Option(help="only this fleet's tokens")] = None,
) -> None:
    """Bootstrap tokens, newest first (never their secrets)."""
    cli = cli_context(ctx)
    params = {"fleet": fleet} if fleet else {}
    with cli.client() as api:
        _emit(cli, api.json("GET", "/v1/node-tokens", params=params), TOKEN_COLUMNS)


@node_token_app.command("revoke")
def token_revoke(ctx: typer.Context, token_id: str) -> None:
    """Revoke an unused bootstrap token by id."""
    cli = cli_context(ctx)
    with cli.client() as api:
        _emit(cli, api.json("POST", f"/v1/node-tokens/{token_id}/revoke"), TOKEN_COLUMNS)


# ------------------------------------------------------------------ node


@node_app.command("revoke")
def node_revoke(ctx: typer.Context, node_id: str) -> None:
    """Revoke a node: the control plane refuses it from its next message on."""
    cli = cli_context(ctx)
    with cli.client() as api:
        _emit(cli, api.json("POST", f"/v1/nodes/{node_id}/revoke"), NODE_COLUMNS)


@node_app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def node_run(ctx: typer.Context) -> None:
    """Run the node agent: `python -m edge_node run ARGS` (see `edgefleet node run --help`).

    The agent is exec'd, not imported: `control_plane` never imports `edge_node` (ADR 0005).
    """
    agent = agent_argv(ctx.args, log_format=cli_context(ctx).log_format)
    argv = [sys.executable, "-m", "edge_node", *agent]
    os.execv(sys.executable, argv)  # noqa: S606  (our own interpreter, no shell)


# ----------------------------------------------------------------- nodes


@nodes_app.command("list")
def nodes_list(
    ctx: typer.Context,
    selector: Annotated[
        str | None, typer.Option(help="labels, e.g. site=a,role!=gate,gpu,!legacy")
    ] = None,
    fleet: Annotated[str | None, typer.Option(help="only this fleet's nodes")] = None,
) -> None:
    """Enrolled nodes with their liveness and certificate expiry."""
    from control_plane.identity.bootstrap import parse_selector

    cli = cli_context(ctx)
    params: dict[str, str] = {}
    if selector:
        parse_selector(selector)  # a typo is reported here, before any request
        params["selector"] = selector
    if fleet:
        params["fleet"] = fleet
    with cli.client() as api:
        nodes = api.json("GET", "/v1/nodes", params=params)
        health = {h["id"]: h for h in api.json("GET", "/v1/health/nodes", params=params)}
    for node in nodes:
        node["health"] = health.get(node["id"])
    if cli.output == "json":
        cli.emit(nodes)
        return
    _table(cli, [_glance_row(node) for node in nodes], NODE_HEALTH_COLUMNS)


@nodes_app.command("health")
def nodes_health(
    ctx: typer.Context,
    node_id: str,
    since: Annotated[str, typer.Option(help="how far back: 90m, 6h, 7d, or seconds")] = "6h",
    resolution: Annotated[
        str, typer.Option(help="auto (raw up to 6h, minute up to 3d, else hour), raw, minute, hour")
    ] = "auto",
) -> None:
    """A node's health series: latency, drift, memory, CPU, throughput, drops, bad frames
    and camera capture."""
    cli = cli_context(ctx)
    duration_param(since)  # a typo is reported here, before any request
    with cli.client() as api:
        series = api.json(
            "GET",
            f"/v1/nodes/{node_id}/health",
            params={"since": since, "resolution": resolution},
        )
    if cli.output == "json":
        cli.emit(series)
        return
    cli.console.print(
        f"node {series['node_id']}: "
        f"{counted(len(series['points']), series['resolution'] + ' point')} "
        f"since {_time_text(series['since'])}"
        + (" (oldest left out)" if series["truncated"] else "")
    )
    _table(cli, [_series_row(p) for p in series["points"]], SERIES_COLUMNS)


def _number(value: Any, digits: int = 1, scale: float = 1.0) -> str | None:
    if value is None:
        return None
    return f"{value / scale:.{digits}f}"


def _active_text(node: dict[str, Any]) -> str | None:
    """What the node serves as `name@version` (a server before `active_model`: from the
    reported target path)."""
    if node.get("active_model"):
        return str(node["active_model"])
    from control_plane.trust.custom import target_label

    target = (node.get("reported_state") or {}).get("active_target")
    return target_label(target) if isinstance(target, str) else None


def _glance_row(node: dict[str, Any]) -> dict[str, Any]:
    row = _table_row({k: v for k, v in node.items() if k != "health"})
    row["active"] = _active_text(node)
    health = node.get("health") or {}
    metrics = health.get("metrics") or {}
    row["status"] = health.get("status", "online" if node.get("online") else "offline")
    row["p99_ms"] = _number(metrics.get("p99_ms"))
    row["drift"] = _number(metrics.get("drift_p99_ratio"), 2)
    row["rss_mb"] = _number(metrics.get("rss_bytes"), 0, 1e6)
    row["slope_mb_h"] = _number(metrics.get("rss_slope_mb_per_h"), 1)
    headroom = metrics.get("headroom_ratio")
    row["headroom"] = None if headroom is None else f"{headroom:.0%}"
    row["alerts"] = ",".join(health.get("alerts") or []) or None
    return row


def _series_row(point: dict[str, Any]) -> dict[str, Any]:
    """One point; a roll-up shows the worst (P99, drift, RSS, slope, headroom), the mean
    (CPU, throughput) or the total (drops, bad frames, capture counts) of its bucket."""
    metrics = point.get("metrics") or {}

    def pick(name: str, how: str) -> Any:
        value = metrics.get(name)
        if isinstance(value, dict):
            return value.get(how)
        return value

    p99 = pick("p99_ms", "max")
    sketched: list[Any] = []
    for kinds in (point.get("latency") or {}).values():
        chosen = kinds.get("end_to_end") or kinds.get("compute") or {}
        sketched.append(chosen.get("p99_ms"))
    if "until" in point and any(v is not None for v in sketched):
        p99 = max(v for v in sketched if v is not None)  # from the merged sketches
    headroom = pick("headroom_ratio", "min")
    return {
        "at": _time_text(point.get("at")),
        "reports": point.get("reports"),
        "p99_ms": _number(p99),
        "drift": _number(pick("drift_p99_ratio", "max"), 2),
        "rss_mb": _number(pick("rss_bytes", "max"), 0, 1e6),
        "slope_mb_h": _number(pick("rss_slope_mb_per_h", "max"), 1),
        "headroom": None if headroom is None else f"{headroom:.0%}",
        "cpu_percent": _number(pick("cpu_process_percent", "mean")),
        "frames_per_s": _number(pick("frames_per_s", "mean")),
        "dropped": _number(pick("frames_dropped", "sum"), 0),
        # Frames that did not decode (corrupt) or fit, grabs that failed, and drop-directory
        # files passed over for a newer one or set aside unread (empty, stale).
        "bad": _number(pick("frames_bad", "sum"), 0),
        "capture_failed": _number(pick("capture_failed", "sum"), 0),
        "superseded": _number(pick("capture_superseded", "sum"), 0),
        "discarded": _number(pick("capture_discarded", "sum"), 0),
    }


@nodes_app.command("show")
def nodes_show(ctx: typer.Context, node_id: str) -> None:
    """One node in detail: what it serves (`name@version`), its last reported state, why
    its last update failed, and the candidate it runs in shadow, if any."""
    cli = cli_context(ctx)
    with cli.client() as api:
        node = api.json("GET", f"/v1/nodes/{node_id}")
    if cli.output == "json":
        cli.emit(node)
        return
    _emit(cli, {**node, "active": _active_text(node)}, NODE_DETAIL_COLUMNS)
    lines = [
        *runtime_lines(node.get("model_runtime")),
        *update_lines(node),
        *shadow_lines(node.get("shadow")),
    ]
    for line in lines:
        # Not wrapped, no markup: a detail quotes names and brackets ('scores', [1, 3]).
        cli.console.print(line, soft_wrap=True, markup=False, highlight=False)


def runtime_lines(runtime: Any) -> list[str]:
    """`runtime config: signed (node.yaml overrides: ...)` — where the served model's
    runtime settings come from, from the newest health report; a node.yaml preprocess the
    signed spec replaces gets a second line. Nothing from an agent that does not say."""
    if not isinstance(runtime, dict) or not runtime.get("config"):
        return []
    config = runtime["config"]
    head = "runtime config: " + (
        "signed with the version"
        if config == "signed"
        else "node.yaml's runtime.preprocess (the version has no signed runtime spec)"
        if config == "node"
        else str(config)
    )
    overrides = runtime.get("session_overrides") or []
    head += (
        "; node.yaml overrides runtime.session " + ", ".join(str(o) for o in overrides)
        if overrides
        else "; no node.yaml session overrides"
    )
    if runtime.get("reported_at"):
        head += f" (report {_time_text(runtime['reported_at'])})"
    lines = [head]
    if runtime.get("node_preprocess_ignored"):
        lines.append("  node.yaml sets runtime.preprocess: not used, the signed spec replaces it")
    return lines


def update_lines(node: dict[str, Any]) -> list[str]:
    """`last update: <phase> — <detail>` and, when it is another one, `last failure: ...`,
    each followed by what it was about (target, sequence, time)."""
    from control_plane.trust.custom import target_label

    lines: list[str] = []
    update, failure = node.get("last_update"), node.get("last_failure")
    shown = [("last update", update)]
    if failure and (not update or _status_key(failure) != _status_key(update)):
        shown.append(("last failure", failure))
    for label, status in shown:
        if not isinstance(status, dict) or not status.get("summary"):
            continue
        lines.append(f"{label}: {status['summary']}")
        path = status.get("target_path")
        about = [f"{target_label(path)} ({path})" if isinstance(path, str) and path else "-"]
        if status.get("director_sequence"):
            about.append(f"sequence {status['director_sequence']}")
        if status.get("at"):
            about.append(f"at {_time_text(status['at'])}")
        facts = status.get("facts") or {}
        if facts:
            about.append(", ".join(f"{k}={v}" for k, v in sorted(facts.items())))
        lines.append("  " + "; ".join(about))
    return lines


# The agreement figures a shadow line shows, per output kind (`shadow.agreement`).
_AGREEMENT: dict[str, tuple[str, ...]] = {
    "classification": ("top1_ratio", "topk_overlap"),
    "detection": ("recall", "precision", "mean_score_diff"),
    "raw": ("min_cosine", "mean_cosine", "max_abs_diff"),
}


def shadow_lines(shadow: Any) -> list[str]:
    """`shadow: <candidate> <state> beside <served> (report <time>)`, then what the
    candidate did so far: the frames compared, and its agreement, P99, CPU and memory; a
    failed one says why. Nothing for a node that shadows nothing."""
    if not isinstance(shadow, dict) or not shadow.get("candidate"):
        return []
    head = f"shadow: {shadow['candidate']} {shadow.get('state') or '?'}"
    if shadow.get("against"):
        head += f" beside {shadow['against']}"
    if shadow.get("reported_at"):
        head += f" (report {_time_text(shadow['reported_at'])})"
    if shadow.get("state") == "failed":
        why = shadow.get("detail") or shadow.get("reason") or "no reason given"
        return [head, f"  {why}"]
    frames = (
        f"  {counted(shadow.get('frames_compared') or 0, 'frame')} compared of "
        f"{shadow.get('frames_sampled') or 0} sampled ({shadow.get('samples_dropped') or 0} "
        f"dropped busy, {shadow.get('samples_skipped_cpu') or 0} skipped for CPU, "
        f"{shadow.get('samples_failed') or 0} failed)"
    )
    agreement = shadow.get("agreement") or {}
    kind = agreement.get("kind")
    figures = [
        f"{name} {agreement[name]:.3f}"
        for name in _AGREEMENT.get(str(kind), ())
        if isinstance(agreement.get(name), int | float)
    ]
    facts = [f"agreement ({kind}): {', '.join(figures)}" if figures else "agreement: none yet"]
    latency = shadow.get("latency_ms") or {}
    if isinstance(latency.get("p99_ms"), int | float):
        p99 = f"p99 {latency['p99_ms']:.3g} ms"
        reference = shadow.get("reference_latency_ms") or {}
        if isinstance(reference.get("p99_ms"), int | float):
            p99 += f" (active {reference['p99_ms']:.3g} ms on the same frames"
            ratio = shadow.get("latency_ratio_p50")
            p99 += f", ratio {ratio:.2f})" if isinstance(ratio, int | float) else ")"
        facts.append(p99)
    if isinstance(shadow.get("cpu_percent"), int | float):
        facts.append(f"CPU {shadow['cpu_percent']:.3g} %")
    if isinstance(shadow.get("rss_delta_bytes"), int | float):
        facts.append(f"RSS {shadow['rss_delta_bytes'] / 1e6:+.1f} MB")
    return [head, frames, "  " + "; ".join(facts)]


def _status_key(status: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(status.get(k) for k in ("phase", "target_path", "director_sequence", "at"))


@nodes_app.command("results")
def nodes_results(
    ctx: typer.Context,
    node_id: str,
    stream: Annotated[str | None, typer.Option(help="only this stream's results")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="newest results to show")] = 20,
) -> None:
    """What the node's model saw: its newest sampled results, newest first (the node
    sends a bounded sample; `-o json` shows every field)."""
    cli = cli_context(ctx)
    params: dict[str, Any] = {"limit": limit}
    if stream:
        params["stream"] = stream
    with cli.client() as api:
        results = api.json("GET", f"/v1/nodes/{node_id}/results", params=params)
    if cli.output == "json":
        cli.emit(results)
        return
    if not results:
        cli.console.print(
            f"node {node_id} has sent no results"
            + (f" for stream {stream}" if stream else "")
            + " (it samples what its model sees while it serves one)"
        )
        return
    _table(cli, [_result_row(r) for r in results], RESULT_COLUMNS)


def _result_row(result: dict[str, Any]) -> dict[str, Any]:
    latency = result.get("latency_ms") or {}
    split = "/".join(
        "-" if latency.get(k) is None else f"{latency[k]:.1f}"
        for k in ("queue", "preprocess", "inference", "decode")
    )
    return {
        "time": _precise_time(result.get("captured_at")),
        "stream": result.get("stream"),
        "model": result.get("model_label"),
        "kind": result.get("kind"),
        "detections": _detections_text(result) or "-",
        _LATENCY_SPLIT: split,
    }


def _precise_time(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except ValueError:
        return value


def _detections_text(result: dict[str, Any]) -> str:
    """The top detections, one a line: `label score [x1,y1,x2,y2]`; a raw result's
    tensors as `name shape min..max mean` (and the share above its threshold)."""
    lines = []
    detections = result.get("detections") or []
    for detection in detections[:_SHOWN_DETECTIONS]:
        score = detection.get("score")
        text = f"{detection.get('label') or detection.get('class_id')}"
        text += "" if score is None else f" {score:.2f}"
        box = detection.get("box")
        if isinstance(box, list) and len(box) == 4:
            text += " [" + ",".join("-" if v is None else f"{v:.2f}" for v in box) + "]"
        lines.append(text)
    total = result.get("detections_total") or len(detections)
    if total > len(lines):
        lines.append(f"+{total - len(lines)} more")
    if not detections:
        for tensor in (result.get("tensors") or [])[:_SHOWN_DETECTIONS]:
            shape = "x".join(str(d) for d in tensor.get("shape") or [])
            text = (
                f"{tensor.get('name')} {shape} {_number(tensor.get('min'), 3)}.."
                f"{_number(tensor.get('max'), 3)} mean {_number(tensor.get('mean'), 3)}"
            )
            above, threshold = tensor.get("above"), tensor.get("threshold")
            if isinstance(above, int | float) and isinstance(threshold, int | float):
                text += f", {above:.1%} > {threshold:g}"
            lines.append(text)
    return "\n".join(lines)


@nodes_app.command("label")
def nodes_label(
    ctx: typer.Context,
    node_id: str,
    changes: Annotated[str, typer.Argument(help="site=b,role=gate sets; old- removes")],
    replace: Annotated[
        bool, typer.Option(help="the given labels become all of the node's labels")
    ] = False,
) -> None:
    """Change a node's labels (audited)."""
    from control_plane.identity.bootstrap import parse_label_changes

    cli = cli_context(ctx)
    parsed = parse_label_changes(changes)
    if replace and any(v is None for v in parsed.values()):
        raise typer.BadParameter("`key-` removals make no sense with --replace")
    with cli.client() as api:
        node = api.json(
            "PATCH", f"/v1/nodes/{node_id}", json={"labels": parsed, "replace": replace}
        )
    _emit(cli, node, NODE_COLUMNS)
