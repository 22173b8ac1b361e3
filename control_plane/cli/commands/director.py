"""`edgefleet nodes pin ...`: assign a model version to one node, or to many nodes of a fleet
(by ids or labels): signed director assignments.

Registers its commands on the `nodes` group of `control_plane.cli.commands.nodes`;
`control_plane.cli.main` imports this module for that side effect.
"""

from __future__ import annotations

from typing import Annotated, Any

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
PIN_MANY_COLUMNS = [
    "fleet",
    "model",
    "version",
    "target_path",
    "selected",
    "pinned",
    "skipped",
    "delivered",
    "sequences",
    "issued_at",
    "expires_at",
]


@nodes_app.command("pin")
def nodes_pin(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="model name in the node's fleet")],
    version: Annotated[str, typer.Option(help="version of that model")],
    node_ids: Annotated[
        list[str] | None,
        typer.Argument(help="node id(s); several, or any with --label/--all, need --fleet"),
    ] = None,
    fleet: Annotated[
        str | None, typer.Option(help="pin many nodes of this fleet in one request")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(help="k=v: nodes having this label (repeatable: all of them); needs --fleet"),
    ] = None,
    all_nodes: Annotated[bool, typer.Option("--all", help="every node of --fleet")] = False,
) -> None:
    """Make nodes run one model version: the director signs a fresh assignment for each.

    One node: `edgefleet nodes pin ID --model M --version V`. Many nodes of a fleet:
    `--fleet F` with ids, with `--label k=v` (repeatable) or with `--all`; unknown ids
    refuse the whole request, revoked nodes are skipped and listed.
    """
    from control_plane.identity.bootstrap import parse_labels

    cli = cli_context(ctx)
    ids = list(node_ids or [])
    labels = parse_labels(",".join(label)) if label else None
    if fleet is None:
        if labels is not None or all_nodes:
            raise typer.BadParameter("--label and --all select nodes of a fleet: add --fleet")
        if len(ids) != 1:
            raise typer.BadParameter("give one node id, or several with --fleet")
        with cli.client() as api:
            assignment = api.json(
                "POST", f"/v1/nodes/{ids[0]}/pin", json={"model": model, "version": version}
            )
        cli.emit(assignment, ASSIGNMENT_COLUMNS)
        return
    if sum((bool(ids), labels is not None, all_nodes)) != 1:
        raise typer.BadParameter("with --fleet give node ids, --label k=v or --all (one of them)")
    body: dict[str, Any] = {"model": model, "version": version}
    if ids:
        body["node_ids"] = ids
    else:
        body["labels"] = labels or {}
    with cli.client() as api:
        result = api.json("POST", f"/v1/fleets/{fleet}/pin", json=body)
    if cli.output == "json":
        cli.emit(result)
        return
    sequences = [a["sequence"] for a in result["assignments"]]
    summary = {
        **result,
        "skipped": len(result["skipped"]),
        "sequences": f"{min(sequences)}-{max(sequences)}" if sequences else "-",
    }
    cli.emit(summary, PIN_MANY_COLUMNS)
    if result["skipped"]:
        cli.emit(result["skipped"], ["node_id", "reason"], title="skipped")


@nodes_app.command("assignment")
def nodes_assignment(ctx: typer.Context, node_id: str) -> None:
    """The node's current director assignment."""
    cli = cli_context(ctx)
    with cli.client() as api:
        assignment = api.json("GET", f"/v1/nodes/{node_id}/assignment")
    if cli.output != "json":
        assignment.pop("signed", None)
    cli.emit(assignment, [*ASSIGNMENT_COLUMNS, "expired", "renewal", "shadow"])
