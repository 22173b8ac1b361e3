"""A RolloutService over a real database (both backends), real enrolled nodes, the real
director, inventory and health store, a manual clock and a scripted verdict source."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from control_plane.access.roles import Principal, Role
from control_plane.access.service import RequestContext
from control_plane.clock import ManualClock
from control_plane.director.service import DirectorService
from control_plane.link.ingest import RecordIngest
from control_plane.nodes.wiring import NodeServices
from control_plane.registry.service import RegistryService
from control_plane.rollouts.machine import Verdict
from control_plane.rollouts.notify import Notifier
from control_plane.rollouts.service import RolloutConfig, RolloutRequest, RolloutService
from control_plane.rollouts.simulation import StaticVerdict
from control_plane.rollouts.spec import RolloutSpec
from control_plane.rollouts.state import RolloutState
from control_plane.rollouts.verdicts import Judgement
from control_plane.services import HealthServices, build_health
from tests.control_plane.director.conftest import (  # noqa: F401  (pytest fixtures)
    Version,
    director,
    director_signer,
    registry,
    versions,
)
from tests.control_plane.health.support import Sender
from tests.control_plane.identity.helpers import make_csr
from tests.control_plane.nodes.conftest import (  # noqa: F401  (pytest fixtures)
    OPERATOR,
    START,
    ca,
    clock,
    engine,
    fleets,
    nodes,
    sessions,
)
from tests.control_plane.rollouts.support import AgentDouble, Behaviour, Fleet, target

RELEASE = RequestContext(Principal(token_id="rm", name="rita", role=Role.RELEASE_MANAGER), "req-rm")
PASS = StaticVerdict("pass", "every gate passes", {"p99_ratio": 1.01})
FAIL = StaticVerdict("fail", "p99 +38 % vs control", {"p99_ratio": 1.38})
TICK = timedelta(minutes=1)


@dataclass
class ScriptedVerdicts:
    """The gates stand-in: `outcome(state)` decides; every question is kept."""

    decide: Callable[[RolloutState], Verdict | None] = lambda state: PASS
    asked: list[tuple[int, str]] = field(default_factory=list)
    retained: list[list[str]] = field(default_factory=list)

    def check(self, spec: RolloutSpec) -> None:
        return None

    def judge(self, state: RolloutState, previous: Any, now: datetime) -> Judgement | None:
        self.asked.append((state.stage, state.status))
        verdict = self.decide(state)
        if verdict is None:
            return None
        return Judgement(verdict, {**verdict.to_dict(), "evaluated_at": now.isoformat()})

    def retain(self, rollouts: Collection[str]) -> None:
        self.retained.append(sorted(rollouts))


@dataclass
class EventLog:
    events: list[dict[str, Any]] = field(default_factory=list)

    def submit(self, event: Any) -> bool:
        self.events.append(dict(event))
        return True


@dataclass
class World:
    sessions: sessionmaker[Session]
    clock: ManualClock
    registry: RegistryService
    nodes: NodeServices
    director: DirectorService
    health: HealthServices
    fleet: Fleet
    verdicts: ScriptedVerdicts
    events: EventLog

    def service(self, replica: str = "a", notifier: Notifier | None = None) -> RolloutService:
        return RolloutService(
            self.sessions,
            self.clock,
            registry=self.registry,
            inventory=self.nodes.inventory,
            health=self.health.queries,
            director=self.director,
            verdicts=self.verdicts,
            notifier=notifier or self.events,
            # Fresh samples: within 10 minutes (the health processor trails the clock
            # by a step, and the two-replica test moves it 3 minutes a step).
            config=RolloutConfig(
                interval_s=1.0,
                lease=timedelta(minutes=2),
                sample_freshness=timedelta(minutes=10),
                replica=replica,
            ),
        )

    def add_node(self, labels: dict[str, str], behaviour: Behaviour = "good") -> str:
        token, _ = self.nodes.tokens.create_bootstrap_token(
            OPERATOR, "gates", labels, timedelta(hours=1)
        )
        node_id = self.nodes.enrollment.enroll(token, make_csr(), transport="grpc").node_id
        self.director.pin(OPERATOR, node_id, "det", "1.0.0")
        agent = AgentDouble(node_id, "1.0.0", behaviour, handled=1)
        agent.hello(self.nodes.presence, self.clock.now())
        self.fleet.agents[node_id] = agent
        return node_id

    def run(
        self,
        service: RolloutService,
        *,
        until: Callable[[RolloutService], bool],
        steps: int = 200,
    ) -> int:
        """Tick, let the nodes answer, move the clock a minute; until `until` or `steps`."""
        for count in range(steps):
            service.tick()
            if until(service):
                return count
            self.fleet.step(self.clock.now())
            self.clock.advance(TICK)
        raise AssertionError(f"not there after {steps} ticks")

    def candidate_pins(self) -> dict[str, int]:
        """How many assignments of det 1.1.0 each node got."""
        out: dict[str, int] = {}
        for node_id in self.fleet.agents:
            latest = self.director.latest(node_id)
            assert latest is not None
            out[node_id] = 0
            for sequence in range(1, latest.sequence + 1):
                out[node_id] += int(self._version_at(node_id, sequence) == "1.1.0")
        return out

    def _version_at(self, node_id: str, sequence: int) -> str | None:
        from sqlalchemy import select

        from control_plane.storage.models import DirectorAssignmentRow

        with self.sessions() as session:
            path = session.scalar(
                select(DirectorAssignmentRow.target_path).where(
                    DirectorAssignmentRow.node_id == node_id,
                    DirectorAssignmentRow.sequence == sequence,
                )
            )
        return None if path is None else path.split("/")[2]


@pytest.fixture
def world(
    sessions: sessionmaker[Session],
    clock: ManualClock,
    registry: RegistryService,
    nodes: NodeServices,
    director: DirectorService,
    versions: dict[str, Version],
) -> Iterator[World]:
    health = build_health(sessions, clock)
    ingest = RecordIngest(sessions, clock)
    fleet = Fleet({}, director, nodes.presence, Sender(ingest), health.processor)
    world = World(
        sessions, clock, registry, nodes, director, health, fleet, ScriptedVerdicts(), EventLog()
    )
    try:
        yield world
    finally:
        ingest.close()


def request(**changes: Any) -> RolloutRequest:
    base: dict[str, Any] = {
        "model": "det",
        "version": "1.1.0",
        "stages": "1,50%,100%",
        "bake": "2m",
        "spread": "site",
    }
    return RolloutRequest(**{**base, **changes})


__all__ = ["FAIL", "PASS", "RELEASE", "TICK", "World", "request", "target"]
