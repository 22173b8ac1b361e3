"""Config parsing: unknown keys, wrong types and unsafe values fail loudly, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from edge_node.errors import InvalidInputError
from edge_node.runtime.config import (
    PreprocessConfig,
    SchedulerConfig,
    SessionConfig,
    StreamConfig,
    parse_preprocess_config,
    parse_runtime_config,
    parse_scheduler_config,
    parse_session_config,
    parse_stream_config,
    parse_streams,
)
from edge_node.runtime.errors import RuntimeConfigError


def test_a_full_runtime_section_parses() -> None:
    config = parse_runtime_config(
        {
            "session": {
                "intra_op_threads": 2,
                "inter_op_threads": 1,
                "graph_optimization": "extended",
                "execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                "allow_spinning": True,
            },
            "preprocess": {
                "layout": "NHWC",
                "size": [224, 320],
                "resize": "nearest",
                "mean": [0.485, 0.456, 0.406],
                "std": [0.229, 0.224, 0.225],
                "scale": 1 / 255,
                "channel_order": "BGR",
            },
            "streams": [
                {"name": "gate-a", "target_fps": 10, "priority": 5, "queue_size": 3},
                {"name": "yard", "motion_threshold": 2.5},
            ],
            "scheduler": {"max_backlog_frames": 8, "shed_after_s": 0.5},
        }
    )
    assert config.session == SessionConfig(
        intra_op_threads=2,
        graph_optimization="extended",
        execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        allow_spinning=True,
    )
    assert config.preprocess.size == (224, 320)
    assert config.preprocess.mean == (0.485, 0.456, 0.406)
    assert config.preprocess.layout == "NHWC"
    assert config.streams == (
        StreamConfig("gate-a", target_fps=10.0, priority=5, queue_size=3),
        StreamConfig("yard", motion_threshold=2.5),
    )
    assert config.scheduler == SchedulerConfig(max_backlog_frames=8, shed_after_s=0.5)


def test_defaults_are_explicit_and_safe() -> None:
    session = parse_session_config({})
    assert (session.intra_op_threads, session.inter_op_threads) == (1, 1)
    assert session.execution_providers == ("CPUExecutionProvider",)
    assert session.allow_spinning is False
    assert parse_preprocess_config({}) == PreprocessConfig()
    assert parse_scheduler_config({}) == SchedulerConfig()


def test_a_single_number_is_one_value_for_every_channel() -> None:
    config = parse_preprocess_config({"mean": 0.5, "std": 0.5})
    assert config.mean == (0.5,)
    assert config.std == (0.5,)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"meen": [0.5, 0.5, 0.5]}, "preprocess.meen"),  # a typo must not fall back to 0
        ({"layout": "CHW"}, "preprocess.layout"),
        ({"size": [224]}, "preprocess.size"),
        ({"size": [0, 224]}, "preprocess.size"),
        ({"size": "224x224"}, "preprocess.size"),
        ({"mean": [0.5, 0.5]}, "preprocess.mean"),
        ({"mean": "half"}, "preprocess.mean"),
        ({"std": [0.2, 0.0, 0.2]}, "preprocess.std"),
        ({"std": [0.2, float("nan"), 0.2]}, "preprocess.std"),
        ({"scale": 0}, "preprocess.scale"),
        ({"scale": True}, "preprocess.scale"),
        ({"dtype": "float64"}, "preprocess.dtype"),
        ({"dtype": "uint8"}, "preprocess.dtype"),  # uint8 with the default 1/255 scale
        ({"dtype": "uint8", "scale": 1, "mean": [0.5]}, "preprocess.dtype"),
        ({"channel_order": "RBG"}, "preprocess.channel_order"),
        ({"resize": "bicubic"}, "preprocess.resize"),
    ],
)
def test_preprocess_errors_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(RuntimeConfigError) as caught:
        parse_preprocess_config(raw)
    assert caught.value.fields["field"] == field
    assert isinstance(caught.value, InvalidInputError)


def test_uint8_input_with_identity_normalisation_is_fine() -> None:
    config = parse_preprocess_config({"dtype": "uint8", "scale": 1, "mean": 0, "std": 1})
    assert config.dtype == "uint8"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"intra_op_threads": 0}, "session.intra_op_threads"),
        ({"intra_op_threads": 1.5}, "session.intra_op_threads"),
        ({"inter_op_threads": "2"}, "session.inter_op_threads"),
        ({"graph_optimization": "max"}, "session.graph_optimization"),
        ({"execution_providers": []}, "session.execution_providers"),
        ({"execution_providers": "CPUExecutionProvider"}, "session.execution_providers"),
        ({"execution_providers": ["cuda"]}, "session.execution_providers"),
        ({"execution_mode": "async"}, "session.execution_mode"),
        ({"allow_spinning": "no"}, "session.allow_spinning"),
        ({"threads": 4}, "session.threads"),
    ],
)
def test_session_errors_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(RuntimeConfigError) as caught:
        parse_session_config(raw)
    assert caught.value.fields["field"] == field


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"target_fps": 10}, "stream.name: is required"),
        ({"name": "bad name"}, "stream.name"),
        ({"name": "a", "target_fps": 0}, "streams.a.target_fps"),
        ({"name": "a", "target_fps": 5000}, "streams.a.target_fps"),
        ({"name": "a", "queue_size": 0}, "streams.a.queue_size"),
        ({"name": "a", "priority": 1.5}, "streams.a.priority"),
        ({"name": "a", "motion_threshold": 300}, "streams.a.motion_threshold"),
        ({"name": "a", "fps": 10}, "unknown key(s) fps"),
    ],
)
def test_stream_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_stream_config(raw)


def test_stream_names_are_unique() -> None:
    with pytest.raises(RuntimeConfigError, match="unique"):
        parse_streams([{"name": "a"}, {"name": "a"}])


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        "session",
        {1: "x"},
    ],
)
def test_sections_must_be_mappings(raw: object) -> None:
    with pytest.raises(RuntimeConfigError):
        parse_session_config(raw)


def test_scheduler_errors() -> None:
    with pytest.raises(RuntimeConfigError, match="max_backlog_frames"):
        parse_scheduler_config({"max_backlog_frames": 0})
    with pytest.raises(RuntimeConfigError, match="shed_after_s"):
        parse_scheduler_config({"shed_after_s": -1})
    assert parse_scheduler_config({"shed_after_s": None}).shed_after_s is None


def test_unknown_top_level_section() -> None:
    with pytest.raises(RuntimeConfigError, match="unknown key"):
        parse_runtime_config({"sessions": {}})
