"""Run every benchmark in ``bench/`` with its defaults (``make bench``); it does not judge them.

A benchmark is a public module of this package with a ``main(argv)`` that returns an exit
code; private modules (``_name``) and this runner are skipped.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

RUNNER = "run_all"


def discover() -> list[str]:
    """Names of the benchmark modules, sorted, without importing them."""
    here = str(Path(__file__).resolve().parent)
    return sorted(
        info.name
        for info in pkgutil.iter_modules([here])
        if not info.ispkg and not info.name.startswith("_") and info.name != RUNNER
    )


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no options: every benchmark runs with its own defaults
    failed: list[str] = []
    for name in discover():
        module = importlib.import_module(f"bench.{name}")
        entry: Callable[[list[str]], int] | None = getattr(module, "main", None)
        if entry is None:
            continue
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.monotonic()
        try:
            code = entry([])
        except Exception as exc:  # one broken benchmark must not hide the others
            print(f"bench.{name} crashed: {type(exc).__name__}: {exc}", flush=True)
            code = 1
        print(f"=== bench.{name}: exit {code} in {time.monotonic() - started:.1f} s ===")
        if code:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
