"""The `edgefleet` command: global options, sub-command groups, and error rendering.

Importing this module must stay cheap (`edgefleet --help` in well under 0.5 s): heavy
libraries load inside the commands that use them (tests/control_plane/cli/test_startup.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

# Imported for the commands they register: `nodes pin`, `model quantize|compare`.
import control_plane.cli.commands.director
import control_plane.cli.commands.optimise  # noqa: F401
from control_plane.cli.commands.access import audit_app, token_app
from control_plane.cli.commands.alerts import alerts_app
from control_plane.cli.commands.events import events_app
from control_plane.cli.commands.mqtt import mqtt_app
from control_plane.cli.commands.nodes import node_app, nodes_app
from control_plane.cli.commands.registry import fleet_app, keys_app, model_app
from control_plane.cli.commands.rollouts import rollout_app
from control_plane.cli.context import CliContext, cli_context
from control_plane.cli.global_options import hoist_global_options
from control_plane.errors import EdgefleetError, InvalidInputError
from control_plane.logs import LOG_FORMAT_ENV, LOG_FORMATS, configure_logging

app = typer.Typer(
    name="edgefleet",
    help="Fleet management for ML inference at the edge.\n\n"
    "The options below may also follow the command: `edgefleet fleet list -o json`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(keys_app, name="keys")
app.add_typer(fleet_app, name="fleet")
app.add_typer(model_app, name="model")
app.add_typer(token_app, name="token")
app.add_typer(audit_app, name="audit")
app.add_typer(node_app, name="node")
app.add_typer(nodes_app, name="nodes")
app.add_typer(mqtt_app, name="mqtt")
app.add_typer(alerts_app, name="alerts")
app.add_typer(events_app, name="events")
app.add_typer(rollout_app, name="rollout")


@app.callback()
def root(
    ctx: typer.Context,
    server: Annotated[
        str, typer.Option(envvar="EDGEFLEET_SERVER", help="control plane URL")
    ] = "http://127.0.0.1:8080",
    token: Annotated[
        str | None, typer.Option(envvar="EDGEFLEET_TOKEN", help="API token", show_default=False)
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table | json")] = "table",
    log_format: Annotated[
        str, typer.Option(envvar=LOG_FORMAT_ENV, help="logfmt (key=value) | json (one per line)")
    ] = "logfmt",
) -> None:
    """The global options; `hoist_global_options` lets them follow the sub-command too."""
    if output not in {"table", "json"}:
        raise typer.BadParameter("--output must be table or json")
    if log_format not in LOG_FORMATS:
        raise typer.BadParameter("--log-format must be logfmt or json")
    ctx.obj = CliContext(
        server=server, token=token, output=output, console=Console(), log_format=log_format
    )


@app.command("server")
def server(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option(help="state, keys and default stores")] = None,
    database_url: Annotated[str | None, typer.Option(help="default: SQLite in data dir")] = None,
    artifacts: Annotated[
        str | None, typer.Option(help="file:///DIR or s3://BUCKET/PREFIX?endpoint_url=...")
    ] = None,
    http: Annotated[str | None, typer.Option(help="HOST:PORT")] = None,
    grpc: Annotated[
        str | None, typer.Option(help="HOST:PORT of the nodes' mTLS gRPC port; enables gRPC")
    ] = None,
    grpc_enroll: Annotated[
        str | None, typer.Option(help="HOST:PORT of the gRPC enrollment port (server TLS only)")
    ] = None,
    grpc_hostname: Annotated[
        list[str] | None,
        typer.Option(
            "--grpc-hostname",
            help="DNS name or IP nodes dial, put in the server certificate (repeatable) "
            "[default: localhost, 127.0.0.1]",
        ),
    ] = None,
    mqtt: Annotated[
        str | None, typer.Option(help="HOST:PORT of the MQTT 5 broker; enables the bridge")
    ] = None,
    mqtt_username: Annotated[
        str | None, typer.Option(help="broker user [default: edgefleet-control-plane]")
    ] = None,
    mqtt_password_file: Annotated[
        Path | None, typer.Option(help="default: <data-dir>/mqtt/control-plane-password")
    ] = None,
    mqtt_accounts: Annotated[
        str | None,
        typer.Option(
            help="who keeps the nodes' broker logins: dynsec (the control plane, through "
            "Mosquitto's dynamic security plugin) or file (`edgefleet mqtt acl`) "
            "[default: file]"
        ),
    ] = None,
    keys_dir: Annotated[
        Path | None,
        typer.Option(
            help="online-keys/, director/ and ca/, the same for every replica [default: data dir]"
        ),
    ] = None,
    init_keys: Annotated[
        bool,
        typer.Option(help="make a missing director key although fleets or nodes exist"),
    ] = False,
) -> None:
    """Run the control plane (REST API, TUF repository, freshness re-signing)."""
    from pydantic import ValidationError

    from control_plane.server import serve
    from control_plane.settings import ServerSettings

    try:
        settings = ServerSettings()
    except ValidationError as exc:
        raise InvalidInputError(f"invalid EDGEFLEET_* environment: {exc}") from exc
    updates: dict[str, object] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "artifacts": artifacts,
        "http": http,
        "grpc": grpc,
        "grpc_enroll": grpc_enroll,
        "grpc_hostnames": grpc_hostname or None,
        "mqtt": mqtt,
        "mqtt_username": mqtt_username,
        "mqtt_password_file": mqtt_password_file,
        "mqtt_accounts": mqtt_accounts,
        "keys_dir": keys_dir,
        "init_keys": init_keys or None,
        "log_format": cli_context(ctx).log_format,
    }
    merged = settings.model_dump() | {k: v for k, v in updates.items() if v is not None}
    try:
        validated = ServerSettings.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInputError(f"invalid server settings: {problems}") from exc
    serve(validated)


def main(argv: list[str] | None = None) -> int:
    err = Console(stderr=True)
    try:
        args = sys.argv[1:] if argv is None else argv
        app(args=hoist_global_options(args), standalone_mode=False, prog_name="edgefleet")
    except EdgefleetError as exc:
        # One line, never wrapped: scripts and log collectors read it.
        err.print(f"[red]error:[/red] {escape(exc.message)}", soft_wrap=True)
        return 1
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as exc:  # usage errors: bad option, missing argument
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return int(getattr(exc, "exit_code", 2))
    return 0


def run() -> None:
    """Console-script entry point: a real process, so it owns the root logger."""
    chosen = os.environ.get(LOG_FORMAT_ENV, "logfmt")
    # A bad value is reported by the root callback, as a usage error (exit 2).
    configure_logging(chosen if chosen in LOG_FORMATS else "logfmt", "warning")
    sys.exit(main())


if __name__ == "__main__":
    run()
