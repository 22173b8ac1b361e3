"""`edgefleet mqtt ...`: the Mosquitto password file and topic ACL for the fleet's nodes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from control_plane.cli.context import cli_context
from control_plane.errors import InvalidInputError

if TYPE_CHECKING:
    from control_plane.link.mqtt_acl import MqttAccount, NodeMqttAccount

mqtt_app = typer.Typer(
    help="MQTT broker set-up: per-node credentials and the topic ACL.", no_args_is_help=True
)


@mqtt_app.command("acl")
def acl(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="directory for `passwd` (0600) and `acl`")],
    group: Annotated[
        str | None,
        typer.Option(help="the broker's group (e.g. mosquitto): `passwd` becomes 0640 with it"),
    ] = None,
) -> None:
    """Write Mosquitto's `passwd` and `acl` files for every unrevoked MQTT node (admin).

    For brokers the control plane does not manage (`--mqtt-accounts file`). Point
    mosquitto.conf's `password_file` and `acl_file` at them, set `allow_anonymous false`
    and `use_username_as_clientid true`, and send the broker SIGHUP after each run
    (enrollments and revocations change the files). Without `--group`, a `passwd`
    already there keeps its owner, group and group read bit.
    """
    from control_plane.link.mqtt_acl import (
        render_acl_file,
        render_password_file,
        write_broker_files,
    )

    cli = cli_context(ctx)
    with cli.client() as api:
        answer = api.json("GET", "/v1/mqtt/credentials")
    own, nodes = _accounts(answer)
    passwd = render_password_file([own, *nodes])
    acl_text = render_acl_file(
        own.username,
        nodes,
        header=f"Written by `edgefleet mqtt acl` from {cli.server}; do not edit by hand.",
    )
    files = write_broker_files(out, passwd, acl_text, group=group)
    summary = {
        "passwd": str(files.passwd),
        "acl": str(files.acl),
        "control_plane_user": own.username,
        "nodes": len(nodes),
    }
    cli.emit(summary, list(summary))
    if cli.output != "json":
        cli.console.print("reload the broker to apply: kill -HUP <mosquitto pid>")


def _accounts(answer: Any) -> tuple[MqttAccount, list[NodeMqttAccount]]:
    from control_plane.link.mqtt_acl import MqttAccount, NodeMqttAccount

    try:
        own = MqttAccount(
            username=str(answer["control_plane"]["username"]),
            password_hash=str(answer["control_plane"]["password_hash"]),
        )
        nodes = [
            NodeMqttAccount(
                node_id=str(n["node_id"]),
                fleet=str(n["fleet"]),
                password_hash=str(n["password_hash"]),
            )
            for n in answer["nodes"]
        ]
    except (KeyError, TypeError) as exc:
        raise InvalidInputError(f"unexpected answer from /v1/mqtt/credentials: {exc}") from exc
    return own, nodes
