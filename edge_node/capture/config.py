"""Camera sources of the runtime's streams: what a ``source`` in node.yaml says, checked.

What it is for: parsing a stream's ``source`` (a URL string, or a mapping with ``url`` and
the options of its scheme) into a frozen :class:`HttpSourceConfig` or
:class:`DirectorySourceConfig`, refusing what the node cannot capture (``rtsp://`` and any
other scheme) with a message that names the schemes it can. Pure: no file is opened here;
the entry point reads the credentials file and hands its text to :func:`parse_credentials`.

What it is not for: fetching frames (``edge_node.capture.sources``) or pacing them
(``edge_node.capture.schedule``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import unquote, urlsplit

from edge_node.errors import InvalidInputError

__all__ = [
    "DEFAULT_FPS",
    "SUPPORTED_SCHEMES",
    "AfterRead",
    "CaptureConfigError",
    "Credentials",
    "DirectorySourceConfig",
    "HttpSourceConfig",
    "SourceConfig",
    "StreamSource",
    "parse_credentials",
    "parse_source",
]

SUPPORTED_SCHEMES: Final = ("http", "https", "file")
DEFAULT_FPS: Final = 1.0
"""A stream with a source and no ``target_fps`` is captured at this rate."""
MAX_TIMEOUT_S: Final = 300.0
MAX_BACKOFF_S: Final = 3600.0
MAX_SNAPSHOT_BYTES: Final = 32 * 1024 * 1024  # as edge_node.runtime.preprocess.MAX_ENCODED_BYTES
MAX_CREDENTIALS_BYTES: Final = 4096
DEFAULT_EMPTY_AFTER_S: Final = 30.0
"""A drop directory's 0-byte file is set aside (``empty``) once it is this old."""

AfterRead = Literal["keep", "delete", "move"]


class CaptureConfigError(InvalidInputError):
    """A stream's ``source`` cannot be used as written."""

    title = "invalid camera source"


@dataclass(frozen=True, slots=True)
class Credentials:
    """HTTP basic-auth user and password (read from a file, never written in node.yaml)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class HttpSourceConfig:
    """Poll a JPEG snapshot URL (e.g. ``/cgi-bin/snapshot.cgi``) once per frame interval.

    ``timeout_s`` bounds one request (connect, read and the whole body); after a failure
    the next request waits a capped exponential backoff (``backoff_initial_s`` doubling up
    to ``backoff_max_s``, with jitter) instead of the frame interval.
    """

    url: str
    timeout_s: float = 5.0
    credentials_file: Path | None = None
    credentials: Credentials | None = field(default=None, repr=False)
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    max_bytes: int = MAX_SNAPSHOT_BYTES
    verify_tls: bool = True


@dataclass(frozen=True, slots=True)
class DirectorySourceConfig:
    """Take the newest new file of ``directory`` (a camera's or FTP server's drop) per frame.

    A file is read only once its mtime is ``settle_s`` old and its size did not change
    between two scans (it is not being written). ``after_read``: ``keep`` the files,
    ``delete`` them, or ``move`` them into ``move_to``; the files set aside unread are
    treated the same way: older files passed over for a newer one (latest frame wins,
    ``superseded``), files older than a frame already taken (``stale``), and files that
    stayed 0 bytes for ``empty_after_s`` (``empty``; a writer may create a file before it
    fills it, so an empty one is given this long).
    """

    directory: Path
    after_read: AfterRead = "keep"
    move_to: Path | None = None
    settle_s: float = 1.0
    empty_after_s: float = DEFAULT_EMPTY_AFTER_S
    suffixes: tuple[str, ...] = (".jpg", ".jpeg", ".png")
    max_bytes: int = MAX_SNAPSHOT_BYTES


SourceConfig = HttpSourceConfig | DirectorySourceConfig


@dataclass(frozen=True, slots=True)
class StreamSource:
    """A stream fed from a camera source, at ``fps`` (its target_fps, or DEFAULT_FPS)."""

    stream: str
    source: SourceConfig
    fps: float = DEFAULT_FPS


_HTTP_KEYS: Final = frozenset(
    {"url", "timeout_s", "credentials_file", "backoff_initial_s", "backoff_max_s", "verify_tls"}
)
_FILE_KEYS: Final = frozenset({"url", "after_read", "move_to", "settle_s", "empty_after_s"})


def _fail(where: str, message: str, value: object) -> CaptureConfigError:
    return CaptureConfigError(f"{where}: {message} (got {value!r})", field=where)


def _seconds(where: str, value: Any, high: float, *, allow_zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not (value >= 0 if allow_zero else value > 0)
        or value > high
    ):
        low = "[0" if allow_zero else "(0"
        raise _fail(where, f"must be a number of seconds in {low}, {high}]", value)
    return float(value)


def _path(where: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(where, "must be a path", value)
    path = Path(value)
    if not path.is_absolute():
        raise _fail(where, "must be an absolute path", value)
    return path


def parse_source(stream: str, raw: object) -> SourceConfig:
    """A stream's ``source``: ``"http://…"`` / ``"file:///dir"`` or ``{url: …, options}``."""
    where = f"streams.{stream}.source"
    options: Mapping[str, Any]
    if isinstance(raw, str):
        options = {"url": raw}
    elif isinstance(raw, Mapping) and all(isinstance(k, str) for k in raw):
        options = raw
    else:
        raise _fail(where, "must be a URL or a mapping with url and options", raw)
    url = options.get("url")
    if not isinstance(url, str) or not url:
        raise _fail(f"{where}.url", "is required: http(s)://… or file:///directory", url)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise _fail(
            f"{where}.url",
            f"scheme {scheme or '(none)'!r} is not supported; supported: http:// and https:// "
            "(JPEG snapshot URL) and file:// (directory of JPEG files)",
            url,
        )
    known = _FILE_KEYS if scheme == "file" else _HTTP_KEYS
    unknown = sorted(set(options) - known)
    if unknown:
        raise CaptureConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)} for a {scheme} source; "
            f"known: {', '.join(sorted(known))}",
            field=f"{where}.{unknown[0]}",
        )
    if scheme == "file":
        return _directory_source(where, url, options)
    return _http_source(where, url, options)


def _http_source(where: str, url: str, options: Mapping[str, Any]) -> HttpSourceConfig:
    parts = urlsplit(url)
    if not parts.hostname:
        raise _fail(f"{where}.url", "has no host", url)
    if parts.username is not None or parts.password is not None:
        raise _fail(
            f"{where}.url",
            "must not hold credentials; put 'user:password' in a file named by credentials_file",
            f"{parts.scheme}://***@{parts.hostname}",
        )
    default = HttpSourceConfig(url=url)
    credentials_file = options.get("credentials_file")
    verify_tls = options.get("verify_tls", default.verify_tls)
    if not isinstance(verify_tls, bool):
        raise _fail(f"{where}.verify_tls", "must be true or false", verify_tls)
    config = HttpSourceConfig(
        url=url,
        timeout_s=_seconds(
            f"{where}.timeout_s", options.get("timeout_s", default.timeout_s), MAX_TIMEOUT_S
        ),
        credentials_file=None
        if credentials_file is None
        else _path(f"{where}.credentials_file", credentials_file),
        backoff_initial_s=_seconds(
            f"{where}.backoff_initial_s",
            options.get("backoff_initial_s", default.backoff_initial_s),
            MAX_BACKOFF_S,
        ),
        backoff_max_s=_seconds(
            f"{where}.backoff_max_s",
            options.get("backoff_max_s", default.backoff_max_s),
            MAX_BACKOFF_S,
        ),
        verify_tls=verify_tls,
    )
    if config.backoff_max_s < config.backoff_initial_s:
        raise _fail(f"{where}.backoff_max_s", "must be >= backoff_initial_s", config.backoff_max_s)
    return config


def _directory_source(where: str, url: str, options: Mapping[str, Any]) -> DirectorySourceConfig:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise _fail(f"{where}.url", "must be file:///absolute/directory", url)
    directory = _path(f"{where}.url", unquote(parts.path))
    after_read = options.get("after_read", "keep")
    if after_read not in ("keep", "delete", "move"):
        raise _fail(f"{where}.after_read", "must be one of keep, delete, move", after_read)
    move_to_raw = options.get("move_to")
    move_to = None if move_to_raw is None else _path(f"{where}.move_to", move_to_raw)
    if (after_read == "move") != (move_to is not None):
        raise _fail(
            f"{where}.move_to", "is required with after_read: move, and only with it", move_to_raw
        )
    if move_to is not None and move_to == directory:
        raise _fail(f"{where}.move_to", "must differ from the watched directory", move_to_raw)
    settle_s = _seconds(
        f"{where}.settle_s", options.get("settle_s", 1.0), MAX_TIMEOUT_S, allow_zero=True
    )
    empty_after_s = _seconds(
        f"{where}.empty_after_s",
        options.get("empty_after_s", max(DEFAULT_EMPTY_AFTER_S, settle_s)),
        MAX_BACKOFF_S,
    )
    if empty_after_s < settle_s:
        raise _fail(f"{where}.empty_after_s", "must be >= settle_s", empty_after_s)
    return DirectorySourceConfig(
        directory=directory,
        after_read=after_read,
        move_to=move_to,
        settle_s=settle_s,
        empty_after_s=empty_after_s,
    )


def parse_credentials(where: str, text: str) -> Credentials:
    """The first line of a credentials file, ``user:password`` (the password may hold ':')."""
    line = text.splitlines()[0].strip() if text.strip() else ""
    username, sep, password = line.partition(":")
    if not sep or not username:
        raise CaptureConfigError(
            f"{where}: the credentials file must hold one line 'user:password'", field=where
        )
    return Credentials(username, password)
