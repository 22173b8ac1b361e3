"""The device SDK on a small device (issue 14 §4): memory per buffered message and CPU
per published result, beside paho's own publish of the same bytes.

Every measurement runs in a fresh spawned process (nothing of one inherited by the next):

- **memory per buffered message**: a `DeviceClient` that is not started (nothing is sent)
  takes ``--messages`` results, one frame of ``--objects`` people each (the detections of
  bench.aggregation_rules' site); the growth of the traced Python heap (``tracemalloc``,
  one process) and of the RSS (another process, no tracing), divided by the messages.
  Memory buffer, and the file ring (``ring_sync`` off here: the ring's memory does not
  depend on it; its bytes on flash per message are reported too). Anchor: paho's own
  queue (a client not connected keeps every QoS 1 publish in memory, unbounded) taking the
  same bytes;
- **CPU per published result**: a started `DeviceClient` connected to a private
  Mosquitto publishes ``--publishes`` results through to their PUBACKs (`flush`); the
  process's CPU time (``process_time``: the firmware's calls and the SDK's thread)
  divided by the results. Memory buffer, and file ring with ``ring_sync`` on (an fsync a
  message, the default). Anchor: a paho client (``loop_start``, QoS 1, its default window
  of 20, the SDK's too) publishing the same bytes, prepared beforehand, to their PUBACKs.

Measured on the machine it runs on, not on a camera: read the ratios, not the
microseconds. Not a test: asserts nothing (no goal in the issue). See docs/benchmarks.md.

    python -m bench.sdk_footprint [--messages 10000] [--publishes 5000] [--objects 6]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import shutil
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._report import Report, machine, parse_benchmark_args
from bench._util import BENCH_DIR, PrivateMosquitto, pin_self
from bench.device_events import camera_frames

MIB = 1 << 20
DEVICE = "cam-0"


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _frames(objects: int) -> list[Any]:
    return camera_frames([DEVICE, "cam-1"], 500, objects)[DEVICE]


def _client(port: int, ring: Path | None, sync: bool, buffer_bytes: int) -> Any:
    from device_sdk.client import ClientConfig, DeviceClient
    from device_sdk.transport import MqttSettings

    return DeviceClient(
        ClientConfig(
            DEVICE,
            mqtt=MqttSettings(port=port),
            buffer_bytes=buffer_bytes,
            ring_directory=ring,
            ring_sync=sync,
            heartbeat_interval_s=3600.0,  # one at start; none in the measurement
        )
    )


def _payloads(n: int, objects: int) -> list[bytes]:
    """What the SDK sends for `n` results (same envelope, same detections)."""
    from bench.device_events import raw_payloads

    return raw_payloads([DEVICE, "cam-1"], n, objects)[DEVICE]


def _measure(
    what: str, method: str, n: int, objects: int, cpu: int | None, extra: dict[str, Any]
) -> dict[str, Any]:
    """In a fresh process: one measurement (see the module docstring)."""
    pin_self(cpu)
    frames = _frames(objects)
    result: dict[str, Any] = {}
    if what.startswith("buffer"):
        ring = Path(extra["ring"]) if what == "buffer-ring" else None
        payloads = None if what != "buffer-paho" else _payloads(n, objects)
        client = None
        paho = None
        if payloads is None:
            client = _client(1, ring, False, 256 * MIB)
        else:
            import paho.mqtt.client as mqtt
            from paho.mqtt.enums import CallbackAPIVersion

            paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        # Warm up: the first calls import, compile and allocate what every later one reuses.
        for seq in range(50):
            if client is not None:
                client.publish_result(seq, time.time(), frames[seq % len(frames)])
            else:
                assert paho is not None and payloads is not None
                paho.publish("edgefleet/dev/cam-0/results", payloads[seq], qos=1)
        gc.collect()
        if method == "tracemalloc":
            tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else _rss()
        cpu_before = time.process_time()
        for seq in range(50, 50 + n):
            if client is not None:
                client.publish_result(seq, time.time(), frames[seq % len(frames)])
            else:
                assert paho is not None and payloads is not None
                paho.publish("edgefleet/dev/cam-0/results", payloads[seq - 50], qos=1)
        cpu_s = time.process_time() - cpu_before
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else _rss()
        result["bytes_per_message"] = (after - before) / n
        result["enqueue_cpu_us"] = cpu_s / n * 1e6
        if client is not None:
            stats = client.stats().buffer
            result["queued"] = stats.queued_messages
            result["queued_bytes_per_message"] = stats.queued_bytes / stats.queued_messages
            result["dropped"] = sum(stats.dropped.values())
            if ring is not None:
                result["ring_file_bytes_per_message"] = (ring / "ring.log").stat().st_size / (
                    n + 50
                )
            client.close(1.0)
        return result
    # CPU per published result, through to PUBACK against the private broker.
    port = extra["port"]
    if what == "publish-paho":
        import threading

        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        payloads = _payloads(n + 50, objects)
        acked = [0]
        done = threading.Event()
        target = [50]

        def on_publish(*_: object) -> None:
            acked[0] += 1
            if acked[0] == target[0]:
                done.set()

        paho = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        paho.on_publish = on_publish
        paho.connect("127.0.0.1", port)
        paho.loop_start()
        for payload in payloads[:50]:
            paho.publish("edgefleet/dev/cam-0/results", payload, qos=1)
        if not done.wait(30):
            raise RuntimeError("paho warm-up not acked")
        done.clear()
        target[0] = 50 + n
        gc.collect()
        started, wall = time.process_time(), time.perf_counter()
        for payload in payloads[50:]:
            paho.publish("edgefleet/dev/cam-0/results", payload, qos=1)
        if not done.wait(120):
            raise RuntimeError(f"paho: {acked[0]} of {target[0]} acked")
        cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall
        paho.disconnect()
        paho.loop_stop()
    else:
        ring = Path(extra["ring"]) if what == "publish-ring" else None
        client = _client(port, ring, True, 16 * MIB)
        client.start()
        for seq in range(50):
            client.publish_result(seq, time.time(), frames[seq % len(frames)])
        if not client.flush(30):
            raise RuntimeError("SDK warm-up not acked")
        gc.collect()
        started, wall = time.process_time(), time.perf_counter()
        for seq in range(50, 50 + n):
            client.publish_result(seq, time.time(), frames[seq % len(frames)])
        if not client.flush(120):
            raise RuntimeError("SDK: not every result acked")
        cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall
        client.close(2.0)
    return {"cpu_us_per_result": cpu_s / n * 1e6, "wall_s": wall_s, "results_per_s": n / wall_s}


def run_in_child(*args: Any) -> dict[str, Any]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(_measure, args)
        return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000, help="buffered, for memory")
    parser.add_argument("--publishes", type=int, default=5_000, help="for CPU per result")
    parser.add_argument(
        "--ring-publishes", type=int, default=1_000, help="for CPU per result, file ring"
    )
    parser.add_argument("--objects", type=int, default=6, help="people per result")
    parser.add_argument("--cpu", type=int, default=None, help="pin each child to one CPU")
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "sdk_footprint")
    args = parse_benchmark_args(
        parser, argv, quick={"messages": 500, "publishes": 200, "ring_publishes": 50}
    )
    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    report = Report("sdk_footprint", machine=machine(cpu_pinned=args.cpu))
    out: dict[str, Any] = {}
    try:
        for name in ("buffer-memory", "buffer-ring", "buffer-paho"):
            for method in ("tracemalloc", "rss"):
                ring = work / f"ring-{name}-{method}"
                out[f"{name}/{method}"] = run_in_child(
                    name, method, args.messages, args.objects, args.cpu, {"ring": str(ring)}
                )
                print(f"{name:<14} {method:<11} {out[f'{name}/{method}']}", flush=True)
        broker = PrivateMosquitto(work / "mqtt").start()
        try:
            for name, n in (
                ("publish-paho", args.publishes),
                ("publish-memory", args.publishes),
                ("publish-ring", args.ring_publishes),
                ("publish-paho", args.publishes),
                ("publish-memory", args.publishes),
            ):
                ring = work / f"ring-{name}-{len(out)}"
                result = run_in_child(
                    name, "cpu", n, args.objects, args.cpu, {"port": broker.port, "ring": str(ring)}
                )
                out.setdefault(name, []).append(result)
                print(f"{name:<14} {n:>6} {result}", flush=True)
        finally:
            broker.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    payload = out["buffer-memory/tracemalloc"]["queued_bytes_per_message"]
    paho_mem = out["buffer-paho/tracemalloc"]["bytes_per_message"]
    for name, label in (("buffer-memory", "memory buffer"), ("buffer-ring", "file ring")):
        for method in ("tracemalloc", "rss"):
            report.figure(
                f"bytes per buffered message, {label} ({method})",
                out[f"{name}/{method}"]["bytes_per_message"],
                "B",
                anchor=out[f"buffer-paho/{method}"]["bytes_per_message"],
                anchor_name="paho's queue",
            )
    best = {k: min(r["cpu_us_per_result"] for r in out[k]) for k in out if k.startswith("pub")}
    report.figure(
        "CPU per published result, memory buffer",
        best["publish-memory"],
        "µs",
        anchor=best["publish-paho"],
        anchor_name="paho publish",
    )
    report.figure(
        "CPU per published result, file ring (fsync)",
        best["publish-ring"],
        "µs",
        anchor=best["publish-paho"],
        anchor_name="paho publish",
    )
    print(
        f"a result as buffered: {payload:.0f} B (record size); paho's queue "
        f"{paho_mem:.0f} B a message (tracemalloc)"
    )
    for f in report.figures:
        ratio = "" if f.ratio is None else f" = {f.ratio:.2f} x {f.anchor_name}"
        print(f"  {f.name:<50} {f.value:>10,.1f} {f.unit}{ratio}")
    print(report.load_line())
    return report.finish(args, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
