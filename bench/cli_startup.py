"""How long `edgefleet` takes to start: `--help`, a group's `--help` and one real command,
each beside a bare `python -c pass` (and `import typer`) measured in the same run. Each
starts by the console script's entry point, the launcher (`control_plane.cli.launch:run`).

Wall time and CPU time (user + system, steadier on a busy machine) of fresh processes;
what `--help` may import is a test (tests/control_plane/cli/test_startup.py), not this.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench._harness import edgefleet_python_args
from bench._report import Report, parse_benchmark_args
from bench._util import REPO_ROOT, free_port, median

GOAL_S = 0.5
"""`edgefleet --help` and `edgefleet <group> --help` (issue 11)."""
ANCHOR = "python -c pass (anchor)"


def cases(dead_server: str, tree: Path) -> dict[str, list[str]]:
    cli = edgefleet_python_args(tree)
    return {
        ANCHOR: ["-c", "pass"],
        "python -c 'import typer' (library floor)": ["-c", "import typer"],
        "edgefleet --help": [*cli, "--help"],
        "edgefleet nodes --help": [*cli, "nodes", "--help"],
        # A real command up to its first request: parse, import httpx, connection refused.
        "edgefleet fleet list (refused)": [
            *cli,
            "fleet",
            "list",
            "--server",
            dead_server,
            "--token",
            "eft_bench",
        ],
    }


def time_once(args: list[str], tree: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of our interpreter with `args` in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="runs of each case (median)")
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a checkout to measure (repeatable, e.g. an older one to compare); default: this",
    )
    args = parse_benchmark_args(parser, argv, quick={"rounds": 1})
    trees: list[Path] = [t.resolve() for t in args.tree or [REPO_ROOT]]
    dead_server = f"http://127.0.0.1:{free_port()}"
    named = {tree: cases(dead_server, tree) for tree in trees}
    names = list(named[trees[0]])
    walls: dict[tuple[Path, str], list[float]] = {(t, n): [] for t in trees for n in names}
    cpus: dict[tuple[Path, str], list[float]] = {(t, n): [] for t in trees for n in names}
    for _ in range(args.rounds):  # interleaved, so load on the machine hits every case alike
        for tree in trees:
            for name, case in named[tree].items():
                wall, cpu = time_once(case, tree)
                walls[(tree, name)].append(wall)
                cpus[(tree, name)].append(cpu)
    report = Report("cli_startup")
    for tree in trees:
        anchor = median(walls[(tree, ANCHOR)])
        print(f"\n{tree} ({args.rounds} rounds; seconds)")
        print(f"{'case':42} {'wall med':>8} {'wall min':>8} {'- anchor':>8} {'CPU med':>8}")
        for name in names:
            wall_med = median(walls[(tree, name)])
            print(
                f"{name:42} {wall_med:8.3f} {min(walls[(tree, name)]):8.3f} "
                f"{wall_med - anchor:8.3f} {median(cpus[(tree, name)]):8.3f}"
            )
            is_help = name.endswith("--help")
            report.figure(
                f"{name} [{tree.name}]" if len(trees) > 1 else name,
                wall_med,
                "s",
                anchor=anchor,
                anchor_name=ANCHOR,
                goal=f"< {GOAL_S} s (median wall)" if is_help else "",
                # a goal of this tree; another (``--tree``) is only a comparison
                met=wall_med < GOAL_S if is_help and tree == trees[0] else None,
            )
    print(f"\n{report.load_line()}")
    return report.finish(args, {"wall_s": _raw(walls), "cpu_s": _raw(cpus)})


def _raw(samples: dict[tuple[Path, str], list[float]]) -> dict[str, list[float]]:
    return {f"{tree} | {name}": values for (tree, name), values in samples.items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
