"""The control plane's log lines keep their context (control_plane/logs.py), access lines
carry the request id (api/middleware.py), and a server that cannot start says why in one
line (control_plane/server.py)."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from control_plane.api.middleware import RequestIdMiddleware
from control_plane.logs import configure_logging, current_request_id
from tests.conftest import free_port, wait_for_port


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Log lines as an operator reads them: configure_logging on the root logger."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    configure_logging("logfmt", "info", stream)
    yield stream
    configure_logging("logfmt", logging.getLevelName(level), io.StringIO())


def test_logfmt_keeps_every_extra_field(lines: io.StringIO) -> None:
    log = logging.getLogger("control_plane.nodes.enrollment")
    log.info("node enrolled", extra={"node_id": "n-0123456789ab", "fleet": "gates"})
    log.warning("odd", extra={"labels": {"site": "a b"}, "count": 3, "note": 'say "hi"'})
    first, second = lines.getvalue().splitlines()
    assert first.startswith("ts=") and first.split(" ", 1)[1] == (
        'level=info logger=control_plane.nodes.enrollment msg="node enrolled" '
        "node_id=n-0123456789ab fleet=gates"
    )
    assert second.endswith('labels="{\\"site\\": \\"a b\\"}" count=3 note="say \\"hi\\""')


def test_json_lines_keep_fields_and_tracebacks_stay_on_one_line() -> None:
    stream = io.StringIO()
    configure_logging("json", "info", stream)
    try:
        log = logging.getLogger("control_plane.test")
        log.info("node enrolled", extra={"node_id": "n-1", "labels": {"a": "b"}, "at": Path("/x")})
        try:
            raise RuntimeError("database went away")
        except RuntimeError:
            log.exception("pass failed", extra={"pass": 7})
    finally:
        configure_logging("logfmt", "warning", io.StringIO())
    enrolled, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert enrolled["msg"] == "node enrolled" and enrolled["level"] == "info"
    assert enrolled["node_id"] == "n-1" and enrolled["labels"] == {"a": "b"}
    assert enrolled["at"] == "/x"  # what JSON cannot hold becomes its str
    assert failed["pass"] == 7 and "RuntimeError: database went away" in failed["exc"]


def test_configure_refuses_unknown_formats_and_replaces_only_its_own_handler() -> None:
    with pytest.raises(ValueError, match="logfmt, json"):
        configure_logging("xml", "info")
    other = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(other)
    try:
        configure_logging("json", "info", io.StringIO())
        configure_logging("logfmt", "warning", io.StringIO())
        ours = [h for h in root.handlers if type(h).__module__ == "control_plane.logs"]
        assert other in root.handlers and len(ours) == 1
        assert root.level == logging.WARNING
    finally:
        root.removeHandler(other)


def _app() -> RequestIdMiddleware:
    inner = logging.getLogger("control_plane.api.test")

    def hello(request: Request) -> PlainTextResponse:
        inner.info("handling", extra={"node_id": "n-2"})
        return PlainTextResponse(f"hi {request.scope['state']['request_id']}")

    def boom(request: Request) -> PlainTextResponse:
        raise RuntimeError("bug")

    app = Starlette(routes=[Route("/hello", hello), Route("/boom", boom)])
    ticks = iter([10.0, 10.0125, 20.0, 20.5, 30.0, 30.001])
    return RequestIdMiddleware(app, monotonic=lambda: next(ticks))


def test_request_ids_are_taken_or_made_and_on_every_line_of_the_request(
    lines: io.StringIO,
) -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        given = client.get("/hello", headers={"X-Request-ID": "req-42"})
        made = client.get("/hello", headers={"X-Request-ID": "no spaces allowed"})
        failed = client.get("/boom")
    assert given.headers["x-request-id"] == "req-42" and given.text == "hi req-42"
    new_id = made.headers["x-request-id"]
    assert len(new_id) == 32 and made.text == f"hi {new_id}"
    assert failed.status_code == 500
    assert current_request_id.get() is None  # nothing leaks past the request
    ours = [line for line in lines.getvalue().splitlines() if "logger=control_plane." in line]
    handling, access, handling2, access2, access3 = ours[:2] + ours[2:4] + ours[-1:]
    assert "msg=handling request_id=req-42 node_id=n-2" in handling
    assert access.split(" ", 1)[1] == (
        'level=info logger=control_plane.access msg="GET /hello 200" request_id=req-42 '
        "method=GET path=/hello status=200 duration_ms=12.5 client=testclient:50000"
    )
    assert f"request_id={new_id}" in handling2 and f"request_id={new_id}" in access2
    assert "duration_ms=500.0" in access2
    assert 'msg="GET /boom 500"' in access3 and "status=500" in access3


def _server(tmp_path: Path, *args: str, level: str = "warning") -> subprocess.Popen[str]:
    env = {**os.environ, "EDGEFLEET_LOG_LEVEL": level}
    for name in ("EDGEFLEET_GRPC", "EDGEFLEET_MQTT", "EDGEFLEET_LOG_FORMAT"):
        env.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _one_error_line(proc: subprocess.Popen[str]) -> str:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_a_server_whose_database_is_down_says_so_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{free_port()}/test"
    proc = _server(tmp_path, "server", "--data-dir", str(tmp_path), "--database-url", url)
    line = _one_error_line(proc)
    assert line.startswith("error: cannot use the database postgresql+psycopg://postgres:***@")
    assert "Connection refused" in line and "hunter2" not in line


def test_a_server_whose_port_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = _server(
            tmp_path, "server", "--data-dir", str(tmp_path), "--http", f"127.0.0.1:{port}"
        )
        line = _one_error_line(proc)
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port} for the REST API: ")
    assert "in use" in line


def test_a_server_whose_data_dir_cannot_be_made_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = _server(tmp_path, "server", "--data-dir", str(tmp_path / "file" / "data"))
    line = _one_error_line(proc)
    assert line == f"error: cannot start: [Errno 20] Not a directory: '{tmp_path}/file/data'"


def test_the_server_writes_json_lines_with_request_ids(tmp_path: Path) -> None:
    http = free_port()
    proc = _server(
        tmp_path,
        "--log-format",
        "json",
        "server",
        "--data-dir",
        str(tmp_path),
        "--http",
        f"127.0.0.1:{http}",
        level="info",
    )
    try:
        assert wait_for_port(http, timeout=30)
        answer = httpx.get(f"http://127.0.0.1:{http}/v1/ca.pem", headers={"X-Request-ID": "r-7"})
        assert answer.headers["x-request-id"] == "r-7"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    (access,) = [r for r in records if r["logger"] == "control_plane.access"]
    assert access["request_id"] == "r-7" and access["path"] == "/v1/ca.pem"
    assert access["status"] == 200 and access["method"] == "GET"
    assert any(r["logger"].startswith("uvicorn") for r in records)  # uvicorn's lines too
