"""Per-node MQTT credentials and the Mosquitto password and ACL files that enforce them.

What it is for: at enrollment over MQTT a node gets a random password (username = node
id); the control plane keeps only its Mosquitto hash. `edgefleet mqtt acl` renders every
unrevoked node's hash, plus the control plane's own account, into a ``passwd`` file and
an ``acl`` file the broker loads (``password_file`` / ``acl_file``, SIGHUP to reload).
Under that ACL a node publishes only on its own ``status``/``health``/``events`` and reads
only its own ``desired``/``ack``/``cmd``; the control plane reads the whole tree (shared
subscriptions included) and writes the downlink leaves. What it is not: a broker client.

The hash is Mosquitto 2.0's own format, ``$7$<iterations>$<salt b64>$<hash b64>``:
PBKDF2-HMAC-SHA512 over the password with a 12-byte salt, 64-byte output, 101 iterations
by default (what ``mosquitto_passwd`` writes). 101 iterations are weak for a human's
password, but these passwords are 256 random bits, which no amount of stretching helps
or hurts.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from control_plane.errors import InvalidInputError
from control_plane.fsutil import atomic_write, make_private_dirs
from control_plane.link.mqtt_topics import (
    DOWNLINK_LEAVES,
    ROOT,
    UPLINK_LEAVES,
    check_segment,
    node_topic,
)

__all__ = [
    "CONTROL_PLANE_MQTT_USER",
    "MOSQUITTO_ITERATIONS",
    "BrokerFiles",
    "MqttAccount",
    "NodeMqttAccount",
    "check_mosquitto_password",
    "load_or_create_password",
    "mosquitto_password_hash",
    "new_mqtt_password",
    "render_acl_file",
    "render_password_file",
    "write_broker_files",
]

CONTROL_PLANE_MQTT_USER: Final = "edgefleet-control-plane"
MOSQUITTO_ITERATIONS: Final = 101  # mosquitto_passwd's default in 2.0
_SALT_BYTES: Final = 12
_HASH_PREFIX: Final = "$7$"


@dataclass(frozen=True, slots=True)
class MqttAccount:
    """A broker user: its name and Mosquitto password hash (never the password)."""

    username: str
    password_hash: str


@dataclass(frozen=True, slots=True)
class NodeMqttAccount:
    """An enrolled, unrevoked node's broker account; the username is the node id."""

    node_id: str
    fleet: str
    password_hash: str

    @property
    def username(self) -> str:
        return self.node_id


@dataclass(frozen=True, slots=True)
class BrokerFiles:
    passwd: Path
    acl: Path


def new_mqtt_password() -> str:
    """256 random bits, URL-safe: no ':' or whitespace to trip the password file."""
    return secrets.token_urlsafe(32)


def mosquitto_password_hash(
    password: str, *, salt: bytes | None = None, iterations: int = MOSQUITTO_ITERATIONS
) -> str:
    """The ``$7$`` hash Mosquitto's ``password_file`` accepts for `password`."""
    if not password:
        raise InvalidInputError("an MQTT password must not be empty")
    if iterations < 1:
        raise InvalidInputError("iterations must be positive")
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return f"{_HASH_PREFIX}{iterations}${_b64(salt)}${_b64(digest)}"


def check_mosquitto_password(password: str, encoded: str) -> bool:
    """Whether `password` matches a ``$7$`` hash (False for anything malformed)."""
    parts = encoded.split("$") if isinstance(encoded, str) else []
    # "$7$101$salt$hash".split("$") == ["", "7", "101", "salt", "hash"]
    if len(parts) != 5 or parts[:2] != ["", "7"] or not parts[2].isdigit():
        return False
    try:
        salt = base64.b64decode(parts[3], validate=True)
        expected = base64.b64decode(parts[4], validate=True)
    except (binascii.Error, ValueError):
        return False
    iterations = int(parts[2])
    if not 0 < iterations <= 1_000_000:
        return False
    actual = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return hmac.compare_digest(actual, expected)


def render_password_file(accounts: Iterable[MqttAccount | NodeMqttAccount]) -> str:
    """Mosquitto's ``password_file``: one ``user:hash`` line per account, sorted, unique."""
    lines: dict[str, str] = {}
    for account in accounts:
        user = check_segment(account.username, "MQTT user")
        _check_hash(account.password_hash, user)
        if user in lines:
            raise InvalidInputError(f"MQTT user {user!r} appears twice", username=user)
        lines[user] = f"{user}:{account.password_hash}"
    return "".join(f"{lines[user]}\n" for user in sorted(lines))


def render_acl_file(
    control_plane_user: str, nodes: Iterable[NodeMqttAccount], *, header: str = ""
) -> str:
    """Mosquitto's ``acl_file``: one explicit block per user, nothing for anyone else.

    Explicit per-node lines rather than a ``pattern ... %u`` rule: a pattern cannot tie a
    node to its fleet segment, so it would let a node write under any fleet's copy of its
    id. Mosquitto checks shared subscriptions against the delivered topic, so
    ``read edgefleet/v1/#`` covers the control plane's ``$share/...`` filters too.
    """
    cp = check_segment(control_plane_user, "MQTT user")
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    out += [
        "# edgefleet control plane: reads every node's uplink, writes the downlink leaves",
        f"user {cp}",
        f"topic read {ROOT}/#",
        *(f"topic write {ROOT}/+/+/{leaf.value}" for leaf in DOWNLINK_LEAVES),
    ]
    seen: set[str] = {cp}
    for node in sorted(nodes, key=lambda n: (n.fleet, n.node_id)):
        if node.node_id in seen:
            raise InvalidInputError(f"MQTT user {node.node_id!r} appears twice")
        seen.add(node.node_id)
        out += [
            "",
            f"# node {node.node_id} of fleet {check_segment(node.fleet, 'fleet')}",
            f"user {check_segment(node.node_id, 'node')}",
            *(
                f"topic write {node_topic(node.fleet, node.node_id, leaf)}"
                for leaf in UPLINK_LEAVES
            ),
            *(
                f"topic read {node_topic(node.fleet, node.node_id, leaf)}"
                for leaf in DOWNLINK_LEAVES
            ),
        ]
    return "\n".join(out) + "\n"


def write_broker_files(
    out_dir: Path, passwd: str, acl: str, *, group: str | int | None = None
) -> BrokerFiles:
    """Write ``passwd`` and ``acl`` (0644) into `out_dir`, each atomically.

    ``passwd`` is 0600, or 0640 with group `group` (the broker's, e.g. ``mosquitto``,
    which reads it after dropping root). Without `group`, a ``passwd`` already there
    keeps its group and its group read bit, and, when we run as root, its owner: a
    regenerated file stays readable by the broker that read the old one.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = BrokerFiles(passwd=out_dir / "passwd", acl=out_dir / "acl")
    mode, owner = 0o600, None
    if group is not None:
        mode, owner = 0o640, (-1, _gid(group))
    else:
        with contextlib.suppress(FileNotFoundError):
            old = files.passwd.stat()
            mode = 0o600 | (old.st_mode & 0o040)
            owner = (old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
    try:
        atomic_write(files.passwd, passwd.encode("utf-8"), mode=mode, owner=owner)
    except PermissionError as exc:
        raise InvalidInputError(
            f"cannot give {files.passwd} the group {group!r} (not a member?): {exc}"
        ) from exc
    atomic_write(files.acl, acl.encode("utf-8"), mode=0o644)
    return files


def _gid(group: str | int) -> int:
    if isinstance(group, int):
        return group
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InvalidInputError(f"no group named {group!r}", group=group) from None


def load_or_create_password(path: Path) -> str:
    """A password kept in `path` (0600), created on first use; races keep the first."""
    try:
        return _read_password(path)
    except FileNotFoundError:
        pass
    make_private_dirs(path.parent)
    # exclusive: when another process created it first, theirs is used.
    with contextlib.suppress(FileExistsError):
        atomic_write(path, (new_mqtt_password() + "\n").encode(), mode=0o600, exclusive=True)
    return _read_password(path)


def _read_password(path: Path) -> str:
    password = path.read_text(encoding="utf-8").strip()
    if not password:
        raise InvalidInputError(f"MQTT password file {path} is empty", path=os.fspath(path))
    return password


def _check_hash(encoded: str, user: str) -> None:
    parts = encoded.split("$") if isinstance(encoded, str) else []
    if len(parts) != 5 or parts[:2] != ["", "7"] or any(c in encoded for c in ":\n\r "):
        raise InvalidInputError(f"MQTT user {user!r} has no valid $7$ password hash")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
