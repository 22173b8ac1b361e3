"""The one report writer of the benchmarks: each figure beside its anchor (the bare
baseline measured in the same run) and its goal, printed, and written as JSON and as
markdown table rows for docs/benchmarks.md.

Not here: measuring, or judging beyond "goal met"; a benchmark says what its figures are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench._util import git_describe


def machine(**extra: Any) -> dict[str, Any]:
    """What a figure was measured on; ``extra`` is what a benchmark's figures also depend
    on (a library's version, the CPU it pinned itself to)."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "commit": git_describe(),
        **extra,
    }


def parse_benchmark_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, *, quick: Mapping[str, Any]
) -> argparse.Namespace:
    """Parse `argv` with a benchmark's own options and those every benchmark takes:
    ``--quick``, which sets the options in `quick` (whatever the command line said) for
    the shortest run that still goes through every path, and `_add_report_arguments`."""
    shortest = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in quick.items())
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"the shortest run, {shortest} (a smoke run: its figures mean nothing)",
    )
    _add_report_arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args


def _add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--markdown`` and ``--check``, the same for every benchmark."""
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the whole report as JSON here"
    )
    parser.add_argument(
        "--markdown", type=Path, default=None, help="also write the figures as markdown rows"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure, the anchor it is read against and the goal it is held to."""

    name: str
    value: float
    unit: str
    anchor: float | None = None
    anchor_name: str = ""
    goal: str = ""
    met: bool | None = None

    @property
    def ratio(self) -> float | None:
        if self.anchor is None or not self.anchor or math.isnan(self.anchor):
            return None
        return self.value / self.anchor


@dataclass
class Report:
    """Figures and goals of one benchmark run; `finish()` prints, writes and decides."""

    benchmark: str
    machine: dict[str, Any] = field(default_factory=machine)
    figures: list[Figure] = field(default_factory=list)
    goals: list[tuple[str, bool]] = field(default_factory=list)
    load_start: tuple[float, float, float] = field(default_factory=os.getloadavg)

    def figure(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        anchor: float | None = None,
        anchor_name: str = "",
        goal: str = "",
        met: bool | None = None,
    ) -> None:
        """Add a figure; one judged against its goal (``met`` given) is also a goal of the
        run, stated once, here: "name: value (ratio x anchor) (goal ...)"."""
        figure = Figure(name, value, unit, anchor, anchor_name, goal, met)
        self.figures.append(figure)
        if met is not None:
            ratio = "" if figure.ratio is None else f" = {figure.ratio:.2f} x {anchor_name}"
            self.goals.append((f"{name}: {_number(value)} {unit}{ratio} (goal {goal})", met))

    def goal(self, text: str, met: bool) -> None:
        """A goal no single figure states."""
        self.goals.append((text, met))

    @property
    def all_met(self) -> bool:
        return all(met for _, met in self.goals)

    def load_line(self) -> str:
        start, end = self.load_start, os.getloadavg()
        return (
            f"load average (1/5/15 min) at start {start[0]:.2f}/{start[1]:.2f}/{start[2]:.2f}, "
            f"at end {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f} on {os.cpu_count()} CPUs"
        )

    def print_goals(self) -> bool:
        """Print each goal as met/MISSED; True when every goal was met."""
        for text, met in self.goals:
            print(f"  [{'met' if met else 'MISSED'}] {text}")
        return self.all_met

    def markdown_rows(self) -> list[str]:
        """``| benchmark | figure | value | anchor | ratio | goal | met |``, one row a figure."""
        rows = [
            "| benchmark | figure | value | anchor | ratio | goal | met |",
            "| --- | --- | ---: | ---: | ---: | --- | --- |",
        ]
        for f in self.figures:
            anchor = "" if f.anchor is None else f"{_number(f.anchor)} {f.unit} ({f.anchor_name})"
            ratio = "" if f.ratio is None else f"{f.ratio:.2f}"
            met = "" if f.met is None else ("yes" if f.met else "**no**")
            rows.append(
                f"| {self.benchmark} | {f.name} | {_number(f.value)} {f.unit} | {anchor} "
                f"| {ratio} | {f.goal} | {met} |"
            )
        return rows

    def finish(
        self,
        args: argparse.Namespace,
        raw: Mapping[str, Any] | None = None,
        *,
        print_goals: bool = True,
    ) -> int:
        """Print the goals; write ``--json`` and ``--markdown``; the exit code ``--check`` asks.

        The JSON has one shape for every benchmark: benchmark, machine, args, load_average,
        figures, goals, and the benchmark's own `raw` data under ``results``, where its keys
        cannot overwrite the writer's."""
        if print_goals:
            self.print_goals()
        json_path: Path | None = getattr(args, "json", None)
        if json_path is not None:
            document = {
                "benchmark": self.benchmark,
                "machine": self.machine,
                "args": {k: str(v) for k, v in vars(args).items()},
                "load_average": {"start": self.load_start, "end": os.getloadavg()},
                "figures": [asdict(f) for f in self.figures],
                "goals": [{"goal": text, "met": met} for text, met in self.goals],
                "results": dict(raw or {}),
            }
            json_path = Path(json_path)
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(document, indent=2, default=str))
        markdown_path: Path | None = getattr(args, "markdown", None)
        if markdown_path is not None:
            markdown_path = Path(markdown_path)
            markdown_path.parent.mkdir(parents=True, exist_ok=True)
            markdown_path.write_text("\n".join(self.markdown_rows()) + "\n")
        return 1 if getattr(args, "check", False) and not self.all_met else 0


def _number(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
