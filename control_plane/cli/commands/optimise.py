"""`edgefleet model quantize|compare`: an INT8 model from an FP32 one, and how far two agree.

Both run on the operator's machine, offline (no server, no keys). ONNX, ONNX Runtime and
numpy load inside the commands (`edgefleet --help` stays cheap); the work is in
`control_plane.registry.quantization` and `control_plane.registry.model_compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from control_plane.cli.commands.registry import model_app
from control_plane.cli.context import CliContext, cli_context

Runtime = Annotated[
    Path | None,
    typer.Option(
        help="runtime.yaml (as pushed): how images become the model's input and how its "
        "outputs are decoded; needed for a folder of images"
    ),
]


@model_app.command("compare")
def model_compare(
    ctx: typer.Context,
    a: Annotated[Path, typer.Argument(help="the reference model (e.g. FP32)")],
    b: Annotated[Path, typer.Argument(help="the model compared with it (e.g. INT8)")],
    data: Annotated[Path, typer.Option(help="folder of images (.png, .jpg) or .npy tensors")],
    runtime: Runtime = None,
) -> None:
    """Run A and B on every sample and report, per output, how far B strays from A
    (max/mean absolute error, cosine similarity and SQNR at the 5th percentile over
    samples) and, with --runtime, how often the decoded results agree."""
    from control_plane.registry.model_compare import check_same_signature, compare_models
    from control_plane.registry.model_data import open_samples
    from control_plane.registry.onnx_inspect import inspect_model

    cli = cli_context(ctx)
    spec = _runtime(runtime)
    info_a, info_b = inspect_model(a), inspect_model(b)
    check_same_signature(info_a, info_b)
    samples = open_samples(data, info_a, spec)
    report = {
        "a": str(a),
        "b": str(b),
        "data": str(data),
        "kind": samples.kind,
        "coverage": None if samples.coverage is None else samples.coverage.to_report(),
        **compare_models(a, b, samples).to_report(),
    }
    _emit(cli, report)


@model_app.command("quantize")
def model_quantize(
    ctx: typer.Context,
    model: Annotated[Path, typer.Argument(help="the FP32 model")],
    calibration: Annotated[
        Path, typer.Option(help="folder of images (.png, .jpg) or .npy tensors")
    ],
    # Not `-o`: that is the root's --output (table | json), which may follow any command.
    output: Annotated[Path, typer.Option("--out", help="the INT8 model to write")],
    runtime: Runtime = None,
    method: Annotated[
        str, typer.Option(help="static (QDQ, calibrated) | dynamic (weights only)")
    ] = "static",
    per_channel: Annotated[bool, typer.Option(help="one scale per output channel")] = False,
    calibration_method: Annotated[
        str,
        typer.Option(help="static only: minmax | percentile (clips rare extremes) | entropy"),
    ] = "minmax",
    activations: Annotated[
        str,
        typer.Option(
            help="static only: int8 | int16 (for heavy-tailed activations; com.microsoft "
            "Q/DQ, ONNX Runtime only, slower)"
        ),
    ] = "int8",
    exclude: Annotated[
        list[str] | None, typer.Option(help="a node kept in float (repeatable)")
    ] = None,
    auto_exclude: Annotated[
        bool,
        typer.Option(
            help="keep nodes in float, one at a time, until the agreement reaches --target"
        ),
    ] = False,
    target: Annotated[
        float,
        typer.Option(
            help="with --auto-exclude: the weakest of every output's 5th-percentile cosine "
            "and the decoded top-1 agreement or box recall"
        ),
    ] = 0.99,
    reference: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="float baseline first: a .npz of input/<name> and output/<name> arrays (and "
            "optionally the frame the input was made from) that the FP32 model must "
            "reproduce in ONNX Runtime before anything is quantized",
        ),
    ] = None,
) -> None:
    """Quantize with ONNX Runtime (QDQ, QInt8 activations and weights, MinMax calibration on
    the images through the node's own preprocessing, unless --activations int16 or
    --calibration-method say otherwise), check the result and report how far
    it agrees with the FP32 model on the calibration set, per output and per layer;
    --auto-exclude keeps nodes in float until the agreement reaches --target."""
    from control_plane.errors import InvalidInputError
    from control_plane.registry.model_data import MIN_CALIBRATION_SAMPLES, open_samples
    from control_plane.registry.onnx_inspect import inspect_model
    from control_plane.registry.quantization import (
        Activations,
        Calibration,
        QuantizeOptions,
        quantize_model,
    )

    cli = cli_context(ctx)
    if method not in ("static", "dynamic"):
        raise InvalidInputError(f"--method must be static or dynamic, got {method!r}")
    spec = _runtime(runtime)
    info = inspect_model(model)
    samples = open_samples(
        calibration, info, spec, minimum=MIN_CALIBRATION_SAMPLES, what="calibration"
    )
    options = QuantizeOptions(
        method="static" if method == "static" else "dynamic",
        per_channel=per_channel,
        calibration=cast("Calibration", calibration_method),
        activations=cast("Activations", activations),
        exclude=tuple(exclude or ()),
        auto_target=target if auto_exclude else None,
    )
    baseline = None
    if reference is not None:
        from control_plane.errors import InvalidModelError
        from control_plane.registry.float_baseline import check_float_baseline, mismatch_message

        baseline = check_float_baseline(model, info, reference, spec)
        if not baseline["matches"]:
            raise InvalidModelError(mismatch_message(baseline), path=str(reference))
    report = quantize_model(model, output, samples, options)
    _emit(cli, {**report, "float_baseline": baseline} if baseline is not None else report)


def settings_text(settings: dict[str, Any]) -> str:
    """The quantizer's settings in one line: `static QDQ, activations QInt8, weights QInt8
    (per tensor), MinMax; in float: fc`."""
    parts = [f"{settings['method']} {settings['format']}"]
    if "activation_type" in settings:
        parts.append(f"activations {settings['activation_type']}")
    scope = "per channel" if settings["per_channel"] else "per tensor"
    parts.append(f"weights {settings['weight_type']} ({scope})")
    if "calibration" in settings:
        parts.append(settings["calibration"])
    excluded = settings.get("nodes_excluded") or []
    text = ", ".join(parts)
    return text + (f"; in float: {', '.join(excluded)}" if excluded else "")


def _runtime(path: Path | None) -> Any:
    if path is None:
        return None
    from control_plane.cli.runtime_file import load_runtime_file

    return load_runtime_file(path)


def _emit(cli: CliContext, report: dict[str, Any]) -> None:
    """JSON as it is, or the figures as tables and the warnings on stderr-like lines."""
    if cli.output == "json":
        cli.emit(report)
        return
    from rich.table import Table

    coverage = report.get("coverage")
    agreement = report.get("agreement", report)
    head = {
        k: v
        for k, v in report.items()
        if k
        not in {
            "coverage",
            "agreement",
            "outputs",
            "decoded",
            "latency",
            "layers",
            "warnings",
            "float_baseline",
        }
    }
    settings = head.get("settings")
    if isinstance(settings, dict):
        head["settings"] = settings_text(settings)
    cli.emit(head)
    if coverage is not None:
        b, c = coverage["brightness_p5_p50_p95"], coverage["contrast_p5_p50_p95"]
        bands = ", ".join(f"{k} {v}" for k, v in coverage["bands"].items())
        cli.console.print(
            f"coverage: {coverage['images']} images; brightness p5/p50/p95 {b[0]}/{b[1]}/{b[2]}"
            f" (of 255), contrast {c[0]}/{c[1]}/{c[2]}; {bands}",
            soft_wrap=True,
        )
        if coverage.get("classes"):
            counts = ", ".join(f"{k} {v}" for k, v in coverage["classes"].items())
            cli.console.print(f"classes: {counts}", soft_wrap=True)
    table = Table(title=f"per output, {agreement['samples']} samples")
    columns = [
        "output",
        "max_abs",
        "mean_abs",
        "cosine_min",
        "cosine_p5",
        "sqnr_db_p5",
        "sqnr_db_p50",
    ]
    for col in columns:
        table.add_column(col)
    for row in agreement["outputs"]:
        table.add_row(*[str(row[col]) for col in columns])
    cli.console.print(table)
    layers = report.get("layers")
    if layers:
        worst = Table(title="per layer, worst first (SQNR of the dequantized tensor, dB)")
        for col in ("tensor", "node", "op", "sqnr_db_p5", "sqnr_db_p50"):
            worst.add_column(col)
        for row in layers[:5]:
            worst.add_row(*[str(row[col]) for col in ("tensor", "node", "op", "sqnr_db_p5",
                                                       "sqnr_db_p50")])  # fmt: skip
        cli.console.print(worst)
    baseline = report.get("float_baseline")
    if baseline:
        figures = ", ".join(f"{o['output']} cosine {o['cosine']}" for o in baseline["outputs"])
        pre = "" if baseline["preprocess"] is None else ", preprocessing reproduces its input"
        cli.console.print(
            f"float baseline: ONNX Runtime FP32 matches {baseline['reference']} ({figures}{pre})",
            soft_wrap=True,
        )
    search = report.get("auto_exclude")
    if search:
        kept = ", ".join(search["kept_in_float"]) or "nothing"
        cli.console.print(
            f"auto-exclude: kept in float: {kept} (agreement {search['score_before']} -> "
            f"{search['score']}, target {search['target']})",
            soft_wrap=True,
        )
    decoded = agreement.get("decoded")
    if decoded is not None:
        figures = ", ".join(f"{k} {v}" for k, v in decoded.items() if k not in {"kind"})
        cli.console.print(f"decoded ({decoded['kind']}): {figures}", soft_wrap=True)
    latency = agreement.get("latency")
    if latency:
        a, b, cpu = latency["a"], latency["b"], latency["cpu"]
        features = ", ".join(cpu["int8_features"]) or "none reported"
        cli.console.print(
            f"latency ({latency['threads']} thread, {a['runs']} runs each): "
            f"A P50 {a['p50_ms']} ms, P99 {a['p99_ms']} ms; B P50 {b['p50_ms']} ms, "
            f"P99 {b['p99_ms']} ms; {cpu['machine']}, int8 features: {features}",
            soft_wrap=True,
        )
    warnings = [*(coverage or {}).get("warnings", []), *agreement.get("warnings", [])]
    if search and not search["reached"]:
        warnings.append(
            f"--auto-exclude did not reach the target {search['target']} (best "
            f"{search['score']}); the model written is the best found"
        )
    for warning in warnings:
        cli.console.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)
