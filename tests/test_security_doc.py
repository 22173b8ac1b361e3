"""docs/security.md stays true: every test its attack table names exists, and every
attack row names one. Cheap on purpose: it reads file and function names, it does not
collect or import the tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
TEST_ID = re.compile(r"`([\w/]+\.py)::(test_\w+)`")


def _attack_rows() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Attack classes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [row for row in rows if not row.startswith(("| attack |", "|---"))]


def test_every_test_the_security_table_names_exists() -> None:
    named = TEST_ID.findall(DOC.read_text())
    assert len(named) >= 40
    missing = []
    for path, name in named:
        source = ROOT / "tests" / path
        defined = source.is_file() and re.search(
            rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE
        )
        if not defined:
            missing.append(f"{path}::{name}")
    assert missing == []


def test_every_attack_row_names_a_module_and_a_test() -> None:
    rows = _attack_rows()
    assert len(rows) >= 40
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 3, row
        attack, stopped_in, proved_by = cells
        assert attack, row
        assert "`" in stopped_in or "python-tuf" in stopped_in, row
        assert TEST_ID.search(proved_by), row


def test_the_readme_and_the_architecture_link_the_threat_model() -> None:
    assert "docs/security.md" in (ROOT / "README.md").read_text()
    assert "security.md" in (ROOT / "docs" / "architecture.md").read_text()
