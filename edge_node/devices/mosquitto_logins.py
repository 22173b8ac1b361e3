"""Camera logins on the node's local Mosquitto: one per allow-listed camera, bound to its id.

What it is for: `edgefleet-node devices broker-files` turns node.yaml's ``devices:``
(the gateway's own login and the ``cameras`` allow-list) into the broker's
``password_file`` and ``acl_file``. Each camera's username is its device id, with a
random password kept in a credentials directory (one ``<device id>.password`` file each,
0600, made once and kept across runs, deleted when the camera leaves the allow-list).
Under the ACL a camera may publish only on its own ``results``/``heartbeat``/``frame``
and receive only its own ``config``/``time``; the gateway reads every camera's uplink
and writes every camera's ``config``/``time``; nobody else has any right (Mosquitto
denies what no line grants). With ``use_username_as_clientid true`` on the listener the
broker replaces each client id by the username, so no camera can take the gateway's
session or another camera's.

Explicit ``user`` blocks with ``topic`` lines, not ``pattern ... %u``: a pattern would
grant a right to any username the password file holds, and a camera's id could hold
characters a pattern treats specially. Each camera's id must therefore be a plain login
(letters, digits, ``.``, ``_``, ``-``; `LOGIN`), refused with its name otherwise.

The hash is Mosquitto 2.0's own ``$7$`` format (PBKDF2-HMAC-SHA512, 12-byte salt, 101
iterations, what ``mosquitto_passwd`` writes); the control plane has its own copy for
the nodes' logins (the two packages share no code). Not here: the broker process (the
operator reloads it with SIGHUP), the gateway (``gateway``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edge_node.devices.config import DeviceGatewayConfig
from edge_node.errors import InvalidInputError
from edge_node.fsutil import atomic_write

__all__ = [
    "CAMERA_READS",
    "CAMERA_WRITES",
    "LOGIN",
    "BrokerFiles",
    "CameraLogin",
    "DeviceLoginError",
    "camera_logins",
    "check_login",
    "ensure_password_file",
    "mosquitto_password_hash",
    "read_password",
    "render_acl",
    "render_passwd",
    "write_broker_files",
]

# The device contract's leaves (device_sdk.topics; a test keeps them equal).
CAMERA_WRITES: Final = ("results", "heartbeat", "frame")
CAMERA_READS: Final = ("config", "time")
LOGIN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
PASSWORD_SUFFIX: Final = ".password"
_ITERATIONS: Final = 101  # mosquitto_passwd's default in 2.0
_SALT_BYTES: Final = 12


class DeviceLoginError(InvalidInputError):
    """The broker files cannot be written as asked; the message names the camera or field."""

    title = "cannot write the device broker files"


@dataclass(frozen=True, slots=True)
class CameraLogin:
    """One camera's broker login: username = device id, its password file, whether new."""

    device_id: str
    password_file: Path
    created: bool


@dataclass(frozen=True, slots=True)
class BrokerFiles:
    passwd: Path
    acl: Path
    logins: tuple[CameraLogin, ...]
    removed: tuple[str, ...]  # cameras whose password file was deleted (left the list)


def mosquitto_password_hash(password: str, *, salt: bytes | None = None) -> str:
    """The ``$7$`` hash Mosquitto's ``password_file`` accepts for `password`."""
    if not password:
        raise DeviceLoginError("a broker password must not be empty")
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, _ITERATIONS)
    b64 = base64.b64encode
    return f"$7${_ITERATIONS}${b64(salt).decode()}${b64(digest).decode()}"


def check_login(name: str, what: str) -> str:
    if LOGIN.fullmatch(name) is None:
        raise DeviceLoginError(
            f"{what} {name!r} cannot be a broker login: use 1 to 128 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit",
            login=name[:64],
        )
    return name


def render_passwd(hashes: Iterable[tuple[str, str]]) -> str:
    """Mosquitto's ``password_file``: one ``user:hash`` line per (user, hash), sorted."""
    lines: dict[str, str] = {}
    for user, encoded in hashes:
        check_login(user, "user")
        if user in lines:
            raise DeviceLoginError(f"broker login {user!r} appears twice", login=user)
        if not encoded.startswith("$7$") or any(c in encoded for c in ":\n\r "):
            raise DeviceLoginError(f"broker login {user!r} has no valid $7$ hash", login=user)
        lines[user] = f"{user}:{encoded}"
    return "".join(f"{lines[user]}\n" for user in sorted(lines))


def render_acl(gateway_user: str, cameras: Iterable[str], *, root: str, header: str = "") -> str:
    """Mosquitto's ``acl_file``: the gateway's block, then one block per camera."""
    check_login(gateway_user, "devices.username")
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    out += [
        "# the node's device gateway: every camera's uplink in, configs and time syncs out",
        f"user {gateway_user}",
        *(f"topic read {root}/+/{leaf}" for leaf in CAMERA_WRITES),
        *(f"topic write {root}/+/{leaf}" for leaf in CAMERA_READS),
    ]
    for device_id in sorted(set(cameras)):
        check_login(device_id, "camera")
        if device_id == gateway_user:
            raise DeviceLoginError(
                f"camera {device_id!r} has the gateway's login (devices.username)",
                login=device_id,
            )
        out += [
            "",
            f"# camera {device_id}",
            f"user {device_id}",
            *(f"topic write {root}/{device_id}/{leaf}" for leaf in CAMERA_WRITES),
            *(f"topic read {root}/{device_id}/{leaf}" for leaf in CAMERA_READS),
        ]
    return "\n".join(out) + "\n"


def camera_logins(cameras: Iterable[str], credentials: Path) -> tuple[list[CameraLogin], list[str]]:
    """Each camera's password file in `credentials` (0700), made with 256 random bits
    when missing and kept otherwise; files of cameras not in `cameras` are deleted.
    Returns the logins, sorted, and the removed cameras."""
    wanted = sorted(set(cameras))
    for device_id in wanted:
        check_login(device_id, "camera")
    credentials.mkdir(mode=0o700, parents=True, exist_ok=True)
    credentials.chmod(0o700)
    logins = []
    for device_id in wanted:
        path = credentials / f"{device_id}{PASSWORD_SUFFIX}"
        created = ensure_password_file(path)
        read_password(path)  # an empty or unreadable one fails now, naming the file
        logins.append(CameraLogin(device_id, path, created))
    removed = []
    for stale in sorted(credentials.glob(f"*{PASSWORD_SUFFIX}")):
        device_id = stale.name.removesuffix(PASSWORD_SUFFIX)
        if device_id not in wanted:
            stale.unlink()
            removed.append(device_id)
    return logins, removed


def ensure_password_file(path: Path) -> bool:
    """Make `path` (0600) with a random password unless it exists; True when made."""
    if path.exists():
        return False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, (secrets.token_urlsafe(32) + "\n").encode(), mode=0o600)
    return True


def read_password(path: Path) -> str:
    try:
        password = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DeviceLoginError(f"cannot read the password file {path}: {exc}") from exc
    if not password:
        raise DeviceLoginError(f"the password file {path} is empty", path=os.fspath(path))
    return password


def write_broker_files(
    devices: DeviceGatewayConfig,
    *,
    out_dir: Path,
    credentials: Path,
    gateway_password: str,
    group: str | int | None = None,
    header: str = "",
) -> BrokerFiles:
    """Write ``passwd`` (0600, or 0640 with `group`, the broker's; an existing one keeps
    its group and group read bit) and ``acl`` (0644) into `out_dir` for the gateway's
    login (``devices.username``) and every camera."""
    if devices.username is None:
        raise DeviceLoginError(
            "devices.username: the gateway's broker login is needed to write the broker files"
        )
    gateway = check_login(devices.username, "devices.username")
    if gateway in devices.cameras:
        raise DeviceLoginError(f"camera {gateway!r} has the gateway's login (devices.username)")
    acl = render_acl(gateway, devices.cameras, root=devices.topic_root, header=header)
    logins, removed = camera_logins(devices.cameras, credentials)
    hash_of = mosquitto_password_hash
    hashes = [(c.device_id, hash_of(read_password(c.password_file))) for c in logins]
    passwd = render_passwd([(gateway, mosquitto_password_hash(gateway_password)), *hashes])
    out_dir.mkdir(parents=True, exist_ok=True)
    files = BrokerFiles(out_dir / "passwd", out_dir / "acl", tuple(logins), tuple(removed))
    # The broker reads passwd after dropping root (as `mosquitto`): with `group` it gets
    # 0640 and that group; without, a passwd already there keeps its group and group bit.
    mode, gid = 0o600, None
    if group is not None:
        mode, gid = 0o640, _gid(group)
    else:
        with contextlib.suppress(FileNotFoundError):
            old = files.passwd.stat()
            mode, gid = 0o600 | (old.st_mode & 0o040), old.st_gid
    atomic_write(files.passwd, passwd.encode(), mode=mode)
    if gid is not None and gid != files.passwd.stat().st_gid:
        try:
            os.chown(files.passwd, -1, gid)
        except PermissionError as exc:
            with contextlib.suppress(OSError):
                files.passwd.chmod(0o600)
            raise DeviceLoginError(
                f"cannot give {files.passwd} the group {group or gid!r} (not a member?): {exc}"
            ) from exc
    atomic_write(files.acl, acl.encode(), mode=0o644)
    return files


def _gid(group: str | int) -> int:
    if isinstance(group, int):
        return group
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise DeviceLoginError(f"no group named {group!r}") from None
