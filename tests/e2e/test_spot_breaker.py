"""The spot circuit breaker on the whole system: EC2 takes a class's spot instances back (the warning to the
stack's rules and the instances' metadata, the end after the notice), the class's next job runs on-demand,
and after the cool-down on spot again; every instance accounted for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from emulator.fake_github import Conclusion, FakeWorkflowRun, JobSpec
from emulator.timeline import Happening
from emulator.world import World
from runner_pool.adapters.spot_breaker import DynamoDbSpotBreaker
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.executions import instance_of_runner
from runner_pool.domain.records import UsageClass
from tests.e2e.conftest import LABEL, accounted, completed, e2e_world, eventually, job_of, settled

pytestmark = pytest.mark.slow

COOLDOWN_SECONDS = 20.0


@pytest.fixture
def system(tmp_path: Path) -> Iterator[World]:
    """The e2e system, its breaker opened by two interruptions and cooling down in seconds."""
    with e2e_world(
        tmp_path,
        fleet={
            "spot_breaker": {"interruptions": 2, "window_seconds": 600, "cooldown_seconds": COOLDOWN_SECONDS}
        },
    ) as running:
        yield running


def usage_of_job(system: World, run: FakeWorkflowRun) -> UsageClass:
    instance_id = instance_of_runner(job_of(system, run).runner_name)
    assert instance_id is not None
    record = system.records.get(instance_id)
    assert record is not None
    return record.usage_class


def test_a_class_ec2_takes_back_runs_its_next_job_on_demand_and_spot_again_after_the_cool_down(
    system: World,
) -> None:
    # Given two spot instances of the large class back in the pool after a run of two jobs
    first = completed(
        system, system.start_run("build", JobSpec("a", LABEL, seconds=0.5), JobSpec("b", LABEL, seconds=0.5))
    )
    assert first.conclusion is Conclusion.SUCCESS
    settled(system)
    pooled = system.instances.booted()
    assert len(pooled) == 2

    # When EC2 interrupts both: the warnings reach the stack's rules, and the instances end after the notice
    for instance_id in pooled:
        system.spot.interrupt(instance_id)
    assert system.stack.ec2_events.delivered(10)
    for instance_id in pooled:
        eventually(partial(system.timeline.first, Happening.TERMINATED, instance_id=instance_id), "its end")
    breaker = DynamoDbSpotBreaker(
        system.stack.plane.settings.table_name,
        system.stack.plane.config.fleet.spot_breaker,
        SystemClock(),
        system.aws.client("dynamodb"),
    )
    open_until = breaker.open_until("large")
    assert open_until is not None

    # And a job asks for a large spot runner during the cool-down
    second = completed(system, system.start_run("test", JobSpec("test", LABEL, seconds=0.5)))
    # Then it ran, on an on-demand instance
    assert job_of(system, second).conclusion is Conclusion.SUCCESS
    assert usage_of_job(system, second) is UsageClass.ON_DEMAND

    # When the cool-down is over, and another job asks
    eventually(lambda: time.time() > open_until, "the cool-down to pass", timeout=COOLDOWN_SECONDS + 5)
    third = completed(system, system.start_run("lint", JobSpec("lint", LABEL, seconds=0.5)))
    # Then it ran on spot again
    assert job_of(system, third).conclusion is Conclusion.SUCCESS
    assert usage_of_job(system, third) is UsageClass.SPOT
    settled(system)
    accounted(system)
