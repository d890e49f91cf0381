"""Simulated instances: our real agent boots for each launched instance, takes a fake GitHub job, and ends."""

from __future__ import annotations

import pytest

from emulator.fake_github import Conclusion, JobSpec, JobStatus
from emulator.simulated_instances import CHRONYC_ASKED
from emulator.timeline import Happening
from runner_pool.domain.records import Signal
from tests.e2e.conftest import LOST_RUNNER_SECONDS, WAIT_SECONDS, Stage, eventually

pytestmark = pytest.mark.slow


def test_a_launched_instance_boots_the_agent_which_signals_it_is_up(stage: Stage) -> None:
    # Given an instance launched with the stack's tag
    instance_id = stage.launch()

    # When the boot delay has passed
    # Then its agent runs, beats, and says it booted
    stage.await_signal(instance_id, Signal.UD_OK, None)
    assert stage.table.read_heartbeat(instance_id) is not None
    assert stage.timeline.first(Happening.BOOTED, instance_id=instance_id) is not None
    # And it checked its clock first: it asked the instance's chronyc, whose answer it passed
    asked = stage.instances.instances()[instance_id].directory / CHRONYC_ASKED
    assert asked.read_text() == "-c tracking\n"


def test_a_claimed_instance_runs_the_matching_job_and_gives_its_receipt_on_release(stage: Stage) -> None:
    # Given a booted instance and a run queued on GitHub
    instance_id = stage.launch()
    stage.await_signal(instance_id, Signal.UD_OK, None)
    run = stage.start_run()
    run_key = f"pool={run.run_id}/class=large"

    # When the control plane claims the instance for the run and hands it a JIT config
    token = stage.hand_over(instance_id, run_key)
    stage.await_signal(instance_id, Signal.UD_REG_OK, run_key)
    job = stage.github.state.jobs[run.job_ids[0]]
    eventually(lambda: job.status is JobStatus.COMPLETED, "the job to complete")
    assert stage.table.activate(instance_id, run_key, max_runtime_minutes=60, claim_token=token).succeeded
    assert stage.table.release(instance_id, run_key).succeeded

    # Then the instance's runner ran the job, and the agent cleaned up and gave its receipt
    assert job.conclusion is Conclusion.SUCCESS
    assert job.runner_name is not None
    assert job.runner_name.startswith(instance_id)
    stage.await_signal(instance_id, Signal.UD_REMOVE_REG_OK, run_key)


def test_terminating_the_instance_in_ec2_stops_its_agent(stage: Stage) -> None:
    # Given a booted instance
    instance_id = stage.launch()
    stage.await_signal(instance_id, Signal.UD_OK, None)

    # When EC2 terminates it
    stage.aws.client("ec2").terminate_instances(InstanceIds=[instance_id])

    # Then its agent is gone
    eventually(lambda: stage.timeline.first(Happening.TERMINATED, instance_id=instance_id), "the termination")
    agent = stage.instances.instances()[instance_id].agent
    assert agent is not None
    assert agent.poll() is not None


def test_an_instance_that_crashes_mid_job_is_lost_to_github_and_its_job_fails(stage: Stage) -> None:
    # Given an instance running a long job
    instance_id = stage.launch()
    stage.await_signal(instance_id, Signal.UD_OK, None)
    run = stage.start_run(JobSpec("long", "pool=${{ github.run_id }}", seconds=60))
    run_key = f"pool={run.run_id}"
    stage.hand_over(instance_id, run_key)
    job = stage.github.state.jobs[run.job_ids[0]]
    eventually(lambda: job.status is JobStatus.IN_PROGRESS, "the job to start")

    # When the instance crashes
    stage.instances.crash(instance_id)

    # Then GitHub loses the runner and fails the job, naming the runner
    eventually(
        lambda: job.status is JobStatus.COMPLETED, "the job to fail", LOST_RUNNER_SECONDS + WAIT_SECONDS
    )
    assert job.conclusion is Conclusion.FAILURE
    assert stage.instances.instances()[instance_id].agent.poll() is not None  # type: ignore[union-attr]
