"""Provision from the stopped tier (issue 16, item 2): the real ASL in moto's interpreter, the real handlers.

Pickup prefers hot, then stopped (claimed, StartInstances, the same readiness checks), then a launch.
After every scenario the accounting holds, stopped instances included.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulator.harness.control_plane import stack_config
from emulator.harness.provision_world import ProvisionWorld, output
from emulator.harness.scripted_agents import Script
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import UsageClass
from tests.integration.conftest import accounted_world

RUN = "pool=4242"
STOPPED_FOR_SECONDS = 3600.0


@pytest.fixture
def world() -> Iterator[ProvisionWorld]:
    config = stack_config(defaults={"usage": "on-demand"}, pool={"stopped_maximum": 2})
    with accounted_world(config) as built:
        yield built


def stopped(world: ProvisionWorld, number: int) -> str:
    """An on-demand instance refresh took through the stopped tier: pooled, stopped in EC2, marked
    stopped. Its pool message from its idle time is still in the queue, stale."""
    table = world.plane.state_table
    message = world.warm(number, usage_class=UsageClass.ON_DEMAND)
    assert table.stop(message.instance_id).succeeded
    world.ec2.stop_instances(InstanceIds=[message.instance_id])
    record = table.get(message.instance_id)
    assert record is not None
    assert table.mark_stopped(record, world.clock.now() + STOPPED_FOR_SECONDS).succeeded
    return message.instance_id


def ec2_state(world: ProvisionWorld, instance_id: str) -> str:
    reservations = world.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def test_with_no_hot_instance_a_stopped_one_is_started_and_serves_the_run(world: ProvisionWorld) -> None:
    # Given no hot instance and one stopped instance (its stale pool message still queued)
    instance_id = stopped(world, 1)

    # When a run asks for one runner
    result = output(world.provision(RUN, 1))

    # Then the stopped one was started once, registered and set running; nothing was launched
    assert result["warm"] == [instance_id]
    assert result["cold"] == []
    assert world.ec2.calls["StartInstances"] == 1
    assert world.ec2.calls["CreateFleet"] == 0
    assert ec2_state(world, instance_id) == "running"
    record = world.plane.state_table.get(instance_id)
    assert record is not None
    assert record.state is InstanceState.RUNNING


def test_a_hot_instance_is_preferred_to_a_stopped_one(world: ProvisionWorld) -> None:
    # Given one stopped instance and one hot one
    stopped_id = stopped(world, 1)
    hot = world.warm(2, usage_class=UsageClass.ON_DEMAND).instance_id

    # When a run asks for one runner
    result = output(world.provision(RUN, 1))

    # Then the hot one serves it, and the stopped one stays stopped
    assert result["warm"] == [hot]
    assert world.ec2.calls["StartInstances"] == 0
    assert ec2_state(world, stopped_id) == "stopped"


def test_a_stopped_instance_serves_one_of_two_executions_racing_for_it_and_starts_once(
    world: ProvisionWorld,
) -> None:
    # Given one stopped instance and no hot one
    instance_id = stopped(world, 1)

    # When two runs ask for a runner each at the same time
    executions = world.provision_concurrently([(RUN, 1), ("pool=4343", 1)])

    # Then exactly one got the stopped instance, started once; the other launched its own
    results = [output(execution) for execution in executions]
    assert sorted(len(result["warm"]) for result in results) == [0, 1]
    assert [r["warm"] for r in results if r["warm"]] == [[instance_id]]
    assert world.ec2.calls["StartInstances"] == 1
    assert world.ec2.calls["CreateFleet"] == 1


def test_a_stopped_instance_ec2_cannot_start_is_terminated_and_the_slot_launched(
    world: ProvisionWorld,
) -> None:
    # Given one stopped instance, and EC2 without capacity to start it (InsufficientInstanceCapacity)
    instance_id = stopped(world, 1)
    world.ec2.refuse_starts(1)

    # When a run asks for one runner
    result = output(world.provision(RUN, 1))

    # Then the stopped instance is expired and terminated, and the runner is launched instead
    assert result["warm"] == []
    assert len(result["cold"]) == 1
    assert ec2_state(world, instance_id) in ("shutting-down", "terminated")


def test_a_started_instance_that_never_registers_is_discarded_and_the_slot_launched(
    world: ProvisionWorld,
) -> None:
    # Given one stopped instance whose agent, once started, never registers its runner
    instance_id = stopped(world, 1)
    world.agents.script(instance_id, Script.NEVER_REGISTERS)

    # When a run asks for one runner
    result = output(world.provision(RUN, 1))

    # Then after timeouts.start_registration_seconds it is discarded, and the runner is launched
    assert result["warm"] == []
    assert len(result["cold"]) == 1
    assert ec2_state(world, instance_id) in ("shutting-down", "terminated")


def test_a_fresh_job_never_starts_a_stopped_instance(world: ProvisionWorld) -> None:
    # Given one stopped instance / When a fresh job asks for a runner
    instance_id = stopped(world, 1)
    result = output(world.provision(f"{RUN}/fresh=true", 1))

    # Then it is launched, and the stopped instance stays stopped
    assert len(result["cold"]) == 1
    assert world.ec2.calls["StartInstances"] == 0
    assert ec2_state(world, instance_id) == "stopped"
