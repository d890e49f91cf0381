"""The state table adapter against moto: every transition of DESIGN.md section 4, its reads, and throttling."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import boto3
import pytest
from boto3.dynamodb.types import TypeSerializer
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from emulator.aws import INSTANCE_ARNS
from emulator.harness.control_plane import REGION
from emulator.resources import create_state_table
from runner_pool.adapters import state_items as schema
from runner_pool.adapters.aws_clients import ATTEMPTS, ServiceBusyError
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.lifecycle import InstanceState, Outcome
from runner_pool.domain.records import InstanceFacts, InstanceRecord, Signal, TransitionResult, UsageClass
from tests.conftest import TABLE_NAME
from tests.support import builders
from tests.support.aws_faults import RetryDelays, answer_busy, lose_answers

RUN = builders.run_key(1, "/class=large")
OTHER_RUN = builders.run_key(2, "/class=large")
TOKEN = "claim-worker-a"
OTHER_TOKEN = "claim-worker-b"
MAX_RUNTIME_MINUTES = 90
ONE_ID = builders.facts(1).instance_id
MISSING_ID = "i-0000000000000dead"
STOPPED_UNTIL = 4_000_000_000.0
"""Far past any test clock: a stopped instance of these tests stays claimable."""


# --- helpers ---------------------------------------------------------------------------------


def instance_in(
    table: StateTable,
    state: InstanceState,
    number: int = 1,
    run_key: str = RUN,
    token: str = TOKEN,
) -> InstanceRecord:
    """Walk one instance through the adapter's own transitions to `state`; each step must apply."""
    instance_id = builders.facts(number).instance_id
    # Only an on-demand instance is ever stopped (config.PoolSettings).
    on_demand = builders.facts(number, usage_class=UsageClass.ON_DEMAND)
    steps: dict[InstanceState, list[Callable[[], TransitionResult]]] = {
        InstanceState.CREATED: [lambda: table.create(builders.facts(number), run_key)],
        InstanceState.IDLE: [
            lambda: table.create(builders.facts(number), None),
            lambda: table.admit(instance_id),
        ],
        InstanceState.CLAIMED: [
            lambda: table.create(builders.facts(number), None),
            lambda: table.admit(instance_id),
            lambda: table.claim(instance_id, run_key, token),
        ],
        InstanceState.RUNNING: [
            lambda: table.create(builders.facts(number), None),
            lambda: table.admit(instance_id),
            lambda: table.claim(instance_id, run_key, token),
            lambda: table.activate(instance_id, run_key, MAX_RUNTIME_MINUTES, claim_token=token),
        ],
        InstanceState.STOPPING: [
            lambda: table.create(on_demand, None),
            lambda: table.admit(instance_id),
            lambda: table.stop(instance_id),
        ],
        InstanceState.STOPPED: [
            lambda: table.create(on_demand, None),
            lambda: table.admit(instance_id),
            lambda: table.stop(instance_id),
            lambda: table.mark_stopped(on_demand, STOPPED_UNTIL),
        ],
        InstanceState.TERMINATED: [
            lambda: table.create(builders.facts(number), run_key),
            lambda: table.expire(instance_id),
            lambda: table.mark_terminated(instance_id),
        ],
    }
    result = None
    for step in steps[state]:
        result = step()
        assert result.outcome is Outcome.APPLIED, result
    assert result is not None
    assert result.record is not None
    return result.record


def applied(table: StateTable, result: TransitionResult, state: InstanceState) -> InstanceRecord:
    """The record a transition of ONE_ID applied: as stored, in `state`."""
    assert result.outcome is Outcome.APPLIED
    assert result.record == table.get(ONE_ID)
    assert result.record is not None
    assert result.record.state is state
    return result.record


def registered_in(table: StateTable, state: InstanceState) -> None:
    """One instance in `state` (instance_in) whose agent has beaten and signalled UD_REG_OK for RUN."""
    instance_in(table, state)
    table.write_heartbeat(ONE_ID)
    table.write_signal(ONE_ID, Signal.UD_REG_OK, RUN)


def raw_item(client: Any, instance_id: str, kind: str = schema.STATE_ITEM) -> dict[str, Any]:
    arn = INSTANCE_ARNS.arn(instance_id)
    partition = arn if kind == schema.STATE_ITEM else schema.agent_partition(arn)
    return client.get_item(  # type: ignore[no-any-return]
        TableName=TABLE_NAME,
        Key={schema.PARTITION_KEY: {"S": partition}, schema.SORT_KEY: {"S": kind}},
        ConsistentRead=True,
    )["Item"]


def wire_item(record: InstanceRecord) -> dict[str, Any]:
    """A state item as DynamoDB holds it, for writing odd records directly or stubbing responses."""
    serializer = TypeSerializer()
    fields = {
        name: Decimal(repr(value)) if isinstance(value, float) else value
        for name, value in record.model_dump(mode="json", exclude_none=True).items()
    }
    return {
        **{name: serializer.serialize(value) for name, value in fields.items()},
        schema.PARTITION_KEY: {"S": INSTANCE_ARNS.arn(record.instance_id)},
        schema.SORT_KEY: {"S": schema.STATE_ITEM},
        schema.SWEEP_SHARD_ATTRIBUTE: {"S": schema.sweep_shard(record.instance_id)},
    }


def operations_seen(client: Any) -> list[tuple[str, str | None]]:
    """Every DynamoDB operation the client sends from now on: its name and the index it reads, if any."""
    seen: list[tuple[str, str | None]] = []

    def record_operation(model: Any, params: dict[str, Any], **_: Any) -> None:
        seen.append((model.name, json.loads(params["body"] or b"{}").get("IndexName")))

    client.meta.events.register("before-call.dynamodb.*", record_operation)
    return seen


def ids(records: list[InstanceRecord]) -> set[str]:
    return {record.instance_id for record in records}


# --- the transition matrix: what every transition refuses --------------------------------------

Call = Callable[[StateTable, str], TransitionResult]
CALLS: dict[str, Call] = {
    "claim": lambda table, i: table.claim(i, RUN, TOKEN),
    "claim by another run": lambda table, i: table.claim(i, OTHER_RUN, OTHER_TOKEN),
    "activate": lambda table, i: table.activate(i, RUN, MAX_RUNTIME_MINUTES),
    "activate the claim": lambda table, i: table.activate(i, RUN, MAX_RUNTIME_MINUTES, claim_token=TOKEN),
    "activate by another run": lambda table, i: table.activate(i, OTHER_RUN, MAX_RUNTIME_MINUTES),
    "activate the claim by another run": lambda table, i: table.activate(
        i, OTHER_RUN, MAX_RUNTIME_MINUTES, claim_token=TOKEN
    ),
    "unclaim": lambda table, i: table.unclaim(i, RUN, TOKEN),
    "unclaim by another run": lambda table, i: table.unclaim(i, OTHER_RUN, TOKEN),
    "release": lambda table, i: table.release(i, RUN),
    "release by another run": lambda table, i: table.release(i, OTHER_RUN),
    "admit": lambda table, i: table.admit(i),
    "expire": lambda table, i: table.expire(i),
    "expire for another run": lambda table, i: table.expire(i, OTHER_RUN),
    "expire as unheld": lambda table, i: table.expire(i, None),
    "mark interrupted": lambda table, i: table.mark_interrupted(i, RUN),
    "mark interrupted for another run": lambda table, i: table.mark_interrupted(i, OTHER_RUN),
    "mark terminated": lambda table, i: table.mark_terminated(i),
}
"""Each transition as a call for RUN (or, where named, for another run) of the instance `i`."""

LOST_FROM: list[tuple[str, InstanceState]] = [
    # Not from the state the transition starts from
    ("claim by another run", InstanceState.CREATED),
    ("claim by another run", InstanceState.RUNNING),
    ("claim by another run", InstanceState.TERMINATED),
    ("activate", InstanceState.IDLE),
    ("activate", InstanceState.TERMINATED),
    ("unclaim", InstanceState.RUNNING),
    ("unclaim", InstanceState.CREATED),
    ("unclaim", InstanceState.TERMINATED),
    ("release", InstanceState.CLAIMED),
    ("release", InstanceState.CREATED),
    ("release", InstanceState.TERMINATED),
    ("admit", InstanceState.TERMINATED),
    ("expire", InstanceState.TERMINATED),
    ("mark interrupted", InstanceState.IDLE),
    ("mark interrupted", InstanceState.STOPPED),
    # From the right state, but held by RUN, not the caller (admit: created for RUN, not for the pool)
    ("activate the claim by another run", InstanceState.CLAIMED),
    ("activate by another run", InstanceState.CREATED),
    ("activate by another run", InstanceState.RUNNING),
    ("unclaim by another run", InstanceState.CLAIMED),
    ("release by another run", InstanceState.RUNNING),
    ("admit", InstanceState.CREATED),
    ("expire for another run", InstanceState.CREATED),
    ("expire for another run", InstanceState.CLAIMED),
    ("expire for another run", InstanceState.RUNNING),
    ("expire as unheld", InstanceState.CLAIMED),
    ("mark interrupted for another run", InstanceState.RUNNING),
    # Before its threshold passed: only an expired instance is terminated
    ("mark terminated", InstanceState.RUNNING),
]


@pytest.mark.parametrize(("call", "state"), LOST_FROM, ids=[f"{c}-{s.value}" for c, s in LOST_FROM])
def test_a_transition_from_a_state_it_does_not_start_from_is_lost_and_changes_nothing(
    state_table: StateTable, call: str, state: InstanceState
) -> None:
    # Given an instance (held by RUN where held) in a state the call may not move it from
    before = state_table.get(instance_in(state_table, state).instance_id)

    # When the call is made
    result = CALLS[call](state_table, ONE_ID)

    # Then it loses, shows the record as it is, and nothing changes
    assert result.outcome is Outcome.LOST
    assert result.record == before == state_table.get(ONE_ID)


@pytest.mark.parametrize(
    "call",
    ["claim", "activate", "unclaim", "release", "admit", "expire", "mark interrupted", "mark terminated"],
)
def test_a_transition_of_a_missing_record_is_lost(state_table: StateTable, call: str) -> None:
    # Given no record for the instance
    # When the call is made
    result = CALLS[call](state_table, MISSING_ID)

    # Then it loses, with no record to show
    assert result == TransitionResult(Outcome.LOST, None)


STARTS_FROM: dict[str, InstanceState] = {
    "claim": InstanceState.IDLE,
    "activate the claim": InstanceState.CLAIMED,
    "unclaim": InstanceState.CLAIMED,
    "release": InstanceState.RUNNING,
    "admit": InstanceState.CREATED,
}
"""The state each transition that hands an instance on starts from."""


def start_of(table: StateTable, call: str) -> InstanceRecord:
    """An instance in the state `call` starts from (admit's: created for the pool, not for RUN; expiry's:
    running; termination's: running, then expired)."""
    if call == "admit":
        return table.create(builders.facts(1), None).record  # type: ignore[return-value]
    if call in ("expire", "mark terminated"):
        running = instance_in(table, InstanceState.RUNNING)
        return running if call == "expire" else table.expire(ONE_ID).record  # type: ignore[return-value]
    return instance_in(table, STARTS_FROM[call])


@pytest.mark.parametrize("call", [*STARTS_FROM, "expire", "mark terminated"])
def test_a_transition_retried_is_replayed_and_changes_nothing(
    state_table: StateTable, clock: ManualClock, call: str
) -> None:
    # Given an instance the call already moved
    start_of(state_table, call)
    first = CALLS[call](state_table, ONE_ID)
    assert first.outcome is Outcome.APPLIED
    clock.advance(1)

    # When the same call is retried (its answer was lost, say)
    retry = CALLS[call](state_table, ONE_ID)

    # Then it is a replay, and the record is as the first call left it: no threshold restarted or
    # extended, no TTL pushed back
    assert retry.outcome is Outcome.REPLAYED
    assert retry.record == first.record == state_table.get(ONE_ID)


@pytest.mark.parametrize("call", list(STARTS_FROM))
def test_a_transition_retried_after_the_instance_was_expired_is_lost(
    state_table: StateTable, call: str
) -> None:
    # Given an instance the call moved, since expired (a failure path, or no release receipt in time)
    start_of(state_table, call)
    assert CALLS[call](state_table, ONE_ID).outcome is Outcome.APPLIED
    state_table.expire(ONE_ID)

    # When the call is retried
    retry = CALLS[call](state_table, ONE_ID)

    # Then it is not reported as done: the instance is on its way out
    assert retry.outcome is Outcome.LOST


# --- create ----------------------------------------------------------------------------------


def test_create_for_a_run_records_a_created_instance_holding_the_run_key(
    state_table: StateTable, clock: ManualClock, config: StackConfig
) -> None:
    # Given an instance EC2 has just launched for a run
    facts = builders.facts(1)

    # When it is recorded
    result = state_table.create(facts, RUN)

    # Then it is created for the run, with the created timeout ahead of it
    assert result.outcome is Outcome.APPLIED
    assert state_table.get(facts.instance_id) == result.record
    assert result.record is not None
    assert result.record.facts == facts
    assert result.record.state is InstanceState.CREATED
    assert result.record.run_key == RUN
    assert result.record.threshold == clock.now() + config.timeouts.created_threshold_seconds
    assert result.record.created_at == result.record.updated_at == clock.now()
    assert result.record.claim_token is None


def test_create_for_the_pool_records_an_instance_without_a_run_key(state_table: StateTable) -> None:
    # Given an instance launched for the warm pool
    facts = builders.facts(1)

    # When it is recorded without a run key
    result = state_table.create(facts, None)

    # Then it is created and held by no run
    assert result.outcome is Outcome.APPLIED
    stored = state_table.get(facts.instance_id)
    assert stored is not None
    assert stored.state is InstanceState.CREATED
    assert stored.run_key is None


def test_create_retried_finds_its_own_record_and_is_replayed(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an instance already recorded for a run
    first = state_table.create(builders.facts(1), RUN)
    clock.advance(3)

    # When the same creation is retried (a Lambda retry)
    retry = state_table.create(builders.facts(1), RUN)

    # Then it is a replay and the record is the first one, untouched
    assert retry.outcome is Outcome.REPLAYED
    assert retry.record == first.record == state_table.get(ONE_ID)


def test_create_of_an_instance_recorded_for_another_run_is_lost(state_table: StateTable) -> None:
    # Given an instance recorded for one run
    first = state_table.create(builders.facts(1), RUN)

    # When another run tries to record the same instance
    result = state_table.create(builders.facts(1), OTHER_RUN)

    # Then it loses and the record still belongs to the first run
    assert result.outcome is Outcome.LOST
    assert result.record == first.record == state_table.get(ONE_ID)


def test_create_of_an_instance_that_has_moved_on_is_lost(state_table: StateTable) -> None:
    # Given a pool instance that was created and has since been admitted to the pool
    idle = instance_in(state_table, InstanceState.IDLE)

    # When its creation is retried
    result = state_table.create(builders.facts(1), None)

    # Then the retry loses instead of resetting it, and the record is as it was
    assert result.outcome is Outcome.LOST
    assert result.record == idle == state_table.get(ONE_ID)


def test_create_retried_after_the_record_expired_is_lost(state_table: StateTable) -> None:
    # Given an instance recorded for a run, then expired by a failure path
    state_table.create(builders.facts(1), RUN)
    state_table.expire(ONE_ID)

    # When the creation is retried
    result = state_table.create(builders.facts(1), RUN)

    # Then it is not reported as a success: the record it finds is no longer valid
    assert result.outcome is Outcome.LOST


def test_create_is_not_blocked_by_the_agents_items(state_table: StateTable) -> None:
    # Given an agent that beat and signalled before its record was written
    state_table.write_heartbeat(ONE_ID)
    state_table.write_signal(ONE_ID, Signal.UD_OK)

    # When the record is created
    result = state_table.create(builders.facts(1), RUN)

    # Then the condition looks at the state item only
    assert result.outcome is Outcome.APPLIED


# --- claim -----------------------------------------------------------------------------------


def test_claim_of_an_idle_instance_holds_it_for_the_run(
    state_table: StateTable, clock: ManualClock, config: StackConfig
) -> None:
    # Given an idle pool instance
    instance_in(state_table, InstanceState.IDLE)
    clock.advance(30)

    # When a claim worker claims it
    result = state_table.claim(ONE_ID, RUN, TOKEN)

    # Then it is claimed by that worker for the run, with the claim timeout ahead
    record = applied(state_table, result, InstanceState.CLAIMED)
    assert record.run_key == RUN
    assert record.claim_token == TOKEN
    assert record.threshold == clock.now() + config.timeouts.claimed_threshold_seconds
    assert record.updated_at == clock.now()


def test_claim_with_another_token_is_lost(state_table: StateTable) -> None:
    # Given an instance one worker has claimed
    claimed = instance_in(state_table, InstanceState.CLAIMED)

    # When a second worker (of the same run) claims it too
    result = state_table.claim(ONE_ID, RUN, OTHER_TOKEN)

    # Then the second worker loses and the first keeps the claim
    assert result.outcome is Outcome.LOST
    assert result.record == claimed == state_table.get(ONE_ID)


def test_claim_of_an_idle_record_that_still_holds_a_run_key_is_lost(
    state_table: StateTable, dynamodb: Any, clock: ManualClock
) -> None:
    # Given an idle record that (against the rules) still carries a run key
    idle = instance_in(state_table, InstanceState.IDLE)
    dynamodb.put_item(TableName=TABLE_NAME, Item=wire_item(idle.model_copy(update={"run_key": RUN})))

    # When a worker claims it
    result = state_table.claim(ONE_ID, OTHER_RUN, OTHER_TOKEN)

    # Then the claim loses: only an unheld instance can be claimed
    assert result.outcome is Outcome.LOST


@pytest.mark.parametrize("past_by", [0.0, 0.5])
def test_claim_after_the_idle_time_ran_out_is_lost(
    state_table: StateTable, clock: ManualClock, past_by: float
) -> None:
    # Given an idle instance whose idle time has run out (the threshold itself counts as passed)
    idle = instance_in(state_table, InstanceState.IDLE)
    assert idle.threshold is not None
    clock.advance(idle.threshold - clock.now() + past_by)

    # When a worker claims it
    result = state_table.claim(ONE_ID, RUN, TOKEN)

    # Then the claim loses and the instance stays idle, for refresh to terminate
    assert result.outcome is Outcome.LOST
    assert result.record == idle == state_table.get(ONE_ID)


# --- activate --------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [InstanceState.CLAIMED, InstanceState.CREATED])
def test_activate_puts_the_instance_to_work_for_its_max_runtime(
    state_table: StateTable, clock: ManualClock, state: InstanceState
) -> None:
    # Given an instance claimed or created for a run
    instance_in(state_table, state)
    clock.advance(45)

    # When post-provision finds it registered and healthy (a claimed one activated by its claim's holder)
    token = TOKEN if state is InstanceState.CLAIMED else None
    result = state_table.activate(ONE_ID, RUN, MAX_RUNTIME_MINUTES, claim_token=token)

    # Then it is running for the run until its max runtime, and no longer carries a claim token
    record = applied(state_table, result, InstanceState.RUNNING)
    assert record.run_key == RUN
    assert record.threshold == clock.now() + MAX_RUNTIME_MINUTES * 60
    assert record.claim_token is None


def test_activate_of_a_pool_instance_still_being_created_is_lost(state_table: StateTable) -> None:
    # Given an instance created for the pool (no run key)
    state_table.create(builders.facts(1), None)

    # When a run activates it
    result = state_table.activate(ONE_ID, RUN, MAX_RUNTIME_MINUTES)

    # Then it loses: pool instances reach a run only through idle and a claim
    assert result.outcome is Outcome.LOST


def test_activate_after_the_claim_timed_out_is_lost(state_table: StateTable, clock: ManualClock) -> None:
    # Given a claim whose threshold has passed
    claimed = instance_in(state_table, InstanceState.CLAIMED)
    assert claimed.threshold is not None
    clock.advance(claimed.threshold - clock.now())

    # When post-provision activates it in the claim holder's name
    result = state_table.activate(ONE_ID, RUN, MAX_RUNTIME_MINUTES, claim_token=TOKEN)

    # Then it loses and the claim stays as it was, for refresh
    assert result.outcome is Outcome.LOST
    assert result.record == claimed == state_table.get(ONE_ID)


def test_activate_from_claimed_needs_the_holding_claim_token(state_table: StateTable) -> None:
    # Given an instance the run's worker A claimed and gave back, then the same run's worker B claimed
    instance_in(state_table, InstanceState.CLAIMED)
    state_table.unclaim(ONE_ID, RUN, TOKEN)
    state_table.claim(ONE_ID, RUN, OTHER_TOKEN)
    before = state_table.get(ONE_ID)

    # When a late activation in worker A's name arrives
    result = state_table.activate(ONE_ID, RUN, MAX_RUNTIME_MINUTES, claim_token=TOKEN)

    # Then it loses: the same run key is not the same claim
    assert result.outcome is Outcome.LOST
    assert state_table.get(ONE_ID) == before


def test_activate_without_a_claim_token_does_not_take_a_claimed_instance(state_table: StateTable) -> None:
    # Given an instance claimed by a worker of the run
    before = instance_in(state_table, InstanceState.CLAIMED)

    # When an activation meant for a created instance (no claim token) names it
    result = state_table.activate(ONE_ID, RUN, MAX_RUNTIME_MINUTES)

    # Then it loses: only the claim's holder may put a claimed instance to work
    assert result.outcome is Outcome.LOST
    assert state_table.get(ONE_ID) == before


def test_late_unclaim_retry_does_not_undo_a_later_claim_of_the_same_run(state_table: StateTable) -> None:
    # Given worker A's claim given back, and the same run's worker B claiming the instance since
    instance_in(state_table, InstanceState.CLAIMED)
    state_table.unclaim(ONE_ID, RUN, TOKEN)
    state_table.claim(ONE_ID, RUN, OTHER_TOKEN)

    # When worker A's unclaim is retried late
    retry = state_table.unclaim(ONE_ID, RUN, TOKEN)

    # Then it loses and worker B keeps its claim
    assert retry.outcome is Outcome.LOST
    record = state_table.get(ONE_ID)
    assert record is not None
    assert (record.state, record.claim_token) == (InstanceState.CLAIMED, OTHER_TOKEN)


# --- unclaim, release, admit: back to idle ---------------------------------------------------

TO_IDLE = ("unclaim", "release", "admit")


@pytest.mark.parametrize("transition", TO_IDLE)
def test_back_to_idle_clears_the_holder_and_starts_the_idle_time(
    state_table: StateTable, clock: ManualClock, config: StackConfig, transition: str
) -> None:
    # Given an instance in the state the transition starts from
    start_of(state_table, transition)
    clock.advance(12)

    # When it goes back to idle
    result = CALLS[transition](state_table, ONE_ID)

    # Then it is idle, held by no run and no worker, with the idle time ahead
    record = applied(state_table, result, InstanceState.IDLE)
    assert record.run_key is None
    assert record.claim_token is None
    assert record.threshold == clock.now() + config.timeouts.idle_seconds


@pytest.mark.parametrize("transition", TO_IDLE)
def test_back_to_idle_after_the_threshold_passed_is_lost(
    state_table: StateTable, clock: ManualClock, transition: str
) -> None:
    # Given an instance whose threshold has passed in the starting state
    start = start_of(state_table, transition)
    assert start.threshold is not None
    clock.advance(start.threshold - clock.now() + 1)

    # When it is taken back to idle
    result = CALLS[transition](state_table, ONE_ID)

    # Then it loses: an expired instance is terminated, never pooled
    assert result.outcome is Outcome.LOST
    assert result.record == state_table.get(ONE_ID)
    assert result.record is not None
    assert result.record.state is start.state


# --- expire ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state", [InstanceState.CREATED, InstanceState.IDLE, InstanceState.CLAIMED, InstanceState.RUNNING]
)
def test_expire_sets_the_threshold_to_now_and_keeps_the_state(
    state_table: StateTable, clock: ManualClock, state: InstanceState
) -> None:
    # Given a live instance
    before = instance_in(state_table, state)
    clock.advance(7)

    # When a failure path expires it (whoever holds it)
    result = state_table.expire(ONE_ID)

    # Then its threshold is now, everything else as it was, and refresh sees it as due
    assert result.outcome is Outcome.APPLIED
    assert result.record == state_table.get(ONE_ID)
    assert result.record == before.model_copy(update={"threshold": clock.now(), "updated_at": clock.now()})
    assert ids(state_table.due()) == {ONE_ID}


@pytest.mark.parametrize("state", [InstanceState.CREATED, InstanceState.CLAIMED, InstanceState.RUNNING])
def test_expire_for_the_holding_run_is_applied(state_table: StateTable, state: InstanceState) -> None:
    # Given an instance held by a run
    instance_in(state_table, state)

    # When that run's failure path expires it
    result = state_table.expire(ONE_ID, RUN)

    # Then it is expired
    assert result.outcome is Outcome.APPLIED


def test_expire_of_an_unheld_instance_for_no_run_is_applied(state_table: StateTable) -> None:
    # Given an idle instance
    instance_in(state_table, InstanceState.IDLE)

    # When it is expired as an unheld instance (run key None)
    result = state_table.expire(ONE_ID, None)

    # Then it is expired
    assert result.outcome is Outcome.APPLIED


def test_expire_of_an_instance_whose_threshold_passed_on_its_own_is_replayed(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given a claim that has timed out
    claimed = instance_in(state_table, InstanceState.CLAIMED)
    assert claimed.threshold is not None
    clock.advance(claimed.threshold - clock.now() + 5)

    # When it is expired
    result = state_table.expire(ONE_ID, RUN)

    # Then the record already is what expire would make it
    assert result.outcome is Outcome.REPLAYED
    assert result.record == claimed


# --- mark_interrupted ------------------------------------------------------------------------


def test_mark_interrupted_notes_the_warning_and_changes_nothing_else(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an instance running a job of the run
    running = instance_in(state_table, InstanceState.RUNNING)
    clock.advance(7)

    # When it is marked interrupted
    result = state_table.mark_interrupted(ONE_ID, RUN)

    # Then the mark is the time of the warning, and state, run key and threshold stay as they were
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert result.record.interrupted_at == clock.now()
    assert (result.record.state, result.record.run_key, result.record.threshold) == (
        InstanceState.RUNNING,
        RUN,
        running.threshold,
    )


def test_mark_interrupted_again_is_replayed_and_keeps_the_first_mark(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given a running instance marked interrupted
    instance_in(state_table, InstanceState.RUNNING)
    first = state_table.mark_interrupted(ONE_ID, RUN).record
    clock.advance(5)

    # When a second warning marks it again
    again = state_table.mark_interrupted(ONE_ID, RUN)

    # Then it is a replay, with the first mark
    assert again.outcome is Outcome.REPLAYED
    assert first is not None
    assert again.record is not None
    assert again.record.interrupted_at == first.interrupted_at


@pytest.mark.parametrize("state", [InstanceState.CLAIMED, InstanceState.CREATED])
def test_mark_interrupted_of_an_instance_held_for_the_run_is_applied(
    state_table: StateTable, state: InstanceState
) -> None:
    # Given an instance held for the run, whose runner may already run a job before it is set running
    instance_in(state_table, state)

    # When it is marked interrupted
    result = state_table.mark_interrupted(ONE_ID, RUN)

    # Then the mark is written, the state kept
    assert result.outcome is Outcome.APPLIED
    assert result.record is not None
    assert result.record.state is state


def test_the_mark_survives_termination(state_table: StateTable) -> None:
    # Given a running instance marked interrupted, then expired
    instance_in(state_table, InstanceState.RUNNING)
    state_table.mark_interrupted(ONE_ID, RUN)
    state_table.expire(ONE_ID)

    # When refresh marks it terminated
    terminated = state_table.mark_terminated(ONE_ID)

    # Then the mark is kept for the job's completion to read
    assert terminated.record is not None
    assert terminated.record.interrupted_at is not None


# --- mark_terminated -------------------------------------------------------------------------


def test_mark_terminated_ends_the_record_with_a_ttl(
    state_table: StateTable, clock: ManualClock, config: StackConfig
) -> None:
    # Given an expired running instance
    instance_in(state_table, InstanceState.RUNNING)
    state_table.expire(ONE_ID)
    clock.advance(60.5)

    # When refresh has terminated it in EC2 and marks the record
    result = state_table.mark_terminated(ONE_ID)

    # Then it is terminated, holds nothing, and expires after the retention period
    record = applied(state_table, result, InstanceState.TERMINATED)
    assert record.run_key is None
    assert record.claim_token is None
    assert record.threshold is None
    assert record.expires_at == int(clock.now()) + config.timeouts.terminated_retention_days * 86_400
    assert record.invariant_violations() == []


def test_a_terminated_record_leaves_both_indexes(state_table: StateTable, dynamodb: Any) -> None:
    # Given a claimed instance that was expired
    instance_in(state_table, InstanceState.CLAIMED)
    state_table.expire(ONE_ID)

    # When it is marked terminated
    state_table.mark_terminated(ONE_ID)

    # Then neither index holds it: its keys are gone and the TTL attribute is set
    item = raw_item(dynamodb, ONE_ID)
    assert schema.RUN_KEY_ATTRIBUTE not in item
    assert schema.SWEEP_SHARD_ATTRIBUTE not in item
    assert schema.THRESHOLD_ATTRIBUTE not in item
    assert schema.TTL_ATTRIBUTE in item
    assert state_table.held_by(RUN) == []
    assert state_table.live() == []
    assert state_table.due() == []


def test_mark_terminated_of_an_instance_whose_threshold_passed_on_its_own_is_applied(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an idle instance whose idle time ran out
    idle = instance_in(state_table, InstanceState.IDLE)
    assert idle.threshold is not None
    clock.advance(idle.threshold - clock.now())

    # When refresh marks it terminated
    result = state_table.mark_terminated(ONE_ID)

    # Then it is terminated
    assert result.outcome is Outcome.APPLIED


# --- reads -----------------------------------------------------------------------------------


def test_get_of_a_missing_record_is_none(state_table: StateTable) -> None:
    # Given no record
    # When it is read
    # Then there is none
    assert state_table.get(MISSING_ID) is None


def test_held_by_finds_exactly_the_records_holding_the_run_key(state_table: StateTable) -> None:
    # Given instances created, claimed and running for RUN, and others idle, terminated or for another run
    instance_in(state_table, InstanceState.CREATED, 1)
    instance_in(state_table, InstanceState.CLAIMED, 2)
    instance_in(state_table, InstanceState.RUNNING, 3)
    instance_in(state_table, InstanceState.IDLE, 4)
    instance_in(state_table, InstanceState.TERMINATED, 5)
    instance_in(state_table, InstanceState.RUNNING, 6, run_key=OTHER_RUN)

    # When the run's instances are looked up
    held = state_table.held_by(RUN)

    # Then exactly the three holding RUN are found
    assert ids(held) == {builders.facts(n).instance_id for n in (1, 2, 3)}
    assert all(record.run_key == RUN for record in held)


def test_held_by_no_longer_finds_a_released_instance(state_table: StateTable) -> None:
    # Given an instance running for RUN
    instance_in(state_table, InstanceState.RUNNING)

    # When it is released
    state_table.release(ONE_ID, RUN)

    # Then the run holds nothing
    assert state_table.held_by(RUN) == []


def test_due_finds_exactly_the_live_records_whose_threshold_passed_in_every_shard(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given 16 idle instances (spread over every sweep shard), half of them then claimed
    for number in range(16):
        instance_in(state_table, InstanceState.IDLE, number)
    for number in range(0, 16, 2):
        state_table.claim(builders.facts(number).instance_id, RUN, f"token-{number}")
    assert {schema.sweep_shard(builders.facts(n).instance_id) for n in range(16)} == {
        str(shard) for shard in range(schema.SWEEP_SHARDS)
    }

    # When the claim timeout (300 s) has passed but not the idle time (600 s)
    clock.advance(300)
    due = state_table.due()

    # Then exactly the claimed ones are due
    assert ids(due) == {builders.facts(n).instance_id for n in range(0, 16, 2)}


def test_due_at_an_explicit_time_uses_that_time(state_table: StateTable, clock: ManualClock) -> None:
    # Given an idle instance
    idle = instance_in(state_table, InstanceState.IDLE)
    assert idle.threshold is not None

    # When refresh asks what is due at the instance's threshold
    due = state_table.due(now=idle.threshold)

    # Then the instance is due although the clock has not moved
    assert ids(due) == {ONE_ID}


def test_live_finds_every_record_not_terminated_whatever_its_threshold(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given instances in every live state, one of them expired, and a terminated one
    for number, state in enumerate(
        [InstanceState.CREATED, InstanceState.IDLE, InstanceState.CLAIMED, InstanceState.RUNNING]
    ):
        instance_in(state_table, state, number)
    state_table.expire(builders.facts(0).instance_id)
    instance_in(state_table, InstanceState.TERMINATED, 9)

    # When the live records are listed
    live = state_table.live()

    # Then all four live ones are there and the terminated one is not
    assert ids(live) == {builders.facts(n).instance_id for n in range(4)}


@pytest.mark.parametrize(
    ("read", "index"),
    [
        (lambda table: table.held_by(RUN), schema.RUN_KEY_INDEX),
        (lambda table: table.due(), schema.THRESHOLD_INDEX),
        (lambda table: table.live(), schema.THRESHOLD_INDEX),
    ],
    ids=["held_by", "due", "live"],
)
def test_lookups_query_the_indexes_and_never_scan(
    state_table: StateTable,
    dynamodb: Any,
    clock: ManualClock,
    read: Callable[[StateTable], Any],
    index: str,
) -> None:
    # Given a table with instances in every state and the agents' items
    for number, state in enumerate(InstanceState):
        instance_in(state_table, state, number)
        state_table.write_heartbeat(builders.facts(number).instance_id)
        state_table.write_signal(builders.facts(number).instance_id, Signal.UD_REG_OK, RUN)
    clock.advance(1_000)
    seen = operations_seen(dynamodb)

    # When the lookup runs
    read(state_table)

    # Then it only queried, and only its index
    assert seen
    assert set(seen) == {("Query", index)}


def test_held_by_follows_every_page_of_the_index(aws: None, clock: ManualClock, config: StackConfig) -> None:
    # Given an index that answers in two pages
    client = boto3.client("dynamodb", region_name=REGION)
    table = StateTable(
        TABLE_NAME, config.timeouts, clock, client, Backoff(sleep=lambda _: None), arns=INSTANCE_ARNS
    )
    record = InstanceRecord.model_validate(
        {
            **builders.facts(1).model_dump(),
            "state": InstanceState.RUNNING,
            "run_key": RUN,
            "threshold": clock.now() + 60,
            "created_at": clock.now(),
            "updated_at": clock.now(),
        }
    )
    second = record.model_copy(update={"instance_id": builders.facts(2).instance_id})
    last_key = {key: wire_item(record)[key] for key in (schema.PARTITION_KEY, schema.SORT_KEY)}
    with Stubber(client) as stubber:
        stubber.add_response("query", {"Items": [wire_item(record)], "LastEvaluatedKey": last_key})
        stubber.add_response(
            "query",
            {"Items": [wire_item(second)]},
            expected_params={
                "TableName": TABLE_NAME,
                "IndexName": schema.RUN_KEY_INDEX,
                "KeyConditionExpression": f"{schema.RUN_KEY_ATTRIBUTE} = :run_key",
                "ExpressionAttributeValues": {":run_key": {"S": RUN}},
                "ExclusiveStartKey": last_key,
            },
        )

        # When the run's instances are looked up
        held = table.held_by(RUN)

        # Then both pages are read
        stubber.assert_no_pending_responses()
    assert held == [record, second]


# --- the agent's items -----------------------------------------------------------------------


def test_heartbeat_written_is_read_back(state_table: StateTable, clock: ManualClock) -> None:
    # Given an agent that beats
    written = state_table.write_heartbeat(ONE_ID)
    clock.advance(5)

    # When the control plane reads the heartbeat
    read = state_table.read_heartbeat(ONE_ID)

    # Then it is the beat written, from its time
    assert read == written
    assert read.beat_at == clock.now() - 5


def test_heartbeat_of_an_agent_that_never_beat_is_none(state_table: StateTable) -> None:
    # Given an agent that has not beaten yet
    # When the heartbeat is read
    # Then there is none
    assert state_table.read_heartbeat(ONE_ID) is None


def test_a_later_heartbeat_replaces_the_earlier_one(state_table: StateTable, clock: ManualClock) -> None:
    # Given an agent that beat once
    state_table.write_heartbeat(ONE_ID)

    # When it beats again a period later
    clock.advance(5)
    later = state_table.write_heartbeat(ONE_ID)

    # Then the later beat is what is read
    assert state_table.read_heartbeat(ONE_ID) == later


@pytest.mark.parametrize("reason", [None, "runner exited with 1"])
def test_signal_written_is_read_back(state_table: StateTable, reason: str | None) -> None:
    # Given an agent that signals registration for a run (with or without a reason)
    written = state_table.write_signal(ONE_ID, Signal.UD_REG_OK, RUN, reason)

    # When the control plane reads the signal
    read = state_table.read_signal(ONE_ID)

    # Then it is the signal written, for that run
    assert read == written
    assert read is not None
    assert read.confirms(Signal.UD_REG_OK, RUN)


def test_signal_without_a_run_key_is_read_back_without_one(state_table: StateTable) -> None:
    # Given an agent that signals its pre-runner script succeeded (no run)
    state_table.write_signal(ONE_ID, Signal.UD_OK)

    # When the signal is read
    read = state_table.read_signal(ONE_ID)

    # Then it names no run
    assert read is not None
    assert read.confirms(Signal.UD_OK, None)


def test_signal_of_an_agent_that_never_signalled_is_none(state_table: StateTable) -> None:
    # Given an agent that has written no signal
    # When the signal is read
    # Then there is none
    assert state_table.read_signal(ONE_ID) is None


@pytest.mark.parametrize("kind", [schema.HEARTBEAT_ITEM, schema.SIGNAL_ITEM])
def test_agent_items_carry_a_ttl(
    state_table: StateTable, dynamodb: Any, clock: ManualClock, config: StackConfig, kind: str
) -> None:
    # Given the agent's heartbeat and signal
    # When they are written
    state_table.write_heartbeat(ONE_ID)
    state_table.write_signal(ONE_ID, Signal.UD_REG_OK, RUN)

    # Then each expires after the retention period
    expected = int(clock.now()) + config.timeouts.terminated_retention_days * 86_400
    assert raw_item(dynamodb, ONE_ID, kind)[schema.TTL_ATTRIBUTE] == {"N": str(expected)}


def test_agent_items_never_appear_in_held_by(state_table: StateTable) -> None:
    # Given an instance running for RUN whose agent beats and signals about RUN, and a signal
    # about RUN from an instance with no record
    registered_in(state_table, InstanceState.RUNNING)
    state_table.write_signal(MISSING_ID, Signal.UD_REG_OK, RUN)

    # When the run's instances are looked up
    held = state_table.held_by(RUN)

    # Then only the instance record is found
    assert [record.instance_id for record in held] == [ONE_ID]


def test_agent_items_never_appear_in_the_threshold_sweep(state_table: StateTable, clock: ManualClock) -> None:
    # Given agents' items but no instance record
    state_table.write_heartbeat(ONE_ID)
    state_table.write_signal(ONE_ID, Signal.UD_REMOVE_REG_OK, RUN)
    clock.advance(10_000)

    # When refresh sweeps
    # Then there is nothing live and nothing due
    assert state_table.live() == []
    assert state_table.due() == []


# --- keys: the instance ARN ------------------------------------------------------------------


def test_every_item_of_an_instance_is_keyed_by_its_arn_and_the_agents_apart(
    state_table: StateTable, dynamodb: Any
) -> None:
    # Given an instance with a record, a heartbeat and a signal
    registered_in(state_table, InstanceState.RUNNING)

    # When the table is read raw
    items = dynamodb.scan(TableName=TABLE_NAME, ConsistentRead=True)["Items"]

    # Then each is keyed by the instance's ARN, what `${ec2:SourceInstanceARN}` resolves to for that
    # instance's own requests: the record under the ARN, the agent's items under `agent#` and the ARN
    arn = f"arn:aws:ec2:{REGION}:123456789012:instance/{ONE_ID}"
    assert {(item[schema.PARTITION_KEY]["S"], item[schema.SORT_KEY]["S"]) for item in items} == {
        (arn, schema.STATE_ITEM),
        (f"agent#{arn}", schema.HEARTBEAT_ITEM),
        (f"agent#{arn}", schema.SIGNAL_ITEM),
    }


def test_records_found_through_either_index_carry_the_instance_id(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given a running instance, keyed by its ARN
    instance_in(state_table, InstanceState.RUNNING)

    # When release looks it up by run and, once its time is up, refresh sweeps for it
    held = state_table.held_by(RUN)
    clock.advance(MAX_RUNTIME_MINUTES * 60)
    due = state_table.due()

    # Then both indexes find it and give back its instance id, never the key
    assert [record.instance_id for record in held] == [ONE_ID]
    assert [record.instance_id for record in due] == [ONE_ID]


def test_without_arns_given_the_table_asks_sts_once_for_its_account(
    aws: None, clock: ManualClock, config: StackConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a state table in eu-west-1 told nothing of where instances live
    client = boto3.client("dynamodb", region_name="eu-west-1")
    create_state_table(client, TABLE_NAME)
    table = StateTable(TABLE_NAME, config.timeouts, clock, client)
    asked: list[InstanceArns] = []
    of_caller = InstanceArns.of_caller

    def counted(*args: Any) -> InstanceArns:
        asked.append(of_caller(*args))
        return asked[-1]

    monkeypatch.setattr(InstanceArns, "of_caller", counted)

    # When it records an instance and the agent's items of it
    table.create(builders.facts(1), None)
    table.write_heartbeat(ONE_ID)
    table.write_signal(ONE_ID, Signal.UD_OK)

    # Then it asked STS once, and keys by the ARN of the caller's account in the client's region
    assert asked == [InstanceArns("aws", "eu-west-1", "123456789012")]
    arn = f"arn:aws:ec2:eu-west-1:123456789012:instance/{ONE_ID}"
    keys = {item[schema.PARTITION_KEY]["S"] for item in client.scan(TableName=TABLE_NAME)["Items"]}
    assert keys == {arn, schema.agent_partition(arn)}


# --- throttling and other errors -------------------------------------------------------------


@pytest.fixture
def stubbed(aws: None, clock: ManualClock, config: StackConfig) -> tuple[StateTable, Stubber, list[float]]:
    """A state table whose client answers only what the test stubs, and a record of backoff sleeps."""
    client = boto3.client("dynamodb", region_name=REGION)
    sleeps: list[float] = []
    table = StateTable(
        TABLE_NAME, config.timeouts, clock, client, Backoff(sleep=sleeps.append), arns=INSTANCE_ARNS
    )
    return table, Stubber(client), sleeps


def claimed_record(clock: ManualClock, config: StackConfig) -> InstanceRecord:
    return InstanceRecord.model_validate(
        {
            **builders.facts(1).model_dump(),
            "state": InstanceState.CLAIMED,
            "run_key": RUN,
            "claim_token": TOKEN,
            "threshold": clock.now() + config.timeouts.claimed_threshold_seconds,
            "created_at": clock.now(),
            "updated_at": clock.now(),
        }
    )


THROTTLED = "ProvisionedThroughputExceededException"
"""What DynamoDB answers a request over the table's throughput (DynamoDB's "Error handling" page)."""


def test_a_transition_throttled_twice_is_retried_by_botocore_and_applied(
    state_table: StateTable, dynamodb: Any, retry_delays: RetryDelays
) -> None:
    # Given an idle instance, and DynamoDB throttling the next two UpdateItems
    instance_in(state_table, InstanceState.IDLE)
    busy = answer_busy(dynamodb, "UpdateItem", times=2, code=THROTTLED)
    # When a worker claims it
    result = state_table.claim(ONE_ID, RUN, TOKEN)
    # Then botocore's third attempt applied it, after two waits within standard mode's bounds
    # (rand(0, 1) * 2**i seconds for throttling: botocore/retries/standard.py, ExponentialBackoff)
    assert result.outcome is Outcome.APPLIED
    assert busy.sent == 3
    assert len(retry_delays.delays) == 2
    assert all(0 <= delay <= 2**i for i, delay in enumerate(retry_delays.delays))


def test_a_call_throttled_on_every_attempt_is_tried_exactly_attempts_times_then_service_busy(
    state_table: StateTable, dynamodb: Any
) -> None:
    # Given an idle instance, and DynamoDB throttling every UpdateItem
    instance_in(state_table, InstanceState.IDLE)
    busy = answer_busy(dynamodb, "UpdateItem", times=1000, code=THROTTLED)
    # When a worker claims
    # Then the caller is told the service is busy (for its own retry), after the stated number of
    # attempts and not one more: one retry layer (issue 17)
    with pytest.raises(ServiceBusyError):
        state_table.claim(ONE_ID, RUN, TOKEN)
    assert busy.sent == ATTEMPTS == 3


def test_a_lookup_throttled_once_is_retried(state_table: StateTable, dynamodb: Any) -> None:
    # Given an idle instance, and DynamoDB throttling a read once
    record = instance_in(state_table, InstanceState.IDLE)
    busy = answer_busy(dynamodb, "GetItem", times=1, code=THROTTLED)
    # When the record is read
    read = state_table.get(ONE_ID)
    # Then the read is retried and succeeds
    assert read == record
    assert busy.sent == 2


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("UpdateItem", lambda table: table.claim(ONE_ID, RUN, TOKEN)),
        ("PutItem", lambda table: table.create(builders.facts(1), RUN)),
        ("Query", lambda table: table.held_by(RUN)),
        ("PutItem", lambda table: table.write_heartbeat(ONE_ID)),
    ],
    ids=["claim", "create", "held_by", "write_heartbeat"],
)
def test_errors_other_than_throttling_are_not_swallowed_or_retried(
    state_table: StateTable, dynamodb: Any, operation: str, call: Callable[[StateTable], Any]
) -> None:
    # Given a table that does not exist
    busy = answer_busy(dynamodb, operation, times=1000, code="ResourceNotFoundException")
    # When the adapter is called
    # Then the error reaches the caller at once, not as a lost race and not after retries
    with pytest.raises(ClientError) as raised:
        call(state_table)
    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert busy.sent == 1


def test_the_runner_of_a_claim_is_noted_and_kept_through_release(state_table: StateTable) -> None:
    # Given an instance claimed for a run
    facts = builders.facts(77)
    state_table.create(facts, run_key=None)
    state_table.admit(facts.instance_id)
    state_table.claim(facts.instance_id, "pool=77", "token-1")
    # When its runner is noted, twice (a retried step), and the instance later goes back to idle
    first = state_table.record_runner(facts.instance_id, "pool=77", 4242)
    again = state_table.record_runner(facts.instance_id, "pool=77", 4242)
    other_run = state_table.record_runner(facts.instance_id, "pool=78", 1)
    state_table.activate(facts.instance_id, "pool=77", 10, claim_token="token-1")
    released = state_table.release(facts.instance_id, "pool=77")
    # Then the note applied, a retry changed nothing, another run cannot write it,
    # and the idle record still names the runner for release to delete
    assert first.succeeded
    assert again.succeeded
    assert other_run.outcome is Outcome.LOST
    assert again.record is not None
    assert again.record.runner_id == 4242
    assert released.record is not None
    assert released.record.runner_id == 4242
    # And a new claim starts without it
    state_table.claim(facts.instance_id, "pool=79", "token-2")
    record = state_table.get(facts.instance_id)
    assert record is not None
    assert record.runner_id is None


def test_observe_reads_record_heartbeat_and_signal_in_one_call(
    state_table: StateTable, dynamodb: Any
) -> None:
    # Given a claimed instance whose agent has beaten and registered, and one with no items at all
    registered_in(state_table, InstanceState.CLAIMED)
    calls: list[str] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.*", lambda model, **_: calls.append(model.name)
    )
    # When each is observed
    view = state_table.observe(ONE_ID)
    nothing = state_table.observe(MISSING_ID)
    # Then one BatchGetItem each gave what get, read_heartbeat and read_signal give, and nothing for the other
    assert calls == ["BatchGetItem", "BatchGetItem"]
    assert (view.record, view.heartbeat, view.signal) == (
        state_table.get(ONE_ID),
        state_table.read_heartbeat(ONE_ID),
        state_table.read_signal(ONE_ID),
    )
    assert (nothing.record, nothing.heartbeat, nothing.signal) == (None, None, None)


def test_observe_many_reads_33_instances_to_a_batch_get_item_and_sees_each_as_observe_does(
    state_table: StateTable, dynamodb: Any
) -> None:
    # Given 40 instances, every other one beating and registered, and one instance with no items at all
    ids = [instance_in(state_table, InstanceState.CLAIMED, number=n).instance_id for n in range(1, 41)]
    for instance_id in ids[::2]:
        state_table.write_heartbeat(instance_id)
        state_table.write_signal(instance_id, Signal.UD_REG_OK, RUN)
    calls: list[str] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.*", lambda model, **_: calls.append(model.name)
    )

    # When all of them are observed together
    views = state_table.observe_many([*ids, MISSING_ID])

    # Then two BatchGetItems read them (three items an instance, at most 100 keys a call)
    assert calls == ["BatchGetItem", "BatchGetItem"]
    # And each instance's view is what observe alone gives
    assert list(views) == [*ids, MISSING_ID]
    for instance_id, view in views.items():
        assert view == state_table.observe(instance_id)
    assert views[ids[0]].signal is not None
    assert views[ids[1]].heartbeat is None
    assert (views[MISSING_ID].record, views[MISSING_ID].heartbeat) == (None, None)


def test_observe_retries_the_keys_dynamodb_left_unprocessed(
    stubbed: tuple[StateTable, Stubber, list[float]], clock: ManualClock, config: StackConfig
) -> None:
    # Given DynamoDB answering the record at once and leaving the heartbeat and signal unprocessed once
    table, stubber, sleeps = stubbed
    record = claimed_record(clock, config)
    pk = {"S": schema.agent_partition(INSTANCE_ARNS.arn(ONE_ID))}
    unprocessed = [
        {schema.PARTITION_KEY: pk, schema.SORT_KEY: {"S": kind}} for kind in ("heartbeat", "signal")
    ]
    beat = {schema.PARTITION_KEY: pk, schema.SORT_KEY: {"S": "heartbeat"}, "beat_at": {"N": "5"}}
    stubber.add_response(
        "batch_get_item",
        {
            "Responses": {TABLE_NAME: [wire_item(record)]},
            "UnprocessedKeys": {TABLE_NAME: {"Keys": unprocessed, "ConsistentRead": True}},
        },
    )
    stubber.add_response(
        "batch_get_item",
        {"Responses": {TABLE_NAME: [beat]}},
        expected_params={"RequestItems": {TABLE_NAME: {"Keys": unprocessed, "ConsistentRead": True}}},
    )
    # When the instance is observed
    with stubber:
        view = table.observe(ONE_ID)
    # Then the remaining keys were asked for again after the house backoff (the one whole operation it
    # retries), and everything found is in the view
    assert len(sleeps) == 1
    assert view.record == record
    assert view.heartbeat is not None
    assert view.heartbeat.beat_at == 5
    assert view.signal is None


# --- markers ---------------------------------------------------------------------------------


def test_a_marker_move_whose_answer_was_lost_is_its_own_win_on_retry(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given DynamoDB applying a marker's compare-and-set but losing its answer, so it is retried
    lost = lose_answers(dynamodb, "UpdateItem")
    table = StateTable(TABLE_NAME, StackConfig().timeouts, clock, dynamodb)
    # When refresh moves the redelivery high-water mark from unset to 5
    moved = table.move_marker("redelivery", 5, expected=None)
    # Then the retry met its own write and the move is won (issue 12, defect 6: before, the mark was
    # read as another run's, and the failed delivery it stood for was skipped for good)
    assert (lost.lost, lost.sent) == (1, 2)
    assert moved is True
    assert table.read_marker("redelivery") == 5


def test_a_marker_moved_by_another_run_to_the_same_value_is_still_lost(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two refresh runs that both read the warm-pool marker unset
    one = StateTable(TABLE_NAME, StackConfig().timeouts, clock, dynamodb, Backoff(sleep=lambda _: None))
    other = StateTable(TABLE_NAME, StackConfig().timeouts, clock, dynamodb, Backoff(sleep=lambda _: None))
    # When both move it to the same schedule slot
    first = one.move_marker("warm-pool", 60, expected=None)
    second = other.move_marker("warm-pool", 60, expected=None)
    # Then only the first owns the slot: the same value is not mistaken for one's own write
    assert (first, second) == (True, False)


INSTANT_LABEL = "pool=instant/class=large"


def instant_instance(state_table: StateTable, number: int) -> InstanceFacts:
    """An instance created for the large class's instant tier, its runner 4242 registered."""
    facts = builders.facts(number)
    state_table.create(facts, run_key=INSTANT_LABEL)
    state_table.record_runner(facts.instance_id, INSTANT_LABEL, 4242)
    return facts


def test_an_instant_runners_job_start_restarts_its_runtime_and_names_its_repository(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an instance running for an instant tier with runner 4242, its runner waiting since 1000 s
    label = INSTANT_LABEL
    facts = instant_instance(state_table, 78)
    state_table.activate(facts.instance_id, label, 10)
    clock.advance(500)
    # When its runner takes a job of octo-org/app, the start reported twice; and another runner's
    started = state_table.job_started(facts.instance_id, label, 4242, "octo-org/app", 10)
    again = state_table.job_started(facts.instance_id, label, 4242, "octo-org/app", 10)
    other = state_table.job_started(facts.instance_id, label, 1, "octo-org/lib", 10)
    # Then its runtime runs from the start, the record names the repository, a repeat changes nothing,
    # and a start reported for another runner is not its own
    assert started.succeeded
    assert again.succeeded
    assert started.record is not None
    assert started.record.threshold == clock.now() + 600
    assert started.record.repository == "octo-org/app"
    assert started.record.state is InstanceState.RUNNING
    assert other.outcome is Outcome.LOST


def test_an_instant_runners_job_start_before_its_provisions_finish_is_noted_and_kept_by_the_activation(
    state_table: StateTable, clock: ManualClock
) -> None:
    # Given an instance created for an instant tier, its runner 4242 registered, not yet set running
    label = INSTANT_LABEL
    facts = instant_instance(state_table, 79)
    # When its runner takes a job of octo-org/app before the provision's Finish comes round
    started = state_table.job_started(facts.instance_id, label, 4242, "octo-org/app", 10)
    # Then the start is noted, the state left to Finish, whose activation keeps the repository
    assert started.succeeded
    assert started.record is not None
    assert (started.record.state, started.record.repository) == (InstanceState.CREATED, "octo-org/app")
    activated = state_table.activate(facts.instance_id, label, 10)
    assert activated.record is not None
    assert (activated.record.state, activated.record.repository) == (InstanceState.RUNNING, "octo-org/app")
