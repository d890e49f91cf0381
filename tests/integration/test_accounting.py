"""The accounting check: EC2's instances of the stack and the state table's live records agree."""

from __future__ import annotations

import dataclasses
from typing import Any

import boto3
import pytest

from emulator.accounting import account
from emulator.ec2_fleet import SimulatedEc2
from emulator.harness.control_plane import REGION
from emulator.resources import create_fleet_setup
from runner_pool.adapters.fleet import Fleet, FleetSetup
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceFacts, UsageClass

STACK = "runner-pool-test"


@pytest.fixture
def ec2(aws: None) -> Any:
    return SimulatedEc2(boto3.client("ec2", region_name=REGION))


@pytest.fixture
def setup(ec2: Any) -> FleetSetup:
    return create_fleet_setup(ec2, STACK)


@pytest.fixture
def fleet(ec2: Any, setup: FleetSetup) -> Fleet:
    return Fleet(setup, ec2)


def launch(fleet: Fleet, config: StackConfig, count: int, key: str = "p-1") -> list[InstanceFacts]:
    return list(fleet.launch(LaunchRequest.for_run(config.spec_for("pool=42"), count, key)).launched)


def test_it_holds_when_every_instance_has_its_record(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given 3 instances launched and recorded for a run, and one launched for the pool and admitted
    for facts in launch(fleet, config, 3):
        state_table.create(facts, run_key="pool=42")
    (pooled,) = launch(fleet, config, 1, key="pool")
    state_table.create(pooled, run_key=None)
    state_table.admit(pooled.instance_id)
    # When the accounting is checked
    accounting = account(ec2, state_table, STACK)
    # Then it holds and tallies the records by state
    assert accounting.holds, accounting.problems
    assert accounting.by_state == {InstanceState.CREATED: 3, InstanceState.IDLE: 1}
    assert accounting.instances == 4


def test_an_instance_without_a_record_is_named_an_orphan(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given 2 launched instances of which only the first was recorded
    recorded, orphan = launch(fleet, config, 2)
    state_table.create(recorded, run_key="pool=42")
    # When the accounting is checked
    accounting = account(ec2, state_table, STACK)
    # Then it fails, naming the unrecorded instance alone
    assert not accounting.holds
    (problem,) = accounting.problems
    assert problem.startswith(f"orphan: EC2 instance {orphan.instance_id} ")


def test_a_record_whose_instance_is_gone_is_named_lost(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given a recorded instance that was terminated behind the state table's back
    (facts,) = launch(fleet, config, 1)
    state_table.create(facts, run_key="pool=42")
    ec2.terminate_instances(InstanceIds=[facts.instance_id])
    # When the accounting is checked / Then it fails, naming the record and its terminated instance
    assert account(ec2, state_table, STACK).problems == (
        f"lost: record of {facts.instance_id} (created for 'pool=42') has an EC2 instance that is terminated",
    )


def test_a_record_of_an_instance_ec2_never_had_is_named_lost(
    ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given a record of an instance id EC2 does not know
    facts = InstanceFacts(
        instance_id="i-0123456789abcdef0", resource_class="large", instance_type="c7i.large",
        usage_class="spot", arch="x64", cpu=2, memory_mib=4096,
    )  # fmt: skip
    state_table.create(facts, run_key=None)
    # When the accounting is checked / Then the record is named as having no instance
    assert account(ec2, state_table, STACK).problems == (
        "lost: record of i-0123456789abcdef0 (created) has no EC2 instance",
    )


def test_instances_of_another_stack_and_terminated_ones_are_not_this_stacks_concern(
    fleet: Fleet, ec2: Any, setup: FleetSetup, state_table: StateTable, config: StackConfig
) -> None:
    # Given an instance of another stack, and one of this stack terminated along with its record
    another_stack = Fleet(dataclasses.replace(setup, stack_tag_value="another-stack"), ec2)
    launch(another_stack, config, 1, key="other")
    (ours,) = launch(fleet, config, 1)
    state_table.create(ours, run_key=None)
    state_table.expire(ours.instance_id)
    ec2.terminate_instances(InstanceIds=[ours.instance_id])
    state_table.mark_terminated(ours.instance_id)
    # When this stack's accounting is checked / Then it holds, with nothing live
    accounting = account(ec2, state_table, STACK)
    assert accounting.holds, accounting.problems
    assert (accounting.instances, accounting.by_state) == (0, {})


def test_an_expired_record_whose_instance_is_terminated_awaits_refresh_and_is_in_order(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig, clock: ManualClock
) -> None:
    # Given an instance whose record a failure path expired, and which was then terminated
    (facts,) = launch(fleet, config, 1)
    state_table.create(facts, run_key="pool=42")
    state_table.expire(facts.instance_id)
    ec2.terminate_instances(InstanceIds=[facts.instance_id])
    # When the accounting runs with the clock / Then that is in order; without it, the record is lost
    assert account(ec2, state_table, STACK, now=clock.now()).holds
    assert not account(ec2, state_table, STACK).holds


def stopped_in_tier(fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig) -> InstanceFacts:
    """An on-demand pool instance taken through the stopped tier: idle, stopping, EC2 stop, stopped."""
    (facts,) = launch(fleet, config, 1, key="pool")
    facts = facts.model_copy(update={"usage_class": UsageClass.ON_DEMAND})
    state_table.create(facts, run_key=None)
    state_table.admit(facts.instance_id)
    state_table.stop(facts.instance_id)
    ec2.stop_instances(InstanceIds=[facts.instance_id])
    state_table.mark_stopped(facts, 4_000_000_000.0)
    return facts


def test_it_holds_for_a_stopped_record_whose_instance_is_stopped(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given an instance of the stopped tier, stopped in EC2 and in its record
    stopped_in_tier(fleet, ec2, state_table, config)
    # When the accounting is checked / Then it holds: a stopped instance of the tier is no leak
    accounting = account(ec2, state_table, STACK)
    assert accounting.holds, accounting.problems
    assert accounting.by_state == {InstanceState.STOPPED: 1}


def test_a_stopped_record_whose_instance_runs_is_named_lost(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given a stopped record whose instance someone started behind the state table's back
    facts = stopped_in_tier(fleet, ec2, state_table, config)
    ec2.start_instances(InstanceIds=[facts.instance_id])
    # When the accounting is checked / Then it fails: a running instance nobody may claim is a leak
    (problem,) = account(ec2, state_table, STACK).problems
    assert problem == f"lost: record of {facts.instance_id} (stopped) has an EC2 instance that is running"


def test_an_idle_record_whose_instance_is_stopped_is_named_lost(
    fleet: Fleet, ec2: Any, state_table: StateTable, config: StackConfig
) -> None:
    # Given an idle record whose instance was stopped (pickup would hand out an instance that cannot run)
    (facts,) = launch(fleet, config, 1, key="pool")
    state_table.create(facts, run_key=None)
    state_table.admit(facts.instance_id)
    ec2.stop_instances(InstanceIds=[facts.instance_id])
    # When the accounting is checked / Then it fails naming it
    (problem,) = account(ec2, state_table, STACK).problems
    assert problem == f"lost: record of {facts.instance_id} (idle) has an EC2 instance that is stopped"
