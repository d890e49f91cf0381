"""EC2's notices on the whole system: an instance warned of leaves the pool before a job lands on it, and one
warned of while it runs a job finishes it and is retired, never pooled; every instance accounted for."""

from __future__ import annotations

import time

import pytest

from emulator.ec2_events import interruption_warning, rebalance_recommendation
from emulator.fake_github import Conclusion, JobSpec
from emulator.world import World
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.lifecycle import InstanceState
from tests.e2e.conftest import LABEL, awaited, completed, job_of, one_pooled, retired

pytestmark = pytest.mark.slow


def test_an_idle_instance_recommended_for_rebalance_is_replaced_before_a_job_lands_on_it(
    system: World,
) -> None:
    # Given an instance back in the pool after a first run
    pooled = one_pooled(system)

    # When EC2 recommends rebalancing it, and a second run's job is queued
    system.stack.ec2_events.put(rebalance_recommendation(pooled, time.time()))
    assert system.stack.ec2_events.delivered(10)
    second = completed(system, system.start_run("test", JobSpec("test", LABEL, seconds=0.5)))

    # Then the job ran elsewhere, and the warned instance was terminated
    job = job_of(system, second)
    assert job.conclusion is Conclusion.SUCCESS
    assert instance_of_runner(job.runner_name) not in (None, pooled)
    retired(system, pooled, "the warned instance to end")


def test_an_instance_warned_of_while_running_finishes_its_job_and_is_retired(system: World) -> None:
    # Given a job running on an instance
    run = system.start_run("build", JobSpec("build", LABEL, seconds=3))
    awaited(system, lambda: job_of(system, run).runner_name, "the job to start")
    instance_id = instance_of_runner(job_of(system, run).runner_name)
    assert instance_id is not None
    awaited(
        system,
        lambda: system.records.get(instance_id).state is InstanceState.RUNNING,  # type: ignore[union-attr]
        "its provision to set it running",
    )

    # When EC2 warns that it interrupts the instance, and the job finishes within the notice
    system.stack.ec2_events.put(interruption_warning(instance_id, time.time()))
    assert system.stack.ec2_events.delivered(10)
    assert system.records.get(instance_id).interrupted_at is not None  # type: ignore[union-attr]
    completed(system, run)

    # Then the job succeeded, and its instance was terminated rather than pooled
    assert job_of(system, run).conclusion is Conclusion.SUCCESS
    retired(system, instance_id, "the instance to end")
