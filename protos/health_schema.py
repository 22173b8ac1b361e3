"""The health report's JSON checked against its one definition, ``HealthReport`` in
``edgefleet/fleet/v1/health.proto`` (ADR 0024): strictly by the node, leniently by the
control plane.

What it is for: both sides of ``edgefleet.agent.health/2``. The node calls
``check_report`` on each document it builds (an unknown field, a wrong JSON type, a null
where the schema has no presence is a bug: ``ReportSchemaError`` lists them, up to 32). The
control plane calls ``conform_report`` on each document it reads: it gets back only the
fields the schema knows, each of its declared type; unknown fields are ignored (newer
agents) and a wrong-typed one is left out and named in the problems, so a report is read
as far as it is understood. The check walks the message descriptor, so ``health.proto``
is the only place a field is declared; what it accepts is the proto3 JSON mapping that
``google.protobuf.json_format.ParseDict`` accepts (field names as written), minus the
string forms of numbers, which no node sends. A walk is used rather than ``ParseDict``
because ``ParseDict`` refuses a whole report over one field and builds a message nobody
reads (ADR 0024 has the figures).

What it is not for: JSON decoding or size limits (the callers do both), the latency
sketch's own rules (``protos.latency_sketch.LatencySketch.from_wire``), or reports of
schema ``/1``, which predate the definition. Pure: ``google.protobuf`` descriptors only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from protos.edgefleet.fleet.v1.health_pb2 import HealthReport

__all__ = [
    "SCHEMA",
    "SCHEMA_PREFIX",
    "SCHEMA_VERSION",
    "ReportSchemaError",
    "SchemaProblem",
    "check_report",
    "conform_report",
]

SCHEMA_PREFIX: Final = "edgefleet.agent.health/"
SCHEMA_VERSION: Final = 2
SCHEMA: Final = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"
_MAX_PROBLEMS: Final = 32


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One field that does not fit: ``path`` like ``latency['m/1'].compute.p99_ms``."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


class ReportSchemaError(ValueError):
    """A report that does not fit ``HealthReport``; ``problems`` names each field."""

    def __init__(self, problems: list[SchemaProblem]) -> None:
        shown = "; ".join(str(p) for p in problems[:8])
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        super().__init__(f"health report does not fit {SCHEMA}: {shown}{more}")
        self.problems = problems


# -- the plan: the descriptor turned into what the walk needs, once per message type ------

_SINGLE: Final = 0
_REPEATED: Final = 1
_MAP: Final = 2  # map<string, V>: the other attributes describe V


@dataclass(frozen=True, slots=True)
class _Field:
    shape: int
    scalar: type | None  # int, float, bool or str; None for a message
    message: dict[str, _Field] | None  # the message's plan (filled once all exist)
    nullable: bool  # null is allowed in strict mode (presence: optional or a message)
    low: int = 0  # an integer's bounds, [low, high)
    high: int = 0


_INT_BOUNDS: Final = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31),
    FieldDescriptor.TYPE_UINT32: (0, 2**32),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63),
    FieldDescriptor.TYPE_UINT64: (0, 2**64),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64),
}
_SCALARS: Final[dict[int, type]] = {
    FieldDescriptor.TYPE_DOUBLE: float,
    FieldDescriptor.TYPE_FLOAT: float,
    FieldDescriptor.TYPE_BOOL: bool,
    FieldDescriptor.TYPE_STRING: str,
}


def _field(
    field: FieldDescriptor, shape: int, nullable: bool, plans: dict[str, dict[str, _Field]]
) -> _Field:
    if field.message_type is not None:
        return _Field(shape, None, plans[field.message_type.full_name], nullable)
    if field.type in _INT_BOUNDS:
        low, high = _INT_BOUNDS[field.type]
        return _Field(shape, int, None, nullable, low, high)
    if field.type in _SCALARS:
        return _Field(shape, _SCALARS[field.type], None, nullable)
    # health.proto uses no other type (bytes, enums); a new one must be taught here first.
    raise TypeError(f"{field.full_name}: field type {field.type} is not supported here")


def _plans(root: Descriptor) -> dict[str, dict[str, _Field]]:
    # Every message type reachable from ``root``, looking through map entries (which are
    # messages in the descriptor, objects in JSON); then each one's fields, so a field
    # can hold the plan of its message type directly.
    messages: dict[str, Descriptor] = {}
    pending = [root]
    while pending:
        message = pending.pop()
        if message.GetOptions().map_entry or message.full_name not in messages:
            if not message.GetOptions().map_entry:
                messages[message.full_name] = message
            pending.extend(f.message_type for f in message.fields if f.message_type is not None)
    plans: dict[str, dict[str, _Field]] = {name: {} for name in messages}
    for name, message in messages.items():
        for f in message.fields:
            entry = f.message_type
            if entry is not None and entry.GetOptions().map_entry:
                if entry.fields_by_name["key"].type != FieldDescriptor.TYPE_STRING:
                    raise TypeError(f"{f.full_name}: only string map keys fit JSON objects")
                spec = _field(entry.fields_by_name["value"], _MAP, False, plans)
            elif f.is_repeated:
                spec = _field(f, _REPEATED, False, plans)
            else:
                spec = _field(f, _SINGLE, f.has_presence, plans)
            plans[name][f.name] = spec
    return plans


_PLAN: Final = _plans(HealthReport.DESCRIPTOR)[HealthReport.DESCRIPTOR.full_name]


# -- the walk --------------------------------------------------------------------------


class _Walk:
    """One document's walk; a field's path is only spelled out for a problem."""

    __slots__ = ("problems", "strict")

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.problems: list[SchemaProblem] = []

    def note(self, path: str, problem: str) -> None:
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(SchemaProblem(path, problem))

    def message(self, doc: Mapping[str, Any], plan: dict[str, _Field], path: str) -> dict[str, Any]:
        isfinite = math.isfinite
        out: dict[str, Any] = {}
        for key, value in doc.items():
            spec = plan.get(key)
            if spec is None:
                if self.strict:
                    self.note(_join(path, key), "not in the schema")
                continue  # a newer agent's field
            if value is None:
                # proto3 JSON: null is "not set". The strict side also checks that the
                # schema documents the field as one that can be unset.
                if self.strict and not spec.nullable:
                    self.note(_join(path, key), "null, but the field cannot be unset")
                out[key] = None
            elif spec.shape == _SINGLE:
                # ``_plain`` inlined: this line runs for nearly every field of a report.
                kind = type(value)
                if kind is spec.scalar and (
                    kind is str
                    or kind is bool
                    or (kind is float and isfinite(value))
                    or (kind is int and spec.low <= value < spec.high)
                ):
                    out[key] = value
                else:
                    fits, kept = self.single(spec, value, path, key)
                    if fits:
                        out[key] = kept
            elif spec.shape == _MAP:
                if isinstance(value, Mapping):
                    entries: dict[str, Any] = {}
                    for name, item in value.items():
                        if _plain(spec, item):
                            entries[name] = item
                        else:
                            fits, kept = self.single(spec, item, _join(path, key), f"[{name!r}]")
                            if fits:
                                entries[name] = kept
                    out[key] = entries
                else:
                    self.note(_join(path, key), f"expected an object, got {_json_type(value)}")
            elif isinstance(value, list):
                items = self.repeated(spec, value, _join(path, key))
                if items is not None:
                    out[key] = items
            else:
                self.note(_join(path, key), f"expected an array, got {_json_type(value)}")
        return out

    def repeated(self, spec: _Field, value: list[Any], path: str) -> list[Any] | None:
        # One bad element drops the list: a sketch's bins are pairs, and a list with a
        # hole would read as another list.
        if not value:
            return []
        # The common case, a sketch's few hundred integers, checked in C.
        if (
            spec.scalar is int
            and set(map(type, value)) == {int}
            and spec.low <= min(value)
            and max(value) < spec.high
        ):
            return list(value)
        items: list[Any] = []
        for index, item in enumerate(value):
            fits, kept = self.single(spec, item, path, f"[{index}]")
            if not fits:
                return None
            items.append(kept)
        return items

    def single(self, spec: _Field, value: object, path: str, key: str) -> tuple[bool, object]:
        kind = type(value)
        if spec.message is not None:
            if kind is dict or isinstance(value, Mapping):
                return True, self.message(value, spec.message, _join(path, key))  # type: ignore[arg-type]
            self.note(_join(path, key), f"expected an object, got {_json_type(value)}")
            return False, None
        elif kind is spec.scalar:
            if kind is int:
                if spec.low <= value < spec.high:  # type: ignore[operator]
                    return True, value
            elif kind is not float or math.isfinite(value):  # type: ignore[arg-type]
                return True, value
        elif spec.scalar is float and kind is int:
            return True, value
        elif spec.scalar is int and kind is float and not self.strict:
            # proto3 JSON reads 3.0 as 3; the node must write integers as integers.
            number: float = value  # type: ignore[assignment]
            if number.is_integer() and spec.low <= number < spec.high:
                return True, int(number)
        shown = "null" if value is None else f"{_json_type(value)} {_short(value)}"
        self.note(_join(path, key), f"{shown} does not fit")
        return False, None


def _plain(spec: _Field, value: object) -> bool:
    """The common case, a scalar of exactly its type and in range, without a call to
    ``single`` (most of a report is such fields: this halves the walk)."""
    kind = type(value)
    return kind is spec.scalar and (
        kind is str
        or kind is bool
        or (kind is float and math.isfinite(value))  # type: ignore[arg-type]
        or (kind is int and spec.low <= value < spec.high)  # type: ignore[operator]
    )


def _join(path: str, key: str) -> str:
    if key.startswith("["):
        return f"{path}{key}"
    return f"{path}.{key}" if path else key


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


# -- the two sides ---------------------------------------------------------------------


def check_report(doc: Mapping[str, Any]) -> None:
    """The node's check of a report it built: raise ``ReportSchemaError`` unless every
    field is declared in ``HealthReport`` with this JSON type and ``schema`` is ours."""
    walk = _Walk(strict=True)
    walk.message(doc, _PLAN, "")
    if doc.get("schema") != SCHEMA:
        walk.note("schema", f"{_short(doc.get('schema'))} is not {SCHEMA!r}")
    if walk.problems:
        raise ReportSchemaError(walk.problems)


def conform_report(doc: Mapping[str, Any]) -> tuple[dict[str, Any], list[SchemaProblem]]:
    """The control plane's reading: ``doc`` with only the fields ``HealthReport`` declares,
    each of its type (nulls kept: they mean "not set"), and what was left out and why.

    Unknown fields are dropped silently; at most 32 problems are listed.
    """
    walk = _Walk(strict=False)
    return walk.message(doc, _PLAN, ""), walk.problems
