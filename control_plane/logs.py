"""Log lines of the control plane's processes (server, CLI): logfmt by default, JSON lines
with `--log-format json`; every `extra=` field and the request id are kept. Not metrics.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any, Final

__all__ = [
    "LOG_FORMATS",
    "LOG_FORMAT_ENV",
    "LineFormatter",
    "configure_logging",
    "current_request_id",
    "record_fields",
]

LOG_FORMAT_ENV: Final = "EDGEFLEET_LOG_FORMAT"
LOG_FORMATS: Final = ("logfmt", "json")

current_request_id: ContextVar[str | None] = ContextVar("edgefleet_request_id", default=None)
"""Set by the API's request-id middleware for the duration of one request."""

# What every LogRecord has; anything else on a record came from `extra=`, except
# uvicorn's `color_message` (the message again, with terminal colours).
_STANDARD: Final = frozenset(
    {
        *vars(logging.LogRecord("", 0, "", 0, "", None, None)),
        *("message", "asctime", "taskName", "color_message"),
    }
)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """time, level, logger, msg, the request id if any, then the `extra=` fields."""
    fields: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    # A record may carry its own (the access line does), else the request's being served.
    request_id = getattr(record, "request_id", None) or current_request_id.get()
    if request_id is not None:
        fields["request_id"] = request_id
    fields.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
    return fields


class LineFormatter(logging.Formatter):
    """One record, one line: `key=value` pairs (values with blanks, quotes or `=` quoted),
    or a JSON object whose values JSON cannot hold become their `str`."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.as_json:
            return json.dumps(fields, default=str, ensure_ascii=False)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\\\n\t'):
        return text
    return json.dumps(text, ensure_ascii=False)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so configuring again replaces it and leaves other handlers (pytest's) alone."""


def configure_logging(log_format: str, level: str, stream: IO[str] | None = None) -> None:
    """Send the root logger's records to `stream` (stderr) in `log_format` at `level`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(LineFormatter(as_json=log_format == "json"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
