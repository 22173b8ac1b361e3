"""`edgefleet token ...` and `edgefleet audit ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from control_plane.cli.context import cli_context

token_app = typer.Typer(help="API tokens (admin).", no_args_is_help=True)
audit_app = typer.Typer(help="The append-only audit log.", no_args_is_help=True)

TOKEN_COLUMNS = ["id", "name", "role", "created_at", "created_by", "revoked_at", "last_used_at"]


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    role: Annotated[str, typer.Option(help="viewer | operator | release-manager | admin")],
    name: Annotated[str, typer.Option(help="who or what the token is for")] = "cli",
) -> None:
    """Create an API token; it is shown once."""
    cli = cli_context(ctx)
    with cli.client() as api:
        created = api.json("POST", "/v1/tokens", json={"name": name, "role": role})
    if cli.output == "json":
        cli.emit(created)
    else:
        cli.emit(created, ["id", "name", "role", "created_at"])
        cli.console.print(f"token (shown once): [bold]{created['token']}[/bold]")


@token_app.command("list")
def token_list(ctx: typer.Context) -> None:
    """List API tokens (never their secrets)."""
    cli = cli_context(ctx)
    with cli.client() as api:
        cli.emit(api.json("GET", "/v1/tokens"), TOKEN_COLUMNS)


@token_app.command("revoke")
def token_revoke(ctx: typer.Context, token_id: str) -> None:
    """Revoke a token by id; it stops working at once."""
    cli = cli_context(ctx)
    with cli.client() as api:
        cli.emit(api.json("DELETE", f"/v1/tokens/{token_id}"), TOKEN_COLUMNS)


@token_app.command("recover")
def token_recover(
    ctx: typer.Context,
    data_dir: Annotated[
        Path | None, typer.Option(help="the server's data dir [default: EDGEFLEET_DATA_DIR]")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="default: EDGEFLEET_DATABASE_URL, or SQLite in data dir")
    ] = None,
    name: Annotated[str, typer.Option(help="name of the new admin token")] = "recovery-admin",
) -> None:
    """On the server: create a new admin token in the database, written to
    <data-dir>/admin-token (0600). For when no admin token works any more; it talks to
    the database, not to the API, and is audited as `system`."""
    from control_plane.access.service import AccessService
    from control_plane.clock import SystemClock
    from control_plane.errors import InvalidInputError
    from control_plane.settings import ServerSettings
    from control_plane.storage.db import check_schema_current, create_engine_for, session_factory

    settings = ServerSettings()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    if database_url is not None:
        settings = settings.model_copy(update={"database_url": database_url})
    if settings.database_url is None and not (settings.data_dir / "edgefleet.db").exists():
        raise InvalidInputError(
            f"no database at {settings.data_dir / 'edgefleet.db'}: pass the server's "
            "--data-dir (or --database-url)"
        )
    engine = create_engine_for(settings.resolved_database_url)
    try:
        check_schema_current(engine)
        token_file = settings.data_dir / "admin-token"
        info = AccessService(session_factory(engine), SystemClock()).recover_admin(
            token_file, name=name
        )
    finally:
        engine.dispose()
    cli = cli_context(ctx)
    if cli.output == "json":
        cli.emit({"id": info.id, "name": info.name, "token_file": str(token_file)})
    else:
        cli.console.print(
            f"admin token {info.name!r} (id {info.id}) written to {token_file} (mode 0600)",
            soft_wrap=True,
        )


@audit_app.command("list")
def audit_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    action: Annotated[str | None, typer.Option(help="e.g. targets.push")] = None,
) -> None:
    """The newest audit entries first: who did what, when, under which request id."""
    cli = cli_context(ctx)
    params: dict[str, str | int] = {"limit": limit}
    if action:
        params["action"] = action
    with cli.client() as api:
        entries = api.json("GET", "/v1/audit", params=params)
    cli.emit(entries, ["id", "at", "actor", "role", "action", "target", "outcome", "request_id"])
