"""Fixtures shared by the whole suite: databases on both backends and a private S3 server.

A test that needs PostgreSQL or S3 skips locally when the service is absent, but
fails under ``CI=true``: CI must never pass by skipping what it was meant to test.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "EDGEFLEET_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing_service(what: str) -> None:
    """Skip locally; fail in CI, where every service must be there."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not reachable")
    pytest.skip(f"{what} not reachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def let_grpc_settle() -> None:
    """Give gRPC's core a moment to finish what closing a server or channel cancelled.

    Core completes the cancelled operations on its own thread and hands each completion
    to the loop that started the call. Every test has its own loop, so a completion that
    arrives after this test's loop has closed is raised in the next test's loop as
    "Event loop is closed" (a harness artefact: a node has one loop for its life). Called
    after a fixture's last close, it lets them land on the loop they belong to.
    """
    import anyio

    await anyio.sleep(0.05)


def wait_for_port(port: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    import psycopg

    try:
        with psycopg.connect(_psycopg_dsn(POSTGRES_ADMIN_URL), connect_timeout=3):
            pass
    except psycopg.OperationalError as exc:
        missing_service(f"PostgreSQL at {POSTGRES_ADMIN_URL} ({exc})")
    return POSTGRES_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, randomly named PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"edgefleet_test_{secrets.token_hex(6)}"
    with psycopg.connect(_psycopg_dsn(postgres_admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = postgres_admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(_psycopg_dsn(postgres_admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'edgefleet.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every storage test runs on both backends."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's standalone S3 server on a free loopback port, for this test session only."""
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except OSError as exc:
        missing_service(f"moto S3 server ({exc})")
    try:
        if not wait_for_port(port):
            missing_service("moto S3 server (did not start)")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh bucket on the private S3 server."""
    import boto3

    name = f"edgefleet-{secrets.token_hex(4)}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=name)
    return name
