"""The webhook Lambda on moto: real payloads in through an API Gateway event, demand out on the queue."""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulator.harness.webhooks import (
    WEBHOOK_SECRET,
    IngressWorld,
    api_request,
    completed_job,
    completed_run,
    delivery,
    encoded,
    event_of,
    fixture,
    fixture_names,
    github_headers,
    queued_job,
)
from runner_pool.domain.executions import runner_name

LABEL = "pool=4242/class=large"
INSTANCE = "i-0123456789abcdef0"


def emf_lines(out: str) -> list[dict[str, Any]]:
    """The metrics Powertools printed, in CloudWatch's embedded metric format."""
    return [
        blob for line in out.splitlines() if line.startswith("{") and "_aws" in (blob := json.loads(line))
    ]


@pytest.mark.parametrize("name", fixture_names())
def test_every_real_payload_is_accepted_and_causes_no_demand(ingress: IngressWorld, name: str) -> None:
    # Given a real GitHub payload, correctly signed (its labels are not ours)
    request = delivery(fixture(name), event_of(name))
    # When it is delivered, and whatever it queued is dispatched
    answer = ingress.deliver(request)
    ingress.dispatch(ingress.take_queued())
    # Then it was acknowledged, and nothing was provisioned or released
    assert answer.status in (200, 202)
    assert ingress.provisions() == []
    assert ingress.releases() == []


def test_a_queued_job_with_our_label_queues_one_unit_of_demand(ingress: IngressWorld) -> None:
    # Given the real queued payload re-labelled with our label
    request = delivery(queued_job(LABEL, job_id=901, run_id=4242), "workflow_job")
    # When it is delivered
    answer = ingress.deliver(request)
    # Then it is accepted and the queue holds exactly that job's demand
    assert answer.status == 202
    assert ingress.queued_bodies() == [
        {
            "kind": "job-queued",
            "repository": "Codertocat/Hello-World",
            "run_key": LABEL,
            "run_id": 4242,
            "run_attempt": 1,
            "job_id": 901,
            "public": True,  # GitHub's example payload's repository is public
            "repository_id": 186853002,  # and its id
            "privileged": False,  # it names no environment
        }
    ]


def test_a_job_completed_on_our_runner_queues_its_release(ingress: IngressWorld) -> None:
    # Given the real completed payload re-labelled, naming the runner we registered on an instance
    payload = completed_job(LABEL, runner_name=runner_name(INSTANCE, "claim-1"), job_id=902)
    # When it is delivered
    ingress.deliver(delivery(payload, "workflow_job"))
    # Then the queue holds the release of that instance, caused by that job
    assert ingress.queued_bodies() == [
        {
            "kind": "release",
            "request": {
                "run_key": LABEL,
                "instance_id": INSTANCE,
                "part": None,
                "runner_id": 5,
                "cause": "job-902",
                "repository": "Codertocat/Hello-World",
                "quarantine": False,
                "suspect": False,
                "privileged": False,
                "failed": False,  # GitHub's successful example
            },
        }
    ]


def test_a_job_cancelled_while_queued_queues_its_cancellation(ingress: IngressWorld) -> None:
    # Given a job with our label that completed without a runner
    ingress.deliver(delivery(completed_job(LABEL, runner_name=None, job_id=903), "workflow_job"))
    # Then the queue holds the cancellation of its demand
    assert ingress.queued_bodies() == [
        {"kind": "job-cancelled", "repository": "Codertocat/Hello-World", "run_key": LABEL, "job_id": 903}
    ]


def test_a_completed_run_queues_the_release_of_the_run(ingress: IngressWorld) -> None:
    # Given the real workflow_run completed payload for attempt 2 of run 4242
    ingress.deliver(delivery(completed_run(run_id=4242, attempt=2), "workflow_run"))
    # Then the queue holds the run's completion
    assert ingress.queued_bodies() == [
        {"kind": "run-completed", "repository": "octo-org/octo-repo", "run_id": 4242, "run_attempt": 2}
    ]


def test_a_replayed_delivery_gets_the_first_answer_and_queues_nothing_more(ingress: IngressWorld) -> None:
    # Given a delivery that was taken once
    request = delivery(queued_job(LABEL), "workflow_job", delivery_id="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    first = ingress.deliver(request)
    # When GitHub delivers it again, same X-GitHub-Delivery
    again = ingress.deliver(request)
    # Then the answer is the same, and one message was queued in all
    assert again == first
    assert len(ingress.queued_bodies()) == 1


def test_an_unserved_label_is_logged_with_its_reason_counted_and_queues_nothing(
    ingress: IngressWorld, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Given a job whose label starts with pool= but does not parse
    request = delivery(queued_job("pool=4242/usage=Spot"), "workflow_job")
    # When it is delivered
    answer = ingress.deliver(request)
    # Then it is acknowledged (never a 5xx), with the reason
    assert answer.status == 200
    assert answer.message == (
        "label 'pool=4242/usage=Spot' is not served: usage='Spot' is not allowed; use usage=spot or on-demand"
    )
    # And logged with the reason, and counted in the UnservedLabels metric
    [log] = [record for record in caplog.records if record.getMessage() == "label not served"]
    assert log.__dict__["reason"] == "usage='Spot' is not allowed; use usage=spot or on-demand"
    assert [
        line["UnservedLabels"] for line in emf_lines(capsys.readouterr().out) if "UnservedLabels" in line
    ] == [[1.0]]
    # And no demand was queued
    assert ingress.queued_bodies() == []


def test_a_delivery_that_failed_on_our_side_is_taken_when_redelivered(ingress: IngressWorld) -> None:
    # Given SQS refuses the first attempt to queue a delivery's demand
    request = delivery(queued_job(LABEL), "workflow_job")
    ingress.fail_next("sqs", "SendMessage", "KMS.DisabledException")
    failed = ingress.deliver(request)
    # When GitHub redelivers it (same delivery id)
    retried = ingress.deliver(request)
    # Then the first answer told GitHub to redeliver, and the redelivery queued the demand once
    assert failed.status == 503
    assert retried.status == 202
    assert len(ingress.queued_bodies()) == 1


def test_a_base64_encoded_body_is_read_as_its_bytes(ingress: IngressWorld) -> None:
    # Given API Gateway passing the body base64-encoded (binary media types configured)
    body = encoded(queued_job(LABEL))
    request = api_request(body, github_headers(body, "workflow_job"), base64_encoded=True)
    # When it is delivered / Then the signature matched the decoded bytes and demand was queued
    assert ingress.deliver(request).status == 202


def test_a_request_to_another_path_is_not_found(ingress: IngressWorld) -> None:
    # Given a signed delivery posted to another path
    body = encoded(fixture("ping.payload.json"))
    request = api_request(body, github_headers(body, "ping"), path="/admin")
    # When it is handled / Then 404, not a 5xx
    assert ingress.deliver(request).status == 404


# --- the secret and its rotation -------------------------------------------------------------------


def rotate(ingress: IngressWorld, new_secret: str) -> None:
    """A new version of the webhook secret; the old one becomes AWSPREVIOUS."""
    name = ingress.plane.config.github.webhook_secret_name
    ingress.secrets.put_secret_value(SecretId=name, SecretString=new_secret)


def test_after_rotation_a_delivery_signed_with_the_new_secret_is_accepted_while_the_old_is_cached(
    ingress: IngressWorld,
) -> None:
    # Given the webhook has the old secret cached, then the secret is rotated and GitHub told
    ingress.deliver(delivery(fixture("ping.payload.json"), "ping"))
    rotate(ingress, "the new secret")
    # When a delivery signed with the new secret arrives within the cache's lifetime
    answer = ingress.deliver(delivery(fixture("ping.payload.json"), "ping", secret="the new secret"))
    # Then it is accepted: the mismatch made the webhook look again
    assert answer.status == 200


def test_after_rotation_a_delivery_still_signed_with_the_old_secret_is_accepted(
    ingress: IngressWorld,
) -> None:
    # Given the secret was rotated and the webhook has seen the new version
    rotate(ingress, "the new secret")
    ingress.deliver(delivery(fixture("ping.payload.json"), "ping", secret="the new secret"))
    # When GitHub, not yet told, signs with the old secret
    answer = ingress.deliver(delivery(fixture("ping.payload.json"), "ping", secret=WEBHOOK_SECRET))
    # Then it is accepted as signed by the previous version
    assert answer.status == 200


def test_forged_deliveries_look_the_secret_up_afresh_at_most_once_per_floor(ingress: IngressWorld) -> None:
    # Given fifty deliveries signed with a guessed secret
    forged = [delivery(fixture("ping.payload.json"), "ping", secret="guess") for _ in range(50)]
    # When they arrive within a few seconds
    answers = {ingress.deliver(request).status for request in forged}
    # Then all are refused, and Secrets Manager was asked once to fill the cache and once afresh
    # (current and previous version), not fifty times
    assert answers == {401}
    assert ingress.calls.count("secretsmanager:GetSecretValue") == 3
