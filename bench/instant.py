"""The instant tier on the emulator: how long a job on `pool=instant/class=large` waits for its runner.

A class keeps an instant tier of TIER runners registered ahead (domain/instant.py); jobs are queued one
at a time, each once the tier is full again, and each one's wait is from the fake GitHub's queueing of it
to its `in_progress` (the runner picking it up). No step of the control plane is on that path: the figure
is the fake GitHub's assignment and the waiting runner's poll for work. The same jobs' paths, read from
the run, are priced at GitHub's and the real runner's published figures (bench/aws_model.py).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench import aws_model
from bench.results import BenchTable
from demo.figures import Spread
from emulator.fake_github import FakeJob, JobSpec, JobStatus
from emulator.world import World, compressed_config, world
from runner_pool.domain.labels import instant_label

TIER = 2
JOBS = 6
SMALL = {"jobs": 1}
LABEL = instant_label("large")
WAIT_SECONDS = 240.0
"""A bound, not a wait: the tier fills in seconds; on a loaded shared machine it may take minutes."""
TARGET_SECONDS = 1.0


def run(jobs: int = JOBS) -> BenchTable:
    config = compressed_config(warm_pool_minimum={"large": {"instant": TIER}})
    waits: list[float] = []
    starts: list[aws_model.InstantStart] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-instant-") as scratch,
        world(Path(scratch), config=config) as system,
    ):
        for number in range(jobs):
            _until(partial(_full, system), "the instant tier to fill")
            listening = aws_model.listening_runners(system, LABEL)
            run = system.start_run(f"instant-{number}", JobSpec("build", LABEL, seconds=0.2))
            job = system.github.state.jobs[run.job_ids[0]]
            _until(partial(_started, job), "the job to start")
            if job.started_at is not None:
                waits.append(job.started_at - job.queued_at)
            starts.append(aws_model.instant_start(system, job.job_id, listening))
    table = _table(waits)
    aws_model.report_instant(table, starts)
    return table


def _full(system: World) -> bool:
    """Whether the tier's runners are all idle and listening at GitHub."""
    return len(aws_model.listening_runners(system, LABEL)) >= TIER


def _started(job: FakeJob) -> bool:
    return job.status is not JobStatus.QUEUED


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.time() + WAIT_SECONDS
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not happen within {WAIT_SECONDS:g} s")


def _table(waits: list[float]) -> BenchTable:
    table = BenchTable("Emulator: the instant tier, queued -> started", ("figure", "value"))
    spread = Spread.of(waits)
    if spread is None:
        table.row("jobs started", "0")
        table.note("no job started: no figure")
        return table
    table.figure("emulator_instant_queued_to_started_median_seconds", round(spread.median, 3))
    table.figure("emulator_instant_queued_to_started_p95_seconds", round(spread.p95, 3))
    table.row("queued -> started (median / p95)", f"{spread.median:.3f} s / {spread.p95:.3f} s")
    table.row("jobs started", str(len(waits)))
    met = "met" if spread.median <= TARGET_SECONDS else "NOT met"
    table.note(
        f"a job on {LABEL} given to a runner of a tier of {TIER} registered ahead; target <= "
        f"{TARGET_SECONDS:g} s median ({met}). The fake GitHub's assignment and the waiting runner's poll "
        "for work, on a shared machine; GitHub's own is about 50 ms (a GitHub Support trace in "
        "actions/actions-runner-controller #4602)."
    )
    return table
