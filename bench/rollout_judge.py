"""Judge quality: how often three canary judges roll back a good model, and how often they
catch a bad one, on the same simulated canary stages in one run (issue 13 §5).

One trial is one canary stage: ``--canaries`` nodes on the candidate and ``--controls``
nodes still on the old version, ``--minutes`` of one-minute intervals after
``--minutes`` of baseline before the update. Each node reports a P99 per interval
(lognormal noise around a per-node offset, a shared per-minute load factor, a few outlier
minutes), an RSS point per minute (per-node level and drift, noise) and counters per
minute (frames, sparse inference errors, dropped frames, rare restarts; per-node rates).
The judges look every ``--every`` minutes from minute ``--first`` on, at everything
since the update:

- **ours**: `control_plane.rollouts.gates.evaluate` with the default gates; a rollback
  is a ``fail`` decision (N failing evaluations in a row, history carried);
- **kayenta**: Kayenta's classifier (NetflixACAJudge, MannWhitneyClassifier): per metric
  (P99, RSS, errors per interval; IQR outliers at 3 removed) a Mann-Whitney interval at
  confidence 0.98, High when it clears 25 % of the Hodges-Lehmann estimate; no effect
  size; one High metric of three is under the marginal score, so the first High rolls back;
- **hawkbit**: an error-count threshold: the group is stopped when at least half of the
  canaries are in error (a failed self-test, a revert, or errors over 1 % of frames).

Cases: ``identical`` (false-rollback rate), ``p99x1.2``, ``p99x1.5`` (all canaries slower),
``leak10`` (10 MB/h on every canary), ``errors_x20`` (sparse errors 20 times as often).
Not a test: asserts nothing unless ``--check``. See docs/benchmarks.md.

    python -m bench.rollout_judge [--trials 1000] [--cases identical,p99x1.2,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from scipy import stats

from bench._report import Report, parse_benchmark_args
from control_plane.rollouts.gates import (
    Counters,
    Decision,
    GatesSpec,
    LatencyVsControlGate,
    NodeSamples,
    Samples,
    evaluate,
    hodges_lehmann,
)

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CASES = ("identical", "p99x1.2", "p99x1.5", "leak10", "errors_x20")
JUDGES = ("ours", "kayenta", "hawkbit")
GOAL_FALSE = 0.01
GOAL_DETECT_1_5 = 0.95
MB = 1_000_000


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the simulation draws from (the defaults are the ones the docs report)."""

    canaries: int = 5
    controls: int = 20
    minutes: int = 30
    p99_s: float = 0.020
    node_spread: float = 0.05  # per-node P99 offset, lognormal sigma
    interval_noise: float = 0.15  # per-interval P99 noise, lognormal sigma
    load_noise: float = 0.03  # shared per-minute load factor, lognormal sigma
    outlier_rate: float = 0.02  # share of minutes 2-5 times slower
    rss_bytes: float = 300 * MB
    rss_spread: float = 50 * MB
    rss_drift: float = 1 * MB  # per-node drift per hour, sigma
    rss_noise: float = 1 * MB
    fps: float = 10.0
    error_rate: float = 1e-4
    drop_rate: float = 0.005
    restarts_per_hour: float = 0.02


@dataclass(frozen=True, slots=True)
class Case:
    p99_factor: float = 1.0
    leak_bytes_per_hour: float = 0.0
    error_factor: float = 1.0


CASE_OF = {
    "identical": Case(),
    "p99x1.2": Case(p99_factor=1.2),
    "p99x1.5": Case(p99_factor=1.5),
    "leak10": Case(leak_bytes_per_hour=10 * MB),
    "errors_x20": Case(error_factor=20.0),
}


@dataclass(slots=True)
class Stage:
    """One simulated stage: arrays of shape (nodes, minutes); canaries first."""

    p99: np.ndarray
    baseline: np.ndarray
    rss: np.ndarray  # (nodes, minutes + 1): a point at every minute mark
    frames: np.ndarray
    errors: np.ndarray
    dropped: np.ndarray
    restarts: np.ndarray


def simulate(fleet: Fleet, case: Case, rng: np.random.Generator) -> Stage:
    nodes, minutes = fleet.canaries + fleet.controls, fleet.minutes
    canary = np.arange(nodes) < fleet.canaries
    offset = rng.lognormal(0.0, fleet.node_spread, nodes)[:, None]

    def p99_window(factor: np.ndarray) -> np.ndarray:
        load = rng.lognormal(0.0, fleet.load_noise, minutes)[None, :]
        noise = rng.lognormal(0.0, fleet.interval_noise, (nodes, minutes))
        outliers = np.where(
            rng.random((nodes, minutes)) < fleet.outlier_rate,
            rng.uniform(2.0, 5.0, (nodes, minutes)),
            1.0,
        )
        result: np.ndarray = fleet.p99_s * offset * load * noise * outliers * factor
        return result

    baseline = p99_window(np.ones((nodes, 1)))
    p99 = p99_window(np.where(canary, case.p99_factor, 1.0)[:, None])
    hours = np.arange(minutes + 1) / 60.0
    slope = rng.normal(0.0, fleet.rss_drift, nodes) + np.where(
        canary, case.leak_bytes_per_hour, 0.0
    )
    level = fleet.rss_bytes + rng.normal(0.0, fleet.rss_spread, nodes)
    rss = (
        level[:, None]
        + slope[:, None] * hours[None, :]
        + rng.normal(0.0, fleet.rss_noise, (nodes, minutes + 1))
    )
    offered = rng.poisson(fleet.fps * 60.0, (nodes, minutes))
    drop = np.minimum(0.5, fleet.drop_rate * rng.lognormal(0.0, 0.3, nodes))[:, None]
    dropped = rng.binomial(offered, drop)
    frames = offered - dropped
    error = (
        fleet.error_rate * rng.lognormal(0.0, 0.5, nodes) * np.where(canary, case.error_factor, 1.0)
    )
    errors = np.minimum(frames, rng.poisson(frames * error[:, None]))
    restarts = rng.poisson(fleet.restarts_per_hour / 60.0, (nodes, minutes))
    return Stage(p99, baseline, np.maximum(rss, 0.0), frames, errors, dropped, restarts)


def samples_at(fleet: Fleet, stage: Stage, minute: int) -> Samples:
    """What the controller would hand `evaluate` at `minute` after the update."""
    t = (np.arange(minute + 1) * 60.0).tolist()
    nodes = []
    for i in range(fleet.canaries + fleet.controls):
        nodes.append(
            NodeSamples(
                node_id=f"{'canary' if i < fleet.canaries else 'control'}-{i}",
                p99_s=stage.p99[i, :minute].tolist(),
                baseline_p99_s=stage.baseline[i].tolist(),
                rss=list(zip(t, stage.rss[i, : minute + 1].tolist(), strict=True)),
                counters=Counters(
                    frames=int(stage.frames[i, :minute].sum()),
                    errors=int(stage.errors[i, :minute].sum()),
                    dropped=int(stage.dropped[i, :minute].sum()),
                    restarts=int(stage.restarts[i, :minute].sum()),
                    seconds=minute * 60.0,
                ),
            )
        )
    return Samples(
        window_start=START,
        window_end=START + timedelta(minutes=minute),
        canaries=nodes[: fleet.canaries],
        controls=nodes[fleet.canaries :],
    )


# ----------------------------------------------------------------------------- baselines


def _iqr_kept(values: np.ndarray, factor: float = 3.0) -> np.ndarray:
    """Kayenta's IQRDetector(factor = 3.0): values beyond the fences are dropped."""
    if len(values) < 4:
        return values
    q1, q3 = np.quantile(values, [0.25, 0.75])
    spread = q3 - q1
    kept: np.ndarray = values[(values >= q1 - factor * spread) & (values <= q3 + factor * spread)]
    return kept


def kayenta_high(experiment: np.ndarray, control: np.ndarray) -> bool:
    """MannWhitneyClassifier(fraction = 0.25, confLevel = 0.98), direction increase."""
    experiment, control = _iqr_kept(experiment), _iqr_kept(control)
    if not len(experiment) or not len(control):
        return False  # Nodata: left out of the score
    if np.array_equal(np.sort(experiment), np.sort(control)):
        return False
    if len(np.unique(np.concatenate([experiment, control]))) == 1:
        return False
    shift = hodges_lehmann(experiment, control, 0.98)
    return shift.low > 0.25 * abs(shift.estimate)


def kayenta_judge(fleet: Fleet, stage: Stage, minute: int) -> str | None:
    """The first High metric, or None (pass)."""
    c = slice(0, fleet.canaries)
    t = slice(fleet.canaries, None)
    metrics = {
        "p99": stage.p99[:, :minute],
        "rss": stage.rss[:, : minute + 1],
        "errors": stage.errors[:, :minute].astype(np.float64),
    }
    for name, values in metrics.items():
        if kayenta_high(values[c].ravel(), values[t].ravel()):
            return name
    return None


def hawkbit_judge(fleet: Fleet, stage: Stage, minute: int) -> str | None:
    """Stopped when at least half of the canaries are in error."""
    frames = stage.frames[: fleet.canaries, :minute].sum(axis=1)
    errors = stage.errors[: fleet.canaries, :minute].sum(axis=1)
    in_error = errors > 0.01 * np.maximum(frames, 1)  # no self-test failures or reverts here
    return "errors" if in_error.sum() * 2 >= fleet.canaries else None


# ----------------------------------------------------------------------------- trials


@dataclass(slots=True)
class Tally:
    rollbacks: int = 0
    minutes: list[int] | None = None
    why: Counter[str] | None = None

    def __post_init__(self) -> None:
        self.minutes = []
        self.why = Counter()

    def add(self, minute: int, why: str) -> None:
        assert self.minutes is not None and self.why is not None
        self.rollbacks += 1
        self.minutes.append(minute)
        self.why[why] += 1


def run_case(
    name: str, fleet: Fleet, spec: GatesSpec, trials: int, checkpoints: Sequence[int], seed: int
) -> dict[str, Any]:
    case = CASE_OF[name]
    tallies = {judge: Tally() for judge in JUDGES}
    inconclusive_at_end: Counter[str] = Counter()
    failing: Counter[str] = Counter()  # evaluations in which a gate's statistics failed
    evaluations = 0
    evaluate_s = 0.0
    for trial in range(trials):
        rng = np.random.default_rng([seed, CASES.index(name), trial])
        stage = simulate(fleet, case, rng)
        history: list[Decision] = []
        done: dict[str, bool] = dict.fromkeys(JUDGES, False)
        last: Decision | None = None
        for minute in checkpoints:
            if not done["ours"]:
                samples = samples_at(fleet, stage, minute)
                now = samples.window_end + timedelta(seconds=1)
                started = time.perf_counter()
                last = evaluate(spec, samples, now, history)
                evaluate_s += time.perf_counter() - started
                evaluations += 1
                history.append(last)
                failing.update(g.name for g in last.gates if g.failing)
                if last.outcome == "fail":
                    done["ours"] = True
                    failed = [g.name for g in last.gates if g.outcome == "fail"]
                    tallies["ours"].add(minute, "+".join(failed))
            for judge, judged in (("kayenta", kayenta_judge), ("hawkbit", hawkbit_judge)):
                if not done[judge] and (why := judged(fleet, stage, minute)) is not None:
                    done[judge] = True
                    tallies[judge].add(minute, why)
            if all(done.values()):
                break
        if last is not None and last.outcome == "inconclusive":
            inconclusive_at_end.update(g.name for g in last.gates if g.outcome == "inconclusive")
    result: dict[str, Any] = {
        "case": name,
        "trials": trials,
        "ours_inconclusive_at_end": dict(inconclusive_at_end),
        "ours_failing_evaluations": dict(failing),
        "ours_evaluations": evaluations,
        "ours_ms_per_evaluation": evaluate_s / max(evaluations, 1) * 1000.0,
    }
    for judge, tally in tallies.items():
        ci = stats.binomtest(tally.rollbacks, trials).proportion_ci(0.95, method="wilson")
        result[judge] = {
            "rollbacks": tally.rollbacks,
            "rate": tally.rollbacks / trials,
            "ci95": [ci.low, ci.high],
            "median_minute": float(np.median(tally.minutes)) if tally.minutes else None,
            "why": dict(tally.why or {}),
        }
    return result


# ----------------------------------------------------------------------------- report


def _pct(rate: float) -> str:
    return f"{rate * 100:.1f} %"


def print_table(
    results: Sequence[dict[str, Any]], written: Report, args: argparse.Namespace
) -> None:
    print()
    print(
        f"commit {written.machine['commit']}; {args.trials} trials per case; "
        f"{args.canaries} canaries + {args.controls} controls, {args.minutes} min; "
        f"judged at minutes {', '.join(map(str, checkpoints_of(args)))}; {written.load_line()}"
    )
    print(f"{'case':<12}" + "".join(f"{judge:>30}" for judge in JUDGES))
    for result in results:
        cells = []
        for judge in JUDGES:
            row = result[judge]
            low, high = row["ci95"]
            cells.append(f"{_pct(row['rate'])} ({low * 100:.1f}-{high * 100:.1f})")
        label = "rollbacks" if result["case"] == "identical" else "detected"
        print(f"{result['case']:<12}" + "".join(f"{cell:>30}" for cell in cells) + f"  {label}")
    for result in results:
        print(f"  {result['case']}: {result['ours_ms_per_evaluation']:.1f} ms per evaluation")
        for judge in JUDGES:
            why = ", ".join(f"{k} {v}" for k, v in sorted(result[judge]["why"].items()))
            minute = result[judge]["median_minute"]
            when = f" (median minute {minute:g})" if minute is not None else ""
            print(f"    {judge}: rolled back on {why or 'nothing'}{when}")
        for label, key in (
            ("failing evaluations", "ours_failing_evaluations"),
            ("inconclusive at the end", "ours_inconclusive_at_end"),
        ):
            counts = ", ".join(f"{k} {v}" for k, v in sorted(result[key].items()))
            print(f"    ours, {label}: {counts or 'none'}")


def add_figures(report: Report, results: Sequence[dict[str, Any]]) -> None:
    by_case = {result["case"]: result for result in results}
    for name, result in by_case.items():
        ours = result["ours"]["rate"]
        good = name == "identical"
        what = "false rollbacks" if good else "detected"
        for anchor in ("kayenta", "hawkbit"):
            report.figure(
                f"{name}: {what} (ours vs {anchor})",
                ours * 100,
                "%",
                anchor=result[anchor]["rate"] * 100,
                anchor_name=anchor,
            )
    for case, label, goal, met in (
        ("identical", "false rollbacks, identical models", f"<= {GOAL_FALSE:.0%}", _at_most),
        ("p99x1.5", "detected, p99 x1.5", f">= {GOAL_DETECT_1_5:.0%}", _at_least),
    ):
        if case in by_case:
            rate = by_case[case]["ours"]["rate"]
            target = GOAL_FALSE if case == "identical" else GOAL_DETECT_1_5
            report.figure(f"{label} (ours)", rate * 100, "%", goal=goal, met=met(rate, target))
    for anchor in ("kayenta", "hawkbit"):
        better = all(
            result["ours"]["rate"] >= result[anchor]["rate"]
            for name, result in by_case.items()
            if name != "identical"
        )
        if "identical" in by_case:
            false_ours = by_case["identical"]["ours"]["rate"]
            better = better and false_ours <= max(GOAL_FALSE, by_case["identical"][anchor]["rate"])
        report.goal(
            f"ours better than {anchor}: detects at least as often in every bad case, "
            f"no more false rollbacks (or <= {GOAL_FALSE * 100:g} %)",
            better,
        )


def _at_most(value: float, limit: float) -> bool:
    return value <= limit


def _at_least(value: float, limit: float) -> bool:
    return value >= limit


def checkpoints_of(args: argparse.Namespace) -> list[int]:
    return list(range(args.first, args.minutes + 1, args.every))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="stages per case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--canaries", type=int, default=5)
    parser.add_argument("--controls", type=int, default=20)
    parser.add_argument("--minutes", type=int, default=30, help="of the stage (and baseline)")
    parser.add_argument("--first", type=int, default=10, help="minute of the first judgement")
    parser.add_argument("--every", type=int, default=5, help="minutes between judgements")
    parser.add_argument("--node-spread", type=float, default=Fleet().node_spread)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-level",
        action="store_true",
        help="ours without latency_vs_control.level_by_baseline (compares levels)",
    )
    args = parse_benchmark_args(parser, argv, quick={"trials": 100})
    cases = [name.strip() for name in args.cases.split(",") if name.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    fleet = Fleet(
        canaries=args.canaries,
        controls=args.controls,
        minutes=args.minutes,
        node_spread=args.node_spread,
    )
    spec = GatesSpec()
    if args.no_level:
        spec = replace(spec, latency_vs_control=LatencyVsControlGate(level_by_baseline=False))
    report = Report("rollout_judge", machine=_machine())
    results = []
    started = time.monotonic()
    for name in cases:
        print(f"{name}: {args.trials} trials", flush=True)
        results.append(run_case(name, fleet, spec, args.trials, checkpoints_of(args), args.seed))
    print_table(results, report, args)
    print(f"({time.monotonic() - started:.0f} s)")
    add_figures(report, results)
    raw = {"fleet": _plain(fleet), "spec": spec.to_dict(), "cases": results}
    return report.finish(args, raw)


def _machine() -> dict[str, Any]:
    import scipy

    from bench._report import machine

    return machine(numpy=np.__version__, scipy=scipy.__version__)


def _plain(fleet: Fleet) -> dict[str, Any]:
    return {name: getattr(fleet, name) for name in fleet.__dataclass_fields__}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
