"""`edgefleet keys|fleet|model ...`: offline keys, fleets and signed model versions.

TUF, the key store and ONNX inspection load inside the commands that use them, so that
`edgefleet --help` and `fleet list` do not pay for them (tests/control_plane/cli/test_startup.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from control_plane.cli.context import cli_context

keys_app = typer.Typer(help="Offline root keys and release keys.", no_args_is_help=True)
fleet_app = typer.Typer(help="Fleets and their TUF trust roots.", no_args_is_help=True)
model_app = typer.Typer(help="Signed model versions.", no_args_is_help=True)

PASSPHRASE_ENV = "EDGEFLEET_KEY_PASSPHRASE"
KeysDir = Annotated[
    Path, typer.Option("--keys", envvar="EDGEFLEET_KEYS", help="directory made by `keys init`")
]
VERSION_COLUMNS = [
    "model",
    "version",
    "release_counter",
    "sha256",
    "length",
    "runtime",
    "revoked",
    "created_at",
]


def _passphrase() -> bytes | None:
    value = os.environ.get(PASSPHRASE_ENV)
    return value.encode() if value else None


@keys_app.command("init")
def keys_init(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="directory to create")],
    root_keys: Annotated[int, typer.Option(min=1, max=15)] = 3,
    root_threshold: Annotated[int, typer.Option(min=1, max=15)] = 2,
    passphrase: Annotated[
        bool, typer.Option(help=f"encrypt private keys (prompted, or ${PASSPHRASE_ENV})")
    ] = False,
) -> None:
    """Create offline root keys (k-of-n) and a release key; private files are 0600."""
    from control_plane.trust.keys import init_operator_keys

    cli = cli_context(ctx)
    secret = _passphrase()
    if passphrase and secret is None:
        secret = typer.prompt("passphrase", hide_input=True, confirmation_prompt=True).encode()
    keyset = init_operator_keys(
        out, root_keys=root_keys, root_threshold=root_threshold, passphrase=secret
    )
    cli.emit(
        {
            "directory": str(out),
            "root_keyids": [k.keyid for k in keyset.root_public_keys],
            "root_threshold": keyset.root_threshold,
            "release_keyid": keyset.release_public_key.keyid,
            "encrypted": secret is not None,
        }
    )
    if cli.output != "json":
        cli.console.print("Keep the root keys offline; the release key signs model pushes.")


@keys_app.command("rotate-release")
def keys_rotate_release(
    ctx: typer.Context,
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    keys: KeysDir,
) -> None:
    """Revoke the fleet's release key: sign root N+1 naming a new one (needs root keys).

    The new key waits in release.key.new until the server accepts the new root; only
    then is the old key archived as release-<keyid>.revoked.key. Interrupted? Run the
    same command again: it resumes the pending rotation.
    """
    from control_plane.cli.release import ReleaseClient
    from control_plane.trust.keys import (
        commit_release_rotation,
        keyset_release_keyid,
        load_operator_keyset,
        pending_release_rotation,
        rotate_release_key,
    )

    cli = cli_context(ctx)
    secret = _passphrase()
    new_signer = pending_release_rotation(keys, secret)
    resumed = new_signer is not None
    result: dict[str, Any] = {"fleet": fleet, "already_rotated": True}
    if new_signer is None or keyset_release_keyid(keys) != new_signer.public_key.keyid:
        keyset = load_operator_keyset(keys, secret)
        with cli.client() as api:
            if new_signer is None:
                _, new_signer = rotate_release_key(keys, secret)
            result = ReleaseClient(api, keyset).rotate_release_key(fleet, new_signer)
    # else: keyset.json already names the new key, so the server had accepted it and
    # only the local commit was interrupted.
    old_keyid, new_keyid = commit_release_rotation(keys)
    cli.emit({**result, "resumed": resumed, "old_keyid": old_keyid, "release_keyid": new_keyid})
    if cli.output != "json":
        cli.console.print(
            f"Release key {old_keyid[:12]} is revoked; pushes are now signed with "
            f"{new_keyid[:12]}. Nodes pick up the new root on their next refresh."
        )


@keys_app.command("rotate-online")
def keys_rotate_online(
    ctx: typer.Context,
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    keys: KeysDir,
) -> None:
    """Replace the fleet's online snapshot/timestamp keys (one was stolen): needs root keys.

    The server makes new keys, you sign root N+1 naming them; nodes that trusted
    metadata forged with the old key recover on their next refresh. Safe to re-run.
    """
    from control_plane.cli.release import ReleaseClient
    from control_plane.trust.keys import load_operator_keyset

    cli = cli_context(ctx)
    keyset = load_operator_keyset(keys, _passphrase())
    with cli.client() as api:
        result = ReleaseClient(api, keyset).rotate_online_keys(fleet)
    cli.emit(result)
    if cli.output != "json":
        cli.console.print(
            f"Online keys {', '.join(k[:12] for k in result['revoked_keyids'])} are revoked; "
            "snapshot and timestamp are now signed with "
            f"{', '.join(k[:12] for k in result['online_keyids'].values())}. "
            "Delete the old key files from every replica's online-keys directory."
        )


@keys_app.command("rotate-director")
def keys_rotate_director(
    ctx: typer.Context,
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    keys: KeysDir,
) -> None:
    """List a new director key in the fleet's root (the old one was stolen): needs root keys.

    The server makes the key; root N+1 lists it alone. Nodes learn it at their next
    refresh and refuse assignments signed by any other key; their sequence floor starts
    again, so a forged sequence cannot lock them out.
    """
    from control_plane.cli.release import ReleaseClient
    from control_plane.trust.keys import load_operator_keyset

    cli = cli_context(ctx)
    keyset = load_operator_keyset(keys, _passphrase())
    with cli.client() as api:
        result = ReleaseClient(api, keyset).rotate_director_key(fleet)
    cli.emit(result)
    if cli.output != "json":
        cli.console.print(
            f"Fleet {fleet}'s assignments are now signed with director key "
            f"{result['director_keyid'][:12]}; nodes accept no other once they refresh."
        )


@fleet_app.command("create")
def fleet_create(ctx: typer.Context, name: str, keys: KeysDir) -> None:
    """Create a fleet: the server makes online keys, you sign the root with your root keys."""
    from control_plane.cli.release import ReleaseClient
    from control_plane.trust.keys import load_operator_keyset

    cli = cli_context(ctx)
    keyset = load_operator_keyset(keys, _passphrase())
    with cli.client() as api:
        fleet = ReleaseClient(api, keyset).create_fleet(name)
    cli.emit(fleet, ["name", "state", "created_at", "versions"])


@fleet_app.command("list")
def fleet_list(ctx: typer.Context) -> None:
    """List fleets and their metadata versions."""
    cli = cli_context(ctx)
    with cli.client() as api:
        cli.emit(api.json("GET", "/v1/fleets"), ["name", "state", "created_at", "versions"])


@model_app.command("push")
def model_push(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    name: Annotated[str, typer.Option(help="model name, e.g. detector")],
    version: Annotated[str, typer.Option(help="model version, e.g. 1.2.0")],
    keys: KeysDir,
    runtime: Annotated[
        Path | None,
        typer.Option(
            help="runtime.yaml: preprocess, output decoder, labels (signed with the version)"
        ),
    ] = None,
    reference_frame: Annotated[
        Path | None,
        typer.Option(
            help="with --runtime: the self-test frame (.npy HxWx3 uint8, .png, .jpg); "
            "default: a generated 640x480 image"
        ),
    ] = None,
    reference_input: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="without --runtime: .npy or .npz"),
    ] = None,
    min_agent_version: str = "0.1.0",
    provider: Annotated[
        list[str] | None, typer.Option(help="compatible execution providers (repeatable)")
    ] = None,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    baseline: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="the float model this one was made from: the push compares them on --data "
            "(as `model compare`), signs the report and is refused below the threshold",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="with --baseline: folder of images (.png, .jpg) or .npy tensors"),
    ] = None,
    min_agreement: Annotated[
        float | None,
        typer.Option(
            help="with --baseline: the threshold (default: top-1 agreement 0.99 for a "
            "classifier, box recall 0.9 for a detector, 5th-percentile cosine 0.99 for raw)"
        ),
    ] = None,
    baseline_reference: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="with --baseline: a .npz (input/<name>, output/<name>, optional frame) the "
            "float baseline must reproduce in ONNX Runtime first",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            help="with --baseline: push even below the threshold (audited; the signed report "
            "says forced)"
        ),
    ] = False,
) -> None:
    """Check, sign and publish a model version (the release key never leaves this machine).

    With --baseline the version is first compared with its float original on --data, on
    this machine; the report is signed with the version and `model show` displays it."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from control_plane.cli.release import ReleaseClient, describe
    from control_plane.cli.runtime_file import load_runtime_file
    from control_plane.errors import InvalidInputError
    from control_plane.trust.keys import load_operator_keyset

    cli = cli_context(ctx)
    spec = None if runtime is None else load_runtime_file(runtime)
    check = _release_check(file, baseline, data, spec, min_agreement, force, baseline_reference)
    keyset = load_operator_keyset(keys, _passphrase())
    with (
        cli.client() as api,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=cli.console,
            disable=cli.output == "json",
            transient=True,
        ) as bars,
    ):
        tasks: dict[str, int] = {}

        def progress(label: str, advance: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = int(bars.add_task(f"upload {label}", total=total))
            bars.advance(tasks[label], advance)  # type: ignore[arg-type]

        try:
            result = ReleaseClient(api, keyset).push_model(
                fleet,
                file,
                name=name,
                version=version,
                reference_input=reference_input,
                min_agent_version=min_agent_version,
                execution_providers=tuple(provider or ["CPUExecutionProvider"]),
                atol=atol,
                rtol=rtol,
                progress=progress,
                runtime=spec,
                reference_frame=reference_frame,
                release_check=check,
            )
        except InvalidInputError as exc:
            if runtime is None or not str(exc.fields.get("field", "")).startswith("runtime."):
                raise
            # Which file does not fit which model: the operator may keep several.
            raise InvalidInputError(
                f"{runtime} does not fit {file.name}: {exc.message}", **exc.fields
            ) from exc
    for warning in result.warnings:
        cli.console.print(f"[yellow]warning:[/yellow] {warning}")
    shown = {k: v for k, v in describe(result).items() if k != "warnings"}
    if cli.output != "json":
        shown["runtime"] = runtime_text(shown["runtime"])
        shown["reference"] = reference_text(shown["reference"])
        shown["release_check"] = release_check_text(shown["release_check"])
    cli.emit(shown)


def _release_check(
    file: Path,
    baseline: Path | None,
    data: Path | None,
    spec: Any,
    threshold: float | None,
    force: bool,
    reference: Path | None = None,
) -> Any:
    """The release gate (`registry.release_check`), before anything is read from or sent
    to the server; None without --baseline. Refused below the threshold unless --force."""
    from control_plane.errors import InvalidInputError, PolicyError

    if baseline is None:
        if data is not None or force or threshold is not None or reference is not None:
            raise InvalidInputError(
                "--data, --min-agreement, --baseline-reference and --force go with "
                "--baseline FP32.onnx",
                field="baseline",
            )
        return None
    if data is None:
        raise InvalidInputError(
            "--baseline needs --data DIR: the samples both models are compared on",
            field="data",
        )
    from control_plane.registry.release_check import refusal, run_release_check

    check = run_release_check(
        file, baseline, data, spec, threshold=threshold, forced=force, reference=reference
    )
    if check.verdict == "failed" and not force:
        raise PolicyError(refusal(check, file.name, baseline.name), field="baseline")
    return check


def release_check_text(report: dict[str, Any] | None) -> str:
    """A version's signed release check as lines for a table cell."""
    if report is None:
        return "- (pushed without --baseline)"
    from control_plane.registry.release_check import check_text
    from control_plane.trust.custom import parse_release_check

    try:
        check = parse_release_check(report)
    except Exception as exc:  # written by a newer CLI: shown as unreadable, not fatal
        return f"unreadable by this CLI: {exc}"
    lines = [check_text(check)]
    for output in check.outputs:
        figures = ", ".join(f"{k} {v}" for k, v in output.items() if k != "output")
        lines.append(f"output {output['output']}: {figures}")
    if check.decoded is not None:
        lines.append("decoded: " + ", ".join(f"{k} {v}" for k, v in check.decoded.items()))
    if check.coverage is not None:
        b = "/".join(check.coverage["brightness_p5_p50_p95"])
        c = "/".join(check.coverage["contrast_p5_p50_p95"])
        lines.append(
            f"coverage: {check.coverage['images']} images, brightness p5/p50/p95 {b}, contrast {c}"
        )
        lines += [f"warning: {w}" for w in check.coverage["warnings"]]
    return "\n".join(lines)


def runtime_text(summary: dict[str, Any] | None) -> str:
    """A version's runtime summary (`custom.runtime_summary`) as lines for a table cell."""
    if summary is None:
        return "- (none signed: the node's own preprocess config)"
    if "unreadable" in summary:
        return f"unreadable by this server: {summary['unreadable']}"
    pre = summary["preprocess"]
    size = "the model's" if pre["size"] is None else "x".join(str(d) for d in pre["size"])
    fit = pre["fit"] + (f" (pad {pre['pad_value']})" if "pad_value" in pre else "")
    params = ", ".join(f"{k} {_value(v)}" for k, v in summary["params"].items())
    output = f" of {summary['output']!r}" if summary.get("output") else ""
    labels = summary["first_labels"]
    more = summary["labels"] - len(labels)
    named = ", ".join(labels) + (f", … (+{more})" if more > 0 else "")
    return "\n".join(
        [
            f"preprocess: {pre['layout']} {pre['dtype']} {pre['channel_order']}, size {size}"
            f" (HxW), {fit}, {pre['resize']}",
            f"            scale {_value(pre['scale'])}, mean {_value(pre['mean'])}, "
            f"std {_value(pre['std'])}",
            f"output:     {summary['decoder']}{output}" + (f" ({params})" if params else ""),
            f"labels:     {summary['labels'] or '-'}" + (f" ({named})" if labels else ""),
        ]
    )


def runtime_brief(summary: dict[str, Any] | None) -> str:
    """One table cell: the decoder and how many labels, or `-` for a version without."""
    if summary is None:
        return "-"
    if "unreadable" in summary:
        return "unreadable"
    labels = summary["labels"]
    if not labels:
        return str(summary["decoder"])
    return f"{summary['decoder']}, {labels} label{'s' if labels != 1 else ''}"


def reference_text(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    inputs = ", ".join(f"{name} {shape}" for name, shape in summary["inputs"].items())
    frame = summary.get("frame")
    made = f"{frame[1]}x{frame[0]} frame ({summary['source']})" if frame else summary["source"]
    lines = [f"{made} -> {inputs}"]
    decoded = summary.get("decoded")
    if decoded is not None:
        results = "; ".join(decoded["results"]) or "nothing above the threshold"
        lines.append(f"decoded: {decoded['kind']}: {results}")
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


@model_app.command("list")
def model_list(
    ctx: typer.Context, fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")]
) -> None:
    """The latest version of every model in a fleet."""
    cli = cli_context(ctx)
    with cli.client() as api:
        cli.emit(
            _brief_runtime(cli.output, api.json("GET", f"/v1/fleets/{fleet}/models")),
            VERSION_COLUMNS,
        )


@model_app.command("show")
def model_show(
    ctx: typer.Context,
    name: str,
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    version: Annotated[str | None, typer.Option(help="one version in full")] = None,
) -> None:
    """Every version of a model, or one version with its signed custom metadata and
    how it is run (preprocessing, output decoder, labels)."""
    cli = cli_context(ctx)
    with cli.client() as api:
        if version is None:
            versions = api.json("GET", f"/v1/fleets/{fleet}/models/{name}")
            cli.emit(_brief_runtime(cli.output, versions), [*VERSION_COLUMNS, "left_on_it"])
            return
        shown = api.json("GET", f"/v1/fleets/{fleet}/models/{name}/versions/{version}")
    if cli.output != "json" and isinstance(shown, dict):
        shown = {**shown, "runtime": runtime_text(shown.get("runtime"))}
        # The runtime is shown above in words; the signed form stays in `-o json`.
        custom = shown.get("custom")
        if isinstance(custom, dict):
            shown["release_check"] = release_check_text(custom.get("release_check"))
            hidden = {k: f"(see {k})" for k in ("runtime", "release_check") if k in custom}
            shown["custom"] = {**custom, **hidden}
    cli.emit(shown)


def _brief_runtime(output: str, versions: Any) -> Any:
    if output == "json" or not isinstance(versions, list):
        return versions
    return [
        {
            **v,
            "runtime": runtime_brief(v.get("runtime")),
            # The nodes left on a revoked version, named (ADR 0035).
            "left_on_it": ", ".join(v.get("left_on_it") or []) or "-",
        }
        for v in versions
    ]


@model_app.command("revoke")
def model_revoke(
    ctx: typer.Context,
    name: str,
    version: str,
    fleet: Annotated[str, typer.Option(envvar="EDGEFLEET_FLEET")],
    keys: KeysDir,
) -> None:
    """Raise the signed floor above VERSION: nodes refuse it and every older version.

    The nodes assigned a revoked version are moved to the newest version at or above the
    floor (`nodes_moved`, `moved_to`); with none, they are left (`nodes_left`) until a good
    version is pushed (ADR 0035)."""
    from control_plane.cli.release import ReleaseClient
    from control_plane.trust.keys import load_operator_keyset

    cli = cli_context(ctx)
    keyset = load_operator_keyset(keys, _passphrase())
    with cli.client() as api:
        result = ReleaseClient(api, keyset).revoke(fleet, name, version)
    cli.emit(result)
