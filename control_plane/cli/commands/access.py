"""`edgefleet token ...` and `edgefleet audit ...`."""

from __future__ import annotations

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
