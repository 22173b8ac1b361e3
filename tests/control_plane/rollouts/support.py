"""Nodes for the rollout service's tests: enrolled for real, answering their director
assignments through the real inventory and health store, one phase per call, as an agent
reports them (update statuses, health reports of the version it serves)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from control_plane.director.service import DirectorService
from control_plane.health.processor import HealthProcessor
from control_plane.nodes.presence import NodePresence
from tests.control_plane.health.support import Sender, v2_report

Behaviour = Literal["good", "fails-self-test", "silent"]
MODEL = "det"


def target(version: str) -> str:
    return f"models/{MODEL}/{version}/model.onnx"


@dataclass
class AgentDouble:
    """One node: `step(now)` moves its current work one phase on and reports it."""

    node_id: str
    serving: str | None
    behaviour: Behaviour = "good"
    handled: int = 0
    work: tuple[str, int] | None = None  # (version, sequence) being applied
    phase: int = 0
    statuses: list[str] = field(default_factory=list)
    shadow: str | None = None  # the shadow candidate's version, while one is assigned
    shadow_steps: int = 0

    def hello(self, presence: NodePresence, now: datetime) -> None:
        state = {"active_target": target(self.serving) if self.serving else ""}
        presence.record_hello(self.node_id, "0.1.0", "grpc", state, now=now)

    def step(
        self,
        director: DirectorService,
        presence: NodePresence,
        sender: Sender,
        now: datetime,
    ) -> None:
        if self.behaviour == "silent":
            return
        latest = director.latest(self.node_id)
        if latest is not None and latest.sequence > self.handled:
            self.handled = latest.sequence
            wanted = None if latest.shadow is None else latest.shadow.target_path.split("/")[2]
            if wanted != self.shadow:
                self.shadow, self.shadow_steps = wanted, 0
            if latest.renewal or latest.version == self.serving:
                self._status(presence, "active", latest.version, latest.sequence, "already active")
                self.work = None
            else:
                self.work, self.phase = (latest.version, latest.sequence), 0
        if self.work is not None:
            version, sequence = self.work
            self.phase += 1
            if self.phase == 1:
                self._status(presence, "downloading", version, sequence)
            elif self.phase == 2:
                self._status(presence, "self-testing", version, sequence)
            elif self.behaviour == "fails-self-test":
                self._status(
                    presence,
                    "reverted",
                    version,
                    sequence,
                    "self-test: output-mismatch; serving " + target(self.serving or ""),
                    reason="self-test: output-mismatch",
                )
                self.work = None
            elif self.phase == 3:
                self.serving = version
                until = (now + timedelta(minutes=1)).isoformat()
                self._status(presence, "active", version, sequence, f"on watch until {until}")
            else:
                self._status(presence, "active", version, sequence, "watchdog window passed")
                self.work = None
        extra = {}
        if self.shadow is not None:
            self.shadow_steps += 1
            state = ("downloading", "self-testing")[self.shadow_steps - 1 : self.shadow_steps]
            running = self.shadow_steps > 2
            extra["shadow"] = {
                "candidate": f"{MODEL}@{self.shadow}",
                "state": "running" if running else state[0],
                "frames_compared": 50 * (self.shadow_steps - 2) if running else 0,
                "latency": {"p99_ms": 12.0},
                "agreement": {"kind": "classification", "top1_ratio": 0.99},
            }
        if self.serving is not None:
            sender.send(self.node_id, v2_report(now, model=f"{MODEL}@{self.serving}", **extra))

    def _status(
        self,
        presence: NodePresence,
        phase: str,
        version: str,
        sequence: int,
        detail: str = "",
        reason: str = "",
    ) -> None:
        self.statuses.append(f"{phase} {version}")
        presence.record_update_status(
            self.node_id,
            {
                "target_path": target(version),
                "phase": phase,
                "detail": detail,
                "director_sequence": sequence,
                "at": None,
                "reason": reason,
                "facts": {},
            },
        )


@dataclass
class Fleet:
    """The test's nodes and the services they report through."""

    agents: dict[str, AgentDouble]
    director: DirectorService
    presence: NodePresence
    sender: Sender
    processor: HealthProcessor

    def step(self, now: datetime, only: Iterable[str] | None = None) -> None:
        for node_id in only if only is not None else self.agents:
            self.agents[node_id].step(self.director, self.presence, self.sender, now)
        self.processor.process_pending(now)

    def serving(self) -> dict[str, str | None]:
        return {node_id: a.serving for node_id, a in self.agents.items()}
