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
