"""Checked fields of a plain mapping (what a YAML or JSON file gives): typed values taken
out one by one, unknown keys refused, every refusal naming its field.

What it is for: the one implementation behind the model bundle's runtime spec
(``protos.bundle.spec``, raising ``BundleError``) and the node's runtime config
(``edge_node.runtime.config``, raising ``RuntimeConfigError``): each builds a
:class:`Fields` with its own error class, so a misspelt ``meen`` or a ``workers: "2"`` is
refused the same way in both, with the same words. What it is not for: what a value means
(ranges, choices and cross-field rules stay with the dataclass that owns them).
Pure: the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, get_args

__all__ = ["Fields", "Reader", "optional"]

E = TypeVar("E", bound=Exception)
T = TypeVar("T")


def optional(convert: Callable[[str, Any], T]) -> Callable[[str, Any], T | None]:
    """``convert``, letting ``null`` through as None."""

    def inner(name: str, value: Any) -> T | None:
        return None if value is None else convert(name, value)

    return inner


class Fields(Generic[E]):
    """Checks and converters raising ``error(message, field=...)``."""

    def __init__(self, error: Callable[..., E]) -> None:
        self._error = error

    def fail(self, field_name: str, message: str, value: object) -> E:
        shown = list(value) if isinstance(value, tuple) else value  # as the YAML wrote it
        return self._error(f"{field_name}: {message} (got {shown!r})", field=field_name)

    def unknown(self, where: str, unknown: Sequence[str], known: Sequence[str]) -> E:
        return self._error(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}",
            field=f"{where}.{unknown[0]}",
        )

    def reader(self, where: str, raw: object) -> Reader[E]:
        return Reader(self, where, raw)

    # ------------------------------------------------------------------------- checks

    def check_choice(self, field_name: str, value: object, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise self.fail(field_name, f"must be one of {', '.join(choices)}", value)

    def check_int(self, field_name: str, value: object, low: int, high: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(field_name, f"must be an integer in [{low}, {high}]", value)

    def check_positive(self, field_name: str, value: object, high: float = math.inf) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 < value <= high
        ):
            raise self.fail(field_name, f"must be a finite number in (0, {high}]", value)

    def check_fraction(self, field_name: str, value: object) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 <= value <= 1
        ):
            raise self.fail(field_name, "must be a number in [0, 1]", value)

    # --------------------------------------------------------------------- converters

    def to_int(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, "must be an integer", value)
        return value

    def to_bool(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(name, "must be true or false", value)
        return value

    def to_str(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(name, "must be a string", value)
        return value

    def choice(self, literal: Any) -> Callable[[str, Any], Any]:
        """A converter for one of a ``Literal``'s values (typed ``Any``: mypy cannot
        narrow it)."""
        choices: tuple[str, ...] = get_args(literal)

        def inner(name: str, value: Any) -> Any:
            self.check_choice(name, value, choices)
            return value

        return inner


class Reader(Generic[E]):
    """Takes typed values out of one mapping and, at the end, rejects what nobody took."""

    def __init__(self, fields: Fields[E], where: str, raw: object) -> None:
        if not isinstance(raw, Mapping):
            raise fields.fail(where, "must be a mapping", raw)
        for key in raw:
            if not isinstance(key, str):
                raise fields.fail(where, "keys must be strings", key)
        self._fields = fields
        self._where = where
        self._raw: Mapping[str, Any] = raw
        self._taken: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self._raw

    def take(self, key: str, convert: Callable[[str, Any], T], default: T) -> T:
        self._taken.add(key)
        if key not in self._raw:
            return default
        return convert(f"{self._where}.{key}", self._raw[key])

    def require(self, key: str, convert: Callable[[str, Any], T]) -> T:
        self._taken.add(key)
        if key not in self._raw:
            raise self._fields.fail(f"{self._where}.{key}", "is required", None)
        return convert(f"{self._where}.{key}", self._raw[key])

    def finish(self, allowed: Sequence[str] | None = None) -> None:
        """Refuse the keys nobody took; the message lists ``allowed`` (default: the keys
        taken) as the known ones."""
        unknown = sorted(set(self._raw) - self._taken)
        if unknown:
            known = sorted(self._taken if allowed is None else allowed)
            raise self._fields.unknown(self._where, unknown, known)
