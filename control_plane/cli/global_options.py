"""Lets the root options (`--server`, `--token`, `-o/--output`, `--log-format`) come after
the sub-command too: `edgefleet fleet list -o json` reads as `edgefleet -o json fleet list`.

Only rewrites the argument list; typer still parses and validates every option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# Every root option takes a value; no sub-command has an option of these names.
VALUE_OPTIONS: Final = frozenset({"--server", "--token", "--output", "-o", "--log-format"})
# `node run` hands its arguments to the node agent untouched.
PASS_THROUGH: Final = ("node", "run")


def hoist_global_options(argv: Sequence[str]) -> list[str]:
    """`argv` with the root options (and their values) moved to the front, in their order.

    A later occurrence still wins over an earlier one, as typer takes the last. Stops at
    `--` and at the arguments of `node run`; an option without a value is left where it is,
    for typer to report.
    """
    hoisted: list[str] = []
    rest: list[str] = []
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or tuple(words[:2]) == PASS_THROUGH:
            rest.extend(argv[i:])
            break
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if name in VALUE_OPTIONS:
            if arg != name:  # `--output=json` or `-ojson`
                hoisted.append(arg)
            elif i + 1 < len(argv):
                hoisted.extend(argv[i : i + 2])
                i += 1
            else:
                rest.append(arg)
        else:
            if not arg.startswith("-"):
                words.append(arg)
            rest.append(arg)
        i += 1
    return [*hoisted, *rest]
