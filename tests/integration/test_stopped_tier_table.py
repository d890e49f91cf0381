"""The stopped tier's transitions against moto (issue 16, item 2): idle → stopping → stopped → claimed, each
one conditional write, with its replay and its lost races, and the by-stopped index pickup reads."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest

from emulator.aws import INSTANCE_ARNS
from emulator.harness.control_plane import NO_WAIT, REGION
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.pickup import ClaimTerms
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceFacts, InstanceRecord, UsageClass
from tests.conftest import TABLE_NAME
from tests.integration.test_state_table import raw_item
from tests.support import builders

RUN = builders.run_key(1, "/class=large/usage=on-demand")
TOKEN = "claim-worker-a"
STOPPED_FOR_SECONDS = 3600.0


def on_demand(number: int = 1) -> InstanceFacts:
    return builders.facts(number, usage_class=UsageClass.ON_DEMAND)


def idle(table: StateTable, facts: InstanceFacts) -> InstanceRecord:
    assert table.create(facts, None).outcome is Outcome.APPLIED
    admitted = table.admit(facts.instance_id)
    assert admitted.outcome is Outcome.APPLIED
    assert admitted.record is not None
    return admitted.record


def stopping(table: StateTable, facts: InstanceFacts) -> None:
    """An idle instance refresh chose for the stopped tier and asked EC2 to stop."""
    idle(table, facts)
    assert table.stop(facts.instance_id).outcome is Outcome.APPLIED


def stopped(table: StateTable, clock: ManualClock, facts: InstanceFacts) -> InstanceRecord:
    stopping(table, facts)
    result = table.mark_stopped(facts, clock.now() + STOPPED_FOR_SECONDS)
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    return result.record


# --- idle → stopping -------------------------------------------------------------------------


def test_stop_takes_an_idle_on_demand_instance_out_of_the_hot_pool(
    state_table: StateTable, clock: ManualClock, config: StackConfig
) -> None:
    # Given an idle on-demand instance
    facts = on_demand()
    idle(state_table, facts)

    # When refresh chooses it for the stopped tier
    result = state_table.stop(facts.instance_id)

    # Then it is stopping, unheld, with the stop's own deadline
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert result.record.state is InstanceState.STOPPING
    assert result.record.threshold == clock.now() + config.timeouts.stopping_seconds
    assert result.record.invariant_violations() == []


def test_stop_retried_is_replayed(state_table: StateTable, clock: ManualClock) -> None:
    # Given an instance already stopping
    facts = on_demand()
    stopping(state_table, facts)
    clock.advance(1)

    # When the stop is written again (a retried refresh) / Then it is recognised
    assert state_table.stop(facts.instance_id).outcome is Outcome.REPLAYED


def _spot(table: StateTable, _clock: ManualClock, _config: StackConfig) -> str:
    """An idle spot instance (an instant fleet's one-time request: EC2 cannot stop it); the write's own
    condition refuses it, and it stays idle."""
    facts = builders.facts(1, usage_class=UsageClass.SPOT)
    idle(table, facts)
    return facts.instance_id


def _idle_time_ran_out(table: StateTable, clock: ManualClock, config: StackConfig) -> str:
    """An idle instance whose idle time has passed: refresh's sweep may be terminating it already, and
    a passed threshold stays final."""
    facts = on_demand()
    idle(table, facts)
    clock.advance(config.timeouts.idle_seconds)
    return facts.instance_id


def _expired(table: StateTable, _clock: ManualClock, _config: StackConfig) -> str:
    """An idle instance expired by a failure path (a release without receipt, a quarantine): it is on
    its way out, never stopped."""
    facts = on_demand()
    idle(table, facts)
    table.expire(facts.instance_id)
    return facts.instance_id


def _claimed(table: StateTable, _clock: ManualClock, _config: StackConfig) -> str:
    """An idle instance claimed a moment before refresh's stop: the claim stands."""
    facts = on_demand()
    idle(table, facts)
    table.claim(facts.instance_id, RUN, TOKEN)
    return facts.instance_id


@pytest.mark.parametrize(
    ("given", "state_after"),
    [
        pytest.param(_spot, InstanceState.IDLE, id="spot"),
        pytest.param(_idle_time_ran_out, InstanceState.IDLE, id="idle-time-ran-out"),
        pytest.param(_expired, InstanceState.IDLE, id="expired"),
        pytest.param(_claimed, InstanceState.CLAIMED, id="claimed"),
    ],
)
def test_a_stop_is_lost(
    state_table: StateTable,
    clock: ManualClock,
    config: StackConfig,
    given: Callable[[StateTable, ManualClock, StackConfig], str],
    state_after: InstanceState,
) -> None:
    # Given an instance no stop may take (each case's docstring says why)
    instance_id = given(state_table, clock, config)
    # When a stop is tried / Then it loses, and the record keeps its state
    result = state_table.stop(instance_id)
    assert result.outcome is Outcome.LOST
    assert result.record is not None
    assert result.record.state is state_after


def test_claim_after_the_stop_is_lost(state_table: StateTable) -> None:
    # Given an instance chosen for the stopped tier while its pool message is still in the queue
    facts = on_demand()
    stopping(state_table, facts)

    # When a hot claim reaches it / Then it loses: the instance is no longer idle
    assert state_table.claim(facts.instance_id, RUN, TOKEN).outcome is Outcome.LOST


# --- stopping → stopped ----------------------------------------------------------------------


def test_mark_stopped_puts_the_instance_in_its_partitions_stopped_index(
    state_table: StateTable, clock: ManualClock, dynamodb: Any
) -> None:
    # Given an instance EC2 has stopped
    facts = on_demand()
    stopping(state_table, facts)

    # When refresh marks it stopped, until an hour from now
    result = state_table.mark_stopped(facts, clock.now() + STOPPED_FOR_SECONDS)

    # Then it is stopped until then, and its partition's index key is on the item
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert result.record.state is InstanceState.STOPPED
    assert result.record.threshold == clock.now() + STOPPED_FOR_SECONDS
    assert result.record.invariant_violations() == []
    item = raw_item(dynamodb, facts.instance_id)
    assert item[schema.STOPPED_PARTITION_ATTRIBUTE] == {"S": PoolPartition.of(facts).name}


def test_mark_stopped_retried_is_replayed(state_table: StateTable, clock: ManualClock) -> None:
    # Given an instance marked stopped
    facts = on_demand()
    stopped(state_table, clock, facts)

    # When the mark is written again / Then it is recognised
    assert state_table.mark_stopped(facts, clock.now() + STOPPED_FOR_SECONDS).outcome is Outcome.REPLAYED


def test_mark_stopped_after_the_stop_timed_out_is_lost(
    state_table: StateTable, clock: ManualClock, config: StackConfig
) -> None:
    # Given an instance whose stop took longer than timeouts.stopping_seconds: it is due for termination
    facts = on_demand()
    stopping(state_table, facts)
    clock.advance(config.timeouts.stopping_seconds)

    # When refresh would mark it stopped / Then it loses: the sweep terminates it
    assert state_table.mark_stopped(facts, clock.now() + STOPPED_FOR_SECONDS).outcome is Outcome.LOST


def test_mark_stopped_of_an_idle_instance_is_lost(state_table: StateTable, clock: ManualClock) -> None:
    # Given an idle instance nobody chose to stop / When it is marked stopped / Then nothing changes
    facts = on_demand()
    idle(state_table, facts)
    assert state_table.mark_stopped(facts, clock.now() + STOPPED_FOR_SECONDS).outcome is Outcome.LOST


# --- stopped → claimed -----------------------------------------------------------------------


def test_claim_of_a_stopped_instance_holds_it_for_the_run_and_leaves_the_index(
    state_table: StateTable, clock: ManualClock, config: StackConfig, dynamodb: Any
) -> None:
    # Given a stopped instance
    facts = on_demand()
    stopped(state_table, clock, facts)

    # When a claim worker claims it to start it
    result = state_table.claim(facts.instance_id, RUN, TOKEN, ClaimTerms(stopped=True))

    # Then it is claimed for the run, with time for EC2's start and the agent's boot, out of the index
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert (result.record.state, result.record.run_key, result.record.claim_token) == (
        InstanceState.CLAIMED,
        RUN,
        TOKEN,
    )
    timeouts = config.timeouts
    assert result.record.threshold == (
        clock.now() + timeouts.claimed_threshold_seconds + timeouts.start_registration_seconds
    )
    assert schema.STOPPED_PARTITION_ATTRIBUTE not in raw_item(dynamodb, facts.instance_id)
    assert state_table.stopped(PoolPartition.of(facts)) == []


def test_claim_of_a_stopped_instance_retried_is_replayed(state_table: StateTable, clock: ManualClock) -> None:
    facts = on_demand()
    stopped(state_table, clock, facts)
    state_table.claim(facts.instance_id, RUN, TOKEN, ClaimTerms(stopped=True))
    clock.advance(1)
    assert (
        state_table.claim(facts.instance_id, RUN, TOKEN, ClaimTerms(stopped=True)).outcome is Outcome.REPLAYED
    )


def test_claim_of_a_stopped_instance_with_another_token_is_lost(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given a stopped instance another worker has just claimed (and is starting)
    facts = on_demand()
    stopped(state_table, clock, facts)
    state_table.claim(facts.instance_id, RUN, TOKEN, ClaimTerms(stopped=True))

    # When a second worker claims it / Then it loses: no instance is started twice
    assert (
        state_table.claim(facts.instance_id, RUN, "claim-worker-b", ClaimTerms(stopped=True)).outcome
        is Outcome.LOST
    )


def test_hot_claim_of_a_stopped_instance_is_lost(state_table: StateTable, clock: ManualClock) -> None:
    # Given a stopped instance / When a hot claim (no start) reaches it / Then it loses
    facts = on_demand()
    stopped(state_table, clock, facts)
    assert state_table.claim(facts.instance_id, RUN, TOKEN).outcome is Outcome.LOST


def test_claim_of_a_stopped_instance_past_its_max_age_is_lost(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given a stopped instance whose time in the tier has run out
    facts = on_demand()
    stopped(state_table, clock, facts)
    clock.advance(STOPPED_FOR_SECONDS)

    # When it is claimed / Then it loses, and pickup no longer finds it
    assert state_table.claim(facts.instance_id, RUN, TOKEN, ClaimTerms(stopped=True)).outcome is Outcome.LOST
    assert state_table.stopped(PoolPartition.of(facts)) == []


def test_stopped_finds_only_its_partitions_claimable_stopped_instances_soonest_first(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given two stopped large on-demand x64 instances (the second stopped later), one stopped xlarge,
    # one stopping and one idle large
    first, second = on_demand(1), on_demand(2)
    stopped(state_table, clock, first)
    clock.advance(5)
    stopped(state_table, clock, second)
    stopped(state_table, clock, builders.facts(3, usage_class=UsageClass.ON_DEMAND, resource_class="xlarge"))
    idle(state_table, on_demand(4))
    state_table.stop(on_demand(4).instance_id)
    idle(state_table, on_demand(5))

    # When pickup reads the large on-demand x64 partition
    found = state_table.stopped(PoolPartition.of(first))

    # Then it finds exactly the two stopped ones, the one that ends first first
    assert [record.instance_id for record in found] == [first.instance_id, second.instance_id]


def test_a_terminated_stopped_record_leaves_the_index(
    state_table: StateTable, clock: ManualClock, dynamodb: Any
) -> None:
    # Given a stopped instance past its time, terminated by refresh
    facts = on_demand()
    stopped(state_table, clock, facts)
    clock.advance(STOPPED_FOR_SECONDS)
    assert state_table.mark_terminated(facts.instance_id).outcome is Outcome.APPLIED

    # Then its item carries no index key of the stopped tier
    assert schema.STOPPED_PARTITION_ATTRIBUTE not in raw_item(dynamodb, facts.instance_id)


@pytest.mark.slow
def test_two_workers_racing_for_one_stopped_instance_never_both_win(
    dynamodb: Any, clock: ManualClock, config: StackConfig
) -> None:
    # Given stopped instances and 8 claim workers, each with its own client and token
    tables = [
        StateTable(
            TABLE_NAME,
            config.timeouts,
            clock,
            boto3.session.Session().client("dynamodb", region_name=REGION),
            NO_WAIT,
            arns=INSTANCE_ARNS,
        )
        for _ in range(8)
    ]
    instances = [on_demand(number) for number in range(1, 5)]
    for facts in instances:
        stopped(tables[0], clock, facts)

    # When every worker claims every stopped instance, all at once
    def claim_all(worker: int) -> list[tuple[str, Outcome]]:
        return [
            (
                facts.instance_id,
                tables[worker].claim(facts.instance_id, RUN, f"w{worker}", ClaimTerms(stopped=True)).outcome,
            )
            for facts in instances
        ]

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        outcomes = [outcome for worker in pool.map(claim_all, range(len(tables))) for outcome in worker]

    # Then each instance was won exactly once: no stopped instance is started twice
    winners = sorted(instance_id for instance_id, outcome in outcomes if outcome is Outcome.APPLIED)
    assert winners == sorted(facts.instance_id for facts in instances)
