"""Mosquitto password hashes made in Python, and the password and ACL files, against the real
`mosquitto_passwd` and a private broker."""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from control_plane.errors import InvalidInputError
from control_plane.link.mqtt_acl import (
    MqttAccount,
    NodeMqttAccount,
    check_mosquitto_password,
    load_or_create_password,
    mosquitto_password_hash,
    new_mqtt_password,
    render_acl_file,
    render_password_file,
    write_broker_files,
)
from tests.conftest import missing_service
from tests.mqtt_support import BrokerFactory, broker_factory, try_connect  # noqa: F401

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def test_the_hash_has_mosquittos_format() -> None:
    encoded = mosquitto_password_hash("secret", salt=b"\x01" * 12)
    prefix, seven, iterations, salt, digest = encoded.split("$")
    assert (prefix, seven, iterations) == ("", "7", "101")
    assert base64.b64decode(salt) == b"\x01" * 12
    assert len(base64.b64decode(digest)) == 64
    assert check_mosquitto_password("secret", encoded)
    assert not check_mosquitto_password("Secret", encoded)
    assert mosquitto_password_hash("secret") != mosquitto_password_hash("secret")  # salted


@pytest.mark.parametrize("bad", ["", "$6$101$a$b", "$7$x$a$b", "$7$101$!!$b", "plain"])
def test_malformed_hashes_never_match(bad: str) -> None:
    assert not check_mosquitto_password("secret", bad)


def test_we_verify_what_mosquitto_passwd_writes(tmp_path: Path) -> None:
    if not Path(MOSQUITTO_PASSWD).exists():
        missing_service("mosquitto_passwd")
    passwd = tmp_path / "passwd"
    subprocess.run([MOSQUITTO_PASSWD, "-c", "-b", str(passwd), "alice", "s3cret"], check=True)
    user, encoded = passwd.read_text().strip().split(":", 1)
    assert user == "alice"
    assert encoded.startswith("$7$101$")
    assert check_mosquitto_password("s3cret", encoded)
    assert not check_mosquitto_password("wrong", encoded)


def test_a_broker_accepts_python_hashes(
    broker_factory: BrokerFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    password = new_mqtt_password()
    nodes = [NodeMqttAccount("n-0a1b2c3d4e5f", "gates", mosquitto_password_hash(password))]
    own = MqttAccount("edgefleet-control-plane", mosquitto_password_hash("cp-pass"))
    files = write_broker_files(
        tmp_path / "mosquitto",
        render_password_file([own, *nodes]),
        render_acl_file(own.username, nodes),
    )
    broker = broker_factory(passwd=files.passwd, acl=files.acl, persistence=False)
    assert try_connect(broker.port, "n-0a1b2c3d4e5f", password) == 0
    assert try_connect(broker.port, "edgefleet-control-plane", "cp-pass") == 0
    assert try_connect(broker.port, "n-0a1b2c3d4e5f", password + "x") == 135
    assert try_connect(broker.port, "n-ffffffffffff", password) == 135


def test_the_acl_names_each_node_and_nothing_else() -> None:
    nodes = [
        NodeMqttAccount("n-bbbbbbbbbbbb", "yards", "$7$101$c2FsdA==$aGFzaA=="),
        NodeMqttAccount("n-aaaaaaaaaaaa", "gates", "$7$101$c2FsdA==$aGFzaA=="),
    ]
    acl = render_acl_file("edgefleet-control-plane", nodes, header="made by a test")
    assert acl.splitlines()[:7] == [
        "# made by a test",
        "# edgefleet control plane: reads every node's uplink, writes the downlink leaves",
        "user edgefleet-control-plane",
        "topic read edgefleet/v1/#",
        "topic write edgefleet/v1/+/+/desired",
        "topic write edgefleet/v1/+/+/ack",
        "topic write edgefleet/v1/+/+/cmd",
    ]
    block = acl.split("user n-aaaaaaaaaaaa\n")[1].split("\n\n")[0].splitlines()
    assert block == [
        "topic write edgefleet/v1/gates/n-aaaaaaaaaaaa/status",
        "topic write edgefleet/v1/gates/n-aaaaaaaaaaaa/health",
        "topic write edgefleet/v1/gates/n-aaaaaaaaaaaa/events",
        "topic read edgefleet/v1/gates/n-aaaaaaaaaaaa/desired",
        "topic read edgefleet/v1/gates/n-aaaaaaaaaaaa/ack",
        "topic read edgefleet/v1/gates/n-aaaaaaaaaaaa/cmd",
    ]
    assert "pattern" not in acl and "%u" not in acl
    assert acl.index("n-aaaaaaaaaaaa") < acl.index("n-bbbbbbbbbbbb")  # sorted: stable output


def test_files_refuse_unsafe_names_and_duplicates() -> None:
    good = "$7$101$c2FsdA==$aGFzaA=="
    with pytest.raises(InvalidInputError):
        render_password_file([MqttAccount("evil:user", good)])
    with pytest.raises(InvalidInputError):
        render_password_file([MqttAccount("user", "plaintext")])
    with pytest.raises(InvalidInputError):
        render_password_file([MqttAccount("a", good), MqttAccount("a", good)])
    with pytest.raises(InvalidInputError):
        render_acl_file("cp", [NodeMqttAccount("n-1", "gates\ntopic readwrite #", good)])
    with pytest.raises(InvalidInputError):
        render_acl_file("cp", [NodeMqttAccount("cp", "gates", good)])


def test_files_are_written_atomically_with_tight_modes(tmp_path: Path) -> None:
    files = write_broker_files(tmp_path / "out", "a:b\n", "user a\n")
    assert stat.S_IMODE(files.passwd.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.acl.stat().st_mode) == 0o644
    assert files.passwd.read_text() == "a:b\n"
    write_broker_files(tmp_path / "out", "c:d\n", "user c\n")
    assert files.passwd.read_text() == "c:d\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["acl", "passwd"]


def test_the_passwd_file_is_readable_by_the_brokers_group_and_keeps_it(tmp_path: Path) -> None:
    """The packaged broker reads `passwd` as user `mosquitto` after dropping root: a file
    only its writer can read, or whose owner a rewrite resets, locks every node out."""
    gid = os.getgid()
    files = write_broker_files(tmp_path / "out", "a:b\n", "user a\n", group=gid)
    assert stat.S_IMODE(files.passwd.stat().st_mode) == 0o640
    assert files.passwd.stat().st_gid == gid
    if os.geteuid() == 0:  # as root, the owner an operator gave the file stays too
        os.chown(files.passwd, 65534, 65534)
    before = files.passwd.stat()
    write_broker_files(tmp_path / "out", "c:d\n", "user c\n")  # no --group this time
    after = files.passwd.stat()
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (
        before.st_uid,
        before.st_gid,
        0o640,
    )
    assert files.passwd.read_text() == "c:d\n"
    with pytest.raises(InvalidInputError, match="no group named"):
        write_broker_files(tmp_path / "out", "a:b\n", "", group="no-such-group-edgefleet")


def test_the_control_planes_password_is_made_once(tmp_path: Path) -> None:
    path = tmp_path / "mqtt" / "control-plane-password"
    first = load_or_create_password(path)
    assert load_or_create_password(path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 40
