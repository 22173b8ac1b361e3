"""The runtime's own errors, under the edge node's tree (``edge_node.errors``).

    InvalidInputError (edge_node.errors)
    ├── RuntimeConfigError   a runtime/stream/preprocess config that cannot be used as written
    ├── ModelLoadError       ONNX Runtime cannot load the model file
    ├── ModelSignatureError  the preprocess config does not fit the model's input signature
    └── BadFrameError        one frame cannot be used (shape, dtype, corrupt bytes, ...)
    EdgeNodeError (edge_node.errors)
    └── InferenceError       ONNX Runtime failed running an input the model was checked to take

They live here rather than in ``edge_node/errors.py`` because that file is shared by the
whole agent and these are raised and caught only inside the runtime.
"""

from __future__ import annotations

from typing import Any

from edge_node.errors import EdgeNodeError, InvalidInputError

__all__ = [
    "BadFrameError",
    "InferenceError",
    "ModelLoadError",
    "ModelSignatureError",
    "RuntimeConfigError",
]


class RuntimeConfigError(InvalidInputError):
    """A config value is missing, mistyped or out of range; ``fields['field']`` names it."""

    title = "invalid runtime config"


class ModelLoadError(InvalidInputError):
    title = "model cannot be loaded"


class ModelSignatureError(InvalidInputError):
    """The model's input and the preprocess config disagree; both sides are in ``fields``."""

    title = "model input does not match the preprocess config"


class BadFrameError(InvalidInputError):
    """A frame the runtime skips; ``reason`` is the counter label it is counted under."""

    title = "bad frame"

    def __init__(self, message: str, *, reason: str, **fields: Any) -> None:
        super().__init__(message, reason=reason, **fields)
        self.reason = reason


class InferenceError(EdgeNodeError):
    """``InferenceSession.run`` raised; the frame is counted as failed, the cause is chained."""

    title = "inference failed"
