"""A rollout as the operator wrote it: which version, to which nodes, in which stages,
how fast, when, and what counts as too many failures.

What it is for: `parse_rollout_spec` (and the `parse_*` for each option) turn the CLI's and
the API's strings into a checked, frozen `RolloutSpec`; every refusal is an
`InvalidInputError` naming the field and the bad value, at creation, so a rollout never
stalls later on a bad setting (argo-rollouts#872). `to_dict`/`from_dict` are its stored
form: the same strings, read back by the same parsers. What it is not for: choosing
nodes (`plan.py`), running the rollout (`machine.py`) or judging metrics (`gates.py`; the
`gates` mapping is kept here unread). Pure: no I/O, no framework.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar, get_args

from control_plane.durations import DurationError, format_duration, parse_duration
from control_plane.errors import InvalidInputError
from control_plane.identity.bootstrap import LabelSelector, parse_selector
from control_plane.rollouts.cron import CronSchedule, parse_cron
from control_plane.trust.custom import validate_model_name, validate_version
from protos.fields import Fields, Reader

__all__ = [
    "DEFAULT_SPREAD",
    "SPEC_FORMAT",
    "ControlMode",
    "Deadlines",
    "FailureBudget",
    "MaintenanceWindow",
    "Rate",
    "RolloutSpec",
    "Share",
    "Stages",
    "parse_bake",
    "parse_control",
    "parse_deadlines",
    "parse_failure_budget",
    "parse_rate",
    "parse_rollout_spec",
    "parse_spread",
    "parse_stages",
    "parse_window",
    "stored_reader",
]

SPEC_FORMAT: Final = 1
ControlMode = Literal["auto", "none"]
RateUnit = Literal["s", "min", "h"]
DEFAULT_SPREAD: Final = ("site", "hardware")

MAX_NODES: Final = 1_000_000
MAX_STAGES: Final = 20
MAX_SPREAD: Final = 4
MAX_RATE: Final = 100_000
_BASIS: Final = 10_000  # basis points in 100 %
_UNIT_SECONDS: Final[Mapping[str, int]] = {"s": 1, "min": 60, "h": 3600}
_UNIT_SPELLINGS: Final[Mapping[str, RateUnit]] = {
    "s": "s",
    "sec": "s",
    "m": "min",
    "min": "min",
    "h": "h",
    "hour": "h",
}
_FLEET = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # the registry's rule for fleet names
_LABEL_KEY = re.compile(r"[A-Za-z0-9._-]{1,63}")  # identity.bootstrap's label part
_COUNT = re.compile(r"[0-9]{1,7}")
_PERCENT = re.compile(r"(?P<whole>[0-9]{1,3})(?:\.(?P<frac>[0-9]{1,2}))?%")
_RATE = re.compile(r"(?P<count>[0-9]{1,6})\s*/\s*(?P<unit>[a-z]+)")
_SHADOW_PREFIX: Final = "shadow:"
_MAX_GATES_DEPTH: Final = 8
_MAX_GATES_ITEMS: Final = 1000

_F: Final = Fields(InvalidInputError)
T = TypeVar("T")


# ------------------------------------------------------------------------ durations


@dataclass(frozen=True, slots=True)
class _Bounds:
    low: timedelta
    high: timedelta


_BAKE_BOUNDS: Final = _Bounds(timedelta(minutes=1), timedelta(days=30))
_WINDOW_BOUNDS: Final = _Bounds(timedelta(minutes=1), timedelta(days=7))
_DEADLINE_BOUNDS: Final = _Bounds(timedelta(minutes=1), timedelta(days=7))


def _duration(field_name: str, text: object, bounds: _Bounds) -> timedelta:
    if not isinstance(text, str):
        raise _F.fail(field_name, "must be a duration text such as 30m or 2h", text)
    try:
        span = parse_duration(text)
    except DurationError as exc:
        raise _F.fail(field_name, str(exc), text) from exc
    _check_span(field_name, span, bounds)
    return span


def _check_span(field_name: str, span: object, bounds: _Bounds) -> None:
    if not isinstance(span, timedelta) or not bounds.low <= span <= bounds.high:
        raise _F.fail(
            field_name,
            f"must be between {format_duration(bounds.low)} and {format_duration(bounds.high)}",
            span if not isinstance(span, timedelta) else format_duration(span),
        )


def parse_bake(text: str, *, field_name: str = "bake") -> timedelta:
    """How long a stage's nodes run healthy before the verdict: `30m`, `2h` (1m-30d)."""
    return _duration(field_name, text, _BAKE_BOUNDS)


# --------------------------------------------------------------------------- stages


def _parse_share(field_name: str, text: str, *, low: int = 1) -> Share:
    """`5` (nodes) or `12.5%` (at most two decimals); below `low` nodes or basis points is
    refused."""
    text = text.strip()
    percent = _PERCENT.fullmatch(text)
    if percent is not None:
        basis_points = int(percent["whole"]) * 100 + int((percent["frac"] or "0").ljust(2, "0"))
        if not low <= basis_points <= _BASIS:
            raise _F.fail(field_name, f"a percentage must be in [{low / 100:g}%, 100%]", text)
        return Share(basis_points=basis_points)
    if _COUNT.fullmatch(text):
        _F.check_int(field_name, int(text), low, MAX_NODES)
        return Share(count=int(text))
    raise _F.fail(field_name, "must be a node count (5) or a percentage (10%, 12.5%)", text)


@dataclass(frozen=True, slots=True)
class Share:
    """A number of nodes or a share of them in basis points (1250 = 12.5 %)."""

    count: int | None = None
    basis_points: int | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.basis_points is None):
            raise _F.fail("share", "give a count or a percentage", (self.count, self.basis_points))
        if self.count is not None:
            _F.check_int("share", self.count, 0, MAX_NODES)
        else:
            _F.check_int("share", self.basis_points, 0, _BASIS)

    @property
    def is_percent(self) -> bool:
        return self.basis_points is not None

    @property
    def is_zero(self) -> bool:
        return not (self.count or self.basis_points)

    def of(self, population: int) -> int:
        """Nodes this share means among `population` (a percentage rounds up: 10 % of 5 is
        1)."""
        if self.count is not None:
            return min(self.count, population)
        assert self.basis_points is not None
        return -(-self.basis_points * population // _BASIS)

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        assert self.basis_points is not None
        whole, frac = divmod(self.basis_points, 100)
        return f"{whole}%" if not frac else f"{whole}.{frac:02d}".rstrip("0") + "%"


@dataclass(frozen=True, slots=True)
class Stages:
    """An optional shadow stage, then the canary stages: cumulative sizes, strictly growing,
    ending at 100 % unless `partial` (the rollout then stops at its last stage).

    Stage indices count the shadow stage first: with a shadow, index 0 is the shadow and
    index 1 the first canary stage. Counts come before percentages (`1,5,10%,100%`): a
    count after a percentage cannot be checked to grow before the fleet is known.
    """

    steps: tuple[Share, ...]
    shadow: Share | None = None
    partial: bool = False

    def __post_init__(self) -> None:
        if not 1 <= len(self.steps) <= MAX_STAGES:
            raise _F.fail("stages", f"give 1 to {MAX_STAGES} canary stages", str(self))
        if any(s.is_zero for s in (*self.steps, self.shadow) if s is not None):
            raise _F.fail("stages", "a stage of 0 nodes or 0% takes nobody", str(self))
        for before, after in zip(self.steps, self.steps[1:], strict=False):
            if before.is_percent and not after.is_percent:
                raise _F.fail(
                    "stages", f"a count ({after}) cannot follow a percentage ({before})", str(self)
                )
            if before.is_percent == after.is_percent and _key(after) <= _key(before):
                raise _F.fail("stages", f"must grow: {after} after {before}", str(self))
        last = self.steps[-1]
        if not self.partial and last.basis_points != _BASIS:
            raise _F.fail(
                "stages",
                f"must end at 100% (or be marked partial to stop at {last})",
                str(self),
            )

    @property
    def count(self) -> int:
        """Stages including the shadow stage."""
        return len(self.steps) + (self.shadow is not None)

    def is_shadow(self, index: int) -> bool:
        return self.shadow is not None and index == 0

    def first_canary(self) -> int:
        return 1 if self.shadow is not None else 0

    def size(self, index: int) -> Share:
        if self.shadow is not None:
            return self.shadow if index == 0 else self.steps[index - 1]
        return self.steps[index]

    def targets(self, population: int) -> tuple[int, ...]:
        """Nodes on the candidate once each canary stage has started, cumulative and never
        shrinking (a stage that adds nobody repeats the one before)."""
        out: list[int] = []
        for step in self.steps:
            out.append(max(step.of(population), out[-1] if out else 0))
        return tuple(out)

    def label(self, index: int) -> str:
        """`shadow (5)`, `stage 2 of 4 (10%)`."""
        if self.is_shadow(index):
            return f"shadow ({self.shadow})"
        number = index - self.first_canary() + 1
        return f"stage {number} of {len(self.steps)} ({self.size(index)})"

    def __str__(self) -> str:
        steps = ",".join(str(s) for s in self.steps)
        return f"{_SHADOW_PREFIX}{self.shadow},{steps}" if self.shadow is not None else steps


def _key(size: Share) -> int:
    return size.count if size.count is not None else size.basis_points or 0


def parse_stages(text: str, *, partial: bool = False, field_name: str = "stages") -> Stages:
    """`shadow:5,1,10%,50%,100%`: an optional leading shadow stage, then canary stages."""
    if not isinstance(text, str) or not text.strip():
        raise _F.fail(field_name, "must list stages, e.g. 1,10%,50%,100%", text)
    terms = [t.strip() for t in text.split(",")]
    shadow: Share | None = None
    if terms[0].startswith(_SHADOW_PREFIX):
        shadow = _parse_share(field_name, terms[0].removeprefix(_SHADOW_PREFIX))
        terms = terms[1:]
    for term in terms:
        if term.startswith(_SHADOW_PREFIX):
            raise _F.fail(field_name, "only the first stage can be a shadow stage", text)
    steps = tuple(_parse_share(field_name, t) for t in terms)
    return _renamed(field_name, lambda: Stages(steps, shadow, partial))


def _renamed(field_name: str, build: Callable[[], T]) -> T:
    """Build a value whose own checks name a default field, naming `field_name` instead."""
    try:
        return build()
    except InvalidInputError as exc:
        default = exc.fields.get("field")
        if default is None or default == field_name:
            raise
        raise InvalidInputError(
            exc.message.replace(f"{default}:", f"{field_name}:", 1), field=field_name
        ) from exc


# ------------------------------------------------------------------ rate and budget


@dataclass(frozen=True, slots=True)
class Rate:
    """Nodes started (assigned the candidate or the shadow) per unit of time.

    Enforced over a sliding window of `window` (the unit, or a minute for `/s`, so a
    controller stepping every few seconds still reaches `10/s`): at most `per_window`
    starts in any such window."""

    count: int
    unit: RateUnit

    def __post_init__(self) -> None:
        _F.check_int("max_rate", self.count, 1, MAX_RATE)
        _F.check_choice("max_rate", self.unit, get_args(RateUnit))

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=max(_UNIT_SECONDS[self.unit], 60))

    @property
    def per_window(self) -> int:
        return self.count * int(self.window.total_seconds()) // _UNIT_SECONDS[self.unit]

    def __str__(self) -> str:
        return f"{self.count}/{self.unit}"


def parse_rate(text: str, *, field_name: str = "max_rate") -> Rate:
    """`200/min`, `10/s`, `500/h` (units s, sec, m, min, h, hour)."""
    match = _RATE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None or match["unit"] not in _UNIT_SPELLINGS:
        raise _F.fail(field_name, "must be nodes per unit: 200/min, 10/s, 500/h", text)
    return _renamed(field_name, lambda: Rate(int(match["count"]), _UNIT_SPELLINGS[match["unit"]]))


@dataclass(frozen=True, slots=True)
class FailureBudget:
    """How many failed or timed-out nodes a rollout tolerates: a count, or a share of the
    nodes started so far (`2%`: a third failure among 100 started nodes rolls back; with
    one node started, its failure does)."""

    size: Share

    def exceeded(self, failures: int, started: int) -> bool:
        if self.size.count is not None:
            return failures > self.size.count
        assert self.size.basis_points is not None
        return failures * _BASIS > self.size.basis_points * started

    def __str__(self) -> str:
        return str(self.size)


def parse_failure_budget(text: str, *, field_name: str = "failure_budget") -> FailureBudget:
    """`2%` (of the nodes started) or `3` (nodes); `0` tolerates no failure."""
    if not isinstance(text, str):
        raise _F.fail(field_name, "must be a count (3) or a percentage (2%)", text)
    return FailureBudget(_parse_share(field_name, text, low=0))


# --------------------------------------------------------------------------- window


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
    """Nodes start only from a cron match (UTC) until `duration` after it; a window that
    closes holds the starting, it fails nothing."""

    cron: CronSchedule
    duration: timedelta

    def __post_init__(self) -> None:
        _check_span("window", self.duration, _WINDOW_BOUNDS)

    def is_open(self, now: datetime) -> bool:
        opened = self.cron.latest_at_or_before(now, now - self.duration + timedelta(microseconds=1))
        return opened is not None

    def next_open(self, now: datetime) -> datetime | None:
        """`now` when open, else the next opening (None: none in the next eight years)."""
        if self.is_open(now):
            return now
        return self.cron.next_after(now, timedelta(days=8 * 366))

    def __str__(self) -> str:
        return f"cron {self.cron} for {format_duration(self.duration)}"


def parse_window(cron: str, duration: str, *, field_name: str = "window") -> MaintenanceWindow:
    """`'cron 0 2 * * *'` and `3h`: from 02:00 UTC every day for three hours."""
    schedule = parse_cron(cron, field_name=field_name)
    return MaintenanceWindow(schedule, _duration(field_name, duration, _WINDOW_BOUNDS))


# ------------------------------------------------------------------------ deadlines

DeadlineName = Literal["start", "download", "activate", "report", "verdict"]


@dataclass(frozen=True, slots=True)
class Deadlines:
    """How long a node may stay in each phase, and the gates may keep the verdict, before
    it counts as timed out (ADR 0033 gives the reasons for the defaults).

    `start`: assigned → the node says it is downloading; `download`: → activating (verify,
    load, self-test); `activate`: → active on the candidate; `report`: active → healthy
    (watchdog window passed, samples of the candidate arriving), also for a healthy node
    that stops reporting; `verdict`: bake over → a verdict, else the rollout pauses.
    """

    start: timedelta = timedelta(minutes=15)
    download: timedelta = timedelta(hours=1)
    activate: timedelta = timedelta(minutes=15)
    report: timedelta = timedelta(minutes=15)
    verdict: timedelta = timedelta(minutes=15)

    def __post_init__(self) -> None:
        for name in get_args(DeadlineName):
            _check_span(f"deadlines.{name}", getattr(self, name), _DEADLINE_BOUNDS)

    def to_dict(self) -> dict[str, str]:
        return {name: format_duration(getattr(self, name)) for name in get_args(DeadlineName)}

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.to_dict().items())


def parse_deadlines(text: str, *, field_name: str = "deadlines") -> Deadlines:
    """`start=10m,download=2h`: the phases named change, the others keep their default."""
    if not isinstance(text, str):
        raise _F.fail(field_name, "must be name=duration terms", text)
    chosen: dict[str, timedelta] = {}
    for term in (t.strip() for t in text.split(",") if text.strip()):
        name, eq, value = term.partition("=")
        name = name.strip()
        if not eq or name not in get_args(DeadlineName):
            names = ", ".join(get_args(DeadlineName))
            raise _F.fail(field_name, f"terms are name=duration, names {names}", term)
        if name in chosen:
            raise _F.fail(field_name, f"{name} given twice", text)
        chosen[name] = _duration(f"{field_name}.{name}", value.strip(), _DEADLINE_BOUNDS)
    return Deadlines(**chosen)


# ------------------------------------------------------------------- small options


def parse_control(text: str, *, field_name: str = "control") -> ControlMode:
    """`auto`: compare canaries with control nodes still on the old version; `none`: only
    with their own pre-update baseline."""
    _F.check_choice(field_name, text, get_args(ControlMode))
    return "auto" if text == "auto" else "none"


def parse_spread(text: str, *, field_name: str = "spread") -> tuple[str, ...]:
    """`site,hardware`: the labels a stage's nodes are spread across ("" for none)."""
    if not isinstance(text, str):
        raise _F.fail(field_name, "must be label keys separated by commas", text)
    keys = tuple(k.strip() for k in text.split(",")) if text.strip() else ()
    return _checked_spread(field_name, keys)


def _checked_spread(field_name: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    if len(keys) > MAX_SPREAD:
        raise _F.fail(field_name, f"at most {MAX_SPREAD} labels", ",".join(keys))
    for key in keys:
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise _F.fail(field_name, "label keys are 1-63 of letters, digits, . _ -", key)
    if len(set(keys)) != len(keys):
        raise _F.fail(field_name, "a label is given twice", ",".join(keys))
    return keys


def _checked_gates(field_name: str, raw: object) -> dict[str, Any]:
    """A plain JSON-like copy (gates.py reads it); bounded in depth and size."""
    budget = [_MAX_GATES_ITEMS]

    def plain(name: str, value: object, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_GATES_DEPTH:
            raise _F.fail(field_name, f"at most {_MAX_GATES_ITEMS} values, nested 8 deep", name)
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _F.fail(name, "keys must be strings", key)
                out[key] = plain(f"{name}.{key}", item, depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [plain(f"{name}[{i}]", item, depth + 1) for i, item in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            raise _F.fail(name, "must be a finite number", value)
        if value is None or isinstance(value, str | int | float | bool):
            return value
        raise _F.fail(name, "must be a mapping, list, string, number, boolean or null", value)

    if not isinstance(raw, Mapping):
        raise _F.fail(field_name, "must be a mapping", raw)
    copy: dict[str, Any] = plain(field_name, raw, 0)
    return copy


# ------------------------------------------------------------------------- the spec


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """One rollout: `version` of `model` to the nodes of `fleet` that `selector` matches."""

    fleet: str
    model: str
    version: str
    stages: Stages
    selector: LabelSelector = field(default_factory=LabelSelector)
    bake: timedelta = timedelta(minutes=30)
    max_rate: Rate = field(default_factory=lambda: Rate(200, "min"))
    failure_budget: FailureBudget = field(
        default_factory=lambda: FailureBudget(Share(basis_points=200))
    )
    window: MaintenanceWindow | None = None
    control: ControlMode = "auto"
    gates: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    deadlines: Deadlines = field(default_factory=Deadlines)
    spread: tuple[str, ...] = DEFAULT_SPREAD

    def __post_init__(self) -> None:
        if not isinstance(self.fleet, str) or not _FLEET.fullmatch(self.fleet):
            raise _F.fail("fleet", "must be 1-63 of a-z 0-9 -, starting alphanumeric", self.fleet)
        validate_model_name(self.model)
        validate_version(self.version)
        _check_span("bake", self.bake, _BAKE_BOUNDS)
        _F.check_choice("control", self.control, get_args(ControlMode))
        _checked_spread("spread", self.spread)
        object.__setattr__(self, "gates", MappingProxyType(_checked_gates("gates", self.gates)))

    @property
    def seed(self) -> str:
        """What orders the nodes when no rollout id is given: a dry run and the rollout
        created from the same spec choose the same nodes."""
        return f"{self.fleet}/{self.model}/{self.version}"

    def summary(self) -> str:
        """One line: `detector 2.0 to fleet f (site=a): shadow:5,1,10%,100%, bake 30m, …`."""
        selector = str(self.selector) or "every node"
        window = f", window {self.window}" if self.window is not None else ""
        partial = " (partial)" if self.stages.partial else ""
        return (
            f"{self.model} {self.version} to fleet {self.fleet} ({selector}): "
            f"{self.stages}{partial}, bake {format_duration(self.bake)}, "
            f"max {self.max_rate}, failure budget {self.failure_budget}{window}, "
            f"control {self.control}"
        )

    def to_dict(self) -> dict[str, Any]:
        window = (
            None
            if self.window is None
            else {"cron": str(self.window.cron), "duration": format_duration(self.window.duration)}
        )
        return {
            "format": SPEC_FORMAT,
            "fleet": self.fleet,
            "model": self.model,
            "version": self.version,
            "selector": str(self.selector),
            "stages": str(self.stages),
            "partial": self.stages.partial,
            "bake": format_duration(self.bake),
            "max_rate": str(self.max_rate),
            "failure_budget": str(self.failure_budget),
            "window": window,
            "control": self.control,
            "gates": _checked_gates("gates", self.gates),
            "deadlines": self.deadlines.to_dict(),
            "spread": list(self.spread),
        }

    @classmethod
    def from_dict(cls, raw: object, *, where: str = "rollout") -> RolloutSpec:
        """The stored form (`to_dict`), checked again by the same parsers."""
        reader = stored_reader(where, raw, SPEC_FORMAT)

        def text(parse: Callable[..., T]) -> Callable[[str, Any], T]:
            return lambda name, value: parse(_F.to_str(name, value), field_name=name)

        partial = reader.take("partial", _F.to_bool, False)
        stages = reader.require(
            "stages", lambda n, v: parse_stages(_F.to_str(n, v), partial=partial, field_name=n)
        )
        spec = cls(
            fleet=reader.require("fleet", _F.to_str),
            model=reader.require("model", _F.to_str),
            version=reader.require("version", _F.to_str),
            stages=stages,
            selector=reader.take("selector", text(_selector), LabelSelector()),
            bake=reader.require("bake", text(parse_bake)),
            max_rate=reader.require("max_rate", text(parse_rate)),
            failure_budget=reader.require("failure_budget", text(parse_failure_budget)),
            window=reader.take("window", _stored_window, None),
            control=reader.take("control", text(parse_control), "auto"),
            gates=reader.take("gates", _checked_gates, MappingProxyType({})),
            deadlines=reader.take("deadlines", _stored_deadlines, Deadlines()),
            spread=reader.take("spread", _stored_spread, DEFAULT_SPREAD),
        )
        reader.finish()
        return spec


def stored_reader(where: str, raw: object, fmt: int) -> Reader[InvalidInputError]:
    """A reader of a stored mapping whose `format` (absent: `fmt`) must be `fmt`."""
    reader = _F.reader(where, raw)
    found = reader.take("format", _F.to_int, fmt)
    if found != fmt:
        raise _F.fail(f"{where}.format", f"this build reads format {fmt}", found)
    return reader


def _selector(text: str, *, field_name: str = "selector") -> LabelSelector:
    try:
        return parse_selector(text)
    except InvalidInputError as exc:
        raise _F.fail(field_name, exc.message, text) from exc


def _stored_window(name: str, raw: object) -> MaintenanceWindow | None:
    if raw is None:
        return None
    reader = _F.reader(name, raw)
    window = parse_window(
        reader.require("cron", _F.to_str),
        reader.require("duration", _F.to_str),
        field_name=name,
    )
    reader.finish()
    return window


def _stored_deadlines(name: str, raw: object) -> Deadlines:
    reader = _F.reader(name, raw)
    chosen = {
        key: reader.require(key, lambda n, v: _duration(n, _F.to_str(n, v), _DEADLINE_BOUNDS))
        for key in get_args(DeadlineName)
        if reader.has(key)
    }
    reader.finish(get_args(DeadlineName))
    return Deadlines(**chosen)


def _stored_spread(name: str, raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise _F.fail(name, "must be a list of label keys", raw)
    return _checked_spread(name, tuple(_F.to_str(f"{name}[{i}]", k) for i, k in enumerate(raw)))


def parse_rollout_spec(
    *,
    fleet: str,
    model: str,
    version: str,
    stages: str,
    selector: str = "",
    bake: str = "30m",
    max_rate: str = "200/min",
    failure_budget: str = "2%",
    window: tuple[str, str] | None = None,
    control: str = "auto",
    gates: Mapping[str, Any] | None = None,
    deadlines: str = "",
    spread: str = ",".join(DEFAULT_SPREAD),
    partial: bool = False,
) -> RolloutSpec:
    """The spec from what an operator typed (`rollout create` options, or the API's
    strings); `window` is (`'cron 0 2 * * *'`, `3h`)."""
    return RolloutSpec(
        fleet=fleet,
        model=model,
        version=version,
        stages=parse_stages(stages, partial=partial),
        selector=_selector(selector),
        bake=parse_bake(bake),
        max_rate=parse_rate(max_rate),
        failure_budget=parse_failure_budget(failure_budget),
        window=None if window is None else parse_window(*window),
        control=parse_control(control),
        gates=MappingProxyType({}) if gates is None else gates,
        deadlines=parse_deadlines(deadlines),
        spread=parse_spread(spread),
    )
