"""The one control-plane harness of the benchmarks: a database to run on, a control plane
started on loopback (as ``edgefleet server`` or in this process), a fleet, N enrolled nodes.

Every benchmark that needs a control plane takes it from here. Not here: what a benchmark
measures, the simulated nodes (`edge_node.testing.simulator`), the report (bench._report).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.process
import os
import secrets
import sqlite3
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._util import (
    REPO_ROOT,
    ChildProcess,
    can_pin,
    free_port,
    pinned,
    run_measured,
    throwaway_postgres,
    wait_http,
    wait_port,
)

START_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 600.0
AGENT_VERSION = "bench-0.1.0"


# ----------------------------------------------------------------------------- processes


LAUNCHER = (
    "import sys; from control_plane.cli.launch import run; "
    "sys.argv[0] = 'edgefleet'; sys.exit(run())"
)
"""What the ``edgefleet`` console script runs (pyproject.toml ``[project.scripts]``)."""


def edgefleet_python_args(tree: Path = REPO_ROOT) -> list[str]:
    """Interpreter arguments that start ``edgefleet`` from `tree` by its real entry point,
    the launcher; a checkout older than the launcher starts at the CLI module it had."""
    if (tree / "control_plane" / "cli" / "launch.py").exists():
        return ["-c", LAUNCHER]
    return ["-m", "control_plane.cli.main"]


def edgefleet_command() -> list[str]:
    """The ``edgefleet`` console script beside this Python, or what it runs when not
    installed: either way through the launcher, as an operator's shell starts it."""
    script = Path(sys.executable).with_name("edgefleet")
    if script.exists():
        return [str(script)]
    return [sys.executable, *edgefleet_python_args()]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with wide, plain, quiet output for a child, plus `extra`."""
    env = dict(os.environ)
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "EDGEFLEET_LOG_LEVEL": "warning"})
    env.update(extra)
    return env


def cli(args: Sequence[str], env: Mapping[str, str], log: Path) -> None:
    """Run ``edgefleet ARGS``; raise with the end of its output when it fails."""
    measured = run_measured(
        [*edgefleet_command(), *args], env=env, timeout_s=CLI_TIMEOUT_S, log=log
    )
    if measured.returncode != 0:
        raise RuntimeError(f"edgefleet {' '.join(args)} failed:\n{measured.output[-2000:]}")


def read_token(data_dir: Path, timeout_s: float = START_TIMEOUT_S) -> str:
    """The admin token a starting control plane writes into its data directory."""
    path = data_dir / "admin-token"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and (token := path.read_text().strip()):
            return token
        time.sleep(0.05)
    raise TimeoutError(f"{path} did not appear within {timeout_s} s")


@contextlib.contextmanager
def spawned(target: Any, *args: Any) -> Iterator[multiprocessing.process.BaseProcess]:
    """A spawned helper process, terminated (then killed) on exit."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


# ----------------------------------------------------------------------------- database


@dataclass(frozen=True, slots=True)
class Database:
    url: str  # SQLAlchemy URL
    postgres_name: str | None  # the PostgreSQL database's name (its backends' CPU is counted)


@contextlib.contextmanager
def database(kind: str, work: Path, *, prefix: str = "edgefleet_bench") -> Iterator[Database]:
    """A throwaway database: a new PostgreSQL database dropped on exit, or a SQLite file
    in `work` removed on exit."""
    if kind == "postgresql":
        with throwaway_postgres(prefix=prefix) as (url, name):
            yield Database(url, name)
        return
    if kind != "sqlite":
        raise ValueError(f"no database kind {kind!r} (postgresql or sqlite)")
    work.mkdir(parents=True, exist_ok=True)
    # A name of its own, so that two runs sharing `work` never share a database.
    path = work / f"{prefix}_{secrets.token_hex(4)}.db"
    try:
        yield Database(f"sqlite:///{path}", None)
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def stored_records(url: str) -> int:
    """How many node records the control plane's database holds."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            return int(conn.execute("SELECT count(*) FROM node_records").fetchone()[0])
    import psycopg

    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM node_records").fetchone()
        return int(row[0]) if row else 0


# ----------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class EnrolledNode:
    """What a simulated node needs to connect: its TLS identity and/or MQTT password."""

    node_id: str
    key_pem: bytes = b""
    cert_pem: bytes = b""
    mqtt_password: str = ""


def grpc_link(target: str, node: EnrolledNode, ca_pem: bytes, connect_timeout_s: float) -> Any:
    """The node's real `GrpcNodeLink` to ``HOST:PORT`` (the server certificate says localhost)."""
    from edge_node.link.grpc_link import GrpcLinkSettings, GrpcNodeLink, NodeCredentials

    settings = GrpcLinkSettings(
        target=target, server_name="localhost", connect_timeout_s=connect_timeout_s
    )
    return GrpcNodeLink(settings, NodeCredentials(node.key_pem, node.cert_pem, ca_pem))


def mqtt_link(fleet: str, port: int, node: EnrolledNode, connect_timeout_s: float) -> Any:
    """The node's real `MqttNodeLink` through the broker on 127.0.0.1:``port``."""
    from edge_node.link.mqtt_link import MqttLinkConfig, MqttNodeLink

    return MqttNodeLink(
        MqttLinkConfig(
            fleet=fleet,
            node_id=node.node_id,
            username=node.node_id,
            password=node.mqtt_password,
            port=port,
            connect_timeout_s=connect_timeout_s,
        )
    )


@dataclass(frozen=True, slots=True)
class LoopbackTls:
    """A server certificate of the fleet CA for 127.0.0.1/localhost and the CA's own:
    what a raw anchor server needs for the nodes' mTLS (plain bytes, so it pickles into a
    spawned process)."""

    ca_pem: bytes
    key_pem: bytes
    cert_pem: bytes

    @classmethod
    def issued_by(cls, ca: Any) -> LoopbackTls:
        """Issued now by `ca` (a `control_plane.identity.ca.CertificateAuthority`)."""
        creds = ca.issue_server_certificate(["localhost"], ["127.0.0.1"], now=datetime.now(UTC))
        return cls(bytes(ca.ca_pem), creds.private_key_pem, creds.certificate_pem)


@contextlib.asynccontextmanager
async def bare_grpc_link(
    tls: LoopbackTls,
    sync: Callable[[AsyncIterator[Any]], AsyncGenerator[Any]],
    *,
    node_id: str,
    port: int = 0,
) -> AsyncIterator[int]:
    """A bare grpc.aio NodeLink server on 127.0.0.1:`port` (0: a free one), yielding the
    port: the anchor the link benchmarks measure edgefleet against.

    The same mTLS as the control plane (client certificates of the fleet CA required) and
    the same messages. Its ``Sync`` reads the Hello and answers the initial metadata the
    node link waits for (``edgefleet-node-id`` = `node_id`), then yields what `sync` makes
    of the rest of the stream. No interceptor, no identity lookup, no database.
    """
    import grpc

    from protos.edgefleet.fleet.v1 import link_pb2_grpc

    class BareLink(link_pb2_grpc.NodeLinkServicer):
        async def Sync(self, request_iterator: Any, context: Any) -> Any:
            await anext(request_iterator, None)
            await context.send_initial_metadata((("edgefleet-node-id", node_id),))
            # aclosing: a stream that ends ends `sync` now (its cleanup runs), not at GC
            async with contextlib.aclosing(sync(request_iterator)) as replies:
                async for message in replies:
                    yield message

    server = grpc.aio.server()
    link_pb2_grpc.add_NodeLinkServicer_to_server(BareLink(), server)  # type: ignore[abstract]  # Sync only
    credentials = grpc.ssl_server_credentials(
        [(tls.key_pem, tls.cert_pem)], root_certificates=tls.ca_pem, require_client_auth=True
    )
    bound = server.add_secure_port(f"127.0.0.1:{port}", credentials)
    await server.start()
    try:
        yield bound
    finally:
        await server.stop(0)


# ----------------------------------------------------------------------------- control planes


class ServerProcess:
    """``edgefleet server`` as its own process on loopback ports (pinned to `cpu` if it can).

    `database_url` None: the server's own default (SQLite in its data directory).
    `extra_args`, `env`: more command-line options and environment for the server.
    """

    def __init__(
        self,
        work: Path,
        database_url: str | None = None,
        *,
        grpc: bool = False,
        mqtt_port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cpu: int | None = None,
        name: str = "cp",
    ) -> None:
        self.data_dir = work / name
        self.http_port = free_port()
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.grpc_port = free_port() if grpc else None
        self.enroll_port = free_port() if grpc else None
        self._env = dict(env or {})
        args = [
            *edgefleet_command(),
            "server",
            "--data-dir",
            str(self.data_dir),
            "--http",
            f"127.0.0.1:{self.http_port}",
        ]
        if database_url is not None:
            args += ["--database-url", database_url]
        if grpc:
            args += ["--grpc", f"127.0.0.1:{self.grpc_port}"]
            args += ["--grpc-enroll", f"127.0.0.1:{self.enroll_port}"]
        if mqtt_port is not None:
            args += ["--mqtt", f"127.0.0.1:{mqtt_port}"]
        args += list(extra_args)
        self.child = ChildProcess(
            pinned(args, cpu if can_pin() else None),
            log=work / "logs" / f"{name}.log",
            env=child_env(**self._env),
            cwd=REPO_ROOT,
        )
        self.token = ""

    def start(self) -> ServerProcess:
        self.child.__enter__()
        try:
            wait_http(f"{self.base}/readyz", START_TIMEOUT_S, self.child.proc)
            self.token = read_token(self.data_dir)
            if self.grpc_port is not None:
                wait_port(self.grpc_port, START_TIMEOUT_S)
        except BaseException:
            print(f"control plane log:\n{self.child.tail()}", file=sys.stderr)
            self.child.stop()
            raise
        return self

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The server's own pid (``taskset`` execs it, so it is the child's)."""
        return self.child.pid

    @property
    def ca_pem(self) -> bytes:
        return (self.data_dir / "ca" / "ca.crt").read_bytes()

    def stop(self) -> None:
        self.child.stop()

    def tail(self) -> str:
        return self.child.tail()

    def api(self, timeout: float = 60.0) -> Any:
        from control_plane.cli.client import ApiClient

        return ApiClient(self.base, self.token, timeout=timeout)

    def cli_env(self, **extra: str) -> dict[str, str]:
        """The environment of an ``edgefleet`` command talking to this server as admin."""
        return child_env(
            **self._env, EDGEFLEET_SERVER=self.base, EDGEFLEET_TOKEN=self.token, **extra
        )

    def cli(self, args: Sequence[str], log: Path, **env: str) -> None:
        cli(args, self.cli_env(**env), log)

    def make_fleet(self, fleet: str) -> None:
        """A fleet without a trust root (``POST /v1/fleets``): enough to enroll nodes."""
        with self.api() as api:
            api.json("POST", "/v1/fleets", json={"name": fleet})

    def node_tokens(self, fleet: str, count: int) -> list[str]:
        with self.api() as api:
            return [
                api.json("POST", f"/v1/fleets/{fleet}/node-tokens", json={"ttl_s": 7200})["token"]
                for _ in range(count)
            ]

    def enroll_grpc(self, fleet: str, count: int, work: Path) -> list[EnrolledNode]:
        """`count` nodes over the gRPC enrollment port, as `edge_node.enroll` does it."""
        from edge_node.enroll import enroll_over_grpc

        assert self.enroll_port is not None, "started without gRPC"
        tokens = self.node_tokens(fleet, count)
        ca_pem = self.ca_pem

        async def enroll_all() -> list[EnrolledNode]:
            nodes = []
            for index, token in enumerate(tokens):
                files = await enroll_over_grpc(
                    f"127.0.0.1:{self.enroll_port}",
                    ca_pem,
                    token,
                    AGENT_VERSION,
                    work / "nodes" / f"node-{index}",
                    server_name="localhost",
                )
                creds = files.credentials()
                nodes.append(EnrolledNode(files.node_id, creds.key_pem, creds.certificate_pem))
            return nodes

        return asyncio.run(enroll_all())

    def enroll_mqtt(self, fleet: str, count: int) -> list[EnrolledNode]:
        """`count` nodes through ``POST /v1/enroll`` with ``"transport": "mqtt"``."""
        from edge_node.enroll import generate_node_key, make_csr

        tokens = self.node_tokens(fleet, count)
        nodes = []
        with self.api() as api:
            for token in tokens:
                answer = api.json(
                    "POST",
                    "/v1/enroll",
                    json={
                        "token": token,
                        "csr_pem": make_csr(generate_node_key()).decode(),
                        "agent_version": AGENT_VERSION,
                        "transport": "mqtt",
                    },
                )
                nodes.append(EnrolledNode(answer["node_id"], mqtt_password=answer["mqtt_password"]))
        return nodes


class InProcessPlane:
    """The control plane's services in this process, with one fleet (no trust root)."""

    def __init__(
        self, work: Path, database_url: str, fleet: str, *, clock: Any | None = None
    ) -> None:
        """`clock`: the services' `control_plane.clock.Clock` (default: the system's)."""
        from control_plane.access.roles import Principal, Role
        from control_plane.access.service import RequestContext
        from control_plane.services import ServiceConfig, build_services

        self.fleet = fleet
        self.admin = RequestContext(
            Principal(token_id="bench", name="bench", role=Role.ADMIN), "bench"
        )
        self.data_dir = work / "cp"
        self.services = build_services(
            ServiceConfig(
                data_dir=self.data_dir,
                database_url=database_url,
                artifacts_url=(self.data_dir / "artifacts").as_uri(),
            ),
            clock=clock,
        )
        self.services.registry.create_fleet(self.admin, fleet)

    @property
    def ca_pem(self) -> bytes:
        return bytes(self.services.ca.ca_pem)

    def enroll(self, count: int, threads: int = 4) -> list[EnrolledNode]:
        """`count` nodes through the real path: a bootstrap token each, a CSR each.

        In-process service calls (the gRPC and REST enrollment front ends are thin), as
        MQTT nodes, which also get a client certificate: one identity serves both
        transports.
        """
        from edge_node.enroll import generate_node_key, make_csr, private_key_pem

        nodes = self.services.nodes
        ttl = timedelta(hours=2)

        def one(_: int) -> EnrolledNode:
            key = generate_node_key()
            token, _info = nodes.tokens.create_bootstrap_token(self.admin, self.fleet, {}, ttl)
            enrolled = nodes.enrollment.enroll(
                token, make_csr(key), agent_version=AGENT_VERSION, transport="mqtt"
            )
            assert enrolled.mqtt_password
            return EnrolledNode(
                enrolled.node_id,
                private_key_pem(key),
                enrolled.certificate_pem,
                enrolled.mqtt_password,
            )

        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(count)))

    def add_nodes(
        self,
        node_ids: Sequence[str],
        labels: Callable[[int], Mapping[str, str]],
        reported_state: Mapping[str, Any],
        now: datetime,
    ) -> None:
        """Nodes written straight into the inventory, a bulk insert per 5,000: the rows
        enrollment leaves (labels, key hash, online, reported state), without the
        certificates; for benchmarks of what the control plane does with many nodes, where
        `enroll` (a CSR each) would take minutes. `labels(i)`: node i's labels."""
        from sqlalchemy import insert, select

        from control_plane.storage import FleetRow, session_factory
        from control_plane.storage.models import NodeRow

        with session_factory(self.services.engine)() as session:
            fleet_id = session.scalars(select(FleetRow.id).where(FleetRow.name == self.fleet)).one()
            rows = [
                {
                    "id": node_id,
                    "fleet_id": fleet_id,
                    "labels": dict(labels(i)),
                    "public_key_sha256": "0" * 64,
                    "created_at": now,
                    "reported_state": dict(reported_state),
                    "agent_version": AGENT_VERSION,
                    "transport": "grpc",
                    "last_seen": now,
                    "online": True,
                }
                for i, node_id in enumerate(node_ids)
            ]
            for start in range(0, len(rows), 5_000):
                session.execute(insert(NodeRow), rows[start : start + 5_000])
            session.commit()

    def add_model_version(
        self, model: str, version: str, release_counter: int, *, sha256: str, length: int
    ) -> None:
        """A published model version, written as the row a targets push leaves (the push
        path has its own benchmark; only the director's and the controller's reading of it
        matters to the others)."""
        from sqlalchemy import select

        from control_plane.storage import FleetRow, session_factory
        from control_plane.storage.models import ModelVersionRow

        with session_factory(self.services.engine)() as session:
            fleet_id = session.scalars(select(FleetRow.id).where(FleetRow.name == self.fleet)).one()
            session.add(
                ModelVersionRow(
                    fleet_id=fleet_id,
                    model=model,
                    version=version,
                    release_counter=release_counter,
                    target_path=f"models/{model}/{version}/model.onnx",
                    sha256=sha256,
                    length=length,
                    custom={"edgefleet": 1, "kind": "model", "release_counter": release_counter},
                    targets_version=2,
                    created_at=datetime.now(UTC),
                    created_by="bench",
                )
            )
            session.commit()

    def database_bytes(self) -> int | None:
        """The database's size on disk (PostgreSQL only)."""
        from sqlalchemy import text

        if self.services.engine.dialect.name != "postgresql":
            return None
        with self.services.engine.connect() as conn:
            return int(
                conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            )

    def close(self) -> None:
        self.services.close()
