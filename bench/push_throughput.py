"""Push throughput and memory: a large ONNX model into the local and the S3 artifact store.

Measures, against the real control plane started as a process (and moto's standalone S3
server as another), the streaming upload ``PUT /v1/artifacts/{sha256}`` as a ratio to
``cp`` of the same file in the same run, the wall time and peak RSS of a full
``edgefleet model push`` CLI process, and how much the server's RSS grows meanwhile.
Not a test: it asserts nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.push_throughput [--size-mb 200] [--small-mb 20] [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench._harness import ServerProcess, child_env, cli, edgefleet_command
from bench._report import Report, parse_benchmark_args
from bench._util import (
    BENCH_DIR,
    MB,
    ChildProcess,
    RssWatcher,
    free_port,
    median,
    run_measured,
    timed,
    wait_http,
)
from control_plane.artifacts import ArtifactStore, LocalArtifactStore
from control_plane.cli.client import file_sha256

GOAL_LOCAL_RATIO = 0.5
"""Issue goal: local upload throughput at least half of ``cp`` (+fsync) of the same file."""
GOAL_SERVER_GROWTH_MB = 64.0
"""Issue goal: the server's RSS grows by less than this, whatever the artifact size."""

BUCKET = "edgefleet-bench"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
FLEET = "bench"
MODEL_COLUMNS = 1000
SEED = 20261130
STEP_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0
WARMUP_BYTES = 1 << 20


# ----------------------------------------------------------------------------- results


@dataclass
class CopyBaseline:
    """The anchors: what the machine does with the same file without edgefleet."""

    size_bytes: int
    cp_s: list[float] = field(default_factory=list)
    cp_fsync_s: list[float] = field(default_factory=list)
    sha256_s: list[float] = field(default_factory=list)


@dataclass
class BackendRun:
    backend: str
    size_bytes: int
    anchor: CopyBaseline
    upload_s: list[float] = field(default_factory=list)
    upload_server_cpu_s: list[float] = field(default_factory=list)
    push_s: list[float] = field(default_factory=list)
    cli_peak_rss_bytes: list[int] = field(default_factory=list)
    server_baseline_rss_bytes: int = 0
    server_growth_upload_bytes: int = 0
    server_growth_total_bytes: int = 0
    s3_server_peak_rss_bytes: int | None = None


# ----------------------------------------------------------------------------- the model


def build_model(path: Path, size_bytes: int) -> Path:
    """A real ONNX model of about ``size_bytes``: y = x @ W + b, W float32 [rows, 1000].

    Deterministic (fixed seed). Checked with ``onnx.checker`` (full check) and loaded and
    run once in ONNX Runtime, as a node would.
    """
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows = max(1, size_bytes // (4 * MODEL_COLUMNS))
    rng = np.random.default_rng(SEED)
    # Scaled so the sum over `rows` terms stays near 1 for inputs in [0, 1).
    weight = rng.random((rows, MODEL_COLUMNS), dtype=np.float32)
    weight *= np.float32(2.0 / rows)
    bias = rng.random(MODEL_COLUMNS, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "weight"], ["xw"], name="matmul"),
            helper.make_node("Add", ["xw", "bias"], ["y"], name="add"),
        ],
        "bench_matmul",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, MODEL_COLUMNS])],
        initializer=[
            numpy_helper.from_array(weight, "weight"),
            numpy_helper.from_array(bias, "bias"),
        ],
    )
    del weight
    opset = [helper.make_opsetid("", 17)]
    model = helper.make_model(graph, opset_imports=opset, producer_name="edgefleet.bench")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString(deterministic=True)
    del model, graph
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    del data

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(["y"], {"x": np.zeros((1, rows), dtype=np.float32)})
    assert out.shape == (1, MODEL_COLUMNS)
    del session
    return path


# ----------------------------------------------------------------------------- anchors


def measure_copy(src: Path, scratch: Path, into: CopyBaseline) -> None:
    """Once each: ``cp``, ``cp`` then ``sync FILE`` (fsync of the copy), sha256 of the file.

    The store fsyncs every artifact before it is visible, so cp+fsync is the fair anchor;
    plain cp (dirty pages left in the page cache) is shown as the optimistic one. Called
    right before each upload so that load from other processes hits both alike.
    """
    dst = scratch / "cp-copy.bin"
    for fsync, samples in ((False, into.cp_s), (True, into.cp_fsync_s)):
        dst.unlink(missing_ok=True)
        os.sync()  # no writeback left over from the previous step
        with timed() as took:
            subprocess.run(["cp", str(src), str(dst)], check=True, timeout=STEP_TIMEOUT_S)
            if fsync:
                subprocess.run(["sync", str(dst)], check=True, timeout=STEP_TIMEOUT_S)
        samples.append(took[0])
    dst.unlink(missing_ok=True)
    os.sync()
    with timed() as took:
        digest = hashlib.sha256()
        with src.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    into.sha256_s.append(took[0])


# ----------------------------------------------------------------------------- processes


def start_s3_server(work: Path) -> tuple[ChildProcess, str]:
    port = free_port()
    moto = ChildProcess(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        log=work / "logs" / "moto.log",
        env=child_env(**AWS_ENV),
    )
    moto.__enter__()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_http(f"{endpoint}/moto-api/", START_TIMEOUT_S, moto.proc)
    except BaseException:
        moto.stop()
        raise
    return moto, endpoint


def s3_store(endpoint: str) -> ArtifactStore:
    """Our own client on the server's bucket: to create it and to delete between runs."""
    import boto3

    from control_plane.artifacts.s3 import S3ArtifactStore

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=AWS_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    return S3ArtifactStore(client, BUCKET, "artifacts/")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads: unlike wall time, load-independent."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


# ----------------------------------------------------------------------------- one run


def run_backend(
    backend: str,
    model: Path,
    repeat: int,
    work: Path,
    keys: Path,
    s3_endpoint: str | None,
    s3_server_pid: int | None,
) -> BackendRun:
    """A fresh control plane on ``backend``: warm up, raw uploads, then full CLI pushes."""
    sha256, length = file_sha256(model)
    label = f"{backend}-{length // MB}mb"
    data_dir = work / label
    extra: list[str] = []
    if backend == "s3":
        assert s3_endpoint is not None
        extra += [
            "--artifacts",
            f"s3://{BUCKET}/artifacts?endpoint_url={s3_endpoint}&region=us-east-1",
        ]
        store = s3_store(s3_endpoint)
    else:
        store = LocalArtifactStore(data_dir / "artifacts")
    result = BackendRun(backend=backend, size_bytes=length, anchor=CopyBaseline(length))
    push = [*edgefleet_command(), "-o", "json", "model", "push", str(model)]
    push += ["--fleet", FLEET, "--name", "big"]

    server = ServerProcess(work, extra_args=extra, env=AWS_ENV, name=label)
    with server:
        try:
            env = server.cli_env(EDGEFLEET_KEYS=str(keys))
            with server.api(timeout=STEP_TIMEOUT_S) as api:
                # Warm-up: the first request of each kind imports and caches; not the cost
                # of an upload. The baseline is taken after it.
                api.upload_bytes(hashlib.sha256(label.encode()).digest() * (WARMUP_BYTES // 32))
                cli(["fleet", "create", FLEET], env, work / "logs" / f"fleet-{label}.log")
                with contextlib.ExitStack() as stack:
                    rss = stack.enter_context(RssWatcher(server.pid))
                    s3_rss = (
                        stack.enter_context(RssWatcher(s3_server_pid)) if s3_server_pid else None
                    )
                    result.server_baseline_rss_bytes = rss.baseline
                    for _ in range(repeat):
                        measure_copy(model, work, result.anchor)
                        store.delete(sha256)  # content-addressed: a re-put is a no-op
                        os.sync()
                        cpu_before = cpu_seconds(server.pid)
                        with timed() as took:
                            api.upload_file(model, sha256, length)
                        result.upload_s.append(took[0])
                        result.upload_server_cpu_s.append(cpu_seconds(server.pid) - cpu_before)
                    result.server_growth_upload_bytes = rss.growth()
                    for i in range(repeat):
                        store.delete(sha256)
                        os.sync()
                        measured = run_measured(
                            [*push, "--version", f"1.0.{i}"],
                            env=env,
                            timeout_s=STEP_TIMEOUT_S,
                            log=work / "logs" / f"push-{label}-{i}.log",
                        )
                        if measured.returncode != 0:
                            raise RuntimeError(f"model push failed:\n{measured.output[-2000:]}")
                        result.push_s.append(measured.wall_s)
                        result.cli_peak_rss_bytes.append(measured.max_rss_bytes)
                    result.server_growth_total_bytes = rss.growth()
                    if s3_rss is not None:
                        result.s3_server_peak_rss_bytes = s3_rss.peak()
            store.delete(sha256)  # S3 lives in moto's memory: give it back
        except BaseException:
            print(f"server log:\n{server.tail()}", file=sys.stderr)
            raise
    return result


# ----------------------------------------------------------------------------- report


def mbps(size_bytes: int, seconds: Sequence[float]) -> float:
    return size_bytes / MB / median(seconds)


def paired_ratio(anchor_s: Sequence[float], upload_s: Sequence[float]) -> float:
    """Median of per-repeat throughput ratios: each upload against the copy just before it."""
    return median([a / u for a, u in zip(anchor_s, upload_s, strict=True)])


def summarise(runs: list[BackendRun]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for run in runs:
        anchor = run.anchor
        upload = mbps(run.size_bytes, run.upload_s)
        rows.append(
            {
                "backend": run.backend,
                "size_mb": run.size_bytes / MB,
                "cp_mbps": mbps(run.size_bytes, anchor.cp_s),
                "cp_fsync_mbps": mbps(run.size_bytes, anchor.cp_fsync_s),
                "sha256_mbps": mbps(run.size_bytes, anchor.sha256_s),
                "upload_mbps": upload,
                "ratio_cp_fsync": paired_ratio(anchor.cp_fsync_s, run.upload_s),
                "ratio_cp": paired_ratio(anchor.cp_s, run.upload_s),
                "ratio_best": min(anchor.cp_fsync_s) / min(run.upload_s),
                "server_cpu_s": median(run.upload_server_cpu_s),
                "push_s": median(run.push_s),
                "server_growth_upload_mb": run.server_growth_upload_bytes / MB,
                "server_growth_mb": run.server_growth_total_bytes / MB,
                "server_baseline_mb": run.server_baseline_rss_bytes / MB,
                "cli_peak_rss_mb": max(run.cli_peak_rss_bytes, default=0) / MB,
                "s3_server_peak_rss_mb": (
                    None
                    if run.s3_server_peak_rss_bytes is None
                    else run.s3_server_peak_rss_bytes / MB
                ),
            }
        )
    return rows


def render(rows: list[dict[str, Any]], repeat: int) -> str:
    header = (
        f"{'backend':<8}{'size MB':>8}{'cp':>7}{'cp+fsync':>9}{'sha256':>7}{'upload':>7}"
        f"{'ratio':>6}{'best':>6}{'vs cp':>6}{'srv CPU s':>10}{'push s':>7}"
        f"{'srv ΔRSS MB':>12}{'CLI RSS MB':>11}"
    )
    lines = [
        f"push throughput: median of {repeat}; MB = 10^6 bytes; cp, cp+fsync, sha256 and "
        "upload in MB/s",
        header,
        "-" * len(header),
    ]
    for r in rows:
        lines.append(
            f"{r['backend']:<8}{r['size_mb']:>8.0f}{r['cp_mbps']:>7.0f}{r['cp_fsync_mbps']:>9.0f}"
            f"{r['sha256_mbps']:>7.0f}{r['upload_mbps']:>7.0f}{r['ratio_cp_fsync']:>6.2f}"
            f"{r['ratio_best']:>6.2f}{r['ratio_cp']:>6.2f}{r['server_cpu_s']:>10.3f}"
            f"{r['push_s']:>7.2f}{r['server_growth_mb']:>12.1f}{r['cli_peak_rss_mb']:>11.0f}"
        )
    lines += [
        "ratio: upload / (cp+fsync), median of per-repeat pairs; best: fastest upload / "
        "fastest cp+fsync; vs cp: upload / plain cp",
        "srv CPU s: server CPU (user+sys) per upload; push s: full `edgefleet model push`; "
        "srv ΔRSS: server peak minus its warm baseline",
        f"goals: ratio >= {GOAL_LOCAL_RATIO} (local); srv ΔRSS < {GOAL_SERVER_GROWTH_MB:.0f} MB "
        "(all backends, all sizes); CLI RSS: none",
    ]
    for r in rows:
        if r["s3_server_peak_rss_mb"] is not None:
            lines.append(
                f"  moto S3 server peak RSS at {r['size_mb']:.0f} MB: "
                f"{r['s3_server_peak_rss_mb']:.0f} MB (it keeps objects in memory)"
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.push_throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size-mb", type=int, default=200, help="model size (default 200)")
    parser.add_argument(
        "--small-mb",
        type=int,
        default=20,
        help="second, smaller size to show RSS does not scale with size (0: skip; default 20)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument(
        "--backends", default="local,s3", help="comma-separated: local, s3 (default both)"
    )
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "push_throughput")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parse_benchmark_args(
        parser, argv, quick={"size_mb": 2, "small_mb": 0, "repeat": 1, "backends": "local"}
    )
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - {"local", "s3"}:
        parser.error("--backends takes local and/or s3")
    if args.size_mb < 1 or args.repeat < 1 or args.small_mb < 0:
        parser.error("sizes and --repeat must be positive")
    args.backends = backends
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work: Path = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sizes = sorted({args.size_mb, *([args.small_mb] if args.small_mb else [])})
    moto: ChildProcess | None = None
    report = Report("push_throughput")
    try:
        models: dict[int, Path] = {}
        for size in sizes:
            print(f"building a {size} MB ONNX model ...", flush=True)
            # In a child process: building holds the model in memory three times over,
            # and this process then acts as the upload client.
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                target = work / "models" / f"model-{size}mb.onnx"
                model = pool.submit(build_model, target, size * MB).result(STEP_TIMEOUT_S)
            models[size] = model

        keys = work / "keys"
        cli(
            ["keys", "init", "--out", str(keys), "--root-keys", "1", "--root-threshold", "1"],
            child_env(**AWS_ENV),
            work / "logs" / "keys.log",
        )
        runs: list[BackendRun] = []
        for backend in args.backends:
            endpoint: str | None = None
            if backend == "s3":
                moto, endpoint = start_s3_server(work)
            for size in sizes:
                print(f"{backend}: {size} MB, {args.repeat} uploads and pushes ...", flush=True)
                runs.append(
                    run_backend(
                        backend,
                        models[size],
                        args.repeat,
                        work,
                        keys,
                        endpoint,
                        moto.pid if moto is not None and backend == "s3" else None,
                    )
                )
            if moto is not None:
                moto.stop()
                moto = None
    finally:
        if moto is not None:
            moto.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    rows = summarise(runs)
    print()
    print(render(rows, args.repeat))
    print(f"{report.load_line()}: above ~0.5, other processes shared the machine")
    for row in rows:
        where = f"{row['backend']} {row['size_mb']:.0f} MB"
        local = row["backend"] == "local"
        report.figure(
            f"{where} upload",
            row["upload_mbps"],
            "MB/s",
            anchor=row["cp_fsync_mbps"],
            anchor_name="cp+fsync",
            goal=f"ratio >= {GOAL_LOCAL_RATIO}" if local else "",
            met=row["ratio_cp_fsync"] >= GOAL_LOCAL_RATIO if local else None,
        )
        report.figure(
            f"{where} server RSS growth",
            row["server_growth_mb"],
            "MB",
            goal=f"< {GOAL_SERVER_GROWTH_MB:.0f} MB",
            met=row["server_growth_mb"] < GOAL_SERVER_GROWTH_MB,
        )
    return report.finish(
        args, {"repeat": args.repeat, "runs": [asdict(r) for r in runs], "summary": rows}
    )


if __name__ == "__main__":
    sys.exit(main())
