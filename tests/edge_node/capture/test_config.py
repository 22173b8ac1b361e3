"""Camera source settings: what a stream's ``source`` may say, and what is refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_node.capture.config import (
    CaptureConfigError,
    DirectorySourceConfig,
    HttpSourceConfig,
    parse_credentials,
    parse_source,
)
from edge_node.config import AgentConfig, ConfigError, load_agent_config

BASE = """\
data_dir: /var/lib/edgefleet-node
server_grpc: cp.example.com:7443
runtime:
  streams:
"""


def load(tmp_path: Path, streams: str) -> AgentConfig:
    path = tmp_path / "node.yaml"
    path.write_text(BASE + streams)
    return load_agent_config(path)


def test_a_url_string_is_an_http_source_with_safe_defaults() -> None:
    source = parse_source("door", "http://10.0.0.5/cgi-bin/snapshot.cgi")
    assert source == HttpSourceConfig(url="http://10.0.0.5/cgi-bin/snapshot.cgi")
    assert source.timeout_s == 5.0 and source.backoff_max_s == 30.0


def test_a_mapping_sets_the_options_of_its_scheme() -> None:
    http = parse_source(
        "door",
        {"url": "https://cam/snap.jpg", "timeout_s": 2, "backoff_max_s": 10, "verify_tls": False},
    )
    assert isinstance(http, HttpSourceConfig)
    assert (http.timeout_s, http.backoff_max_s, http.verify_tls) == (2.0, 10.0, False)
    drop = parse_source(
        "yard", {"url": "file:///srv/ftp/yard", "after_read": "move", "move_to": "/srv/done"}
    )
    assert drop == DirectorySourceConfig(
        directory=Path("/srv/ftp/yard"), after_read="move", move_to=Path("/srv/done")
    )
    assert drop.empty_after_s == 30.0
    slow = parse_source("yard", {"url": "file:///srv/in", "settle_s": 45, "empty_after_s": 90})
    assert isinstance(slow, DirectorySourceConfig)
    assert (slow.settle_s, slow.empty_after_s) == (45.0, 90.0)
    # An empty file is never set aside before a full file would be read.
    assert parse_source("yard", {"url": "file:///srv/in", "settle_s": 45}).empty_after_s == 45.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("rtsp://10.0.0.5:554/stream1", "scheme 'rtsp' is not supported; supported: http"),
        ("ftp://cam/x.jpg", "scheme 'ftp' is not supported"),
        ("10.0.0.5/snap.jpg", "scheme '(none)' is not supported"),
        ("http://admin:secret@cam/snap.jpg", "must not hold credentials"),
        ("http:///snap.jpg", "has no host"),
        ("file://relative/dir", "file:///absolute/directory"),
        ({"url": "file:///srv/in", "after_read": "move"}, "move_to: is required"),
        ({"url": "file:///srv/in", "move_to": "/srv/out"}, "move_to: is required"),
        ({"url": "file:///srv/in", "after_read": "shred"}, "keep, delete, move"),
        ({"url": "file:///srv/in", "timeout_s": 3}, "unknown key(s) timeout_s"),
        ({"url": "file:///srv/in", "settle_s": 5, "empty_after_s": 2}, "must be >= settle_s"),
        ({"url": "file:///srv/in", "empty_after_s": 0}, "empty_after_s: must be"),
        ({"url": "http://cam/s.jpg", "after_read": "delete"}, "unknown key(s) after_read"),
        ({"url": "http://cam/s.jpg", "timeout_s": 0}, "timeout_s: must be"),
        ({"url": "http://cam/s.jpg", "backoff_initial_s": 5, "backoff_max_s": 1}, ">= backoff"),
        ({"url": "http://cam/s.jpg", "credentials_file": "rel/cred"}, "absolute path"),
        ({"timeout_s": 1}, "url: is required"),
        (42, "must be a URL or a mapping"),
    ],
)
def test_sources_that_are_refused(raw: object, message: str) -> None:
    with pytest.raises(CaptureConfigError, match=r"streams\.cam\.source") as caught:
        parse_source("cam", raw)
    assert message in caught.value.message
    assert "secret" not in caught.value.message


def test_credentials_are_one_user_password_line() -> None:
    credentials = parse_credentials("where", "admin:pa:ss\n")
    assert (credentials.username, credentials.password) == ("admin", "pa:ss")
    assert "pa:ss" not in repr(credentials)
    for bad in ("", "admin", ":nouser\n"):
        with pytest.raises(CaptureConfigError, match="user:password"):
            parse_credentials("where", bad)


def test_the_node_config_carries_sources_with_the_stream_rate(tmp_path: Path) -> None:
    secret = tmp_path / "door.cred"
    secret.write_text("viewer:s3cret\n")
    config = load(
        tmp_path,
        f"""\
    - name: door
      target_fps: 4
      source: {{url: "http://10.0.0.5/cgi-bin/snapshot.cgi", credentials_file: {secret}}}
    - name: yard
      source: file:///srv/ftp/yard
    - name: api
""",
    )
    assert [s.name for s in config.runtime.streams] == ["door", "yard", "api"]
    door, yard = config.camera_sources
    assert (door.stream, door.fps) == ("door", 4.0)
    assert isinstance(door.source, HttpSourceConfig)
    assert door.source.credentials is not None
    assert door.source.credentials.password == "s3cret"
    assert "s3cret" not in repr(config)
    assert (yard.stream, yard.fps) == ("yard", 1.0)  # no target_fps: the default rate


def test_rtsp_is_refused_at_load_naming_the_supported_schemes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rtsp.*not supported; supported: http:// and https://"):
        load(tmp_path, "    - name: door\n      source: rtsp://10.0.0.5/live\n")


def test_a_missing_or_malformed_credentials_file_is_refused_at_load(tmp_path: Path) -> None:
    missing = tmp_path / "nope.cred"
    streams = (
        f"    - name: door\n      source: {{url: http://cam/s.jpg, credentials_file: {missing}}}\n"
    )
    with pytest.raises(ConfigError, match="credentials_file: cannot read"):
        load(tmp_path, streams)
    missing.write_text("just-a-token\n")
    with pytest.raises(ConfigError, match="user:password"):
        load(tmp_path, streams)
