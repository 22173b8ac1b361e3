"""The `link_kit` fixture: every contract test runs over the memory, gRPC and MQTT links."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.edge_node.link_contract._kits import GrpcKit, LinkKit, MemoryKit, MqttKit
from tests.mqtt_support import broker_factory  # noqa: F401  (pytest fixture)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "grpc", "mqtt"])
async def link_kit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LinkKit]:
    kit: LinkKit
    if request.param == "memory":
        kit = MemoryKit()
    elif request.param == "grpc":
        kit = await GrpcKit(tmp_path).start()
    else:
        kit = MqttKit(tmp_path, request.getfixturevalue("broker_factory")).start()
    try:
        yield kit
    finally:
        await kit.close()
