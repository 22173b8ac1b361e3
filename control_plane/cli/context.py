"""What every CLI command receives: where the server is, the token, the output format.

Imports only what `edgefleet --help` needs; the HTTP client and rich tables load on use.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console

from control_plane.errors import AuthenticationError

if TYPE_CHECKING:
    from control_plane.cli.client import ApiClient


@dataclass
class CliContext:
    server: str
    token: str | None
    output: str
    console: Console
    log_format: str = "logfmt"

    def client(self, *, need_token: bool = True) -> ApiClient:
        if need_token and not self.token:
            raise AuthenticationError(
                "no API token: pass --token or set EDGEFLEET_TOKEN "
                "(the first admin token is in <data-dir>/admin-token)"
            )
        from control_plane.cli.client import ApiClient  # httpx: only for commands that call

        if self.token and plain_http_to_another_machine(self.server):
            # A warning, not a refusal: lab setups over a trusted network keep working,
            # and whoever sends a token in clear text is told so every time.
            Console(stderr=True).print(
                f"[yellow]warning:[/yellow] sending the API token in clear text to "
                f"{self.server}: use https:// for a server on another machine",
                soft_wrap=True,
                highlight=False,
            )
        return ApiClient(self.server, self.token)

    def emit(
        self, data: Any, columns: Sequence[str] | None = None, title: str | None = None
    ) -> None:
        """Print `data` as JSON or as a table of `columns` (a list of dicts) / key-value pairs."""
        if self.output == "json":
            typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
            return
        from rich.table import Table

        if isinstance(data, list):
            table = Table(title=title, show_lines=False)
            cols = list(columns or (data[0].keys() if data else []))
            for col in cols:
                table.add_column(col)
            for row in data:
                table.add_row(*[_cell(row.get(c)) for c in cols])
            self.console.print(table)
        elif isinstance(data, dict):
            table = Table(title=title, show_header=False)
            table.add_column("field", style="bold")
            table.add_column("value")
            for key in columns or data.keys():
                table.add_row(key, _cell(data.get(key)))
            self.console.print(table)
        else:
            self.console.print(str(data))


def plain_http_to_another_machine(url: str) -> bool:
    """`http://` to a host that is not this machine (localhost, 127.0.0.0/8, ::1)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: it may resolve anywhere


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def cli_context(ctx: typer.Context) -> CliContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliContext)
    return obj
