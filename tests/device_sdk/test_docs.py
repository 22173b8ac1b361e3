"""docs/device-sdk.md's firmware test is run as written, so the page cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "device-sdk.md"
MARKER = "This test runs in the repository's suite as written here:"


def test_the_documented_firmware_test_passes() -> None:
    text = DOC.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert block is not None
    namespace: dict[str, object] = {}
    exec(compile(block[1], str(DOC), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert len(tests) == 1
    tests[0]()
