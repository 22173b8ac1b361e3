"""docs/architecture.md against the tree: its package map and its edge-node error tree.

A map that nobody can keep true is worse than none, so this test reads the two drawings
and fails when a module, a benchmark, a migration or an error class is added, moved or
removed without them. It reads files and imports `edge_node`; it changes nothing.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_architecture import PURE_CORES

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
ERROR_TREE_HEADING = "### The edge node's error tree"
TOP_LEVEL = ("control_plane/", "edge_node/", "device_sdk/", "protos/", "bench/")

# An entry line: up to four levels of two-space indentation, then a file or folder name.
_ENTRY = re.compile(
    r"^(?P<indent> {0,8})(?P<name>[\w.]+(?:/[\w.]+)*(?:/|\.py))(?:\s{2,}(?P<text>.*))?$"
)


@dataclass
class Entry:
    path: str  # relative to the repository root; folders end in "/"
    text: str
    children: list[Entry] = field(default_factory=list)

    @property
    def is_folder(self) -> bool:
        return self.path.endswith("/")


def fenced_block(heading: str) -> list[str]:
    """The lines of the first fenced block after a markdown heading."""
    lines = DOC.read_text().splitlines()
    start = lines.index(heading)
    opening = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1 : closing]


def package_map() -> list[Entry]:
    roots: list[Entry] = []
    stack: list[tuple[int, Entry]] = []
    last: Entry | None = None
    for line in fenced_block("## Package map"):
        match = _ENTRY.match(line)
        if match is None:
            assert last is not None and line.startswith(" " * 10), f"stray line: {line!r}"
            last.text += " " + line.strip()
            continue
        depth = len(match["indent"]) // 2
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1] if stack else None
        path = (parent.path if parent else "") + match["name"]
        last = Entry(path, match["text"] or "")
        (parent.children if parent else roots).append(last)
        if last.is_folder:
            stack.append((depth, last))
    return roots


def walk(entries: list[Entry]) -> list[Entry]:
    out: list[Entry] = []
    for entry in entries:
        out += [entry, *walk(entry.children)]
    return out


def hand_written(folder: Path) -> list[Path]:
    """The Python files a reader looks for: no package markers, no generated protobuf."""
    return sorted(
        p
        for p in folder.glob("*.py")
        if p.name != "__init__.py" and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


def is_package_with_code(folder: Path) -> bool:
    return any(hand_written(p.parent) for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_listed_path_exists() -> None:
    missing = [e.path for e in walk(package_map()) if not (ROOT / e.path).exists()]
    assert missing == []


def test_the_map_covers_every_top_level_part() -> None:
    assert {e.path for e in package_map()} >= set(TOP_LEVEL)


def test_every_module_of_an_expanded_folder_is_listed() -> None:
    """A folder drawn with its children lists every module and sub-package it has."""
    unlisted: list[str] = []
    for entry in walk(package_map()):
        if not (entry.is_folder and entry.children):
            continue
        folder = ROOT / entry.path
        listed = {child.path for child in entry.children}
        unlisted += [
            str(p.relative_to(ROOT))
            for p in hand_written(folder)
            if str(p.relative_to(ROOT)) not in listed
        ]
        unlisted += [
            f"{p.relative_to(ROOT)}/"
            for p in sorted(folder.iterdir())
            if p.is_dir()
            and p.name != "__pycache__"
            and (p / "__init__.py").exists()
            and is_package_with_code(p)
            and f"{p.relative_to(ROOT)}/" not in listed
        ]
    assert unlisted == []


def test_a_folder_drawn_in_one_line_names_each_of_its_modules() -> None:
    """`api/  … app.py, deps.py, routes/{health,…}.py`: each module's name appears in the line.

    Migrations are named by number: the line gives the range up to the newest revision.
    """
    unnamed: list[str] = []
    for entry in walk(package_map()):
        if not entry.is_folder or entry.children:
            continue
        folder = ROOT / entry.path
        if not folder.is_dir() or not any(folder.rglob("*.py")):
            continue
        words = set(re.findall(r"\w+", entry.text))
        revisions: list[str] = []
        for p in sorted(folder.rglob("*.py")):
            if p.name == "__init__.py" or p.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            number = re.match(r"(\d{4})_", p.name)
            if number:
                revisions.append(number[1])
            elif p.stem not in words:
                unnamed.append(str(p.relative_to(ROOT)))
        if revisions and max(revisions) not in words:
            unnamed.append(f"{entry.path}: newest revision {max(revisions)}")
    assert unnamed == []


def test_every_proto_file_is_named() -> None:
    text = "\n".join(fenced_block("## Package map"))
    protos = sorted(p for p in ROOT.rglob("*.proto") if ".venv" not in p.parts)
    assert protos, "no .proto files found"
    assert [str(p.relative_to(ROOT)) for p in protos if p.stem not in text] == []


def test_pure_marks_match_the_architecture_test() -> None:
    marked = {e.path for e in walk(package_map()) if e.text.startswith("PURE")}
    assert marked == set(PURE_CORES)


# --- the edge node's error tree -----------------------------------------------------------

_TREE_LINE = re.compile(r"^(?P<lead>[ │├└─]*)(?P<name>[A-Z]\w*Error)\b")


def parse_error_tree(lines: list[str]) -> dict[str, str | None]:
    """Class name -> its parent's name, from a drawing (lines without a class are skipped)."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match["lead"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        name = match["name"]
        assert name not in parents, f"{name} drawn twice"
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def real_error_tree() -> dict[str, str | None]:
    import edge_node
    from edge_node.errors import EdgeNodeError

    for module in pkgutil.walk_packages(edge_node.__path__, "edge_node."):
        importlib.import_module(module.name)
    found: dict[str, str | None] = {"EdgeNodeError": None}
    todo = [EdgeNodeError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__name__.startswith("_") or not sub.__module__.startswith("edge_node."):
                continue
            found[sub.__name__] = next(
                base.__name__ for base in sub.__mro__[1:] if not base.__name__.startswith("_")
            )
    return found


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_edge_error_tree_is_drawn_as_it_is() -> None:
    drawn = parse_error_tree(fenced_block(ERROR_TREE_HEADING))
    assert drawn == real_error_tree()


def test_the_tree_parser_sees_nesting() -> None:
    lines = [
        "EdgeNodeError",
        "├── BError",
        "│   └── CError",
        "│ the operator's fault:",
        "└── DError",
    ]
    assert parse_error_tree(lines) == {
        "EdgeNodeError": None,
        "BError": "EdgeNodeError",
        "CError": "BError",
        "DError": "EdgeNodeError",
    }
