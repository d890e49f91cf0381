"""The whole system with AWS failing as AWS does: throttles, 500s and answers lost after the call took effect,
on a seeded fraction of the control plane's calls (emulator/aws_faults.py), each retried by botocore as in
production. A transient fault may delay a job; it never strands it, never hands a serving runner's
instance to another run, and never counts as served an instance that served nothing."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.aws_faults import AwsFaults, Fault
from emulator.fake_github import Conclusion, JobSpec
from emulator.world import World, world
from runner_pool.domain.executions import instance_of_runner
from tests.e2e.conftest import FAST_INSTANCES, FAST_TIMERS, LABEL, accounted, completed, settled
from tests.support.serving import assert_one_job_at_a_time

pytestmark = pytest.mark.slow

FAULT_FRACTION = 0.08
SEED = 44
RUNS = 4
JOBS_PER_RUN = 3


@pytest.fixture
def faults() -> AwsFaults:
    return AwsFaults(fraction=FAULT_FRACTION, seed=SEED)


@pytest.fixture
def faulty_system(tmp_path: Path, faults: AwsFaults) -> Iterator[World]:
    with world(tmp_path, instance_settings=FAST_INSTANCES, timers=FAST_TIMERS, faults=faults) as running:
        yield running


def test_runs_served_through_aws_faults_never_share_a_serving_instance(
    faulty_system: World, faults: AwsFaults
) -> None:
    system = faulty_system
    # Given AWS failing a seeded fraction of the control plane's calls
    # When runs of a small matrix are queued one after another, each reusing what the last gave back
    runs = []
    for number in range(RUNS):
        run = system.start_run(f"faults-{number}", JobSpec("build", LABEL, matrix=JOBS_PER_RUN, seconds=0.5))
        runs.append(completed(system, run, timeout=240))
    # Then faults of every kind were met
    assert all(faults.total(kind) > 0 for kind in Fault), faults.counts
    # And every job ran to success on a runner of ours
    jobs = [system.github.state.jobs[job_id] for run in runs for job_id in run.job_ids]
    assert all(job.conclusion is Conclusion.SUCCESS for job in jobs)
    # And no instance ran two jobs at once: none was handed to another run while its runner served one
    assert_one_job_at_a_time(jobs)
    # And every provision's `lost` instance served one of its run's jobs
    served_by_run: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for job_id in run.job_ids:
            job = system.github.state.jobs[job_id]
            served_by_run[str(run.run_id)].add(instance_of_runner(job.runner_name) or "?")
    for execution in system.stack.executions():
        if execution["machine"] != "provision" or execution["status"] != "SUCCEEDED":
            continue
        described = system.stack.stepfunctions.describe_execution(executionArn=execution["executionArn"])
        output = json.loads(described["output"])
        run_id = str(output["run_key"]).split("/")[0].removeprefix("pool=")
        assert set(output.get("lost", [])) <= served_by_run[run_id], output
    # And no registration was refused, so none spent a token on a refused call
    assert system.github.limits.refused.total() == 0
    settled(system, timeout=120)
    accounted(system)
