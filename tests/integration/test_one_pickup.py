"""Issue 15, item 2: one pickup for the whole request. Begin picks up and claims an instance for every
slot at once, so the claim workers only hand over, never take offers from each other, and an empty
pool is known after that one look (the workers then go straight to creation)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ConnectTimeoutError

from emulator.harness.control_plane import LocalControlPlane, local_control_plane, stack_config
from emulator.harness.provision_world import REPOSITORY, output, provision_world
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import PICKUP_BUDGET_SECONDS, ClaimTerms, PickupManager
from runner_pool.domain.provision import ClaimWorker, ProvisionPlan, Readiness
from runner_pool.domain.records import PoolMessage
from runner_pool.domain.trust import TrustLevel
from runner_pool.handlers.provision import provision_of
from runner_pool.steps.claim_workers import CLAIM_RESERVE_SECONDS
from runner_pool.steps.provision import Provision

RUN = "pool=5151"


def begin(steps: Provision, count: int, execution: str = "one-pickup") -> ProvisionPlan:
    return steps.begin(
        ProvisionRequest(trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=RUN, count=count),
        execution,
    )


def no_more_pickups(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("a claim worker picked up for itself")

    monkeypatch.setattr(PickupManager, "pickup", refused)


def test_begin_claims_an_instance_for_every_slot_and_the_workers_only_hand_over(
    local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three idle instances / When a request for three begins
    idle = {record.instance_id for record in local.pooled(3)}
    steps = provision_of(local.plane)
    plan = begin(steps, 3)
    # Then each slot holds a claim of its own, made with the slot's first token
    assert set(plan.pre_claims) == idle
    assert not plan.pool_exhausted
    for slot, instance_id in enumerate(plan.pre_claims):
        record = local.record(str(instance_id))
        assert (record.state, record.claim_token) == (InstanceState.CLAIMED, plan.claim_token(slot, 0))
    # And each worker hands its slot's instance over without a pickup of its own
    no_more_pickups(monkeypatch)
    workers = [steps.claim(ClaimWorker(plan=plan, slot=slot)) for slot in plan.slots]
    assert [w.instance_id for w in workers] == list(plan.pre_claims)
    assert all(w.claimed for w in workers)
    assert all(local.record(str(i)).runner_id is not None for i in plan.pre_claims)


def test_an_empty_pool_is_known_after_begins_one_look(
    local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one idle instance and a request for three
    (idle,) = local.pooled(1)
    steps = provision_of(local.plane)
    plan = begin(steps, 3)
    # Then the one is claimed for the first slot and the pool is known to be exhausted
    assert plan.pre_claims == (idle.instance_id, None, None)
    assert plan.pool_exhausted
    assert not plan.creation_only  # the first slot's worker hands its instance over
    # And the other slots go to creation without looking again
    no_more_pickups(monkeypatch)
    left = [steps.claim(ClaimWorker(plan=plan, slot=slot)) for slot in (1, 2)]
    assert [(w.claimed, w.instance_id) for w in left] == [(False, None), (False, None)]


def test_a_retried_begin_finds_its_own_claims_and_claims_no_more(local: LocalControlPlane) -> None:
    # Given a Begin that claimed for both slots and whose answer was lost, and a third idle instance
    local.pooled(3)
    steps = provision_of(local.plane)
    first = begin(steps, 2)
    # When Step Functions retries it
    again = begin(steps, 2)
    # Then it answers the same claims, and the third instance stays idle
    assert again.pre_claims == first.pre_claims
    claimed = [r for r in local.table.live() if r.state is InstanceState.CLAIMED]
    assert sorted(r.instance_id for r in claimed) == sorted(str(i) for i in first.pre_claims)


def test_a_fresh_request_picks_nothing_up(local: LocalControlPlane) -> None:
    local.pooled(1)
    steps = provision_of(local.plane)
    plan = steps.begin(
        ProvisionRequest(
            trust=TrustLevel.TRUSTED, repository="octo-org/app", run_key=f"{RUN}/fresh=true", count=1
        ),
        "fresh",
    )
    assert plan.pre_claims == ()
    assert plan.creation_only


def test_a_request_of_undecided_level_is_single_use_and_skips_a_pool_that_keeps_nothing_pristine(
    local: LocalControlPlane,
) -> None:
    # Given a pristine instance in the pool of a class that keeps no pristine minimum
    local.pooled(1)
    # When a request whose jobs' level could not be decided begins
    plan = provision_of(local.plane).begin(
        ProvisionRequest(repository="octo-org/app", run_key=RUN, count=1), "undecided"
    )
    # Then it is single use (fail closed), and goes straight to creation without a look at the pool
    assert plan.single_use
    assert (plan.pre_claims, plan.creation_only) == ((), True)


@pytest.mark.parametrize(
    "request_fields",
    [
        {"run_key": f"{RUN}/fresh=true", "trust": "trusted"},
        {"run_key": RUN, "trust": "privileged"},
        {"run_key": RUN},
    ],
    ids=["fresh", "privileged", "undecided"],
)
def test_a_single_use_request_takes_a_pristine_instance_where_the_class_keeps_some(
    request_fields: dict[str, Any],
) -> None:
    # Given a class that keeps a pristine minimum, one instance that served a trusted job of the same
    # repository and one pristine instance, both idle in the pool
    config = stack_config(warm_pool_minimum={"large": {"pristine": 1}})
    with local_control_plane(config, pause=lambda _s: None) as local:
        (used,) = local.pooled(1)  # its offer as pristine goes stale at the claim below
        trusted = ClaimTerms(repository="octo-org/app", trust=TrustLevel.TRUSTED)
        assert local.table.claim(used.instance_id, "pool=1", "t", trusted).succeeded
        assert local.table.activate(used.instance_id, "pool=1", 60, claim_token="t").succeeded
        released = local.table.release(used.instance_id, "pool=1").record
        assert released is not None
        local.plane.pool_queues.offer(PoolMessage.for_idle(released))
        (pristine,) = local.pooled(1)
        # When a single-use request (fresh, privileged, or of undecided level) begins
        request = ProvisionRequest(repository="octo-org/app", count=1, **request_fields)
        plan = provision_of(local.plane).begin(request, "single-use")
        # Then it claims the pristine instance warm, for single use, and leaves the used one idle
        assert plan.single_use
        assert plan.pre_claims == (pristine.instance_id,)
        claimed = local.record(pristine.instance_id)
        assert (claimed.state, claimed.single_use, claimed.trust) == (
            InstanceState.CLAIMED,
            True,
            request.trust,
        )
        assert local.record(used.instance_id).state is InstanceState.IDLE


def test_a_request_the_pool_has_nothing_for_goes_straight_to_creation(local: LocalControlPlane) -> None:
    plan = begin(provision_of(local.plane), 2)
    assert plan.pool_exhausted
    assert plan.creation_only


def test_with_a_stopped_tier_an_empty_hot_pool_still_runs_the_workers() -> None:
    # The workers look in the stopped tier when the hot pool had nothing (issue 16, item 2)
    with local_control_plane(stack_config(pool={"stopped_maximum": 2}), pause=lambda _s: None) as plane:
        plan = begin(provision_of(plane.plane), 2)
    assert plan.pool_exhausted
    assert not plan.creation_only


def test_begin_hands_its_claims_over_and_the_workers_register_no_second_runner(
    local: LocalControlPlane,
) -> None:
    # Given three idle instances / When a request for three begins
    local.pooled(3)
    steps = provision_of(local.plane)
    plan = begin(steps, 3)
    # Then each claimed instance has its runner and its config before any worker runs
    runners = {str(i): local.record(str(i)).runner_id for i in plan.pre_claims}
    assert None not in runners.values()
    registered = len(local.github.state.runners)
    # And each worker finds its hand-over done: the same runner, no second registration
    workers = [steps.claim(ClaimWorker(plan=plan, slot=slot)) for slot in plan.slots]
    assert all(w.claimed for w in workers)
    assert {str(w.instance_id): local.record(str(w.instance_id)).runner_id for w in workers} == runners
    assert len(local.github.state.runners) == registered


def test_a_hand_over_that_fails_in_begin_is_made_by_its_worker(
    local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two idle instances, and the configs' store failing while Begin runs
    local.pooled(2)
    steps = provision_of(local.plane)
    credentials = local.plane.credentials
    store = credentials.store

    def failing(*_: Any, **__: Any) -> None:
        raise RuntimeError("KMS is down")

    monkeypatch.setattr(credentials, "store", failing)
    # When a request for two begins
    plan = begin(steps, 2)
    # Then Begin still answers with both claims, handed over to none
    assert None not in plan.pre_claims
    assert all(local.record(str(i)).state is InstanceState.CLAIMED for i in plan.pre_claims)
    # And once the store works again, each worker hands its slot's instance over
    monkeypatch.setattr(credentials, "store", store)
    workers = [steps.claim(ClaimWorker(plan=plan, slot=slot)) for slot in plan.slots]
    assert [w.instance_id for w in workers] == list(plan.pre_claims)
    assert all(w.claimed for w in workers)
    for instance_id in plan.pre_claims:
        assert credentials.stored_runner(str(instance_id), local.plane.instance_arn(str(instance_id)))


LAMBDA_TIMED_OUT = type("Sandbox.Timedout", (Exception,), {})
"""What Lambda answers for a function that ran past its timeout (errorType `Sandbox.Timedout`;
https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html)."""


@pytest.mark.parametrize(
    "fault",
    [
        # its answer lost after its effect, as a Lambda starved under a burst does
        LAMBDA_TIMED_OUT("Task timed out after 120.00 seconds"),
        # a transient AWS fault its client's own retries did not outlast (seen in the loaded 1,000-job burst)
        ConnectTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com/"),
    ],
    ids=["timed-out", "connect-timeout"],
)
def test_a_begin_that_failed_after_its_claims_is_retried_and_serves_the_run(fault: Exception) -> None:
    # Given two idle instances, and a Begin that claims and hands both over, then fails once
    with provision_world() as world:
        warm = sorted(world.warm(n).instance_id for n in (1, 2))
        real = world.machine.handlers["begin"]
        failed: list[str] = []

        def fails_once(event: dict[str, Any], context: Any) -> Any:
            answer = real(event, context)
            if not failed:
                failed.append("begin")
                raise fault
            return answer

        # When a run asks for two runners
        with world.machine.swapped({"begin": fails_once}):
            result = output(world.provision(RUN, 2))
        # Then Begin was tried again (not the request refused), found its own claims, and both warm
        # instances serve the run
        assert failed == ["begin"]
        assert sorted(result["warm"]) == warm
        assert result["cold"] == []
        assert world.ec2.calls["CreateFleet"] == 0
        accounting = world.accounting()
        assert accounting.holds, accounting.problems


def test_requests_begun_together_share_a_pool_that_holds_enough_without_a_cold_launch() -> None:
    # Issue 15: "3-5 of 200 warm slots launch cold although the pool holds enough"; bench/provision.py
    # measures 200 (provision_warm_200_cold_launches_count), this is its shape at 24.
    with provision_world() as world:
        warm = {world.warm(n).instance_id for n in range(24)}
        # When three requests for eight begin at once, their pickups reading the same queues
        executions = world.provision_concurrently([(f"pool={6100 + n}", 8) for n in range(3)])
        results = [output(execution) for execution in executions]
        # Then every runner is one of the pool's instances, none launched, none discarded
        assert {i for result in results for i in result["warm"]} == warm
        assert [result["cold"] for result in results] == [[], [], []]
        assert world.ec2.calls["CreateFleet"] == 0
        accounting = world.accounting()
        assert accounting.holds, accounting.problems


def test_a_request_whose_label_is_refused_fails_at_once_without_a_retry() -> None:
    # Given a run key whose label names a resource class the stack does not have
    with provision_world() as world:
        real = world.machine.handlers["begin"]
        tries: list[str] = []

        def counted(event: dict[str, Any], context: Any) -> Any:
            tries.append("begin")
            return real(event, context)

        # When a run asks for a runner with it
        with world.machine.swapped({"begin": counted}):
            execution = world.machine.machines.run(
                world.machine.arn,
                ProvisionRequest(
                    trust=TrustLevel.TRUSTED, repository=REPOSITORY, run_key="pool=4242/class=huge", count=1
                ).model_dump(mode="json"),
                "refused-label",
                60,
            )
        # Then the execution was refused after one Begin: a label error is not a fault to wait out
        assert execution.status == "FAILED"
        assert tries == ["begin"]
        failed = [e for e in execution.events if e["type"] == "ExecutionFailed"]
        assert failed[0]["executionFailedEventDetails"]["error"] == "ProvisionRefused"


# --- a claim step bounded by its Lambda's time (steps/claim_workers.py CLAIM_RESERVE_SECONDS) ---------------


def test_a_claim_step_without_time_for_a_whole_pickup_holds_nothing_and_claims_again(
    local: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker that looks for itself (a discard made it try another) and an idle instance that fits
    plan = begin(provision_of(local.plane), 1)
    (idle,) = local.pooled(1)
    worker = ClaimWorker(plan=plan, slot=0, attempt=1)
    # When its Lambda has less left than a pickup's budget and a hand-over
    no_more_pickups(monkeypatch)
    short = provision_of(local.plane, time_left=lambda: CLAIM_RESERVE_SECONDS + PICKUP_BUDGET_SECONDS - 1)
    result = short.claim(worker)
    # Then it picked nothing up and holds nothing: the state machine waits and claims again
    assert (result.claimed, result.instance_id, result.readiness) == (False, None, Readiness.DEFERRED)
    assert result.reason == "too little time left for a pickup"
    assert local.record(idle.instance_id).state is InstanceState.IDLE


def test_a_claim_step_with_time_for_a_pickup_claims_as_before(local: LocalControlPlane) -> None:
    plan = begin(provision_of(local.plane), 1)
    (idle,) = local.pooled(1)
    enough = provision_of(local.plane, time_left=lambda: CLAIM_RESERVE_SECONDS + PICKUP_BUDGET_SECONDS + 1)
    result = enough.claim(ClaimWorker(plan=plan, slot=0, attempt=1))
    assert (result.claimed, result.instance_id) == (True, idle.instance_id)


def test_a_claim_step_short_of_time_leaves_the_in_line_checks_to_the_state_machine() -> None:
    pauses: list[float] = []
    with local_control_plane(pause=pauses.append) as local:
        local.pooled(2)
        plan = begin(provision_of(local.plane), 1)
        short = provision_of(local.plane, time_left=lambda: CLAIM_RESERVE_SECONDS - 1)
        result = short.claim(ClaimWorker(plan=plan, slot=0))
        # Then the pre-claimed instance is handed over and held, checked by the Wait loop, not in-line
        assert (result.claimed, result.readiness) == (True, Readiness.WAITING)
        assert pauses == []
        # While a step with time checks in-line, as before
        again = begin(provision_of(local.plane), 1, "with-time")
        provision_of(local.plane).claim(ClaimWorker(plan=again, slot=0))
    assert pauses
