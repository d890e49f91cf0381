"""The agent ends its own instance when nobody else will: a passed threshold, no record, EC2 refusing."""

from __future__ import annotations

import pytest

from runner_pool.domain.clock import ManualClock
from runner_pool.domain.records import Signal
from tests.agent.conftest import (
    AgentFactory,
    ControlPlane,
    eventually,
    idle_agent,
    instance_state,
    launch_instance,
    throttling_response,
)


@pytest.fixture
def instance_id(aws: None) -> str:
    """Here the instance is a real one of moto's EC2, so termination can be seen there."""
    return launch_instance()


def test_a_passed_threshold_makes_the_agent_terminate_its_own_instance(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given an idle instance whose control plane has gone quiet
    running = idle_agent(control_plane, agents, termination_grace_seconds=60)
    record = control_plane.records.get(control_plane.instance_id)
    assert record is not None
    assert record.threshold is not None

    # When the idle threshold has passed, but not yet the grace after it
    clock.advance(record.threshold - clock.now() + 30)
    running.looked_again()

    # Then the instance still runs, though the agent has looked at its record since
    assert instance_state(control_plane.instance_id) == "running"

    # And once the grace is over too, the agent terminates its own instance through EC2
    clock.advance(31)
    eventually(lambda: instance_state(control_plane.instance_id) == "terminated", what="the instance to end")
    eventually(lambda: running.agent.terminated, what="the agent to stop")
    assert running.powered_off == []


def test_when_ec2_refuses_the_agent_powers_the_instance_off(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given an agent whose TerminateInstances calls are refused
    control_plane.launch_for_pool()
    running = agents.build()
    running.ec2.meta.events.register(
        "before-call.ec2.TerminateInstances",
        lambda **_: throttling_response("UnauthorizedOperation", status=403),
    )
    agents.started.append(running.start())

    # When its threshold and the grace have long passed
    clock.advance(24 * 3600)

    # Then it powers off (the launch template turns that into termination)
    eventually(lambda: running.powered_off, what="a poweroff")
    assert instance_state(control_plane.instance_id) == "running"


def test_an_instance_nobody_recorded_terminates_itself_after_the_orphan_grace(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given an agent on an instance that has no record in the state table
    running = agents.start(orphan_grace_seconds=600)
    control_plane.await_signal(Signal.UD_OK, None)

    # When the orphan grace passes without a record appearing
    clock.advance(601)

    # Then the agent terminates its instance
    eventually(lambda: instance_state(control_plane.instance_id) == "terminated", what="the instance to end")
    eventually(lambda: running.agent.terminated, what="the agent to stop")


def test_with_the_state_table_unreachable_the_last_threshold_seen_still_ends_the_instance(
    control_plane: ControlPlane, agents: AgentFactory, clock: ManualClock
) -> None:
    # Given an agent that has seen its idle record, and then loses the state table for good
    control_plane.launch_for_pool()
    running = agents.build()
    outage = {"on": False}
    running.dynamodb.meta.events.register(
        "before-call.dynamodb.*",
        lambda **_: throttling_response("ServiceUnavailable", status=503) if outage["on"] else None,
    )
    agents.started.append(running.start())
    control_plane.await_signal(Signal.UD_OK, None)
    record = control_plane.records.get(control_plane.instance_id)
    assert record is not None
    assert record.threshold is not None
    running.looked_again(times=1)
    outage["on"] = True

    # When the threshold and the grace pass while every read fails
    clock.advance(record.threshold - clock.now() + 61)

    # Then the agent still terminates its instance, from the threshold it saw last
    eventually(lambda: instance_state(control_plane.instance_id) == "terminated", what="the instance to end")
