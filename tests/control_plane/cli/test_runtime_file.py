"""An operator's runtime.yaml: parsed by the model bundle's parser, refused with the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.cli.runtime_file import load_runtime_file
from control_plane.errors import InvalidInputError

GOOD = """\
preprocess:
  layout: NHWC
  size: [480, 640]
  mean: [0.5]
  std: 0.25
  channel_order: BGR
output:
  decoder: raw
  threshold: 0.3
"""


def write(tmp_path: Path, text: str, name: str = "runtime.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_runtime_file_parses_into_the_bundle_spec(tmp_path: Path) -> None:
    spec = load_runtime_file(write(tmp_path, GOOD))
    assert spec.preprocess.layout == "NHWC"
    assert spec.preprocess.size == (480, 640)
    assert spec.preprocess.mean == (0.5,)
    assert spec.preprocess.std == (0.25,)
    assert spec.preprocess.channel_order == "BGR"
    assert spec.output.decoder == "raw"
    assert spec.output.threshold == 0.3
    assert spec.labels == ()


def test_labels_inline_and_from_a_file_relative_to_the_yaml(tmp_path: Path) -> None:
    inline = load_runtime_file(
        write(tmp_path, "output: {decoder: classification}\nlabels: [cat, dog]\n")
    )
    assert inline.labels == ("cat", "dog")
    sub = tmp_path / "conf"
    sub.mkdir()
    (sub / "names.txt").write_text("cat\n dog \r\nbird\n\n")  # trailing blanks, CRLF, spaces
    from_file = load_runtime_file(
        write(sub, "output: {decoder: classification}\nlabels_file: names.txt\n")
    )
    assert from_file.labels == ("cat", "dog", "bird")


@pytest.mark.parametrize(
    ("text", "field", "shown"),
    [
        ("output: {decoder: ssd}\n", "runtime.output.decoder", "ssd"),
        ("output: {decoder: raw, top_k: 3}\n", "runtime.output.top_k", "unknown key"),
        ("preprocess: {meen: [1]}\noutput: {decoder: raw}\n", "runtime.preprocess.meen", "meen"),
        ("preprocess: {std: [0]}\noutput: {decoder: raw}\n", "runtime.preprocess.std", "> 0"),
        ("preprocess: {layout: NCWH}\noutput: {decoder: raw}\n", "runtime.preprocess.layout", ""),
        ("preprocess: {layout: NCHW}\n", "runtime.output", "required"),
        ("output: {decoder: classification}\nlabels: [a, 3]\n", "runtime.labels[1]", "quote"),
        ("outputs: {decoder: raw}\n", "runtime.outputs", "labels_file"),
        ("- a list\n", "runtime", "mapping"),
        ("", "runtime", "mapping"),
        ("preprocess: [unclosed\n", "runtime", "not valid YAML"),
        ("output: {decoder: raw}\noutput: {decoder: yolo}\n", "runtime", "given twice"),
        (
            "output: {decoder: classification}\nlabels: [a]\nlabels_file: l.txt\n",
            "runtime.labels_file",
            "not both",
        ),
        ("output: {decoder: classification}\nlabels_file: nope.txt\n", "runtime", "nope.txt"),
        ("output: {decoder: classification}\nlabels_file: 3\n", "runtime.labels_file", "file"),
    ],
)
def test_bad_runtime_files_name_the_field(
    tmp_path: Path, text: str, field: str, shown: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidInputError) as info:
        load_runtime_file(path)
    assert info.value.fields["field"] == field
    assert shown in info.value.message
    assert str(tmp_path) in info.value.message  # which file


def test_a_blank_line_inside_a_labels_file_is_refused(tmp_path: Path) -> None:
    # It would shift every class id after it.
    (tmp_path / "l.txt").write_text("cat\n\ndog\n")
    path = write(tmp_path, "output: {decoder: classification}\nlabels_file: l.txt\n")
    with pytest.raises(InvalidInputError, match="line 2 is blank"):
        load_runtime_file(path)


def test_missing_directory_and_oversized_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot read runtime file"):
        load_runtime_file(tmp_path / "absent.yaml")
    with pytest.raises(InvalidInputError, match="not a regular file"):
        load_runtime_file(tmp_path)
    big = write(tmp_path, "#" * (1024 * 1024 + 1))
    with pytest.raises(InvalidInputError, match="over the"):
        load_runtime_file(big)
