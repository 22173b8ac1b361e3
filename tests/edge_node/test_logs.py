"""The node agent's log lines keep their context (edge_node/logs.py), and an agent that
cannot start says why in one line, without a traceback (edge_node/__main__.py)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.__main__ import one_line
from edge_node.logs import configure_logging


def test_logfmt_and_json_keep_every_extra_field() -> None:
    stream = io.StringIO()
    log = logging.getLogger("edge_node.agent.updater")
    configure_logging("logfmt", "info", stream)
    try:
        log.info("model activated", extra={"model": "det", "version": "1.2.0", "attempt": 1})
        configure_logging("json", "info", stream)
        log.info("model activated", extra={"model": "det", "version": "1.2.0", "attempt": 1})
    finally:
        configure_logging("logfmt", "warning", io.StringIO())
    text, as_json = stream.getvalue().splitlines()
    assert text.split(" ", 1)[1] == (
        'level=info logger=edge_node.agent.updater msg="model activated" '
        "model=det version=1.2.0 attempt=1"
    )
    record = json.loads(as_json)
    assert (record["model"], record["version"], record["attempt"]) == ("det", "1.2.0", 1)
    with pytest.raises(ValueError):
        configure_logging("xml", "info")


def test_a_yaml_error_becomes_one_line() -> None:
    message = "not valid YAML: while parsing\nexpected the node content\n  line 2:\n    \n    ^"
    assert one_line(message) == "not valid YAML: while parsing; expected the node content; line 2:"


def _agent(*args: str, log_format: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_NODE_")}
    env.pop("EDGEFLEET_LOG_FORMAT", None)
    if log_format:
        env["EDGEFLEET_LOG_FORMAT"] = log_format
    return subprocess.run(
        [sys.executable, "-m", "edge_node", "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unreadable_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("fleet: [\n")
    done = _agent("--config", str(bad))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: the config file {bad} is not valid YAML")
    missing = _agent("--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"error: cannot read the config file {tmp_path / 'nope.yaml'}: No such file or directory"
    )


def test_a_data_dir_that_cannot_be_made_is_one_json_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "ca.pem").write_text("")
    done = _agent(
        "--data-dir",
        str(tmp_path / "file" / "sub"),
        "--fleet",
        "f",
        "--server-grpc",
        "127.0.0.1:9",
        "--enroll-grpc",
        "127.0.0.1:9",
        "--bootstrap-token",
        "eft_x",
        "--ca-file",
        str(tmp_path / "ca.pem"),
        log_format="json",
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert records[-1]["level"] == "error"
    assert records[-1]["msg"].startswith("agent stopped: startup: NotADirectoryError")
