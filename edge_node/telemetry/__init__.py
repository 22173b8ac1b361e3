"""The node's health telemetry: latency per model version, drift, memory trend, system.

``Telemetry`` (``telemetry``) is what the agent uses: the pipeline's result path records
frames into it, the health loop asks it for one ``edgefleet.agent.health/2`` report per
window. Pure cores: ``latency`` (window sketches, drift baselines), ``memory`` (Theil-Sen
RSS slope, leak judgement), ``report`` (the document's sections, bounded size) and
``config``; adapters: ``probe`` (psutil, disk) and ``thermal`` (sysfs). The sketch itself
and its wire form live in ``protos.latency_sketch``, shared with the control plane.
Nothing here imports ``control_plane``; importing this package starts nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_node.telemetry.config import TelemetryConfig, parse_telemetry_config
    from edge_node.telemetry.latency import DriftReading, LatencyBook, LatencyWindow, RatioReading
    from edge_node.telemetry.memory import RssTrend, RssTrendReading, downsample, theil_sen_slope
    from edge_node.telemetry.probe import SystemProbe, SystemSample
    from edge_node.telemetry.report import HEALTH_SCHEMA
    from edge_node.telemetry.report import encode as encode_report
    from edge_node.telemetry.telemetry import ErrorLogHandler, FrameTiming, Probe, Telemetry
    from edge_node.telemetry.thermal import ThermalReading, read_thermal, throttling

__all__ = [
    "HEALTH_SCHEMA",
    "DriftReading",
    "ErrorLogHandler",
    "FrameTiming",
    "LatencyBook",
    "LatencyWindow",
    "Probe",
    "RatioReading",
    "RssTrend",
    "RssTrendReading",
    "SystemProbe",
    "SystemSample",
    "Telemetry",
    "TelemetryConfig",
    "ThermalReading",
    "downsample",
    "encode_report",
    "parse_telemetry_config",
    "read_thermal",
    "theil_sen_slope",
    "throttling",
]

# Public name -> (module, attribute), loaded on first use (PEP 562)
# so that importing a pure submodule (`config`, `latency`, `memory`, `report`)
# does not load psutil or ONNX Runtime through this package.
_EXPORTS: dict[str, tuple[str, str]] = {
    "HEALTH_SCHEMA": ("edge_node.telemetry.report", "HEALTH_SCHEMA"),
    "DriftReading": ("edge_node.telemetry.latency", "DriftReading"),
    "ErrorLogHandler": ("edge_node.telemetry.telemetry", "ErrorLogHandler"),
    "FrameTiming": ("edge_node.telemetry.telemetry", "FrameTiming"),
    "LatencyBook": ("edge_node.telemetry.latency", "LatencyBook"),
    "LatencyWindow": ("edge_node.telemetry.latency", "LatencyWindow"),
    "Probe": ("edge_node.telemetry.telemetry", "Probe"),
    "RatioReading": ("edge_node.telemetry.latency", "RatioReading"),
    "RssTrend": ("edge_node.telemetry.memory", "RssTrend"),
    "RssTrendReading": ("edge_node.telemetry.memory", "RssTrendReading"),
    "SystemProbe": ("edge_node.telemetry.probe", "SystemProbe"),
    "SystemSample": ("edge_node.telemetry.probe", "SystemSample"),
    "Telemetry": ("edge_node.telemetry.telemetry", "Telemetry"),
    "TelemetryConfig": ("edge_node.telemetry.config", "TelemetryConfig"),
    "ThermalReading": ("edge_node.telemetry.thermal", "ThermalReading"),
    "downsample": ("edge_node.telemetry.memory", "downsample"),
    "encode_report": ("edge_node.telemetry.report", "encode"),
    "parse_telemetry_config": ("edge_node.telemetry.config", "parse_telemetry_config"),
    "read_thermal": ("edge_node.telemetry.thermal", "read_thermal"),
    "theil_sen_slope": ("edge_node.telemetry.memory", "theil_sen_slope"),
    "throttling": ("edge_node.telemetry.thermal", "throttling"),
}


def __getattr__(name: str) -> object:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
