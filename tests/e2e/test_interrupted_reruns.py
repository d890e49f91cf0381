"""Re-running a run whose job an interruption failed, on the whole system: once, on on-demand, and never a
run that was cancelled, that a person re-ran first, or when the setting is off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.ec2_events import SpotReclaim, interruption_warning
from emulator.fake_github import Conclusion, FakeWorkflowRun, JobSpec, JobStatus
from emulator.world import World
from runner_pool.domain.demand import RunCompleted, to_body
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import UsageClass
from tests.e2e.conftest import (
    LABEL,
    accounted,
    awaited,
    completed,
    demand_handled,
    e2e_world,
    job_of,
    settled,
)

pytestmark = pytest.mark.slow

RERUN_ROUTE = "POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs"
SPOT = f"{LABEL}/usage=spot"
JOB_SECONDS = 6.0
"""Long enough for the test to interrupt the job while it runs, on a loaded machine."""


@pytest.fixture
def system_without_reruns(tmp_path: Path) -> Iterator[World]:
    """The e2e `system`, with fleet.rerun_interrupted_jobs off."""
    with e2e_world(tmp_path, fleet={"rerun_interrupted_jobs": False}) as running:
        yield running


def interrupt(system: World, run: FakeWorkflowRun, index: int = 0) -> str:
    """EC2 takes back the spot instance running the run's job: the two-minute warning, then (the notice
    played short) the instance terminated. Returns the instance's id."""
    awaited(system, lambda: job_of(system, run, index).runner_name, "the job to start")
    instance_id = instance_of_runner(job_of(system, run, index).runner_name)
    assert instance_id is not None
    awaited(
        system,
        lambda: system.records.get(instance_id).state is InstanceState.RUNNING,  # type: ignore[union-attr]
        "its provision to set it running",
    )
    ec2_events = system.stack.ec2_events
    ec2_events.put(interruption_warning(instance_id, time.time()))
    assert ec2_events.delivered(10)
    assert system.records.get(instance_id).interrupted_at is not None  # type: ignore[union-attr]
    SpotReclaim(system.aws.client("ec2"), ec2_events.put).end(instance_id, time.time())
    assert ec2_events.delivered(10)
    return instance_id


def attempt_completed(system: World, run: FakeWorkflowRun, attempt: int) -> None:
    awaited(
        system,
        lambda: run.run_attempt == attempt and run.status is JobStatus.COMPLETED,
        f"attempt {attempt} of run {run.run_id} to complete",
        90.0,
    )


def reruns_asked(system: World) -> int:
    with system.github.state.lock:
        return system.github.state.calls[RERUN_ROUTE]


def spot_job(system: World) -> FakeWorkflowRun:
    return system.start_run("build", JobSpec("build", SPOT, seconds=JOB_SECONDS))


def interrupted_completion_held_back(system: World, run: FakeWorkflowRun) -> None:
    """The run's job interrupted and failed, and the run completed, its completion's delivery failed (it
    reaches the stack once refresh has it redelivered)."""
    system.github.webhooks.drop_next(
        "workflow_run", "completed", where=lambda payload: payload["workflow_run"]["id"] == run.run_id
    )
    interrupt(system, run)
    awaited(system, lambda: run.status is JobStatus.COMPLETED, "the run to complete", every=0.01)


def ends_at(system: World, run: FakeWorkflowRun, attempt: int, reruns: int) -> None:
    """Once everything the scenario set off has been dispatched and has ended, the run is at `attempt`,
    the stack asked GitHub for `reruns` re-runs, and every instance is accounted for."""
    demand_handled(system)
    settled(system)
    demand_handled(system)
    assert run.run_attempt == attempt
    assert reruns_asked(system) == reruns
    accounted(system)


def test_a_job_interrupted_mid_job_is_re_run_once_and_succeeds_on_on_demand(system: World) -> None:
    # Given a spot job running
    run = spot_job(system)

    # When EC2 interrupts its instance mid-job, and the job fails for it
    interrupted = interrupt(system, run)
    awaited(system, lambda: job_of(system, run).conclusion is Conclusion.FAILURE, "the job to fail")

    # Then the run is re-run once: attempt 2's job succeeds, on an on-demand instance
    attempt_completed(system, run, 2)
    job = job_of(system, run)
    assert job.conclusion is Conclusion.SUCCESS
    served = instance_of_runner(job.runner_name)
    assert served is not None
    assert served != interrupted
    record = system.records.get(served)
    assert record is not None
    assert record.usage_class is UsageClass.ON_DEMAND
    ends_at(system, run, 2, reruns=1)


def test_the_re_runs_own_interruption_is_not_re_run_again(system: World) -> None:
    # Given a spot job interrupted mid-job, failed, and its run re-run on on-demand
    run = spot_job(system)
    first = interrupt(system, run)
    awaited(system, lambda: run.run_attempt == 2, "the run to be re-run")

    # When the re-run's instance is interrupted too (EC2 warns only spot instances; the notice is played
    # to the on-demand one so the rule, not the market, decides), and its job fails
    second = interrupt(system, run)
    assert second != first
    record = system.records.get(second)
    assert record is not None
    assert record.usage_class is UsageClass.ON_DEMAND
    attempt_completed(system, run, 2)

    # Then the run ends failed at attempt 2: the stack's own re-run is not re-run
    assert job_of(system, run).conclusion is Conclusion.FAILURE
    assert run.conclusion is Conclusion.FAILURE
    ends_at(system, run, 2, reruns=1)


def test_a_cancelled_run_is_not_re_run(system: World) -> None:
    # Given a run of two spot jobs running
    run = system.start_run(
        "build", JobSpec("build", SPOT, seconds=JOB_SECONDS), JobSpec("test", SPOT, seconds=60.0)
    )
    awaited(system, lambda: job_of(system, run, 1).runner_name, "the second job to start")

    # When the first job's instance is interrupted and it fails, and someone then cancels the run
    interrupt(system, run, 0)
    awaited(system, lambda: job_of(system, run, 0).conclusion is Conclusion.FAILURE, "the job to fail")
    system.github.actions.cancel_run(run.run_id)

    # Then the run ends cancelled, and is not re-run
    completed(system, run)
    assert run.conclusion is Conclusion.CANCELLED
    ends_at(system, run, 1, reruns=0)


def test_a_run_a_person_re_ran_first_is_not_re_run_again(system: World) -> None:
    # Given a spot job running
    run = spot_job(system)

    # When its instance is interrupted and the job fails, and a person re-runs the run's failed jobs at
    # once, before the run's completion reaches the stack
    interrupted_completion_held_back(system, run)
    system.github.actions.rerun_failed_jobs(run.run_id)

    # Then the person's attempt is the only re-run, even once the run's completion is redelivered
    attempt_completed(system, run, 2)
    awaited(system, lambda: system.github.state.redelivery_requests, "the run's completion to be redelivered")
    ends_at(system, run, 2, reruns=0)


def test_with_the_setting_off_an_interrupted_job_is_left_failed(system_without_reruns: World) -> None:
    system = system_without_reruns
    # Given a stack with fleet.rerun_interrupted_jobs off, and a spot job running
    run = spot_job(system)

    # When its instance is interrupted and the job fails
    interrupt(system, run)
    completed(system, run)

    # Then the run stays failed: no re-run is asked
    assert run.conclusion is Conclusion.FAILURE
    ends_at(system, run, 1, reruns=0)


def test_a_duplicated_run_completion_re_runs_once(system: World) -> None:
    # Given a spot job running
    run = spot_job(system)

    # When its instance is interrupted, the job fails, and the run's completion reaches the dispatcher
    # twice at once (SQS delivers at least once) and once more when refresh has it redelivered
    interrupted_completion_held_back(system, run)
    sqs = system.aws.client("sqs")
    queue = system.stack.plane.settings.require("demand_queue_url", "the demand queue")
    duplicate = to_body(RunCompleted(repository=run.repository, run_id=run.run_id, run_attempt=1))
    for _ in range(2):
        sqs.send_message(QueueUrl=queue, MessageBody=duplicate)

    # Then the run is re-run once
    attempt_completed(system, run, 2)
    ends_at(system, run, 2, reruns=1)
