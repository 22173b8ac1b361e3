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


def agent_argv(args: Sequence[str], *, log_format: str | None) -> list[str]:
    """`python -m edge_node`'s arguments for `node run ARGS`: the root's --log-format first,
    so that one given to the agent itself (later) wins."""
    root = ["--log-format", log_format] if log_format else []
    return ["run", *root, *args]


def node_run(argv: Sequence[str]) -> list[str] | None:
    """The agent's arguments when `argv` is `edgefleet [root options] node run ARGS`, else
    None: what the console script execs before the operator CLI loads. Of the root
    options only --log-format means anything to the agent."""
    args = hoist_global_options(argv)
    log_format: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if name not in VALUE_OPTIONS:
            break
        if arg == name:  # the value is the next word (hoisting kept the pair together)
            value, i = (args[i + 1] if i + 1 < len(args) else ""), i + 2
        else:
            value, i = arg[len(name) :].removeprefix("="), i + 1
        if name == "--log-format":
            log_format = value
    if tuple(args[i : i + 2]) != PASS_THROUGH:
        return None
    return agent_argv(args[i + 2 :], log_format=log_format)
