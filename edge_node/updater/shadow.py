"""The shadow stage on the node (ADR 0031): what the reconciler does with an assignment's
`shadow` candidate.

A candidate is verified against TUF like a target (`director.verify_shadow`, in the
reconciler's plan), downloaded into the model store with its reference pair, then handed to
the `ShadowHost` to load beside the served model, self-test (the same self-test as a
trial) and run on a sample of the served frames. Nothing served changes and nothing is
journalled: a candidate that fails to download, verify, load or self-test is `failed`
with its reason, and the node serves on. `ShadowStage.status` is what the health report's
`shadow` section says (with the host's running figures).

Rules:
- Each accepted assignment (new, re-delivered or renewed) says which candidate should run:
  none stops and unloads it; the same one running with the same settings goes on; another
  one replaces it.
- A candidate that failed is tried again only by a new decision of the director (an
  assignment that is neither a re-delivery nor a renewal), never by a renewal.
- The candidate is not in the journal: a restarted agent starts it again from the
  assignment it is sent at its Hello. While one loads and self-tests, `shadow.loading`
  (beside the journal) names it; a start that finds the file blames that candidate (the
  process died with it: a model that exhausts memory at load), so it is not loaded again
  until a new decision. The store keeps its files only while it is wanted (`kept`).

Not here: running the candidate (the agent's `RuntimeHost` and `edge_node.runtime.shadow`),
comparing outputs (`protos.bundle.agreement`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from edge_node.fsutil import atomic_write
from edge_node.updater.director import TargetInfo, VerifiedShadow
from edge_node.updater.host import ModelBundle, ShadowHost, ShadowSettings, name_and_version
from edge_node.updater.selftest import SelfTestResult, TrialLoader
from edge_node.updater.store import ModelStore
from protos.bundle.spec import RuntimeSpec

__all__ = [
    "LOADING_MARK",
    "ShadowPlan",
    "ShadowRefusal",
    "ShadowStage",
    "ShadowStatus",
    "ShadowWanted",
]

_log = logging.getLogger(__name__)

LOADING_MARK: Final = "shadow.loading"
RESTARTED: Final = "restarted-while-loading"
_MAX_DETAIL: Final = 400


@dataclass(frozen=True, slots=True)
class ShadowPlan:
    """A candidate that passed `verify_shadow`, with its reference pair and signed spec."""

    shadow: VerifiedShadow
    reference: TargetInfo
    atol: float
    rtol: float
    runtime: RuntimeSpec | None

    @property
    def target_path(self) -> str:
        return self.shadow.target_path

    @property
    def sha256(self) -> str:
        return self.shadow.sha256

    @property
    def settings(self) -> ShadowSettings:
        return ShadowSettings(self.shadow.sample_per_mille, self.shadow.max_cpu_percent)

    @property
    def label(self) -> str:
        return self.bundle(Path()).label

    def bundle(self, path: Path) -> ModelBundle:
        name, version = name_and_version(self.target_path)
        signed = self.shadow.target.custom.get("version")
        return ModelBundle(
            path,
            self.shadow.model or name,
            signed if isinstance(signed, str) else version,
            self.sha256,
            self.runtime,
            self.target_path,
        )


@dataclass(frozen=True, slots=True)
class ShadowRefusal:
    """A candidate the node refuses (not in TUF, other hashes, ranges, ...): `reason`."""

    target_path: str
    sha256: str
    settings: ShadowSettings | None
    reason: str
    detail: str

    @property
    def label(self) -> str:
        name, version = name_and_version(self.target_path)
        return name if version is None else f"{name}@{version}"


ShadowWanted = ShadowPlan | ShadowRefusal | None


@dataclass(frozen=True, slots=True)
class ShadowStatus:
    """Where the candidate is: `downloading`, `self-testing`, `running` or `failed`."""

    candidate: str
    target_path: str
    sha256: str
    state: str
    settings: ShadowSettings | None
    reason: str | None = None
    detail: str = ""
    rss_delta_bytes: int | None = None

    def to_report(self, figures: Mapping[str, Any] | None) -> dict[str, Any]:
        """The health report's `shadow` section: this status with the host's figures
        (`ShadowHost.shadow_figures`) while it runs."""
        settings = self.settings
        section: dict[str, Any] = {
            "candidate": self.candidate,
            "state": self.state,
            "reason": self.reason,
            "detail": self.detail[:_MAX_DETAIL],
            "sample_per_mille": 0 if settings is None else settings.sample_per_mille,
            "max_cpu_percent": 0 if settings is None else settings.max_cpu_percent,
            "rss_delta_bytes": self.rss_delta_bytes,
        }
        if figures is not None and self.state == "running":
            section.update(figures)
        return section


Describe = Callable[[BaseException], tuple[str, str]]
"""An error -> (reason, message), as the reconciler names its failures."""


class ShadowStage:
    def __init__(
        self,
        host: ShadowHost | None,
        *,
        store: ModelStore,
        fetch: Callable[[TargetInfo], Awaitable[Path]],
        room_for: Callable[[list[TargetInfo]], None],
        selftest: Callable[[TrialLoader, Path, float, float], SelfTestResult],
        describe: Describe,
        mark_dir: Path,
    ) -> None:
        """`fetch(target)` downloads a verified target into staging (the part file);
        `room_for(targets)` raises when the disk has no room for what of them is missing;
        `mark_dir` holds `shadow.loading`."""
        self._host = host
        self._store = store
        self._fetch = fetch
        self._room_for = room_for
        self._selftest = selftest
        self._describe = describe
        self._mark = Path(mark_dir) / LOADING_MARK
        self._status: ShadowStatus | None = None
        self._blamed: str | None = None

    @property
    def status(self) -> ShadowStatus | None:
        return self._status

    def kept(self) -> frozenset[str]:
        """Store entries the wanted candidate needs (the store's gc keeps them)."""
        status = self._status
        if status is None or status.state == "failed" or not status.sha256:
            return frozenset()
        return frozenset({status.sha256})

    def report(self) -> dict[str, Any] | None:
        """The health report's `shadow` section, None when no candidate is assigned."""
        status = self._status
        if status is None:
            return None
        figures = self._host.shadow_figures() if self._host is not None else None
        return status.to_report(figures)

    async def reconcile(self, wanted: ShadowWanted, *, new_decision: bool) -> None:
        """Take the candidate to what an accepted assignment says (see the module's rules);
        `new_decision`: the assignment is neither a re-delivery nor a renewal."""
        if wanted is None:
            await self.stop()
            return
        settings = wanted.settings
        current = self._status
        if current is not None and (current.target_path, current.sha256) == (
            wanted.target_path,
            wanted.sha256,
        ):
            if current.state == "running" and current.settings == settings:
                return
            if current.state == "failed" and not new_decision:
                return  # only a new decision tries a failed candidate again
        await self._stop_host()
        if isinstance(wanted, ShadowRefusal):
            self._fail(wanted, wanted.reason, wanted.detail)
            return
        if wanted.sha256 == self._blamed and not new_decision:
            self._fail(
                wanted,
                RESTARTED,
                "the agent restarted while this candidate loaded; a new assignment tries it again",
            )
            return
        self._blamed = None
        await self._start(wanted)

    async def stop(self) -> None:
        """No candidate is wanted: stop and unload it."""
        await self._stop_host()
        if self._status is not None:
            _log.info("shadow %s stopped", self._status.candidate)
        self._status = None

    async def _start(self, plan: ShadowPlan) -> None:
        settings, label = plan.settings, plan.label
        self._set(plan, "downloading")
        host = self._host
        if host is None:
            self._fail(plan, "unsupported", "this node runs no shadow candidates")
            return
        try:
            model_path, ref_path = await self._install(plan)
        except Exception as exc:
            reason, message = self._describe(exc)
            self._fail(plan, reason, message)
            return
        self._set(plan, "self-testing")

        def trial(load: TrialLoader) -> SelfTestResult:
            return self._selftest(load, ref_path, plan.atol, plan.rtol)

        try:
            await asyncio.to_thread(atomic_write, self._mark, plan.sha256.encode(), mode=0o600)
        except OSError as exc:
            reason, message = self._describe(exc)
            self._fail(plan, reason, message)
            return
        try:
            result = await host.run_shadow(plan.bundle(model_path), settings, trial=trial)
        except Exception as exc:
            _, message = self._describe(exc)
            self._fail(plan, "load-failed", message)
            return
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._mark.unlink, missing_ok=True)
        if not result.ok:
            self._fail(
                plan,
                f"self-test: {result.reason}",
                result.detail,
                result.rss_delta_bytes,
            )
            return
        self._status = ShadowStatus(
            label,
            plan.target_path,
            plan.sha256,
            "running",
            settings,
            rss_delta_bytes=result.rss_delta_bytes,
        )
        _log.info(
            "shadow %s running on %d per mille of the frames (at most %d %% CPU)",
            label,
            settings.sample_per_mille,
            settings.max_cpu_percent,
        )

    async def _install(self, plan: ShadowPlan) -> tuple[Path, Path]:
        """The candidate and its reference pair in the store (downloaded when missing)."""
        store = self._store
        sha, ref = plan.sha256, plan.reference
        model_path = store.path_of(sha)
        ref_path = store.reference_path_of(sha, plan.target_path)
        have_model = await asyncio.to_thread(store.verify, sha)
        have_ref = have_model and ref_path.is_file()
        wanted = ([] if have_model else [plan.shadow.target]) + ([] if have_ref else [ref])
        if wanted:
            await asyncio.to_thread(self._room_for, wanted)
        if not have_model:
            part = await self._fetch(plan.shadow.target)
            model_path = await asyncio.to_thread(store.install, part, sha, plan.shadow.length)
        if not have_ref:
            part = await self._fetch(ref)
            ref_path = await asyncio.to_thread(
                functools.partial(
                    store.install_reference,
                    sha,
                    part,
                    ref.sha256,
                    ref.length,
                    target_path=plan.target_path,
                )
            )
        # No bundle record: the candidate never serves from the store (a pin of it writes
        # its own), and the same bytes may be the served version's, whose record stays.
        return model_path, ref_path

    def _set(self, plan: ShadowPlan, state: str) -> None:
        self._status = ShadowStatus(plan.label, plan.target_path, plan.sha256, state, plan.settings)

    def _fail(
        self,
        wanted: ShadowPlan | ShadowRefusal,
        reason: str,
        detail: str,
        rss_delta_bytes: int | None = None,
    ) -> None:
        label = wanted.label
        _log.warning("shadow %s failed (%s): %s; the node serves on", label, reason, detail)
        self._status = ShadowStatus(
            label,
            wanted.target_path,
            wanted.sha256,
            "failed",
            wanted.settings,
            reason,
            detail[:_MAX_DETAIL],
            rss_delta_bytes,
        )

    async def _stop_host(self) -> None:
        if self._host is not None and self._status is not None:
            await self._host.stop_shadow()

    def recover(self) -> None:
        """At start-up (blocking): a `shadow.loading` left behind blames its candidate."""
        try:
            raw = self._mark.read_bytes()[:64]
        except OSError:
            return
        self._blamed = raw.decode("ascii", "replace")
        _log.warning(
            "the agent stopped while shadow candidate %s loaded; it is not loaded again "
            "until a new assignment",
            self._blamed,
        )
        with contextlib.suppress(OSError):
            self._mark.unlink()
