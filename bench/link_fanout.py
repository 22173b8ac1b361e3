"""Fan-out: how long a desired-state change takes to reach every connected node.

Measures, for N simulated nodes (default 10,000) enrolled for real (bootstrap token + CSR
each), the time from the first signed assignment until the last node has received its
own, over gRPC (one mTLS `Sync` stream per node) and over MQTT (a retained doorbell per
node), along these paths: the link layer called directly (`LinkHub.send`,
`MqttBridge.publish_desired`, one freshly signed assignment per node), and end to end
through `DirectorService.pin_many` for the whole fleet (what `POST /v1/fleets/F/pin` and
`edgefleet nodes pin --fleet F --all` run: chunks of 1,000 nodes, a transaction each,
then one delivery call per chunk); optionally (``--single-pin-rounds``) through
`DirectorService.pin` one node at a time, the path before `pin_many`. Beside them, in
the same run, the bare transport with the same connections and message sizes: a grpc.aio
server that pushes one message onto every stream, a paho client that publishes to every
node's topic. It also reports the control plane's memory per connected node.

The control plane runs in this process, pinned to CPU 0 (the benchmark calls the
services itself rather than through REST); the simulated nodes run in child processes
pinned to CPU 1. Not a test: it asserts nothing unless ``--check`` is given. See
docs/benchmarks.md.

    python -m bench.link_fanout [--nodes 10000] [--transports grpc,mqtt] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import math
import multiprocessing
import os
import queue
import resource
import shutil
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._harness import (
    AGENT_VERSION,
    EnrolledNode,
    InProcessPlane,
    LoopbackTls,
    bare_grpc_link,
    database,
    grpc_link,
)
from bench._report import Report, parse_benchmark_args
from bench._util import (
    BENCH_DIR,
    MB,
    PrivateMosquitto,
    can_pin,
    git_describe,
    median,
    pin_self,
    rss_bytes,
)

GOAL_FANOUT_S = 10.0
"""Issue goal: every one of 10,000 nodes has the change within 10 s (AWS IoT Jobs: 1,000/min)."""
GOAL_NODES = 10_000

CP_CPU = 0
NODE_CPU = 1
FLEET = "bench"
NODES_PER_PROCESS = 2_500
CONNECT_CONCURRENCY = 64  # per node process: keeps the listen backlogs from overflowing
CONNECT_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
WORKER_LIFETIME_S = 3_600.0  # a node process ends by itself after this, whatever happens
TARGET_SHA256 = "ab" * 32
TARGET_LENGTH = 4_700_000
MODEL = "detector"

log = logging.getLogger("bench.link_fanout")


# ----------------------------------------------------------------------------- data


@dataclass
class Round:
    """One desired-state change to every node and when each node had it."""

    transport: str
    path: str  # bare, hub-loop, hub-thread, publish_desired, director.pin_many, director.pin
    number: int  # the change: its target is models/detector/1.0.<number>/model.onnx
    nodes: int
    arrived: int = 0
    started: float = 0.0  # time.monotonic() of the first send (shared by all processes)
    queued_s: float = 0.0  # until the sender had handed the last message over
    sign_s: float = 0.0  # of which signing assignments
    last_s: float = math.nan  # until the last node had it
    p50_s: float = math.nan
    p99_s: float = math.nan
    dropped: int = 0

    @property
    def complete(self) -> bool:
        return self.arrived == self.nodes


@dataclass
class Phase:
    """One server (bare or edgefleet) with every node connected to it."""

    transport: str
    server: str
    nodes: int
    connected: int = 0
    connect_s: float = 0.0
    ready_s: float = 0.0  # until the control plane had every Hello (edgefleet only)
    server_rss_idle: int = 0
    server_rss_connected: int = 0
    broker_rss_idle: int = 0
    broker_rss_connected: int = 0
    rounds: list[Round] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def server_bytes_per_node(self) -> float:
        return (self.server_rss_connected - self.server_rss_idle) / max(1, self.connected)

    @property
    def broker_bytes_per_node(self) -> float:
        return (self.broker_rss_connected - self.broker_rss_idle) / max(1, self.connected)


# ----------------------------------------------------------------------------- node processes


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    transport: str  # grpc | mqtt
    nodes: list[EnrolledNode]
    ca_pem: bytes
    port: int
    cpu: int | None
    connect_concurrency: int = CONNECT_CONCURRENCY


class Arrivals:
    """When each node first had each change; reports a change once all its nodes had it.

    A change is known by the version in its assignment's target path, so a repeat (a
    Hello answered with the current assignment, a redelivery) is not counted twice.
    """

    def __init__(self, spec: WorkerSpec, reports: Any) -> None:
        self._spec = spec
        self._reports = reports
        self._seen: dict[int, set[int]] = {}
        self._times: dict[int, list[float]] = {}

    def arrived(self, index: int, payload: Any, at: float) -> None:
        number = change_number(payload)
        if number is None:
            return
        seen = self._seen.setdefault(number, set())
        if index in seen:
            return
        seen.add(index)
        times = self._times.setdefault(number, [])
        times.append(at)
        if len(times) == len(self._spec.nodes):
            self._reports.put(("round", self._spec.index, number, times))

    def final(self) -> None:
        counts = {number: len(times) for number, times in self._times.items()}
        self._reports.put(("final", self._spec.index, counts))


def change_number(message: Any) -> int | None:
    """The change a downlink ControlMessage (or its bytes) carries, or None."""
    from protos.edgefleet.fleet.v1 import director_pb2, link_pb2

    if isinstance(message, bytes | bytearray):
        message = link_pb2.ControlMessage.FromString(bytes(message))
    if message.WhichOneof("body") != "desired":
        return None
    assignment = director_pb2.DirectorAssignment.FromString(message.desired.assignment.assignment)
    version = assignment.target_path.split("/")[2]
    return int(version.rsplit(".", 1)[1])


def node_worker(spec: WorkerSpec, reports: Any, stop: Any) -> None:
    """Entry point of a node process (spawned): connect every node, count arrivals."""
    pin_self(spec.cpu)
    logging.basicConfig(level=logging.ERROR)
    try:
        if spec.transport == "grpc":
            asyncio.run(_grpc_nodes(spec, reports, stop))
        else:
            _mqtt_nodes(spec, reports, stop)
    except BaseException as exc:
        reports.put(("error", spec.index, f"{type(exc).__name__}: {exc}"))
        raise


async def _grpc_nodes(spec: WorkerSpec, reports: Any, stop: Any) -> None:
    """Each node: its own `GrpcNodeLink` (own channel, own mTLS identity), Hello, read."""
    from edge_node.testing.simulator import SimulatedFleet, SimulatedNode, SimulatorConfig

    target = f"127.0.0.1:{spec.port}"
    fleet = SimulatedFleet(
        [grpc_link(target, node, spec.ca_pem, connect_timeout_s=120.0) for node in spec.nodes],
        SimulatorConfig(
            agent_version=AGENT_VERSION,
            connect_concurrency=spec.connect_concurrency,
            connect_timeout_s=120.0,
            connect_attempts=3,
        ),
    )
    arrivals = Arrivals(spec, reports)
    outcome = {"ok": 0, "failed": 0}

    def settled(node: SimulatedNode, error: BaseException | None) -> None:
        if error is None:
            outcome["ok"] += 1
        else:
            outcome["failed"] += 1
            reports.put(("failed", spec.index, f"{spec.nodes[node.index].node_id}: {error}"))
        _settled(spec, reports, outcome)

    def arrived(index: int, message: Any, at: float) -> None:
        arrivals.arrived(index, message, at)

    async def stopped() -> None:
        deadline = time.monotonic() + WORKER_LIFETIME_S
        while not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    await fleet.connect_all(settled)
    await fleet.listen_all(arrived, stopped)
    arrivals.final()
    await fleet.close()


def _settled(spec: WorkerSpec, reports: Any, outcome: dict[str, int]) -> None:
    if outcome["ok"] + outcome["failed"] == len(spec.nodes):
        reports.put(("connected", spec.index, outcome["ok"], outcome["failed"]))


def _mqtt_nodes(spec: WorkerSpec, reports: Any, stop: Any) -> None:
    """Many paho clients on one selector loop (`MqttSwarm`), each on the wire like
    `MqttNodeLink`, which runs one paho network thread per node: 2,500 nodes per process
    cannot afford that; the packets are the same."""
    from edge_node.testing.mqtt_swarm import MqttSwarm, SwarmConfig, SwarmNode

    swarm = MqttSwarm(
        SwarmConfig(
            fleet=FLEET,
            port=spec.port,
            agent_version=AGENT_VERSION,
            connect_concurrency=spec.connect_concurrency,
        ),
        [SwarmNode(node.node_id, node.mqtt_password) for node in spec.nodes],
    )
    arrivals = Arrivals(spec, reports)
    outcome = {"ok": 0, "failed": 0}

    def settled(index: int, ok: bool, why: str) -> None:
        outcome["ok" if ok else "failed"] += 1
        if not ok:
            reports.put(("failed", spec.index, f"{spec.nodes[index].node_id}: {why}"))
        _settled(spec, reports, outcome)

    deadline = time.monotonic() + WORKER_LIFETIME_S
    swarm.run(
        keep_running=lambda: not stop.is_set() and time.monotonic() < deadline,
        on_settled=settled,
        on_desired=arrivals.arrived,
    )
    arrivals.final()


class NodeProcesses:
    """The node processes of one phase, and their reports; always ended on exit."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self._context = multiprocessing.get_context("spawn")
        self.reports: Any = self._context.Queue()
        self._stop = self._context.Event()
        self._procs = [
            self._context.Process(
                target=node_worker,
                args=(spec, self.reports, self._stop),
                name=f"nodes-{spec.transport}-{spec.index}",
                daemon=True,
            )
            for spec in specs
        ]
        self.specs = specs
        self.finals: list[dict[int, int]] = []
        self.failures: list[str] = []
        self._rounds: dict[int, list[list[float]]] = {}

    def __enter__(self) -> NodeProcesses:
        for proc in self._procs:
            proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self._procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        with contextlib.suppress(Exception):
            while True:
                self._handle(self.reports.get_nowait())

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def _handle(self, report: tuple[Any, ...]) -> tuple[Any, ...]:
        kind = report[0]
        if kind == "round":
            self._rounds.setdefault(report[2], []).append(report[3])
        elif kind == "final":
            self.finals.append(report[2])
        elif kind == "failed":
            if len(self.failures) < 20:
                self.failures.append(report[2])
        elif kind == "error":
            raise RuntimeError(f"node process {report[1]} failed: {report[2]}")
        return report

    async def wait_connected(self, timeout_s: float) -> tuple[int, int]:
        """Until every process has settled every node; (connected, failed)."""
        settled: dict[int, tuple[int, int]] = {}
        deadline = time.monotonic() + timeout_s
        while len(settled) < len(self._procs):
            report = await self._next(deadline, "the nodes to connect")
            if report[0] == "connected":
                settled[report[1]] = (report[2], report[3])
        return sum(ok for ok, _ in settled.values()), sum(bad for _, bad in settled.values())

    async def wait_round(self, number: int, timeout_s: float) -> list[float] | None:
        """Every node's arrival time of change ``number``, or None after the timeout."""
        deadline = time.monotonic() + timeout_s
        while len(self._rounds.get(number, [])) < len(self._procs):
            try:
                await self._next(deadline, f"change {number} to reach every node")
            except TimeoutError:
                return None
        return [t for times in self._rounds[number] for t in times]

    async def _next(self, deadline: float, what: str) -> tuple[Any, ...]:
        while True:
            try:
                return self._handle(self.reports.get_nowait())
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            for proc in self._procs:
                if not proc.is_alive() and not self._stop.is_set():
                    raise RuntimeError(f"{proc.name} exited with {proc.exitcode}")
            await asyncio.sleep(0.005)

    def arrived_in(self, number: int) -> int:
        return sum(final.get(number, 0) for final in self.finals)


def settled_rss() -> int:
    """This process's RSS after a collection and after glibc handed back its free pages, so
    that memory freed by an earlier phase does not read as this phase's."""
    import ctypes
    import ctypes.util

    gc.collect()
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    return rss_bytes(os.getpid())


def worker_specs(
    transport: str, nodes: list[EnrolledNode], ca_pem: bytes, port: int, processes: int
) -> list[WorkerSpec]:
    size = math.ceil(len(nodes) / processes)
    cpu = NODE_CPU if can_pin() else None
    return [
        WorkerSpec(i, transport, nodes[i * size : (i + 1) * size], ca_pem, port, cpu)
        for i in range(processes)
        if nodes[i * size : (i + 1) * size]
    ]


def finish_round(result: Round, times: list[float] | None) -> None:
    if times is None:
        return  # incomplete: `settle_incomplete` counts the arrivals after the phase
    offsets = sorted(t - result.started for t in times)
    result.arrived = len(offsets)
    result.last_s = offsets[-1]
    result.p50_s = offsets[len(offsets) // 2]
    result.p99_s = offsets[min(len(offsets) - 1, math.ceil(0.99 * len(offsets)) - 1)]


def settle_incomplete(rounds: list[Round], processes: NodeProcesses) -> None:
    for result in rounds:
        if not result.complete and result.arrived == 0:
            result.arrived = processes.arrived_in(result.number)


# ----------------------------------------------------------------------------- control plane


class Plane(InProcessPlane):
    """The harness's in-process control plane, plus what the fan-out rounds need: model
    versions to pin, the director's key and signed assignments."""

    def __init__(self, work: Path, database_url: str) -> None:
        from control_plane.director.assignments import load_or_create_director_key

        super().__init__(work, database_url, FLEET)
        # The director's own key, as the control plane loads it.
        self.director_key = load_or_create_director_key(self.data_dir / "director")
        self.sequence = 0

    def next_change(self) -> int:
        """A new change number: the assignments of change n name version 1.0.n."""
        self.sequence += 1
        return self.sequence

    def add_change_version(self, number: int) -> None:
        """Version 1.0.<number> of the detector, to pin."""
        self.add_model_version(
            MODEL, f"1.0.{number}", number, sha256=TARGET_SHA256, length=TARGET_LENGTH
        )

    def pin_fleet(self, result: Round) -> None:
        """`DirectorService.pin_many` for the whole fleet from this thread, as the REST
        handler runs it: the version looked up once, then per chunk of 1,000 nodes one
        transaction (lock, grouped max(sequence), signatures, one insert, one audit
        entry) and one call of the delivery port for the transports running here."""
        director = self.services.director
        self.add_change_version(result.number)
        result.started = time.monotonic()
        pinned = director.pin_many(
            self.admin, MODEL, f"1.0.{result.number}", fleet=FLEET, labels={}
        )
        result.queued_s = time.monotonic() - result.started
        result.sign_s = math.nan
        if pinned.pinned != result.nodes:
            log.warning("pin_many pinned %d of %d nodes", pinned.pinned, result.nodes)

    def pin_each(self, node_ids: list[str], result: Round) -> None:
        """`DirectorService.pin` for every node, one after another (the path before
        `pin_many`): a transaction, a version lookup and a delivery per node."""
        director = self.services.director
        self.add_change_version(result.number)
        result.started = time.monotonic()
        for node_id in node_ids:
            director.pin(self.admin, node_id, MODEL, f"1.0.{result.number}")
        result.queued_s = time.monotonic() - result.started
        result.sign_s = math.nan

    def sign(self, node_id: str) -> Any:
        """A fresh signed assignment for one node, as the director makes it."""
        from control_plane.director.assignments import sign_assignment

        issued = datetime.now(UTC).replace(microsecond=0)
        return sign_assignment(
            self.director_key,
            fleet=FLEET,
            node_id=node_id,
            sequence=self.sequence,
            target_path=f"models/{MODEL}/1.0.{self.sequence}/model.onnx",
            sha256=TARGET_SHA256,
            length=TARGET_LENGTH,
            issued_at=issued,
            expires_at=issued + timedelta(days=7),
        )

    def desired_message(self, node_id: str) -> Any:
        from protos.edgefleet.fleet.v1 import link_pb2

        return link_pb2.ControlMessage(
            protocol_version=1, desired=link_pb2.DesiredState(assignment=self.sign(node_id))
        )


# ----------------------------------------------------------------------------- gRPC


def bare_grpc_server(tls: LoopbackTls, conn: Any) -> None:
    """The raw gRPC anchor (spawned, pinned like the control plane): a bare NodeLink
    (`bench._harness.bare_grpc_link`) that keeps a queue per stream; on "push" it puts one
    message on every queue."""
    pin_self(CP_CPU)
    asyncio.run(_bare_grpc(tls, conn))


async def _bare_grpc(tls: LoopbackTls, conn: Any) -> None:
    from protos.edgefleet.fleet.v1 import link_pb2

    streams: list[asyncio.Queue[Any]] = []

    async def pushed(messages: AsyncIterator[Any]) -> AsyncGenerator[Any]:
        inbox: asyncio.Queue[Any] = asyncio.Queue(64)
        streams.append(inbox)

        async def drain() -> None:
            async for _ in messages:
                pass

        reader = asyncio.create_task(drain())
        try:
            while True:
                yield await inbox.get()
        finally:
            reader.cancel()
            streams.remove(inbox)

    async with bare_grpc_link(tls, pushed, node_id="bare") as port:
        conn.send(("port", port, os.getpid()))
        loop = asyncio.get_running_loop()
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command[0] == "push":
                message = link_pb2.ControlMessage.FromString(command[1])
                started = time.monotonic()
                for inbox in list(streams):
                    inbox.put_nowait(message)
                conn.send(("pushed", started, time.monotonic() - started, len(streams)))
            elif command[0] == "count":
                conn.send(("count", len(streams)))
            else:
                break


@dataclass(frozen=True)
class PinRounds:
    """How many changes go through `pin_many` (the fleet at once) and through `pin`."""

    many: int
    single: int


async def grpc_phases(
    plane: Plane, nodes: list[EnrolledNode], rounds: int, pins: PinRounds, processes: int
) -> list[Phase]:
    return [
        await grpc_bare_phase(plane, nodes, rounds, processes),
        await grpc_edgefleet_phase(plane, nodes, rounds, pins, processes),
    ]


async def grpc_bare_phase(
    plane: Plane, nodes: list[EnrolledNode], rounds: int, processes: int
) -> Phase:
    ca = plane.services.ca
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(
        target=bare_grpc_server, args=(LoopbackTls.issued_by(ca), child), daemon=True
    )
    server.start()
    phase = Phase("grpc", "bare grpc.aio", len(nodes))
    try:
        _, port, pid = await _recv(parent, 60)
        await asyncio.sleep(0.5)
        phase.server_rss_idle = rss_bytes(pid)
        specs = worker_specs("grpc", nodes, ca.ca_pem, port, processes)
        print(f"  bare grpc.aio: connecting {len(nodes)} nodes ...", flush=True)
        with NodeProcesses(specs) as procs:
            started = time.monotonic()
            phase.connected, failed = await procs.wait_connected(CONNECT_TIMEOUT_S)
            phase.connect_s = time.monotonic() - started
            phase.failures = procs.failures
            parent.send(("count",))
            _, streams = await _recv(parent, 30)
            await asyncio.sleep(1.0)
            phase.server_rss_connected = rss_bytes(pid)
            print(
                f"  bare grpc.aio: {phase.connected} connected ({failed} failed, "
                f"{streams} streams) in {phase.connect_s:.1f} s",
                flush=True,
            )
            for _ in range(rounds):
                number = plane.next_change()
                message = plane.desired_message(nodes[0].node_id).SerializeToString()
                result = Round("grpc", "bare", number, phase.connected)
                parent.send(("push", message))
                _, result.started, result.queued_s, _ = await _recv(parent, 60)
                finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                phase.rounds.append(result)
                _print_round(result)
        settle_incomplete(phase.rounds, procs)
    finally:
        with contextlib.suppress(Exception):
            parent.send(("stop",))
        server.join(timeout=20)
        if server.is_alive():
            server.kill()
            server.join(timeout=10)
    return phase


async def _recv(conn: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not conn.poll():
        if time.monotonic() > deadline:
            raise TimeoutError("no answer from the bare server")
        await asyncio.sleep(0.005)
    return conn.recv()


async def grpc_edgefleet_phase(
    plane: Plane, nodes: list[EnrolledNode], rounds: int, pins: PinRounds, processes: int
) -> Phase:
    from control_plane.link.grpc_server import GrpcLinkConfig
    from control_plane.services import grpc_link_server

    services = plane.services
    server = grpc_link_server(
        services,
        GrpcLinkConfig(node_address="127.0.0.1:0", hostnames=("localhost",), ips=("127.0.0.1",)),
    )
    phase = Phase("grpc", "edgefleet GrpcLinkServer", len(nodes))
    await server.start()
    try:
        hub = server.hub
        await asyncio.sleep(0.5)
        phase.server_rss_idle = settled_rss()
        assert server.node_port is not None
        specs = worker_specs("grpc", nodes, services.ca.ca_pem, server.node_port, processes)
        print(f"  edgefleet gRPC: connecting {len(nodes)} nodes ...", flush=True)
        with NodeProcesses(specs) as procs:
            started = time.monotonic()
            phase.connected, failed = await procs.wait_connected(CONNECT_TIMEOUT_S)
            phase.connect_s = time.monotonic() - started
            phase.ready_s = phase.connect_s
            phase.failures = procs.failures
            await asyncio.sleep(1.0)
            phase.server_rss_connected = settled_rss()
            print(
                f"  edgefleet gRPC: {phase.connected} connected ({failed} failed, "
                f"{len(hub.connected())} in the hub) in {phase.connect_s:.1f} s",
                flush=True,
            )
            ids = [n.node_id for n in nodes]
            for _ in range(rounds):
                for path in ("hub-loop", "hub-thread"):
                    number = plane.next_change()
                    result = Round("grpc", path, number, phase.connected)
                    dropped = hub.dropped
                    if path == "hub-loop":
                        await _send_from_loop(plane, hub, ids, result)
                    else:
                        await asyncio.to_thread(_send_from_thread, plane, hub, ids, result)
                    result.dropped = hub.dropped - dropped
                    finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                    phase.rounds.append(result)
                    _print_round(result)
            for path, count in (("director.pin_many", pins.many), ("director.pin", pins.single)):
                for _ in range(count):
                    number = plane.next_change()
                    result = Round("grpc", path, number, phase.connected)
                    dropped = hub.dropped
                    await asyncio.to_thread(_pin_round, plane, ids, result)
                    result.dropped = hub.dropped - dropped
                    finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                    phase.rounds.append(result)
                    _print_round(result)
            # The nodes leave first, while the loop still serves their streams' ends.
            await asyncio.to_thread(procs.stop)
        settle_incomplete(phase.rounds, procs)
    finally:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await server.stop(1.0)
    return phase


def _pin_round(plane: Plane, ids: list[str], result: Round) -> None:
    if result.path == "director.pin_many":
        plane.pin_fleet(result)
    else:
        plane.pin_each(ids, result)


async def _send_from_loop(plane: Plane, hub: Any, ids: list[str], result: Round) -> None:
    """Sign and `hub.send` on the event loop, yielding every 256 nodes so delivery overlaps."""
    from protos.edgefleet.fleet.v1 import link_pb2

    result.started = time.monotonic()
    sign_s = 0.0
    for index, node_id in enumerate(ids):
        before = time.perf_counter()
        signed = plane.sign(node_id)
        sign_s += time.perf_counter() - before
        hub.send(
            node_id,
            link_pb2.ControlMessage(
                protocol_version=1, desired=link_pb2.DesiredState(assignment=signed)
            ),
        )
        if index % 256 == 255:
            await asyncio.sleep(0)
    result.queued_s = time.monotonic() - result.started
    result.sign_s = sign_s


def _send_from_thread(plane: Plane, hub: Any, ids: list[str], result: Round) -> None:
    """Sign and `hub.send` from a worker thread, as a service running off the loop would."""
    from protos.edgefleet.fleet.v1 import link_pb2

    result.started = time.monotonic()
    sign_s = 0.0
    for node_id in ids:
        before = time.perf_counter()
        signed = plane.sign(node_id)
        sign_s += time.perf_counter() - before
        hub.send(
            node_id,
            link_pb2.ControlMessage(
                protocol_version=1, desired=link_pb2.DesiredState(assignment=signed)
            ),
        )
    result.queued_s = time.monotonic() - result.started
    result.sign_s = sign_s


# ----------------------------------------------------------------------------- MQTT


class BarePublisher:
    """A plain paho client with the control plane's broker account: publish, nothing else."""

    def __init__(self, port: int, username: str, password: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self._connected = threading.Event()
        self._lock = threading.Lock()
        self._unacked = 0
        self._acked = threading.Event()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="bench-bare-publisher", protocol=mqtt.MQTTv5
        )
        client.username_pw_set(username, password)
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.connect("127.0.0.1", port, clean_start=True)
        client.loop_start()
        if not self._connected.wait(15):
            client.loop_stop()
            raise TimeoutError("the bare publisher did not connect")
        self._client = client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if not reason.is_failure:
            self._connected.set()

    def _on_publish(self, *_: Any) -> None:
        with self._lock:
            self._unacked -= 1
            if self._unacked == 0:
                self._acked.set()

    def publish_all(self, topics: list[str], payload: bytes, timeout_s: float) -> float:
        """Publish ``payload`` retained, QoS 1, to every topic, pipelined; seconds to all acks."""
        started = time.monotonic()
        with self._lock:
            self._unacked += len(topics)
            self._acked.clear()
        for topic in topics:
            self._client.publish(topic, payload, qos=1, retain=True)
        if not self._acked.wait(timeout_s):
            raise TimeoutError("the broker did not acknowledge every bare publish")
        return time.monotonic() - started

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


async def mqtt_phases(
    plane: Plane,
    nodes: list[EnrolledNode],
    rounds: int,
    pins: PinRounds,
    processes: int,
    work: Path,
) -> list[Phase]:
    from control_plane.link.mqtt_acl import (
        render_acl_file,
        render_password_file,
        write_broker_files,
    )
    from control_plane.link.mqtt_bridge import MqttBridgeConfig, control_plane_account
    from control_plane.link.mqtt_topics import Leaf, node_topic
    from control_plane.services import mqtt_bridge

    services = plane.services
    password = "bench-" + os.urandom(16).hex()
    config = MqttBridgeConfig(password=password, client_id="edgefleet-cp-bench")
    own = control_plane_account(plane.data_dir, config)
    accounts = services.nodes.inventory.mqtt_accounts(plane.admin)
    # Exactly what `edgefleet mqtt acl` writes.
    files = write_broker_files(
        work / "broker-files",
        render_password_file([own, *accounts]),
        render_acl_file(own.username, accounts),
    )
    broker = PrivateMosquitto(work / "broker", passwd=files.passwd, acl=files.acl).start()
    phase = Phase("mqtt", "edgefleet MqttBridge", len(nodes))
    bare = Phase("mqtt", "bare paho publisher", len(nodes))
    bridge = mqtt_bridge(services, dataclasses.replace(config, port=broker.port))
    try:
        bridge.start()
        if not bridge.wait_connected(30):
            raise RuntimeError("the MQTT bridge did not connect to the private broker")
        await asyncio.sleep(0.5)
        phase.server_rss_idle = settled_rss()
        phase.broker_rss_idle = rss_bytes(broker.pid)
        specs = worker_specs("mqtt", nodes, b"", broker.port, processes)
        print(f"  MQTT: connecting {len(nodes)} nodes ...", flush=True)
        with NodeProcesses(specs) as procs:
            started = time.monotonic()
            phase.connected, failed = await procs.wait_connected(CONNECT_TIMEOUT_S)
            phase.connect_s = time.monotonic() - started
            phase.failures = procs.failures
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while bridge.counts["hellos"] < phase.connected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            phase.ready_s = time.monotonic() - started
            await asyncio.sleep(1.0)
            phase.server_rss_connected = settled_rss()
            phase.broker_rss_connected = rss_bytes(broker.pid)
            bare.connected, bare.connect_s = phase.connected, phase.connect_s
            bare.broker_rss_idle = phase.broker_rss_idle
            bare.broker_rss_connected = phase.broker_rss_connected
            print(
                f"  MQTT: {phase.connected} connected ({failed} failed) in "
                f"{phase.connect_s:.1f} s; the bridge had {bridge.counts['hellos']} Hellos "
                f"after {phase.ready_s:.1f} s",
                flush=True,
            )
            topics = [node_topic(FLEET, n.node_id, Leaf.DESIRED) for n in nodes]
            publisher = BarePublisher(broker.port, own.username, password)
            try:
                for _ in range(rounds):
                    number = plane.next_change()
                    payload = plane.desired_message(nodes[0].node_id).SerializeToString()
                    result = Round("mqtt", "bare", number, bare.connected)
                    result.started = time.monotonic()
                    result.queued_s = await asyncio.to_thread(
                        publisher.publish_all, topics, payload, ROUND_TIMEOUT_S
                    )
                    finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                    bare.rounds.append(result)
                    _print_round(result)

                    number = plane.next_change()
                    result = Round("mqtt", "publish_desired", number, phase.connected)
                    await asyncio.to_thread(_publish_desired_all, plane, bridge, nodes, result)
                    finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                    phase.rounds.append(result)
                    _print_round(result)
            finally:
                publisher.close()
            delivery = _mqtt_delivery(plane, bridge)
            try:
                ids = [n.node_id for n in nodes]
                for path, count in (
                    ("director.pin_many", pins.many),
                    ("director.pin", pins.single),
                ):
                    for _ in range(count):
                        number = plane.next_change()
                        result = Round("mqtt", path, number, phase.connected)
                        await asyncio.to_thread(_pin_round, plane, ids, result)
                        finish_round(result, await procs.wait_round(number, ROUND_TIMEOUT_S))
                        phase.rounds.append(result)
                        _print_round(result)
            finally:
                plane.services.delivery.detach(delivery)
            await asyncio.to_thread(bridge.stop)
            await asyncio.to_thread(procs.stop)
        settle_incomplete(bare.rounds, procs)
        settle_incomplete(phase.rounds, procs)
    finally:
        bridge.stop()
        broker.stop()
    return [bare, phase]


def _mqtt_delivery(plane: Plane, bridge: Any) -> Any:
    """Attach the bridge to the director's delivery port, as the server's lifespan does
    (the gRPC server attaches itself when it starts)."""
    from control_plane.link.desired import MqttDelivery

    delivery = MqttDelivery(bridge)
    plane.services.delivery.attach(delivery)
    return delivery


def _publish_desired_all(
    plane: Plane, bridge: Any, nodes: list[EnrolledNode], result: Round
) -> None:
    """Sign and ring each node's doorbell, one after another (each waits for its PUBACK)."""
    result.started = time.monotonic()
    sign_s = 0.0
    for node in nodes:
        before = time.perf_counter()
        signed = plane.sign(node.node_id)
        sign_s += time.perf_counter() - before
        bridge.publish_desired(FLEET, node.node_id, signed, timeout_s=30.0)
    result.queued_s = time.monotonic() - result.started
    result.sign_s = sign_s


# ----------------------------------------------------------------------------- report


def _print_round(result: Round) -> None:
    state = "" if result.complete else f" INCOMPLETE ({result.arrived}/{result.nodes})"
    print(
        f"    {result.transport} {result.path}: last node after {result.last_s:.2f} s "
        f"(p50 {result.p50_s:.2f}, p99 {result.p99_s:.2f}); sender done after "
        f"{result.queued_s:.2f} s{_signing(result.sign_s)}{state}",
        flush=True,
    )


def _signing(seconds: float) -> str:
    return "" if math.isnan(seconds) or seconds == 0 else f", of which signing {seconds:.2f} s"


def summarise(phases: list[Phase]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for phase in phases:
        by_path: dict[str, list[Round]] = {}
        for result in phase.rounds:
            by_path.setdefault(result.path, []).append(result)
        for path, results in by_path.items():
            complete = [r for r in results if r.complete]
            rows.append(
                {
                    "transport": phase.transport,
                    "server": phase.server,
                    "path": path,
                    "nodes": phase.connected,
                    "rounds": len(results),
                    "complete_rounds": len(complete),
                    "last_s": median([r.last_s for r in complete]),
                    "best_last_s": min((r.last_s for r in complete), default=math.nan),
                    "p50_s": median([r.p50_s for r in complete]),
                    "p99_s": median([r.p99_s for r in complete]),
                    "queued_s": median([r.queued_s for r in results]),
                    "sign_s": median([r.sign_s for r in results]),
                    "connect_s": phase.connect_s,
                    "ready_s": phase.ready_s,
                    "server_kb_per_node": phase.server_bytes_per_node / 1000,
                    "broker_kb_per_node": phase.broker_bytes_per_node / 1000,
                }
            )
    return rows


def _cell(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.2f}"


def render(rows: list[dict[str, Any]], phases: list[Phase]) -> str:
    header = (
        f"{'transport':<10}{'server':<26}{'path':<19}{'nodes':>7}{'last s':>8}{'p50 s':>7}"
        f"{'p99 s':>7}{'sent s':>8}{'sign s':>8}{'rounds':>8}"
    )
    lines = ["fan-out: seconds from the first send until a node had it", header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['transport']:<10}{r['server']:<26}{r['path']:<19}{r['nodes']:>7}"
            f"{r['last_s']:>8.2f}{r['p50_s']:>7.2f}{r['p99_s']:>7.2f}{r['queued_s']:>8.2f}"
            f"{_cell(r['sign_s']):>8}{r['complete_rounds']:>5}/{r['rounds']:<2}"
        )
    lines += [
        "last/p50/p99: medians over rounds of when the last / median / 99th-percentile node "
        "had the change; sent: until the sender had handed over every message; sign: of "
        "which Ed25519 signing (hub and publish_desired paths sign one assignment per node in "
        "the window; director.pin_many / director.pin: the whole pin path, signing "
        "included)",
        "",
        "connections and memory (RSS growth of the server process / broker, per connected node)",
    ]
    for phase in phases:
        broker = (
            f", broker {phase.broker_bytes_per_node / 1000:.1f} kB/node"
            if phase.broker_rss_connected
            else ""
        )
        ready = f", every Hello handled after {phase.ready_s:.1f} s" if phase.ready_s else ""
        lines.append(
            f"  {phase.transport} {phase.server}: {phase.connected}/{phase.nodes} connected in "
            f"{phase.connect_s:.1f} s{ready}; server "
            f"{phase.server_rss_idle / MB:.0f} -> {phase.server_rss_connected / MB:.0f} MB = "
            f"{phase.server_bytes_per_node / 1000:.1f} kB/node{broker}"
        )
        for failure in phase.failures[:3]:
            lines.append(f"    failed: {failure}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.link_fanout", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=GOAL_NODES, help="simulated nodes (10000)")
    parser.add_argument("--transports", default="grpc,mqtt", help="grpc and/or mqtt")
    parser.add_argument("--rounds", type=int, default=2, help="changes per path (median)")
    parser.add_argument(
        "--pin-rounds",
        type=int,
        default=2,
        help="end-to-end changes through DirectorService.pin_many per transport (0: none)",
    )
    parser.add_argument(
        "--single-pin-rounds",
        type=int,
        default=0,
        help="end-to-end changes through DirectorService.pin, one node at a time (about 40 s "
        "per change for 10,000 nodes; the path before pin_many)",
    )
    parser.add_argument(
        "--node-processes",
        type=int,
        default=0,
        help=f"processes holding the nodes (default: one per {NODES_PER_PROCESS})",
    )
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "link_fanout")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parse_benchmark_args(
        parser,
        argv,
        quick={
            "nodes": 20,
            "rounds": 1,
            "pin_rounds": 1,
            "node_processes": 1,
            "database": "sqlite",
        },
    )
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not transports or set(transports) - {"grpc", "mqtt"}:
        parser.error("--transports takes grpc and/or mqtt")
    if (
        args.nodes < 1
        or args.rounds < 1
        or args.node_processes < 0
        or args.pin_rounds < 0
        or args.single_pin_rounds < 0
    ):
        parser.error("--nodes, --rounds and --node-processes must be positive")
    args.transports = transports
    args.node_processes = args.node_processes or math.ceil(args.nodes / NODES_PER_PROCESS)
    return args


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    work: Path = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    raise_fd_limit()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pin_self(CP_CPU)
    report = Report("link_fanout")
    phases: list[Phase] = []
    pins = PinRounds(many=args.pin_rounds, single=args.single_pin_rounds)
    enroll_s = 0.0
    db_per_node = math.nan
    try:
        with database(args.database, work) as made:
            plane = Plane(work, made.url)
            try:
                print(f"enrolling {args.nodes} nodes (token + CSR each) ...", flush=True)
                started = time.monotonic()
                db_before = plane.database_bytes()
                nodes = plane.enroll(args.nodes)
                enroll_s = time.monotonic() - started
                db_after = plane.database_bytes()
                if db_before is not None and db_after is not None:
                    db_per_node = (db_after - db_before) / args.nodes
                print(f"  {args.nodes} nodes enrolled in {enroll_s:.1f} s", flush=True)
                if "grpc" in args.transports:
                    print("gRPC:", flush=True)
                    phases += asyncio.run(
                        grpc_phases(plane, nodes, args.rounds, pins, args.node_processes)
                    )
                if "mqtt" in args.transports:
                    print("MQTT:", flush=True)
                    phases += asyncio.run(
                        mqtt_phases(plane, nodes, args.rounds, pins, args.node_processes, work)
                    )
            finally:
                plane.close()
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    rows = summarise(phases)
    print()
    print(render(rows, phases))
    if not math.isnan(db_per_node):
        print(
            f"database on disk: {db_per_node / 1000:.1f} kB per enrolled node (node row, token, "
            "audit entries and their indexes)"
        )
    print(f"code: {git_describe()}")
    print(
        f"enrollment: {args.nodes} nodes in {enroll_s:.1f} s; database {args.database}; "
        f"control plane pinned to CPU {CP_CPU}, nodes to CPU {NODE_CPU} "
        f"({'pinned' if can_pin() else 'NOT pinned: fewer than 2 CPUs'})"
    )
    print(report.load_line())
    for row in rows:
        if row["path"] == "bare":
            continue
        bare = [r for r in rows if r["path"] == "bare" and r["transport"] == row["transport"]]
        report.figure(
            f"{row['transport']} {row['path']}: last of {row['nodes']} nodes",
            row["last_s"],
            "s",
            anchor=bare[0]["last_s"] if bare else None,
            anchor_name="bare transport",
            goal=f"{GOAL_NODES} nodes in < {GOAL_FANOUT_S:.0f} s",
            met=row["nodes"] >= GOAL_NODES and row["last_s"] < GOAL_FANOUT_S,
        )
    return report.finish(
        args,
        {
            "enroll_s": enroll_s,
            "database_bytes_per_node": db_per_node,
            "phases": [asdict(p) for p in phases],
            "summary": rows,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
