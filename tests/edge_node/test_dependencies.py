"""The dependency rule (design §2): ``edge_node`` never imports ``control_plane``."""

from __future__ import annotations

import ast
from pathlib import Path

import edge_node

FORBIDDEN = ("control_plane",)


def test_edge_node_never_imports_the_control_plane() -> None:
    package = Path(edge_node.__file__).parent
    offenders = []
    for module in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(), filename=str(module))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{module.relative_to(package)}: {name}"
                for name in names
                if name.split(".")[0] in FORBIDDEN
            ]
    assert offenders == []
