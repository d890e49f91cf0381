"""A transient fault never hands a serving runner's instance to another run, never loses an offer, and a
registration GitHub refuses for good is asked once (steps/hand_over.py, steps/provision.py, pickup).

Faults are answered on the wire beneath botocore's retries (tests/support/aws_faults.py), as AWS would."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from emulator.harness.control_plane import LocalControlPlane, client, local_control_plane, stack_config
from emulator.harness.github_app import OWNER, REPO
from emulator.harness.provision_world import ProvisionWorld, output
from runner_pool.adapters.aws_clients import ServiceBusyError
from runner_pool.adapters.runner_credentials import RUNNER_CONFIG_ITEM
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import ClaimWorker, plan
from runner_pool.domain.runners import RepositoryUnknownError, refused_for_good
from runner_pool.domain.trust import TrustLevel
from runner_pool.handlers.provision import provision_of
from runner_pool.steps.hand_over import HandOver
from runner_pool.steps.provision import Provision
from tests.integration.conftest import app_github
from tests.support.aws_faults import answer_busy, lose_answers

RUN = "pool=4343"
JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"
THROTTLED = "ProvisionedThroughputExceededException"
EVERY_ATTEMPT = 1000
"""Enough refusals that every attempt botocore makes of a call is refused: the call raises."""


def worker(steps: Provision) -> ClaimWorker:
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository=f"{OWNER}/{REPO}", run_key=RUN, count=1)
    return ClaimWorker(plan=steps.begin(request, "provision-faults"), slot=0)


def plain_worker(local: LocalControlPlane) -> ClaimWorker:
    """A worker of a plan whose Begin made no pickup, so the claim step makes its own."""
    request = ProvisionRequest(trust=TrustLevel.TRUSTED, repository=f"{OWNER}/{REPO}", run_key=RUN, count=1)
    spec = request.key.resolve(local.config)
    planned = plan(request, spec, "provision-faults", local.config.timeouts, local.clock.now())
    return ClaimWorker(plan=planned, slot=0)


def test_a_busy_notice_after_a_completed_hand_over_keeps_the_instance_for_the_run(
    local: LocalControlPlane,
) -> None:
    # Given a warm instance, and SQS busy through every attempt at the notice sent after the hand-over
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    begun = worker(steps)
    busy = answer_busy(local.plane.client("sqs"), "SendMessage", times=3)
    # When the claim step hands it over
    claimed = steps.claim(begun)
    # Then the notice was refused, and the instance is still the run's: claimed, its runner noted, its
    # config stored, and no offer of it in the pool
    assert busy.refused == 3
    assert claimed.claimed
    assert claimed.instance_id == idle.instance_id
    record = local.record(idle.instance_id)
    assert (record.state, record.run_key) == (InstanceState.CLAIMED, RUN)
    arn = local.plane.instance_arn(idle.instance_id)
    assert local.plane.credentials.stored_runner(idle.instance_id, arn) == (RUN, record.runner_id)
    assert local.drain_pool() == []


def test_a_throttled_read_of_the_stored_runner_on_a_retry_fails_the_step_and_keeps_the_claim(
    local: LocalControlPlane,
) -> None:
    # Given a claim step that handed its instance over and died before it answered
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    begun = worker(steps)
    assert steps.claim(begun).claimed
    handed = local.record(idle.instance_id)
    # When Step Functions retries it while DynamoDB throttles every read of the stored runner config
    busy = answer_busy(
        local.plane.client("dynamodb"),
        "GetItem",
        times=EVERY_ATTEMPT,
        code=THROTTLED,
        when=lambda body: RUNNER_CONFIG_ITEM.encode() in body,
    )
    with pytest.raises(ServiceBusyError):
        steps.claim(begun)
    busy.refused = EVERY_ATTEMPT  # the next retry finds DynamoDB answering again
    # Then the claim and its runner are untouched, nothing was offered, and the next retry resumes it
    record = local.record(idle.instance_id)
    assert (record.state, record.run_key, record.runner_id) == (InstanceState.CLAIMED, RUN, handed.runner_id)
    assert local.drain_pool() == []
    resumed = steps.claim(begun)
    assert resumed.instance_id == idle.instance_id
    assert local.record(idle.instance_id).runner_id == handed.runner_id


def test_a_delete_whose_answer_is_lost_still_hands_over_the_instance_it_took(
    local: LocalControlPlane,
) -> None:
    # Given a warm instance, and every DeleteMessageBatch taking effect with its answer lost
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    lost = lose_answers(local.plane.client("sqs"), "DeleteMessageBatch", times=EVERY_ATTEMPT)
    # When a claim step picks it up
    claimed = steps.claim(plain_worker(local))
    lost.lost = EVERY_ATTEMPT  # SQS answers again from here on
    # Then the delete was lost, and the claim went ahead with the instance it took off the queue
    assert lost.lost >= 3
    assert claimed.claimed
    assert claimed.instance_id == idle.instance_id
    assert local.record(idle.instance_id).state is InstanceState.CLAIMED


def test_a_claim_that_raises_offers_the_instance_again(local: LocalControlPlane) -> None:
    # Given a warm instance, and DynamoDB throttling every attempt at the claim's write
    (idle,) = local.pooled()
    steps = provision_of(local.plane)
    planned = plain_worker(local)
    busy = answer_busy(local.plane.client("dynamodb"), "UpdateItem", times=EVERY_ATTEMPT, code=THROTTLED)
    # When a claim step picks it up and its claim raises
    with pytest.raises(ServiceBusyError):
        steps.claim(planned)
    busy.refused = EVERY_ATTEMPT  # DynamoDB answers again from here on
    # Then the instance, idle still, is offered in the pool again: a warm instance anyone can find
    assert local.record(idle.instance_id).state is InstanceState.IDLE
    assert [message.instance_id for message in local.drain_pool()] == [idle.instance_id]


# --- a registration GitHub refuses for good ---------------------------------------------------------


@dataclass
class BudgetLedger:
    """Registration tokens taken from and given back to the App's budget."""

    taken: int = 0
    given_back: int = 0

    @property
    def spent(self) -> int:
        return self.taken - self.given_back


def counted_budget(world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch) -> BudgetLedger:
    ledger = BudgetLedger()
    budget = world.plane.registration_budget
    take, give_back = budget.take, budget.give_back

    def counted_take(wanted: int):  # type: ignore[no-untyped-def]
        grant = take(wanted)
        ledger.taken += grant.granted
        return grant

    def counted_give_back(count: int) -> None:
        ledger.given_back += count
        give_back(count)

    monkeypatch.setattr(budget, "take", counted_take)
    monkeypatch.setattr(budget, "give_back", counted_give_back)
    return ledger


def test_a_refused_registration_for_launched_instances_is_asked_once_and_spends_no_budget(
    refusing_world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = refusing_world
    ledger = counted_budget(world, monkeypatch)
    # Given an empty pool / When a run asks for three runners
    result = output(world.provision(RUN, 3))
    # Then GitHub was asked only by the hand-overs already in flight when it refused (Create's, side
    # by side), and nothing more was asked: no CheckFleet passes
    assert 1 <= world.github.state.calls[JIT_ROUTE] <= 3
    assert result["refused"] is not None
    assert "runner group" in result["refused"]
    assert (result["warm"], result["cold"]) == ([], [])
    # And no token of the App's budget is spent on the refused call, nor on those never made
    assert ledger.spent == 0
    # And the provision asked for no other provision (it would be refused again)
    listed = client("stepfunctions").list_executions(stateMachineArn=world.machine.arn)["executions"]
    assert len(listed) == 1
    assert len(world.invocations.of("provision-check-fleet")) == 0


def test_a_refused_registration_of_a_claimed_instance_gives_it_back_and_launches_nothing(
    refusing_world: ProvisionWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = refusing_world
    ledger = counted_budget(world, monkeypatch)
    # Given one warm instance
    warm = world.warm(1).instance_id
    # When a run asks for two runners
    result = output(world.provision(RUN, 2))
    # Then GitHub refused the registration once; the warm instance is back in the pool, idle, and no
    # instance was launched for a runner GitHub will not register
    assert world.github.state.calls[JIT_ROUTE] == 1
    assert result["refused"] is not None
    assert world.ec2.calls["CreateFleet"] == 0
    assert world.plane.state_table.get(warm).state is InstanceState.IDLE
    assert [message.instance_id for message in world.pool_messages()] == [warm]
    assert ledger.spent == 0


def hand_over_of(local: LocalControlPlane) -> HandOver:
    """The hand-over as the provision builds it, over the local control plane's collaborators."""
    plane = local.plane
    return HandOver(
        plane.state_table,
        github=plane.config.github,
        arns=plane.instance_arns,
        registry=lambda: plane.github,
        credentials=lambda: plane.credentials,
        queues=lambda: plane.pool_queues,
        notices=lambda: plane.notices,
    )


def test_a_hand_over_whose_record_names_no_repository_is_refused_and_registers_nothing(
    local: LocalControlPlane,
) -> None:
    # Given an instance recorded for a run without the run's repository
    [facts] = local.launch(1, RUN)
    handing = hand_over_of(local)

    # When its runner is handed over / Then the hand-over is refused for good, and GitHub was asked nothing
    with pytest.raises(RepositoryUnknownError) as refused:
        handing.register(facts.instance_id, RUN, "t")
    assert refused_for_good(refused.value)
    assert local.github.state.calls[JIT_ROUTE] == 0
    assert local.github.state.calls["POST /orgs/{org}/actions/runners/generate-jitconfig"] == 0


@pytest.mark.parametrize(
    "known", [{}, {"repository": f"{OWNER}/{REPO}"}], ids=["no repository", "no repository id"]
)
def test_an_organisations_hand_over_without_its_repository_id_registers_nothing_at_the_organisation(
    known: dict[str, str],
) -> None:
    # Given an organisation's stack on its default registration (runner groups), and an instance recorded
    # for a run without its repository, or without the repository's id
    with local_control_plane(
        config=stack_config(github=app_github(scope=OWNER)), pause=lambda _seconds: None
    ) as local:
        [facts] = local.plane.fleet.launch(LaunchRequest.for_run(local.config.spec_for(RUN), 1, "t")).launched
        local.table.create(facts, RUN, **known)  # type: ignore[arg-type]
        handing = hand_over_of(local)

        # When its runner is handed over / Then it is refused for good, and GitHub was asked for no runner
        # and no runner group: nothing is registered where another repository's job could take it
        with pytest.raises(RepositoryUnknownError) as refused:
            handing.register(facts.instance_id, RUN, "t")
        assert refused_for_good(refused.value)
        calls = local.github.state.calls
        assert calls["POST /orgs/{org}/actions/runners/generate-jitconfig"] == 0
        assert calls["POST /orgs/{org}/actions/runner-groups"] == 0
        assert local.github.state.runners == {}
