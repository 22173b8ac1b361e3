"""`edgefleet node ...` and `edgefleet nodes ...` against a live control plane."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import typer

from control_plane.cli.commands.nodes import duration_param
from control_plane.cli.main import main
from control_plane.errors import PermissionDeniedError
from tests.control_plane.conftest import LiveServer
from tests.control_plane.identity.helpers import make_csr


class Cli:
    def __init__(self, server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
        self.server = server
        self.capsys = capsys

    def run(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--server", self.server.url, "--token", self.server.admin_token, *args])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run("--output", "json", *args)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(
    live_server: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")  # rich folds table cells on narrow terminals
    with live_server.api() as api:
        api.create_fleet("gates")
    return Cli(live_server, capsys)


def enroll(server: LiveServer, token: str) -> dict[str, Any]:
    with server.api(token="") as anonymous:
        enrolled: dict[str, Any] = anonymous.json(
            "POST",
            "/v1/enroll",
            json={"token": token, "csr_pem": make_csr().decode(), "transport": "grpc"},
        )
    return enrolled


def test_token_enroll_list_show_label_revoke(cli: Cli) -> None:
    created = cli.json(
        "node",
        "token",
        "create",
        "--fleet",
        "gates",
        "--labels",
        "site=a,role=gate",
        "--ttl",
        "30m",
    )
    assert created["labels"] == {"site": "a", "role": "gate"}
    enrolled = enroll(cli.server, created["token"])
    node_id = enrolled["node_id"]

    listed = cli.json("nodes", "list", "--selector", "site=a")
    assert [(n["id"], n["labels"]) for n in listed] == [(node_id, {"site": "a", "role": "gate"})]
    assert cli.json("nodes", "list", "--selector", "site=a,!role") == []
    assert [n["id"] for n in cli.json("nodes", "list", "--fleet", "gates")] == [node_id]

    code, table, _ = cli.run("nodes", "list")
    assert code == 0
    assert node_id in table
    assert "role=gate,site=a" in table

    shown = cli.json("nodes", "show", node_id)
    assert shown["cert_serial"] == enrolled["cert_serial"]
    code, table, _ = cli.run("nodes", "show", node_id)
    assert code == 0 and "cert_serial" in table

    relabelled = cli.json("nodes", "label", node_id, "site=b,role-")
    assert relabelled["labels"] == {"site": "b"}
    assert cli.json("nodes", "label", node_id, "zone=z", "--replace")["labels"] == {"zone": "z"}
    assert len(cli.json("audit", "list", "--action", "node.labels")) == 2

    revoked = cli.json("node", "revoke", node_id)
    assert revoked["revoked"] is True
    with pytest.raises(PermissionDeniedError):
        cli.server.services.nodes.authentication.authorize(node_id, enrolled["cert_serial"])

    tokens = cli.json("node", "token", "list", "--fleet", "gates")
    assert [(t["state"], t["node_id"]) for t in tokens] == [("used", node_id)]


def test_token_table_output_shows_the_token_once(cli: Cli) -> None:
    code, out, _ = cli.run("node", "token", "create", "--fleet", "gates")
    assert code == 0
    assert "bootstrap token (shown once): efb_" in out
    token_id = cli.json("node", "token", "list")[0]["id"]
    assert cli.json("node", "token", "revoke", token_id)["state"] == "revoked"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("node", "token", "create", "--fleet", "gates", "--ttl", "5x"), 2, "not a duration"),
        (("node", "token", "create", "--fleet", "gates", "--ttl", "31d"), 1, "between 1m and 30d"),
        (("node", "token", "create", "--fleet", "gates", "--labels", "site"), 1, "key=value"),
        (("node", "token", "create", "--fleet", "nowhere"), 1, "no fleet"),
        (("nodes", "list", "--selector", "site="), 1, "label value"),
        (("nodes", "show", "n-000000000000"), 1, "no node"),
        (("node", "revoke", "n-000000000000"), 1, "no node"),
        (("nodes", "label", "n-000000000000", "a-", "--replace"), 2, "--replace"),
    ],
)
def test_mistakes_are_clear_errors(
    cli: Cli, args: tuple[str, ...], code: int, message: str
) -> None:
    got, out, err = cli.run(*args)
    assert got == code
    assert message in out + err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("1h", timedelta(hours=1)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        (" 1H ", timedelta(hours=1)),
        # Bare seconds, as the server's `since` takes them (one parser: control_plane.durations).
        ("1", timedelta(seconds=1)),
        ("3600", timedelta(hours=1)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert duration_param(text) == expected


@pytest.mark.parametrize("text", ["", "h", "1y", "-1h", "1h 30m", "1.5h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        duration_param(text)
