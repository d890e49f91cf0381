"""A pristine pool serving single-use jobs on the emulator: queued → ready, and the control plane's share
beside the reused pool's.

The stack is configured `reuse.mode: single-use`, with a pristine minimum of the class large enough for
the matrix, so every job takes an instance no job has used and leaves it to be terminated. One cold
phase (a matrix on the stack just deployed, served before refresh's first pristine instances are up),
then warm runs one after the other, each once refresh has refilled the pool with `MATRIX` pristine idle
instances. The same world, runs and figures as bench/emulator.py (a job is warm when its instance was
launched before it was queued); the target is the reused pool's warm control-plane share there
(`emulator_warm_control_plane_median_seconds` in bench/results.json), within `TARGET_FACTOR`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.emulator import MATRIX, WARM_RUNS, Cost, Usage, cost_between, serve, served_rows
from bench.results import RESULTS_PATH, BenchTable
from demo.figures import JobFigures, Kind, Spread, job_figures
from demo.scenario import LABEL
from emulator.fake_github import JobSpec
from emulator.timeline import Happening
from emulator.world import compressed_config, world
from runner_pool.domain.config import ReuseMode, StackConfig
from runner_pool.domain.labels import RunnerLabel
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord

TARGET_FACTOR = 1.5
"""A pristine hand-over may cost the control plane at most this much more than a reused one."""
REUSED_WARM_SHARE_KEY = "emulator_warm_control_plane_median_seconds"

SMALL = {"warm_runs": 1}
"""`make test`'s size (tests/bench): the cold phase and one warm run."""


def single_use_config() -> StackConfig:
    """The emulator's stack, single use throughout, keeping `MATRIX` pristine idle instances of the
    label's class."""
    resource_class = single_use_class()
    return compressed_config(
        reuse={"mode": ReuseMode.SINGLE_USE},
        warm_pool_minimum={resource_class: {"pristine": MATRIX}},
    )


def single_use_class() -> str:
    """The class the bench's label asks for (any run's: the run id changes nothing else)."""
    (label,) = JobSpec("shard", LABEL).labels(run_id=1)
    return compressed_config().resolve(RunnerLabel.parse(label)).resource_class


def pristine_pool_full(records: list[InstanceRecord]) -> bool:
    """The pool holds `MATRIX` pristine idle instances, offered to no run: the next matrix may go warm."""
    pristine = [r for r in records if r.state is InstanceState.IDLE and r.run_key is None and r.pristine]
    return len(pristine) >= MATRIX


def run(warm_runs: int = WARM_RUNS) -> BenchTable:
    config = single_use_config()
    with (
        tempfile.TemporaryDirectory(prefix="bench-single-use-") as scratch,
        world(Path(scratch), config=config) as system,
    ):
        cold_start = Usage.now(system)
        serve(system, "cold", pristine_pool_full)
        cold_end = Usage.now(system)
        for number in range(warm_runs):
            serve(system, f"warm-{number}", pristine_pool_full)
        warm_end = Usage.now(system)
        figures = job_figures(system.events(), system.github.state)
        cold = cost_between(system, cold_start, cold_end)
        warm = cost_between(system, cold_end, warm_end)
        events = system.timeline.events()
        launched = sum(1 for e in events if e.happening is Happening.LAUNCHED)
        served = [f.instance_id for f in figures if f.instance_id is not None]
        reused = len(served) - len(set(served))
    return _table(figures, cold, warm, launched=launched, reused=reused, reference=reused_warm_share())


def reused_warm_share() -> float | None:
    """The reused pool's warm control-plane share, as bench/emulator.py last measured it."""
    figures = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {}
    value = figures.get(REUSED_WARM_SHARE_KEY)
    return None if value is None else float(value)


def _table(
    figures: list[JobFigures],
    cold: Cost,
    warm: Cost,
    *,
    launched: int,
    reused: int,
    reference: float | None,
) -> BenchTable:
    table = BenchTable(
        "Emulator, single use: a pristine pool serving one-job instances, queued -> ready",
        ("figure", "cold", "warm"),
    )
    prefix = "emulator_single_use"
    phases = ((Kind.COLD, cold), (Kind.WARM, warm))
    by_kind, jobs = served_rows(table, figures, phases, prefix)
    served = len(by_kind[Kind.COLD]) + len(by_kind[Kind.WARM])
    warm_jobs = len(by_kind[Kind.WARM])
    standard = {kind: cost.standard / jobs[kind] for kind, cost in phases}
    for kind, value in standard.items():
        table.figure(f"{prefix}_{kind.value}_standard_cost_per_job_microdollars_count", round(value * 1e6, 1))
    table.row("cost per job, Standard (USD)", f"{standard[Kind.COLD]:.6f}", f"{standard[Kind.WARM]:.6f}")
    # Over every job, the cold phase's too, as the reused pool's `emulator_warm_hit_ratio` counts it.
    ratio = table.figure(f"{prefix}_warm_hit_ratio", round(warm_jobs / max(1, served), 3))
    table.note(
        f"{served} jobs, {launched} instances launched, {reused} jobs on an instance that had served one "
        f"(single use: 0 expected); warm-hit ratio {ratio:.0%} over every job, the cold phase's included "
        f"(each warm run starts once refresh has {MATRIX} pristine idle instances)."
    )
    table.note(_verdict(Spread.of(f.control_plane_seconds for f in by_kind[Kind.WARM]), reference))
    return table


def _verdict(share: Spread | None, reference: float | None) -> str:
    if share is None:
        return "no warm job: no control-plane share to compare"
    if reference is None:
        return f"no {REUSED_WARM_SHARE_KEY} in bench/results.json: run `make bench emulator` to compare"
    bound = TARGET_FACTOR * reference
    met = "met" if share.median <= bound else "NOT met"
    return (
        f"target: warm control-plane share within {TARGET_FACTOR:g}x the reused pool's "
        f"({reference:.3f} s, bench/results.json) = {bound:.3f} s; single use {share.median:.3f} s median "
        f"({met})"
    )
