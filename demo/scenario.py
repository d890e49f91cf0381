"""Scenarios on the emulated world: workflow runs arriving over time, and what goes wrong on the way.

A scenario is a list of steps at offsets from its start: a run of a workflow arrives (optionally
with its first `queued` webhook dropped by GitHub), a run is cancelled, an instance crashes while
it runs a given job. `play` performs them in order on a World, then waits until the system has
settled: every run completed, no execution running, and no instance held, being released or
expired but still alive. `DEMO` is what `make demo` plays.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from emulator.fake_github import FakeWorkflowRun, JobSpec, JobStatus
from emulator.world import World
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState

LABEL = "pool=${{ github.run_id }}/class=large"
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Arrive:
    """A run of `workflow` arrives `at` seconds into the scenario."""

    at: float
    workflow: str
    jobs: tuple[JobSpec, ...]
    drop_first_queued: bool = False
    """GitHub fails to deliver the `queued` webhook of this run's first job."""


@dataclass(frozen=True)
class Cancel:
    at: float
    workflow: str


@dataclass(frozen=True)
class CrashDuring:
    """The instance running `job` of `workflow` crashes `after` seconds into the job."""

    workflow: str
    job: str
    after: float = 1.0


Step = Arrive | Cancel | CrashDuring


@dataclass
class Played:
    runs: dict[str, FakeWorkflowRun] = field(default_factory=dict)
    crashed: list[str] = field(default_factory=list)
    started_at: float = 0.0
    settled: bool = False
    seconds: float = 0.0


def matrix(name: str, size: int, seconds: float) -> JobSpec:
    return JobSpec(name, LABEL, matrix=size, seconds=seconds)


DEMO: Sequence[Step] = (
    Arrive(0, "build", (matrix("test", 3, 4.0),)),
    Arrive(2, "lint", (JobSpec("lint", LABEL, seconds=3.0),)),
    Arrive(24, "integration", (matrix("suite", 4, 5.0),)),
    CrashDuring("integration", "suite (2)", after=1.5),
    Arrive(28, "docs", (JobSpec("docs", LABEL, seconds=2.0),), drop_first_queued=True),
    Arrive(44, "release", (matrix("package", 3, 3.0),)),
)
"""Cold starts first (an empty pool), warm reuse for the later runs, one crash and one lost webhook."""


def play(world: World, steps: Sequence[Step], settle_timeout: float = 60.0) -> Played:
    played = Played(started_at=time.time())
    timed = sorted((s for s in steps if not isinstance(s, CrashDuring)), key=lambda s: s.at)
    crashes = [s for s in steps if isinstance(s, CrashDuring)]
    while timed or crashes:
        now = time.time() - played.started_at
        while timed and timed[0].at <= now:
            _perform(world, timed.pop(0), played)
        for crash in list(crashes):
            if _crash_due(world, crash, played):
                crashes.remove(crash)
        time.sleep(POLL_SECONDS)
    deadline = time.time() + settle_timeout
    while not (settled := _settled(world)) and time.time() < deadline:
        time.sleep(POLL_SECONDS)
    played.settled = settled
    played.seconds = time.time() - played.started_at
    return played


def _perform(world: World, step: Arrive | Cancel, played: Played) -> None:
    if isinstance(step, Cancel):
        world.github.actions.cancel_run(played.runs[step.workflow].run_id)
        return
    if step.drop_first_queued:
        workflow = step.workflow
        world.github.webhooks.drop_next(
            "workflow_job", "queued", where=lambda p: p["workflow_job"]["workflow_name"] == workflow
        )
    played.runs[step.workflow] = world.start_run(step.workflow, *step.jobs)


def _crash_due(world: World, crash: CrashDuring, played: Played) -> bool:
    run = played.runs.get(crash.workflow)
    if run is None:
        return False
    state = world.github.state
    with state.lock:
        job = next(state.jobs[j] for j in run.job_ids if state.jobs[j].name == crash.job)
        started, instance_id = job.started_at, instance_of_runner(job.runner_name)
    if started is None or instance_id is None or time.time() < started + crash.after:
        return False
    if instance_id in world.instances.booted():
        world.instances.crash(instance_id)
        played.crashed.append(instance_id)
    return True


def _settled(world: World) -> bool:
    """Every run done, no execution running, every live instance idle and in date."""
    with world.github.state.lock:
        if any(run.status is not JobStatus.COMPLETED for run in world.github.state.runs.values()):
            return False
    if any(e["status"] == "RUNNING" for e in world.stack.executions()):
        return False
    now = time.time()
    live = world.records.live()
    return all(record.state is InstanceState.IDLE and not record.threshold_passed(now) for record in live)
