"""An operator's ``runtime.yaml`` (``model push --runtime``) read into a model-bundle spec.

What it is for: reading the file safely (bounded size, YAML without duplicate keys) and
resolving ``labels_file``; the spec itself is parsed by the model bundle's own parser
(``protos.bundle.spec.parse_runtime_spec``), the one the node uses on the signed form. The
file holds ``preprocess:``, ``output:`` (``decoder:`` and its parameters) and either
``labels:`` (a list) or ``labels_file:`` (one label per line, the path relative to the
YAML file's directory). What it is not for: checking the spec against a model
(``control_plane.trust.custom.check_runtime``) or signing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

from control_plane.errors import InvalidInputError
from control_plane.trust.custom import bundle_input_error
from protos.bundle.spec import MAX_LABELS, BundleError, RuntimeSpec, parse_runtime_spec

__all__ = ["MAX_LABELS_FILE_BYTES", "MAX_RUNTIME_FILE_BYTES", "load_runtime_file"]

MAX_RUNTIME_FILE_BYTES: Final = 1024 * 1024
MAX_LABELS_FILE_BYTES: Final = 1024 * 1024
_FIELD: Final = "runtime"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice (``mean:`` twice would silently
    take the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _refuse(message: str, path: Path, field: str = _FIELD) -> InvalidInputError:
    return InvalidInputError(message, field=field, path=str(path))


def _read(path: Path, what: str, limit: int) -> bytes:
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise _refuse(f"{what} {path} is not a regular file", path)
        if size > limit:
            raise _refuse(f"{what} {path} is {size} bytes, over the {limit}-byte limit", path)
        data = path.read_bytes()
    except OSError as exc:
        raise _refuse(f"cannot read {what} {path}: {exc.strerror or exc}", path) from exc
    if len(data) > limit:
        raise _refuse(f"{what} {path} is over the {limit}-byte limit", path)
    return data


def _labels_from_file(value: object, runtime_path: Path) -> list[str]:
    field = "runtime.labels_file"
    if not isinstance(value, str) or not value.strip():
        raise _refuse(
            f"{runtime_path}: {field}: must be a file name, got {value!r}", runtime_path, field
        )
    path = Path(value)
    if not path.is_absolute():
        path = runtime_path.parent / path
    data = _read(path, "labels file", MAX_LABELS_FILE_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _refuse(f"labels file {path} is not UTF-8 text: {exc}", path, field) from exc
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()  # a trailing blank line is a file's last newline, not a class
    for number, line in enumerate(lines, start=1):
        if not line:
            # A blank line in the middle would shift every class id after it.
            raise _refuse(
                f"labels file {path}: line {number} is blank; one label per line, class 0 first",
                path,
                field,
            )
    if not lines:
        raise _refuse(f"labels file {path} holds no labels", path, field)
    if len(lines) > MAX_LABELS:
        raise _refuse(
            f"labels file {path} holds {len(lines)} labels, at most {MAX_LABELS}", path, field
        )
    return lines


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: where, what, and the construct it was in."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context:
        started = exc.context_mark
        where = (
            "" if started is None else f" at line {started.line + 1}, column {started.column + 1}"
        )
        text += f" ({exc.context}{where})"
    return text


def load_runtime_file(path: Path) -> RuntimeSpec:
    """Read and parse ``path``; InvalidInputError names the file and the field."""
    data = _read(path, "runtime file", MAX_RUNTIME_FILE_BYTES)
    try:
        document = yaml.load(data, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise _refuse(f"runtime file {path} is not valid YAML: {_yaml_problem(exc)}", path) from exc
    if not isinstance(document, dict):
        raise _refuse(
            f"runtime file {path} must hold a mapping (preprocess:, output:, labels:), "
            f"got {type(document).__name__}",
            path,
        )
    if "labels_file" in document:
        if "labels" in document:
            raise _refuse(
                f"{path}: give labels: or labels_file:, not both", path, "runtime.labels_file"
            )
        document = dict(document)
        document["labels"] = _labels_from_file(document.pop("labels_file"), path)
    try:
        return parse_runtime_spec(document, where="runtime", also_known=("labels_file",))
    except BundleError as exc:
        error = bundle_input_error(exc, "runtime")
        raise _refuse(f"{path}: {error.message}", path, error.fields["field"]) from exc
