"""The `edgefleet` console script: hands `edgefleet node run` to the node agent before the
operator CLI loads, so that the command works on a box installed with `edgefleet[node]`
alone (no typer, rich or onnx there). Every other command is `control_plane.cli.main`'s.
"""

from __future__ import annotations

import os
import sys

from control_plane.cli.global_options import node_run

# Our own top-level packages: a missing one is a broken install, never a missing extra.
_OURS = frozenset({"control_plane", "edge_node", "device_sdk", "protos"})


def run() -> None:
    """Console-script entry point."""
    agent = node_run(sys.argv[1:])
    if agent is not None:
        # Exec'd, not imported: control_plane never imports edge_node (ADR 0005). The
        # same argv `node run` of the full CLI builds (control_plane.cli.commands.nodes).
        argv = [sys.executable, "-m", "edge_node", *agent]
        os.execv(sys.executable, argv)  # noqa: S606  (our own interpreter, no shell)
    try:
        from control_plane.cli.main import run as cli
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not missing or missing in _OURS:
            raise
        sys.exit(
            f"edgefleet: the operator CLI needs {missing}, which is not installed here: "
            "pip install 'edgefleet[cli]' (an edge node needs only `edgefleet node run`)"
        )
    cli()
