"""The runtime package's public surface: what ``__all__`` names exists, sorted, and nothing
in the runtime reaches into the control plane."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "edge_node.runtime",
    "edge_node.runtime.config",
    "edge_node.runtime.errors",
    "edge_node.runtime.pipeline",
    "edge_node.runtime.preprocess",
    "edge_node.runtime.session",
    "edge_node.runtime.streams",
    "edge_node.runtime.timing",
]


def isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=isort_key)
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.{attribute}"


def test_every_runtime_error_is_an_edge_node_error() -> None:
    from edge_node.errors import EdgeNodeError, InvalidInputError
    from edge_node.runtime import errors

    for attribute in errors.__all__:
        error = getattr(errors, attribute)
        assert issubclass(error, EdgeNodeError)
        if attribute != "InferenceError":
            assert issubclass(error, InvalidInputError)
