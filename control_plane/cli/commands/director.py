"""`edgefleet nodes pin ...`: assign a model version to one node (a signed director assignment).

Registers its commands on the `nodes` group of `control_plane.cli.commands.nodes`;
`control_plane.cli.main` imports this module for that side effect.
"""

from __future__ import annotations

from typing import Annotated

import typer

from control_plane.cli.commands.nodes import nodes_app
from control_plane.cli.context import cli_context

ASSIGNMENT_COLUMNS = [
    "node_id",
    "fleet",
    "sequence",
    "model",
    "version",
    "target_path",
    "sha256",
    "issued_at",
    "expires_at",
    "created_by",
]


@nodes_app.command("pin")
def nodes_pin(
    ctx: typer.Context,
    node_id: str,
    model: Annotated[str, typer.Option(help="model name in the node's fleet")],
    version: Annotated[str, typer.Option(help="version of that model")],
) -> None:
    """Make a node run one model version: the director signs a fresh assignment for it."""
    cli = cli_context(ctx)
    with cli.client() as api:
        assignment = api.json(
            "POST", f"/v1/nodes/{node_id}/pin", json={"model": model, "version": version}
        )
    cli.emit(assignment, ASSIGNMENT_COLUMNS)


@nodes_app.command("assignment")
def nodes_assignment(ctx: typer.Context, node_id: str) -> None:
    """The node's current director assignment."""
    cli = cli_context(ctx)
    with cli.client() as api:
        assignment = api.json("GET", f"/v1/nodes/{node_id}/assignment")
    if cli.output != "json":
        assignment.pop("signed", None)
    cli.emit(assignment, [*ASSIGNMENT_COLUMNS, "expired"])
