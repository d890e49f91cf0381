"""The dispatcher Lambda on moto: demand from the webhook in, provision and release executions out.

Deliveries go through the real webhook onto the real queue; the dispatcher's batches are what SQS
hands it. The state machines are trivial (one Pass state): what is checked is which executions
start, with which input, and how many.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from emulator.harness.webhooks import (
    IDEMPOTENCY_TABLE,
    REPOSITORY,
    IngressWorld,
    completed_job,
    completed_run,
    delivery,
    event_of,
    fixture,
    fixture_names,
    queued_job,
    sqs_record,
)
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.domain.class_history import Entry, demand_of
from runner_pool.domain.demand import LEASE_MARGIN_SECONDS, Reservation
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest, runner_name
from runner_pool.domain.follow_up import BURST_QUIET_SECONDS, FOLLOW_UP_WINDOW_SECONDS
from runner_pool.steps import demand_starts
from tests.support.aws_faults import lose_answers

LABEL = "pool=4242/class=large"
OTHER_LABEL = "pool=4242/class=xlarge"
INSTANCE = "i-0123456789abcdef0"


def queue_jobs(ingress: IngressWorld, job_ids: range | list[int], label: str = LABEL, **job: Any) -> None:
    for job_id in job_ids:
        assert (
            ingress.deliver(delivery(queued_job(label, job_id=job_id, **job), "workflow_job")).status == 202
        )


def failed_ids(response: dict[str, Any]) -> list[str]:
    return sorted(failure["itemIdentifier"] for failure in response["batchItemFailures"])


# --- every real payload, re-labelled --------------------------------------------------------------


def relabelled(name: str) -> tuple[str, dict[str, Any], str]:
    """A real payload with our label for its own run (and our runner, if it names one); its event and run key."""
    payload = fixture(name)
    event = event_of(name)
    if event != "workflow_job":
        run = payload.get("workflow_run", {}).get("id", 0)
        return event, payload, f"pool={run}/class=large"
    job = payload["workflow_job"]
    run_key = f"pool={job['run_id']}/class=large"
    job["labels"] = [run_key]
    if job.get("runner_name"):
        job["runner_name"] = runner_name(INSTANCE, "claim")
    return event, payload, run_key


def effects(ingress: IngressWorld) -> list[tuple[str, str, Any]]:
    provisions = [("provision", p["run_key"], p["job_ids"]) for p in ingress.provisions()]
    releases = [("release", r["run_key"], r["instance_id"]) for r in ingress.releases()]
    return provisions + releases


@pytest.mark.parametrize("name", fixture_names())
def test_every_real_payload_relabelled_causes_exactly_its_effect(ingress: IngressWorld, name: str) -> None:
    # Given a real payload re-labelled with our label (a run's completion: a run that had our demand)
    event, payload, run_key = relabelled(name)
    if event == "workflow_run":
        queue_jobs(ingress, [1], run_key, run_id=payload["workflow_run"]["id"])
        ingress.dispatch(ingress.take_queued())
    before = effects(ingress)
    # When it is delivered and dispatched
    ingress.deliver(delivery(payload, event))
    ingress.dispatch(ingress.take_queued())
    # Then exactly what its event and action ask for happened
    expected = {
        ("workflow_job", "queued"): [("provision", run_key, [payload.get("workflow_job", {}).get("id")])],
        ("workflow_job", "completed"): [("release", run_key, INSTANCE)],
        ("workflow_run", "completed"): [("release", run_key, None)],
    }.get((event, payload.get("action", "")), [])
    assert effects(ingress)[len(before) :] == expected


# --- batching ---------------------------------------------------------------------------------------


def test_a_matrix_of_twenty_jobs_in_one_batch_is_one_provision_of_twenty(ingress: IngressWorld) -> None:
    # Given the 20 queued jobs of one matrix, delivered within the batching window
    queue_jobs(ingress, range(1001, 1021))
    # When the dispatcher gets them as one batch
    response = ingress.dispatch(ingress.take_queued())
    # Then one provision execution started, for 20 runners, naming every job
    assert response == {"batchItemFailures": []}
    assert ingress.provisions() == [
        {
            "repository": REPOSITORY,
            "run_key": LABEL,
            "count": 20,
            "job_ids": list(range(1001, 1021)),
            "redrives": 0,
            "origin": None,
            "public": True,  # GitHub's example payload's repository is public
            "repository_id": 186853002,  # and its id
            "trust": None,  # no `requested` delivery, and no GitHub to ask: single use
            "on_demand": False,  # as its label says: no re-run of interrupted jobs
        }
    ]


def test_jobs_with_different_labels_are_provisioned_apart(ingress: IngressWorld) -> None:
    # Given 3 jobs asking for large runners and 2 asking for xlarge, in one run
    queue_jobs(ingress, [1, 2, 3])
    queue_jobs(ingress, [4, 5], OTHER_LABEL)
    # When dispatched as one batch
    ingress.dispatch(ingress.take_queued())
    # Then each label got its own provision, of its own size
    assert sorted((p["run_key"], p["count"]) for p in ingress.provisions()) == [(LABEL, 3), (OTHER_LABEL, 2)]


def test_the_execution_is_named_after_its_jobs(ingress: IngressWorld) -> None:
    # Given two jobs of one label
    queue_jobs(ingress, [7, 8])
    # When dispatched
    ingress.dispatch(ingress.take_queued())
    # Then the execution's name is the request's deterministic name
    request = ProvisionRequest(repository=REPOSITORY, run_key=LABEL, count=2, job_ids=(7, 8))
    assert [e["name"] for e in ingress.executions(ingress.provision_arn)] == [request.execution_name]


def test_a_group_larger_than_one_provision_takes_is_split(
    ingress: IngressWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given provisions limited to 5 runners, and 12 jobs of one label
    monkeypatch.setattr(demand_starts, "PROVISION_LIMIT", 5)
    queue_jobs(ingress, range(1, 13))
    # When dispatched as one batch
    ingress.dispatch(ingress.take_queued())
    # Then three provisions share the 12 jobs
    assert sorted(p["count"] for p in ingress.provisions()) == [2, 5, 5]


# --- each job counted once -----------------------------------------------------------------------


def test_demand_repeated_in_a_later_batch_never_reaches_start_execution(ingress: IngressWorld) -> None:
    # Given a job dispatched once, then queued again by another delivery of the same event
    # (GitHub's redelivery after the idempotency record expired, or a second App hook)
    queue_jobs(ingress, [31])
    ingress.dispatch(ingress.take_queued())
    queue_jobs(ingress, [31])
    # When the repeat is dispatched
    response = ingress.dispatch(ingress.take_queued())
    # Then it succeeded without asking for a provision again: Express workflows, which do not
    # refuse a name twice, would otherwise start a second one (moto refuses it either way). The
    # dispatcher finds the job counted before it takes a turn: the repeat opens no follow-up.
    assert response == {"batchItemFailures": []}
    assert ingress.gather_follow_ups() == 0
    assert len(ingress.provisions()) == 1
    assert ingress.calls.count("stepfunctions:StartExecution") == 1


def test_the_same_message_twice_in_one_batch_is_one_runner(ingress: IngressWorld) -> None:
    # Given SQS handing the dispatcher the same message twice in one batch (at-least-once delivery)
    queue_jobs(ingress, [41, 42])
    records = ingress.take_queued()
    # When dispatched
    ingress.dispatch([*records, records[0]])
    # Then the two jobs got two runners, not three
    assert [p["count"] for p in ingress.provisions()] == [2]


def test_a_batch_redelivered_after_a_crash_between_start_and_confirmation_starts_nothing_new(
    ingress: IngressWorld,
) -> None:
    # Given a batch whose provision started, but whose dispatcher died before confirming the jobs
    queue_jobs(ingress, [51, 52])
    records = ingress.take_queued()
    ingress.fail_next("dynamodb", "UpdateItem", "AccessDeniedException", when=confirming)
    ingress.dispatch(records)
    # When the reservations lapse and SQS delivers the whole batch again
    ingress.clock.advance(60 + LEASE_MARGIN_SECONDS + 1)
    response = ingress.dispatch(records)
    # Then the jobs were reserved again and asked for again, under the same name, which Standard
    # refuses to start twice: still one provision (on Express this is the one window left open)
    assert response == {"batchItemFailures": []}
    assert ingress.calls.count("stepfunctions:StartExecution") == 2
    assert len(ingress.provisions()) == 1


def confirming(params: dict[str, Any]) -> bool:
    return ":started" in params.get("ExpressionAttributeValues", {})


# --- cancellation --------------------------------------------------------------------------------


def test_a_job_cancelled_in_the_same_batch_as_its_demand_is_not_provisioned(ingress: IngressWorld) -> None:
    # Given jobs 61 and 62 queued, and 62 cancelled while still queued, all within the window
    queue_jobs(ingress, [61, 62])
    ingress.deliver(delivery(completed_job(LABEL, runner_name=None, job_id=62), "workflow_job"))
    # When the batch is dispatched
    ingress.dispatch(ingress.take_queued())
    # Then one runner is provisioned, for job 61
    assert ingress.provisions() == [
        {
            "repository": REPOSITORY,
            "run_key": LABEL,
            "count": 1,
            "job_ids": [61],
            "redrives": 0,
            "origin": None,
            "public": True,
            "repository_id": 186853002,
            "trust": None,
            "on_demand": False,
        }
    ]


def test_a_cancellation_that_overtakes_its_demand_still_cancels_it(ingress: IngressWorld) -> None:
    # Given a job's cancellation dispatched in a batch before the job's own demand
    ingress.deliver(delivery(completed_job(LABEL, runner_name=None, job_id=71), "workflow_job"))
    ingress.dispatch(ingress.take_queued())
    queue_jobs(ingress, [71])
    # When the demand arrives
    ingress.dispatch(ingress.take_queued())
    # Then nothing is provisioned for it
    assert ingress.provisions() == []


def test_a_cancellation_after_the_provision_started_leaves_it_to_the_runs_release(
    ingress: IngressWorld,
) -> None:
    # Given a job whose provision has started
    queue_jobs(ingress, [81])
    ingress.dispatch(ingress.take_queued())
    # When the job is cancelled and the cancellation dispatched
    ingress.deliver(delivery(completed_job(LABEL, runner_name=None, job_id=81), "workflow_job"))
    response = ingress.dispatch(ingress.take_queued())
    # Then nothing fails and nothing more starts; the run's completion releases the spare runner
    assert response == {"batchItemFailures": []}
    assert len(ingress.provisions()) == 1
    assert ingress.releases() == []


# --- releases ------------------------------------------------------------------------------------


def test_a_job_completed_on_our_runner_starts_the_release_of_its_instance(ingress: IngressWorld) -> None:
    # Given job 91 completed on the runner of instance i-0123456789abcdef0
    payload = completed_job(LABEL, runner_name=runner_name(INSTANCE, "claim"), job_id=91)
    ingress.deliver(delivery(payload, "workflow_job"))
    # When dispatched
    ingress.dispatch(ingress.take_queued())
    # Then one release execution started for that instance, named by the request
    request = ReleaseRequest(
        run_key=LABEL, instance_id=INSTANCE, runner_id=5, cause="job-91", repository=REPOSITORY
    )
    assert ingress.releases() == [request.model_dump(mode="json")]
    assert [e["name"] for e in ingress.executions(ingress.release_arn)] == [request.execution_name]


def test_a_completed_run_releases_every_run_key_its_demand_used(ingress: IngressWorld) -> None:
    # Given run 4242 had demand under two labels
    queue_jobs(ingress, [101])
    queue_jobs(ingress, [102], OTHER_LABEL)
    ingress.dispatch(ingress.take_queued())
    # When the run completes
    ingress.deliver(delivery(completed_run(run_id=4242), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # Then one release per run key started, for the whole run
    assert sorted(r["run_key"] for r in ingress.releases()) == [LABEL, OTHER_LABEL]
    assert {(r["instance_id"], r["cause"]) for r in ingress.releases()} == {(None, "run-4242-attempt-1")}


def test_a_completed_run_that_had_no_demand_of_ours_releases_nothing(ingress: IngressWorld) -> None:
    # Given a run with no job of ours / When it completes and is dispatched
    ingress.deliver(delivery(completed_run(run_id=5555), "workflow_run"))
    response = ingress.dispatch(ingress.take_queued())
    # Then nothing starts, and nothing fails
    assert response == {"batchItemFailures": []}
    assert ingress.releases() == []


def test_demand_arriving_after_its_run_completed_is_not_provisioned(ingress: IngressWorld) -> None:
    # Given run 4242 had demand and has completed
    queue_jobs(ingress, [111])
    ingress.dispatch(ingress.take_queued())
    ingress.deliver(delivery(completed_run(run_id=4242), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # When a late queued event of the same attempt is dispatched
    queue_jobs(ingress, [112])
    ingress.dispatch(ingress.take_queued())
    # Then no runner is provisioned for a run that is over
    assert [p["job_ids"] for p in ingress.provisions()] == [[111]]


def test_a_rerun_of_a_completed_run_is_provisioned(ingress: IngressWorld) -> None:
    # Given attempt 1 of run 4242 completed
    queue_jobs(ingress, [121])
    ingress.dispatch(ingress.take_queued())
    ingress.deliver(delivery(completed_run(run_id=4242, attempt=1), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # When a job of attempt 2 is queued (same run id, same label)
    queue_jobs(ingress, [122], attempt=2)
    ingress.dispatch(ingress.take_queued())
    # Then it is provisioned
    assert [p["job_ids"] for p in ingress.provisions()] == [[121], [122]]


def test_a_run_completion_that_arrives_before_its_first_job_is_remembered(ingress: IngressWorld) -> None:
    # Given (fix 7) run 4242's completion redelivered after an outage, before any of its jobs' demand
    ingress.deliver(delivery(completed_run(run_id=4242), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # When the queued event of one of its jobs arrives late
    queue_jobs(ingress, [161])
    response = ingress.dispatch(ingress.take_queued())
    # Then nothing is provisioned for the finished attempt, and the message is done with
    assert response == {"batchItemFailures": []}
    assert ingress.provisions() == []


def test_a_late_completion_of_attempt_1_releases_nothing_of_attempt_2(ingress: IngressWorld) -> None:
    # Given run 4242's attempt 1 and attempt 2 both had demand (a re-run: same run id, same label)
    queue_jobs(ingress, [171])
    queue_jobs(ingress, [172], attempt=2)
    ingress.dispatch(ingress.take_queued())
    # When attempt 1's completion arrives only now
    ingress.deliver(delivery(completed_run(run_id=4242, attempt=1), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # Then only attempt 1's run key is released; attempt 2's runners are left to serve its jobs
    assert [p["run_key"] for p in ingress.provisions()] == [LABEL, f"{LABEL}@2"]
    assert [(r["run_key"], r["cause"]) for r in ingress.releases()] == [(LABEL, "run-4242-attempt-1")]


def test_demand_is_batched_per_full_label_set(ingress: IngressWorld) -> None:
    # Given one batch with two jobs asking [gpu, <label>] (one in another case) and one asking [<label>]
    for job_id, others in ((181, ["gpu"]), (182, ["GPU"]), (183, [])):
        payload = queued_job(LABEL, job_id=job_id)
        payload["workflow_job"]["labels"] = [*others, LABEL]
        ingress.deliver(delivery(payload, "workflow_job"))
    # When dispatched
    ingress.dispatch(ingress.take_queued())
    # Then one provision per label set: a runner for [<label>] alone could not take a gpu job
    provisions = sorted((p["run_key"], p["job_ids"]) for p in ingress.provisions())
    assert provisions == [(LABEL, [183]), (f"{LABEL} gpu", [181, 182])]


# --- faults ----------------------------------------------------------------------------------------


def test_a_failed_start_fails_exactly_that_groups_messages_and_their_redelivery_succeeds(
    ingress: IngressWorld,
) -> None:
    # Given a batch of two groups, and Step Functions refusing the first StartExecution
    queue_jobs(ingress, [131, 132])
    queue_jobs(ingress, [133], OTHER_LABEL)
    records = ingress.take_queued()
    first_group = sorted(record["messageId"] for record in records[:2])
    ingress.fail_next("stepfunctions", "StartExecution", "ExecutionLimitExceeded")
    # When dispatched
    response = ingress.dispatch(records)
    # Then only the first group's messages are reported failed, the other group started
    assert failed_ids(response) == first_group
    assert [p["run_key"] for p in ingress.provisions()] == [OTHER_LABEL]
    # And when SQS redelivers the failed messages, their reservations were freed: they start now
    # (within the window the failed start opened: they lead its follow-up, gathered once it closes)
    ingress.dispatch([record for record in records if record["messageId"] in first_group])
    ingress.gather_follow_ups()
    assert sorted(p["count"] for p in ingress.provisions()) == [1, 2]


def test_a_message_that_is_not_demand_fails_alone(ingress: IngressWorld) -> None:
    # Given a batch with one job's demand and one body that is not a demand message
    queue_jobs(ingress, [141])
    stray = sqs_record({"MessageId": "stray-1", "ReceiptHandle": "r", "Body": '{"kind": "something-else"}'})
    # When dispatched
    response = ingress.dispatch([*ingress.take_queued(), stray])
    # Then only the stray message fails (it will reach the dead-letter queue); the job is provisioned
    assert failed_ids(response) == ["stray-1"]
    assert len(ingress.provisions()) == 1


def test_a_job_another_dispatch_holds_is_handed_back_and_taken_once_the_hold_lapses(
    ingress: IngressWorld,
) -> None:
    # Given job 151 reserved by a dispatch that then died before starting anything
    ledger = DynamoDbLedger(IDEMPOTENCY_TABLE, ingress.clock, ingress.dynamodb)
    assert ledger.reserve(151, "dead-dispatcher", until=ingress.clock.now() + 30) is Reservation.RESERVED
    queue_jobs(ingress, [151])
    records = ingress.take_queued()
    # When its demand is dispatched while the reservation stands
    held = ingress.dispatch(records)
    # Then the message goes back to SQS (not dropped: the holder may be gone) and nothing starts
    assert failed_ids(held) == [records[0]["messageId"]]
    assert ingress.provisions() == []
    # And when SQS delivers it again after the reservation lapsed, the job is provisioned
    ingress.clock.advance(31)
    assert ingress.dispatch(records) == {"batchItemFailures": []}
    assert [p["job_ids"] for p in ingress.provisions()] == [[151]]


def test_a_reservation_whose_answer_was_lost_is_recognised_as_its_own_on_retry(ingress: IngressWorld) -> None:
    # Given DynamoDB applying a reservation but losing its answer, so botocore tries it again
    lost = lose_answers(ingress.dynamodb, "PutItem")
    ledger = DynamoDbLedger(IDEMPOTENCY_TABLE, ingress.clock, ingress.dynamodb)
    # When job 152 is reserved
    reserved = ledger.reserve(152, "this-dispatch", until=ingress.clock.now() + 30)
    # Then the retry met its own write: reserved, not held by "somebody else" (issue 12, defect 6)
    assert (lost.lost, lost.sent) == (1, 2)
    assert reserved is Reservation.RESERVED
    # And another dispatch still finds it held
    assert ledger.reserve(152, "other-dispatch", until=ingress.clock.now() + 30) is Reservation.HELD


# --- runs from forks never reuse (issue 14, item 2) -------------------------------------------------


def requested_run(head: str, run_id: int = 4242) -> dict[str, Any]:
    """GitHub's `workflow_run requested` example for run `run_id` of REPOSITORY, its head in `head`."""
    payload = fixture("workflow_run.requested.payload.json")
    payload["repository"]["full_name"] = REPOSITORY
    payload["workflow_run"].update(id=run_id, run_attempt=1)
    payload["workflow_run"]["head_repository"]["full_name"] = head
    return payload


def private_jobs(ingress: IngressWorld, job_ids: list[int]) -> None:
    for job_id in job_ids:
        payload = queued_job(LABEL, job_id=job_id)
        payload["repository"].update(private=True, visibility="private")
        assert ingress.deliver(delivery(payload, "workflow_job")).status == 202


@pytest.mark.parametrize(
    ("head", "single_use"), [("someone/Hello-World", True), (REPOSITORY, False)], ids=["fork", "own"]
)
def test_the_jobs_of_a_run_from_a_fork_are_provisioned_single_use(
    ingress: IngressWorld, head: str, single_use: bool
) -> None:
    # Given a private repository's run requested from `head` (a fork's pull request, or its own branch)
    ingress.deliver(delivery(requested_run(head), "workflow_run"))
    ingress.dispatch(ingress.take_queued())
    # When its jobs' demand is dispatched, in a batch of its own as GitHub sends it later
    private_jobs(ingress, [71, 72])
    ingress.dispatch(ingress.take_queued())
    # Then the provision marks them single use exactly when the run comes from a fork
    (provision,) = ingress.provisions()
    assert provision["job_ids"] == [71, 72]
    assert provision["public"] is single_use


def test_a_fork_mark_in_the_same_batch_as_the_demand_still_counts(ingress: IngressWorld) -> None:
    # Given a fork's run requested and its job queued, arriving in one batch (the demand first)
    private_jobs(ingress, [73])
    ingress.deliver(delivery(requested_run("someone/Hello-World"), "workflow_run"))
    # When the batch is dispatched / Then the mark is written before the demand is counted
    ingress.dispatch(ingress.take_queued())
    (provision,) = ingress.provisions()
    assert provision["public"] is True


# --- follow-ups: gathered by their own state machine, not in the dispatcher -----------------------


def test_a_follow_ups_leader_returns_at_once_and_its_machine_starts_one_provision_for_every_job(
    ingress: IngressWorld,
) -> None:
    # Given a run's first job dispatched (its provision started at once)
    queue_jobs(ingress, [161])
    ingress.dispatch(ingress.take_queued())
    # When two more batches of its matrix come within the window
    opened = ingress.clock.now()
    queue_jobs(ingress, [162, 163])
    leader = ingress.dispatch(ingress.take_queued())
    queue_jobs(ingress, [164])
    joined = ingress.dispatch(ingress.take_queued())
    # Then neither dispatch waited for the window (a leader waiting would hold one of the demand queue's
    # pollers): the leader started the follow-up state machine, and both messages are done
    assert ingress.clock.now() == opened
    assert leader == joined == {"batchItemFailures": []}
    assert len(ingress.follow_ups()) == 1
    assert len(ingress.provisions()) == 1
    # And once its window closed, the machine's gather step started one provision for all three jobs
    assert ingress.gather_follow_ups() == 1
    assert ingress.clock.now() >= opened + FOLLOW_UP_WINDOW_SECONDS
    assert sorted(tuple(p["job_ids"]) for p in ingress.provisions()) == [(161,), (162, 163, 164)]


def test_a_follow_up_whose_machine_does_not_start_is_gathered_by_its_leader(ingress: IngressWorld) -> None:
    # Given a run's first job dispatched, and Step Functions refusing the follow-up machine's start
    queue_jobs(ingress, [171])
    ingress.dispatch(ingress.take_queued())
    ingress.fail_next(
        "stepfunctions", "StartExecution", "ExecutionLimitExceeded", when=lambda p: "follow" in p["name"]
    )
    # When the next batch of the matrix leads its follow-up
    queue_jobs(ingress, [172, 173])
    response = ingress.dispatch(ingress.take_queued())
    # Then the leader waited for the window itself and started the follow-up: nothing failed, nothing lost
    assert response == {"batchItemFailures": []}
    assert ingress.follow_ups() == []
    assert sorted(tuple(p["job_ids"]) for p in ingress.provisions()) == [(171,), (172, 173)]


def test_a_follow_up_whose_provision_does_not_start_in_its_gather_step_is_started_by_its_start_step(
    ingress: IngressWorld,
) -> None:
    # Given a run's first job dispatched, and a follow-up handed to its state machine
    queue_jobs(ingress, [181])
    ingress.dispatch(ingress.take_queued())
    queue_jobs(ingress, [182, 183])
    ingress.dispatch(ingress.take_queued())
    # When Step Functions refuses the provision its gather step starts (the follow-up already sealed and
    # marked started: the run's next demand may have opened the next follow-up in the ledger)
    ingress.fail_next(
        "stepfunctions",
        "StartExecution",
        "ExecutionLimitExceeded",
        when=lambda p: p["name"].startswith("provision"),
    )
    assert ingress.gather_follow_ups() == 1
    # Then its start step started it with the jobs the gather step sealed, carried in the machine's state
    assert ingress.started_follow_ups == 1
    assert sorted(tuple(p["job_ids"]) for p in ingress.provisions()) == [(181,), (182, 183)]


# --- the instant tier -------------------------------------------------------------------------------


INSTANT = "pool=instant/class=large"


def test_a_batch_of_tier_jobs_asks_the_tier_for_one_runner_each_in_one_provision(
    ingress: IngressWorld,
) -> None:
    # Given three jobs queued on the instant tier's label, one of them delivered twice
    queue_jobs(ingress, [7001, 7002, 7003, 7001], INSTANT)
    # When dispatched in one batch
    response = ingress.dispatch(ingress.take_queued())
    # Then one provision asks the tier for one runner per job, with no run's demand behind it
    assert response == {"batchItemFailures": []}
    started = [(p["run_key"], p["count"], p["job_ids"]) for p in ingress.provisions()]
    assert started == [(INSTANT, 3, [7001, 7002, 7003])]


def test_a_tier_job_delivered_again_after_its_provision_started_asks_for_nothing(
    ingress: IngressWorld,
) -> None:
    # Given a tier job whose provision started
    queue_jobs(ingress, [7101], INSTANT)
    ingress.dispatch(ingress.take_queued())
    # When its `queued` comes again in a later batch (a redelivery), after a quiet spell
    ingress.clock.advance(BURST_QUIET_SECONDS + 1)
    queue_jobs(ingress, [7101], INSTANT)
    response = ingress.dispatch(ingress.take_queued())
    # Then the ledger has it counted: no second provision, whatever the state machine's type (an Express
    # workflow starts a second execution of the same name)
    assert response == {"batchItemFailures": []}
    assert [p["job_ids"] for p in ingress.provisions()] == [[7101]]


def test_a_burst_of_tier_jobs_over_many_batches_is_served_by_one_provision_and_one_follow_up(
    ingress: IngressWorld,
) -> None:
    # Given a burst of tier jobs of two repositories of one owner, delivered over four batches
    for job_ids, name in (([7201], "app"), ([7202, 7203], "lib"), ([7204], "app"), ([7205], "lib")):
        for job_id in job_ids:
            payload = queued_job(INSTANT, job_id=job_id)
            owner = payload["repository"]["full_name"].split("/")[0]
            payload["repository"]["full_name"] = f"{owner}/{name}"
            assert ingress.deliver(delivery(payload, "workflow_job")).status == 202
        assert ingress.dispatch(ingress.take_queued()) == {"batchItemFailures": []}
    # When the follow-up's window closes
    assert ingress.gather_follow_ups() == 1
    # Then the first job was served at once, and the rest by one follow-up: two provisions, each job once
    provisions = [tuple(p["job_ids"]) for p in ingress.provisions()]
    assert len(provisions) == 2
    assert sorted(job for ids in provisions for job in ids) == [7201, 7202, 7203, 7204, 7205]
    assert {p["run_key"] for p in ingress.provisions()} == {INSTANT}


# --- the class history ------------------------------------------------------------------------------


def test_each_queued_job_is_noted_once_as_an_arrival_in_its_class(ingress: IngressWorld) -> None:
    # Given 3 large jobs and 2 xlarge ones dispatched, and one large job's delivery dispatched again later
    queue_jobs(ingress, [1, 2, 3])
    queue_jobs(ingress, [4, 5], OTHER_LABEL)
    ingress.dispatch(ingress.take_queued())
    first = ingress.clock.now()
    ingress.clock.advance(5)
    queue_jobs(ingress, [2])
    ingress.dispatch(ingress.take_queued())
    # When each class's history is read
    history = ingress.plane.class_history
    large = history.read("large", first - 60)
    # Then each job arrived in its own class, when it was dispatched; the repeat is read as one arrival
    assert sorted((entry.key, entry.value) for entry in large.arrivals) == [
        ("1", first),
        ("2", first),
        ("2", first + 5),
        ("3", first),
    ]
    assert sorted(entry.key for entry in history.read("xlarge", first - 60).arrivals) == ["4", "5"]
    large = replace(large, launches=[Entry("i-1", 30.0)])
    demand = demand_of(large, 60.0)
    assert demand is not None
    assert list(demand.arrivals) == [first] * 3
