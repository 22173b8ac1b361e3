"""The rules file adapter: read a YAML file, hand its document to ``parse_rules``.

A local file for now; later the node's signed desired state carries the same document.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from edge_node.aggregation.config import RulesFile, parse_rules
from edge_node.aggregation.errors import RulesConfigError

__all__ = ["MAX_RULES_FILE_BYTES", "load_rules_file"]

MAX_RULES_FILE_BYTES = 1_000_000


def load_rules_file(path: Path) -> RulesFile:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_RULES_FILE_BYTES + 1)
    except OSError as exc:
        raise RulesConfigError(str(path), f"cannot be read: {exc.strerror or exc}") from exc
    if len(data) > MAX_RULES_FILE_BYTES:
        raise RulesConfigError(str(path), f"larger than {MAX_RULES_FILE_BYTES} bytes")
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise RulesConfigError(str(path), f"not YAML: {exc}") from exc
    return parse_rules({} if doc is None else doc)
