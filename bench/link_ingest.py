"""Control-plane ingestion: health records per second over gRPC and over MQTT, beside the raw
transport measured in the same run.

The control plane runs as its own process (``edgefleet server``), pinned to CPU 0, with
PostgreSQL (and, if asked, SQLite) as its database. Simulated nodes, enrolled for real
(bootstrap token + CSR each), run in another process pinned to CPU 1, each with its real
node link (`GrpcNodeLink`, `MqttNodeLink`): stop-and-wait like the uplink, one
``RecordBatch`` of health records in flight per node, the next one sent when its ``Ack``
came. What counts is records acked, i.e. stored and committed. The records are real
``edgefleet.agent.health/2`` reports (about 2.6 kB each). The control plane runs with
its health processor off (``EDGEFLEET_HEALTH_PROCESSOR=false``, as an ingest-only
replica) unless ``--health-processor`` is given: this measures ingestion, and
``bench.health_store`` the processor.

The raw anchors use the same node processes, links, mTLS / broker accounts, messages and
CPU split, with the control plane replaced by a bare echo that acks without storing:
a grpc.aio ``Sync`` servicer, and a paho subscriber on a private Mosquitto. Not a test:
it asserts nothing unless ``--check`` is given. See docs/benchmarks.md.

    python -m bench.link_ingest [--nodes 100] [--batches 100,1] [--seconds 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import multiprocessing
import random
import shutil
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench._harness import (
    AGENT_VERSION,
    EnrolledNode,
    LoopbackTls,
    ServerProcess,
    bare_grpc_link,
    database,
    grpc_link,
    mqtt_link,
    spawned,
    stored_records,
)
from bench._report import Report, parse_benchmark_args
from bench._util import (
    BENCH_DIR,
    MB,
    POSTGRES_ADMIN_URL,
    PrivateMosquitto,
    can_pin,
    free_port,
    git_describe,
    median,
    pin_self,
    postgres_backends_cpu_s,
    rss_bytes,
    wait_port,
)

GOAL_RATIO = 0.7
"""Issue goal: ingestion at least 70 % of the raw transport's rate."""
REPORT_INTERVAL_S = 10.0
"""To turn a rate into a fleet size: one health report per node every 10 s."""

CP_CPU = 0
NODE_CPU = 1
FLEET = "bench"
START_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 30.0
WINDOW_SLACK_S = 120.0  # a load process that has not answered this long after its window
# Mosquitto sends small packets at once only when told (the operator guide says to).
DEFAULT_BROKER_OPTIONS = ("set_tcp_nodelay true",)
PUBSUB_PUBLISHERS = 4  # node accounts the open-loop MQTT anchor publishes with
PUBSUB_WINDOW = 64  # unacknowledged QoS 1 publishes per publisher

log = logging.getLogger("bench.link_ingest")


# ----------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class LoadSpec:
    """One measuring window, as the load process runs it."""

    transport: str  # grpc | mqtt
    port: int  # the gRPC node port, or the broker's port
    nodes: list[EnrolledNode]
    ca_pem: bytes
    batch: int
    warmup_s: float
    seconds: float
    server_pid: int
    database: str | None  # PostgreSQL database whose backends' CPU is counted
    cpu: int | None


@dataclass
class Window:
    """What one window measured (records and messages acked inside the window)."""

    transport: str
    server: str  # raw | edgefleet
    database: str  # postgresql | sqlite | none
    batch: int
    nodes: int
    seconds: float = 0.0
    records: int = 0
    messages: int = 0
    acked_total: int = 0  # including the warm-up: what the database must hold
    rtt_p50_ms: float = 0.0
    rtt_p99_ms: float = 0.0
    server_cpu: float = 0.0  # CPU seconds per second of the server process (1.0 = a core)
    db_cpu: float = 0.0  # the same for the PostgreSQL backends serving it
    client_cpu: float = 0.0  # the same for the load process
    db_sessions: int = -1  # PostgreSQL sessions opened in the window (-1: not PostgreSQL)
    errors: list[str] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def health_payload(node_index: int) -> bytes:
    """A real health report as a node's agent writes it: ``edgefleet.agent.health/2``, one
    model version with its three latency sketches (300 frames in a 10 s window), about
    2.6 kB of JSON; the same builder as ``bench.health_store``."""
    from bench.health_store import report

    rng = random.Random(node_index)
    return report(rng, datetime.now(UTC), rss_mb=400.0 + node_index % 200)


def load_worker(spec: LoadSpec, conn: Any) -> None:
    """Entry point of the load process (spawned): connect, warm up, measure, report."""
    pin_self(spec.cpu)
    logging.basicConfig(level=logging.ERROR)
    try:
        conn.send(("done", asyncio.run(_load(spec))))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _load(spec: LoadSpec) -> dict[str, Any]:
    from edge_node.testing.simulator import SimulatedFleet, SimulatorConfig

    fleet = SimulatedFleet(
        [_make_link(spec, node) for node in spec.nodes],
        SimulatorConfig(
            agent_version=AGENT_VERSION,
            connect_timeout_s=START_TIMEOUT_S,
            ack_timeout_s=ACK_TIMEOUT_S,
        ),
    )
    outcome = await fleet.connect_all()
    if outcome.failed:
        raise RuntimeError(f"{len(outcome.failed)} nodes did not connect: {outcome.failed[:3]}")
    health_payload(0)  # imports the report builder now, not inside the window
    started = time.monotonic()
    window_start = started + spec.warmup_s
    window_end = window_start + spec.seconds

    async def sample() -> dict[str, float]:
        me = psutil.Process()
        server = psutil.Process(spec.server_pid)
        stats = _SessionCounter(spec.database)

        def reading() -> tuple[float, float, float, int]:
            own, srv = me.cpu_times(), server.cpu_times()
            db = postgres_backends_cpu_s(spec.database) if spec.database else 0.0
            return own.user + own.system, srv.user + srv.system, db, stats.read()

        try:
            await asyncio.sleep(max(0.0, window_start - time.monotonic()))
            first, at_first = reading(), time.monotonic()
            await asyncio.sleep(max(0.0, window_end - time.monotonic()))
            # PostgreSQL publishes session counts with a delay of up to a second.
            last, at_last = reading(), time.monotonic()
            await asyncio.sleep(1.2)
            sessions = stats.read() - first[3] if spec.database else -1
        finally:
            stats.close()
        span = at_last - at_first
        return {
            "client_cpu": (last[0] - first[0]) / span,
            "server_cpu": (last[1] - first[1]) / span,
            "db_cpu": (last[2] - first[2]) / span,
            "db_sessions": sessions,
        }

    sampler = asyncio.create_task(sample())
    result = await fleet.stop_and_wait(
        batch=spec.batch,
        payload=health_payload,
        window_start=window_start,
        window_end=window_end,
    )
    cpu = await sampler
    await fleet.close()
    return {
        "seconds": spec.seconds,
        "records": result.records,
        "messages": result.messages,
        "acked_total": result.acked_total,
        "rtt_p50_ms": 1000 * result.rtt_quantile(0.5),
        "rtt_p99_ms": 1000 * result.rtt_quantile(0.99),
        "errors": result.errors[:5],
        **cpu,
    }


class _SessionCounter:
    """PostgreSQL's count of sessions ever opened to one database (``pg_stat_database``)."""

    def __init__(self, database: str | None) -> None:
        self._conn: Any = None
        self._database = database
        if database is not None:
            import psycopg

            base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
            self._conn = psycopg.connect(f"{base}/{database}", autocommit=True)

    def read(self) -> int:
        if self._conn is None:
            return 0
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self._conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", (self._database,)
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _make_link(spec: LoadSpec, node: EnrolledNode) -> Any:
    if spec.transport == "grpc":
        return grpc_link(f"127.0.0.1:{spec.port}", node, spec.ca_pem, connect_timeout_s=30.0)
    return mqtt_link(FLEET, spec.port, node, connect_timeout_s=30.0)


def run_window(spec: LoadSpec, server: str, database: str) -> Window:
    """One load process for one window; it is always ended."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    proc = context.Process(target=load_worker, args=(spec, child), daemon=True)
    proc.start()
    window = Window(spec.transport, server, database, spec.batch, len(spec.nodes))
    try:
        limit = START_TIMEOUT_S + spec.warmup_s + spec.seconds + WINDOW_SLACK_S
        if not parent.poll(limit):
            raise TimeoutError(f"the load process did not report within {limit:.0f} s")
        kind, result = parent.recv()
        if kind != "done":
            raise RuntimeError(f"the load process failed: {result}")
        for name, value in result.items():
            setattr(window, name, value)
    finally:
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    return window


# ----------------------------------------------------------------------------- raw anchors


def grpc_echo_server(tls: LoopbackTls, port: int) -> None:
    """The raw gRPC anchor (spawned, pinned like the control plane): a bare NodeLink
    (`bench._harness.bare_grpc_link`) whose ``Sync`` answers each RecordBatch with an Ack
    of its ids."""
    pin_self(CP_CPU)
    asyncio.run(_grpc_echo(tls, port))


async def _grpc_echo(tls: LoopbackTls, port: int) -> None:
    from protos.edgefleet.fleet.v1 import link_pb2

    async def acks(messages: AsyncIterator[Any]) -> AsyncGenerator[Any]:
        async for message in messages:
            if message.WhichOneof("body") == "records":
                ids = [r.id for r in message.records.records]
                yield link_pb2.ControlMessage(protocol_version=1, ack=link_pb2.Ack(record_ids=ids))

    async with bare_grpc_link(tls, acks, node_id="echo", port=port):
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def mqtt_echo_server(port: int, username: str, password: str, subscribed: Any) -> None:
    """The raw MQTT anchor (spawned, pinned like the control plane): one paho client that
    reads the nodes' health messages through a shared subscription, QoS 1 with manual
    PUBACK and the bridge's Receive Maximum, publishes an Ack of the ids on the node's
    ``ack`` topic, then PUBACKs. What the bridge does, minus checks and the database."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from protos.edgefleet.fleet.v1 import link_pb2

    pin_self(CP_CPU)
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id="bench-raw-echo",
        protocol=mqtt.MQTTv5,
        manual_ack=True,
    )
    client.username_pw_set(username, password)
    expiry = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    expiry.MessageExpiryInterval = 3600

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        client.subscribe("$share/bench-raw/edgefleet/v1/+/+/health", qos=1)

    # A shared subscription with no member drops what is published to it: the windows
    # wait for this before the nodes send anything.
    client.on_subscribe = lambda *_: subscribed.set()

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        body = link_pb2.NodeMessage.FromString(message.payload)
        ack = link_pb2.ControlMessage(
            protocol_version=1,
            ack=link_pb2.Ack(record_ids=[r.id for r in body.records.records]),
        )
        topic = message.topic.rsplit("/", 1)[0] + "/ack"
        client.publish(topic, ack.SerializeToString(), qos=1, properties=expiry)
        client.ack(message.mid, message.qos)

    client.on_connect = on_connect
    client.on_message = on_message
    connect = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    connect.ReceiveMaximum = 64
    client.connect("127.0.0.1", port, clean_start=True, properties=connect)
    signal.signal(signal.SIGTERM, lambda *_: client.disconnect())
    client.loop_forever()


def pubsub_subscriber(port: int, username: str, password: str, conn: Any) -> None:
    """The open-loop MQTT anchor's consumer (spawned, pinned like the control plane): a
    paho client on the nodes' topics (shared subscription, QoS 1, PUBACK by paho at
    once) that only counts. Answers ``count`` with (messages, monotonic time)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    pin_self(CP_CPU)
    received = [0]
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="bench-raw-subscriber", protocol=mqtt.MQTTv5
    )
    client.username_pw_set(username, password)
    # ``events``, not ``health``: the closed-loop echo reads ``health`` on the same broker.
    topic = "$share/bench-pubsub/edgefleet/v1/+/+/events"
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    client.on_subscribe = lambda *_: conn.send(("ready",))

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        received[0] += 1

    client.on_message = on_message
    connect = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    connect.ReceiveMaximum = 64  # as the bridge
    client.connect("127.0.0.1", port, clean_start=True, properties=connect)
    client.loop_start()
    try:
        while (command := conn.recv()) != "stop":
            if command == "count":
                conn.send((received[0], time.monotonic()))
    finally:
        client.disconnect()
        client.loop_stop()


def pubsub_publisher(
    port: int, nodes: list[EnrolledNode], payload: bytes, window: int, stop: Any
) -> None:
    """The open-loop anchor's producers (spawned, pinned like the nodes): one paho client
    per given node account, each publishing ``payload`` QoS 1 on its own ``events`` topic
    as fast as the broker acknowledges, at most ``window`` unacknowledged each."""
    import threading

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    pin_self(NODE_CPU if can_pin() else None)
    clients = []
    for node in nodes:
        credit = threading.Semaphore(window)
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{node.node_id}", protocol=mqtt.MQTTv5
        )
        client.username_pw_set(node.node_id, node.mqtt_password)
        client.on_publish = lambda *_, credit=credit: credit.release()
        client.connect("127.0.0.1", port, clean_start=True)
        client.loop_start()
        clients.append((client, credit, f"edgefleet/v1/{FLEET}/{node.node_id}/events"))

    def pump(client: Any, credit: Any, topic: str) -> None:
        while not stop.is_set():
            if credit.acquire(timeout=0.2):
                client.publish(topic, payload, qos=1)

    threads = [threading.Thread(target=pump, args=c, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    stop.wait(timeout=3600)
    for thread in threads:
        thread.join(timeout=5)
    for client, _, _ in clients:
        client.disconnect()
        client.loop_stop()


def pubsub_batch_payload(batch: int) -> bytes:
    """The bytes a node sends for one batch of ``batch`` health records."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from edge_node.clock import SystemClock
    from edge_node.uuid7 import UUIDv7Generator
    from protos.edgefleet.fleet.v1 import link_pb2

    ids = UUIDv7Generator(SystemClock())
    created = Timestamp()
    created.GetCurrentTime()
    records = [
        link_pb2.Record(
            id=str(ids.new()),
            seq=seq,
            kind=link_pb2.RECORD_KIND_HEALTH,
            created_at=created,
            content_type="application/json",
            payload=health_payload(0),
        )
        for seq in range(1, batch + 1)
    ]
    message = link_pb2.NodeMessage(
        protocol_version=1, records=link_pb2.RecordBatch(records=records)
    )
    return message.SerializeToString()


def run_pubsub_window(
    port: int, nodes: list[EnrolledNode], password: str, batch: int, args: argparse.Namespace
) -> Window:
    """Open loop: publishers push as fast as the broker acks; the subscriber counts."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    stop = context.Event()
    window = Window("mqtt", "pubsub", "none", batch, len(nodes))
    subscriber = context.Process(
        target=pubsub_subscriber,
        args=(port, "edgefleet-control-plane", password, child),
        daemon=True,
    )
    publisher = context.Process(
        target=pubsub_publisher,
        args=(port, nodes, pubsub_batch_payload(batch), PUBSUB_WINDOW, stop),
        daemon=True,
    )
    subscriber.start()
    try:
        if not parent.poll(START_TIMEOUT_S):
            raise TimeoutError("the pub/sub subscriber did not subscribe")
        parent.recv()
        publisher.start()
        time.sleep(args.warmup)
        procs = [psutil.Process(subscriber.pid), psutil.Process(publisher.pid)]
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
        parent.send("count")
        count0, t0 = parent.recv()
        time.sleep(args.seconds)
        parent.send("count")
        count1, t1 = parent.recv()
        cpu1 = [sum(p.cpu_times()[:2]) for p in procs]
        window.seconds = t1 - t0
        window.messages = count1 - count0
        window.records = window.messages * batch
        window.server_cpu = (cpu1[0] - cpu0[0]) / window.seconds
        window.client_cpu = (cpu1[1] - cpu0[1]) / window.seconds
    finally:
        stop.set()
        with contextlib.suppress(OSError, BrokenPipeError):
            parent.send("stop")
        for proc in (publisher, subscriber):
            if proc.pid is None:
                continue
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
    return window


# ----------------------------------------------------------------------------- control plane


def control_plane(
    work: Path,
    url: str,
    args: argparse.Namespace,
    *,
    grpc: bool = False,
    mqtt_port: int | None = None,
) -> ServerProcess:
    """``edgefleet server`` pinned to CP_CPU, as an ingest-only replica unless asked."""
    return ServerProcess(
        work,
        url,
        grpc=grpc,
        mqtt_port=mqtt_port,
        cpu=CP_CPU,
        name=f"cp-{'grpc' if grpc else 'mqtt'}",
        env={
            "EDGEFLEET_MQTT_CLIENT_ID": "edgefleet-cp-bench",
            "EDGEFLEET_HEALTH_PROCESSOR": "true" if args.health_processor else "false",
        },
    )


# ----------------------------------------------------------------------------- runs


@dataclass
class Run:
    """Every window of one transport on one database, and what the database held after."""

    transport: str
    database: str
    windows: list[Window] = field(default_factory=list)
    stored: int = 0
    acked: int = 0
    server_rss_start: int = 0
    server_rss_end: int = 0


def paired_windows(
    run: Run,
    args: argparse.Namespace,
    nodes: list[EnrolledNode],
    ca_pem: bytes,
    batch: int,
    repeat: int,
    servers: Sequence[tuple[str, int, int, str | None]],
) -> None:
    """One window against each ``(name, port, pid, PostgreSQL database)``, back to back,
    so that each edgefleet window has its echo anchor beside it."""
    cpu = NODE_CPU if can_pin() else None
    for server, port, pid, db in servers:
        spec = LoadSpec(
            transport=run.transport,
            port=port,
            nodes=nodes,
            ca_pem=ca_pem,
            batch=batch,
            warmup_s=args.warmup,
            seconds=args.seconds,
            server_pid=pid,
            database=db,
            cpu=cpu,
        )
        window = run_window(spec, server, run.database if server != "echo" else "none")
        run.windows.append(window)
        _print_window(window, repeat)


def run_grpc(args: argparse.Namespace, kind: str, work: Path) -> Run:
    from control_plane.identity.ca import CertificateAuthority

    run = Run("grpc", kind)
    with database(kind, work) as made:
        url, pg_name = made.url, made.postgres_name
        plane = control_plane(work, url, args, grpc=True).start()
        try:
            print(f"  gRPC/{kind}: enrolling {args.nodes} nodes ...", flush=True)
            plane.make_fleet(FLEET)
            nodes, ca_pem = plane.enroll_grpc(FLEET, args.nodes, work), plane.ca_pem
            ca = CertificateAuthority.load_or_create(plane.data_dir / "ca", now=datetime.now(UTC))
            echo_port = free_port()
            with spawned(grpc_echo_server, LoopbackTls.issued_by(ca), echo_port) as echo:
                wait_port(echo_port, START_TIMEOUT_S)
                run.server_rss_start = rss_bytes(plane.pid)
                for batch in args.batches:
                    for repeat in range(args.repeat):
                        assert echo.pid is not None and plane.grpc_port is not None
                        servers = [
                            ("echo", echo_port, echo.pid, None),
                            ("edgefleet", plane.grpc_port, plane.pid, pg_name),
                        ]
                        paired_windows(run, args, nodes, ca_pem, batch, repeat, servers)
                run.server_rss_end = rss_bytes(plane.pid)
            run.acked = sum(w.acked_total for w in run.windows if w.server == "edgefleet")
            run.stored = stored_records(url)
        except BaseException:
            print(f"control plane log:\n{plane.tail()}", file=sys.stderr)
            raise
        finally:
            plane.stop()
    return run


def run_mqtt(args: argparse.Namespace, kind: str, work: Path) -> Run:
    """Two private brokers with the same configuration, password file and ACL: the raw
    echo uses one, the control plane's bridge the other, so the bridge's persistent
    session never holds messages from a raw window."""
    run = Run("mqtt", kind)
    with database(kind, work) as made:
        url, pg_name = made.url, made.postgres_name
        files = work / "broker-files"
        files.mkdir(parents=True)
        (files / "passwd").write_text("")
        (files / "acl").write_text("")
        brokers = [
            PrivateMosquitto(
                work / f"broker-{name}",
                passwd=files / "passwd",
                acl=files / "acl",
                extra=args.broker_option,
            )
            for name in ("raw", "cp")
        ]
        plane = control_plane(work, url, args, mqtt_port=brokers[1].port)
        try:
            for broker in brokers:
                broker.start()
            plane.start()
            print(f"  MQTT/{kind}: enrolling {args.nodes} nodes ...", flush=True)
            plane.make_fleet(FLEET)
            nodes = plane.enroll_mqtt(FLEET, args.nodes)
            plane.cli(["mqtt", "acl", "--out", str(files)], work / "logs" / "mqtt-acl.log")
            for broker in brokers:
                broker.reload()
            password = (plane.data_dir / "mqtt" / "control-plane-password").read_text().strip()
            subscribed = multiprocessing.get_context("spawn").Event()
            with spawned(
                mqtt_echo_server, brokers[0].port, "edgefleet-control-plane", password, subscribed
            ) as echo:
                if not subscribed.wait(START_TIMEOUT_S):
                    raise TimeoutError("the MQTT echo did not subscribe")
                # The bridge retries its refused login with backoff; the first window's
                # connect waits for it (the warm-up is not measured).
                run.server_rss_start = rss_bytes(plane.pid)
                for batch in args.batches:
                    for repeat in range(args.repeat):
                        assert echo.pid is not None
                        servers = [
                            ("echo", brokers[0].port, echo.pid, None),
                            ("edgefleet", brokers[1].port, plane.pid, pg_name),
                        ]
                        paired_windows(run, args, nodes, b"", batch, repeat, servers)
                        window = run_pubsub_window(
                            brokers[0].port, nodes[:PUBSUB_PUBLISHERS], password, batch, args
                        )
                        run.windows.append(window)
                        _print_window(window, repeat)
                run.server_rss_end = rss_bytes(plane.pid)
            run.acked = sum(w.acked_total for w in run.windows if w.server == "edgefleet")
            run.stored = stored_records(url)
        except BaseException:
            print(f"control plane log:\n{plane.tail()}", file=sys.stderr)
            raise
        finally:
            plane.stop()
            for broker in brokers:
                broker.stop()
    return run


# ----------------------------------------------------------------------------- report


def _print_window(window: Window, repeat: int) -> None:
    errors = f"  ERRORS: {window.errors[:2]}" if window.errors else ""
    print(
        f"    {window.transport:<5}{window.server:<10}{window.database:<11}batch "
        f"{window.batch:<4} #{repeat + 1}: {window.records_per_s:>8.0f} records/s "
        f"{window.messages_per_s:>7.0f} msg/s  rtt p50 {window.rtt_p50_ms:.1f} ms  "
        f"server CPU {window.server_cpu:.2f}  db CPU {window.db_cpu:.2f}  "
        f"nodes' CPU {window.client_cpu:.2f}{_sessions(window)}{errors}",
        flush=True,
    )


def _sessions(window: Window) -> str:
    if window.db_sessions < 0:
        return ""
    return f"  new db sessions {window.db_sessions / window.seconds:.0f}/s"


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for run in runs:
        for batch in sorted({w.batch for w in run.windows}, reverse=True):
            echo, pubsub, ours = (
                [w for w in run.windows if w.batch == batch and w.server == server]
                for server in ("echo", "pubsub", "edgefleet")
            )
            # The raw transport doing the same exchange: the node's batch in, an Ack out,
            # nothing stored (grpc.aio echo; Mosquitto + paho pub/sub both ways). The
            # one-way open-loop pub/sub is reported beside it; it carries no Ack.
            anchor = echo
            pairs = [_ratio(o, a) for a, o in zip(anchor, ours, strict=True)]
            echo_pairs = [_ratio(o, e) for e, o in zip(echo, ours, strict=True)]
            rate = median([w.records_per_s for w in ours])
            messages = median([w.messages_per_s for w in ours])
            server_cpu = median([w.server_cpu for w in ours])
            rows.append(
                {
                    "transport": run.transport,
                    "database": run.database,
                    "batch": batch,
                    "nodes": ours[0].nodes if ours else 0,
                    "anchor": "Mosquitto + paho echo"
                    if run.transport == "mqtt"
                    else "grpc.aio echo",
                    "ratio_pubsub": median(
                        [
                            o.records_per_s / p.records_per_s
                            for p, o in zip(pubsub, ours, strict=True)
                        ]
                    )
                    if pubsub
                    else math.nan,
                    "anchor_records_s": median([w.records_per_s for w in anchor]),
                    "echo_records_s": median([w.records_per_s for w in echo]),
                    "pubsub_records_s": median([w.records_per_s for w in pubsub]),
                    "records_s": rate,
                    "messages_s": messages,
                    "ratio": median(pairs),
                    "ratio_min": min(pairs, default=float("nan")),
                    "ratio_max": max(pairs, default=float("nan")),
                    "ratio_echo": median(echo_pairs),
                    "rtt_p50_ms": median([w.rtt_p50_ms for w in ours]),
                    "rtt_p99_ms": median([w.rtt_p99_ms for w in ours]),
                    "echo_rtt_p50_ms": median([w.rtt_p50_ms for w in echo]),
                    "server_cpu": server_cpu,
                    "echo_server_cpu": median([w.server_cpu for w in echo]),
                    "pubsub_server_cpu": median([w.server_cpu for w in pubsub]),
                    "db_cpu": median([w.db_cpu for w in ours]),
                    "client_cpu": median([w.client_cpu for w in ours]),
                    "echo_client_cpu": median([w.client_cpu for w in echo]),
                    "pubsub_client_cpu": median([w.client_cpu for w in pubsub]),
                    # One health report per node every REPORT_INTERVAL_S, one per message.
                    "nodes_at_interval": messages * REPORT_INTERVAL_S if batch == 1 else math.nan,
                    "cpu_ms_per_message": 1000 * server_cpu / messages if messages else math.nan,
                    "errors": sum(len(w.errors) for w in run.windows),
                }
            )
    return rows


def _ratio(ours: Window, anchor: Window) -> float:
    """Records per second of `ours` over the anchor's; NaN when the anchor acked nothing."""
    return ours.records_per_s / anchor.records_per_s if anchor.records_per_s else math.nan


def render(rows: list[dict[str, Any]], runs: list[Run]) -> str:
    header = (
        f"{'transport':<10}{'db':<11}{'batch':>6}{'echo':>9}{'pub/sub':>9}{'edgefleet':>10}"
        f"{'msg/s':>8}{'ratio':>7}{'range':>12}{'vs p/s':>8}{'rtt ms':>8}{'srv CPU':>8}"
        f"{'db CPU':>7}{'node CPU':>9}{'ms/msg':>8}{'nodes@10s':>10}"
    )
    lines = [
        "ingestion: health records acked per second (stop-and-wait per node), medians",
        header,
        "-" * len(header),
    ]
    for r in rows:
        pubsub = "-" if math.isnan(r["pubsub_records_s"]) else f"{r['pubsub_records_s']:.0f}"
        lines.append(
            f"{r['transport']:<10}{r['database']:<11}{r['batch']:>6}{r['echo_records_s']:>9.0f}"
            f"{pubsub:>9}{r['records_s']:>10.0f}{r['messages_s']:>8.0f}{r['ratio']:>7.2f}"
            f"{r['ratio_min']:>6.2f}-{r['ratio_max']:<5.2f}"
            f"{'-' if math.isnan(r['ratio_pubsub']) else format(r['ratio_pubsub'], '.3f'):>8}"
            f"{r['rtt_p50_ms']:>8.1f}{r['server_cpu']:>8.2f}{r['db_cpu']:>7.2f}"
            f"{r['client_cpu']:>9.2f}{r['cpu_ms_per_message']:>8.2f}"
            f"{'-' if math.isnan(r['nodes_at_interval']) else round(r['nodes_at_interval']):>10}"
        )
    lines += [
        "echo, pub/sub, edgefleet: records/s. echo = the same nodes against a bare echo that "
        "acks without storing (grpc.aio servicer / paho subscriber); pub/sub = paho "
        f"publishers ({PUBSUB_PUBLISHERS}, {PUBSUB_WINDOW} QoS 1 in flight each) -> Mosquitto "
        "-> one paho subscriber, open loop (MQTT only)",
        "ratio: edgefleet / echo (the raw transport doing the same exchange), median of "
        "back-to-back pairs (range min-max); vs p/s: edgefleet / open-loop pub/sub",
        "rtt: batch sent -> its Ack, p50; CPU: CPU seconds per second of the server (pinned "
        "to one core), of the PostgreSQL backends serving it (not pinned), of the node "
        "process (the other core); ms/msg: server CPU per message",
        f"nodes@10s (batch 1 only): nodes sending one report every {REPORT_INTERVAL_S:.0f} s, "
        "each in its own message, that the rate would carry; larger batches are a backlog "
        "being drained",
    ]
    for run in runs:
        check = "every acked record stored" if run.stored >= run.acked else "RECORDS MISSING"
        lines.append(
            f"  {run.transport}/{run.database}: {run.acked} records acked, {run.stored} in the "
            f"database ({check}); server RSS {run.server_rss_start / MB:.0f} -> "
            f"{run.server_rss_end / MB:.0f} MB"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.link_ingest", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes (100)")
    parser.add_argument(
        "--batches", default="100,1", help="records per RecordBatch, comma-separated (100,1)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per window")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds first")
    parser.add_argument("--repeat", type=int, default=3, help="windows per server and batch")
    parser.add_argument("--transports", default="grpc,mqtt", help="grpc and/or mqtt")
    parser.add_argument(
        "--databases", default="postgresql", help="postgresql and/or sqlite (postgresql)"
    )
    parser.add_argument(
        "--broker-option",
        action="append",
        default=None,
        help="a mosquitto.conf line for the private brokers (repeatable); default "
        f"{DEFAULT_BROKER_OPTIONS!r}, as the operator guide recommends; '' for none",
    )
    parser.add_argument(
        "--health-processor",
        action="store_true",
        help="run the health processor in the measured control plane too (default: off, "
        "EDGEFLEET_HEALTH_PROCESSOR=false: this measures ingestion; bench.health_store "
        "measures the processor)",
    )
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "link_ingest")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={
            "nodes": 4,
            "batches": "10",
            "seconds": 2.0,
            "warmup": 1.0,
            "repeat": 1,
            "databases": "sqlite",
        },
    )
    if args.broker_option is None:
        args.broker_option = list(DEFAULT_BROKER_OPTIONS)
    args.broker_option = [line for line in args.broker_option if line.strip()]
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        parser.error("--batches takes integers")
    if not args.transports or set(args.transports) - {"grpc", "mqtt"}:
        parser.error("--transports takes grpc and/or mqtt")
    if not args.databases or set(args.databases) - {"postgresql", "sqlite"}:
        parser.error("--databases takes postgresql and/or sqlite")
    if not args.batches or min(args.batches) < 1 or max(args.batches) > 1000:
        parser.error("--batches must be between 1 and 1000 (the control plane's limit)")
    if args.nodes < 1 or args.repeat < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--nodes, --repeat and --seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work_root: Path = args.workdir.resolve()
    shutil.rmtree(work_root, ignore_errors=True)
    work_root.mkdir(parents=True)
    report = Report("link_ingest")
    runs: list[Run] = []
    print(
        f"ingestion: {args.nodes} nodes, batches {args.batches}, {args.repeat} x "
        f"{args.seconds:g} s windows; control plane on CPU {CP_CPU}, nodes on CPU {NODE_CPU} "
        f"({'pinned' if can_pin() else 'NOT pinned'}); health processor "
        f"{'on' if args.health_processor else 'off'}; reports of {len(health_payload(0))} bytes",
        flush=True,
    )
    try:
        for kind in args.databases:
            for transport in args.transports:
                work = work_root / f"{transport}-{kind}"
                work.mkdir(parents=True)
                runner = run_grpc if transport == "grpc" else run_mqtt
                runs.append(runner(args, kind, work))
    finally:
        if not args.keep:
            shutil.rmtree(work_root, ignore_errors=True)
    rows = summarise(runs)
    print()
    print(render(rows, runs))
    print(f"code: {git_describe()}")
    print(report.load_line())
    for row in rows:
        report.figure(
            f"{row['transport']}/{row['database']} batch {row['batch']}",
            row["records_s"],
            "records/s",
            anchor=row["anchor_records_s"],
            anchor_name=row["anchor"],
            goal=f"ratio >= {GOAL_RATIO}",
            met=row["ratio"] >= GOAL_RATIO,
        )
    return report.finish(
        args,
        {
            "runs": [{**asdict(r), "windows": [asdict(w) for w in r.windows]} for r in runs],
            "summary": rows,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
