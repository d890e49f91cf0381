"""The webhook's domain: the signature, the order of the checks, and what each delivery asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from emulator.harness.webhooks import (
    REPOSITORY,
    WEBHOOK_SECRET,
    completed_job,
    completed_run,
    encoded,
    fixture,
    github_headers,
    queued_job,
    signature,
)
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import InstanceRelease, JobCancelled, JobQueued, RunCompleted
from runner_pool.domain.executions import runner_name
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.webhooks import (
    MAX_BODY_BYTES,
    Accepted,
    Delivery,
    Ignored,
    Refusal,
    Unserved,
    WorkflowJobEvent,
    WorkflowRunEvent,
    read_delivery,
    signature_matches,
    verdict,
)
from tests.support.builders import release_of_runner_5

SECRET = WEBHOOK_SECRET.encode()
LABEL = "pool=4242/class=large/usage=spot"
RUNNER = runner_name("i-0123456789abcdef0", "claim-1")


def signed_by_test_secret(body: bytes, header: str) -> bool:
    return signature_matches(body, header, [SECRET])


def as_the_handler_reads(headers: Mapping[str, Any]) -> dict[str, str]:
    """Headers as the webhook handler hands them to read_delivery: from API Gateway's event, through
    Powertools' case-insensitive dict."""
    return APIGatewayProxyEvent({"headers": dict(headers)}).headers


def read(body: bytes, event: str = "workflow_job", **header_changes: str | None) -> Delivery | Refusal:
    headers: dict[str, Any] = github_headers(body, event)
    for name, value in header_changes.items():
        headers.pop(name.replace("_", "-"), None)
        if value is not None:
            headers[name.replace("_", "-")] = value
    return read_delivery(as_the_handler_reads(headers), body, signed_by_test_secret)


def job_delivery(payload: dict[str, Any]) -> Delivery:
    return Delivery("d-1", "workflow_job", WorkflowJobEvent.model_validate(payload))


def run_delivery(payload: dict[str, Any]) -> Delivery:
    return Delivery("d-2", "workflow_run", WorkflowRunEvent.model_validate(payload))


# --- the signature ---------------------------------------------------------------------------------


def test_the_signature_of_the_body_with_the_secret_matches() -> None:
    # Given a body and GitHub's signature of it / When checked / Then it matches
    assert signature_matches(b'{"zen": "x"}', signature(b'{"zen": "x"}'), [SECRET])


def test_a_signature_made_with_another_secret_does_not_match() -> None:
    # Given a body signed with another secret / When checked / Then it does not match
    assert not signature_matches(b"{}", signature(b"{}", "guessed"), [SECRET])


def test_a_signature_of_another_body_does_not_match() -> None:
    # Given a signature of one body / When checked against a changed body / Then it does not match
    assert not signature_matches(b'{"a": 2}', signature(b'{"a": 1}'), [SECRET])


def test_any_of_several_secret_versions_may_have_signed() -> None:
    # Given the current and previous secret, and a body signed with the previous one
    body = b"{}"
    # When checked against both / Then it matches
    assert signature_matches(body, signature(body, "previous"), [SECRET, b"previous"])


@pytest.mark.parametrize("header", ["", "sha256=", "sha1=" + "0" * 40, "sha256=" + "z" * 64, "sha256=ééé"])
def test_a_malformed_signature_header_never_matches(header: str) -> None:
    # Given a header that is not sha256=<64 hex> / When checked / Then it does not match, and nothing raises
    assert not signature_matches(b"{}", header, [SECRET])


# --- the order of the checks ---------------------------------------------------------------------


def test_an_oversized_body_is_refused_with_413_before_its_signature_is_computed() -> None:
    # Given a signed body one byte over the limit, and a secret check that records being asked
    body = b" " * (MAX_BODY_BYTES + 1)
    asked: list[bytes] = []

    def records_being_asked(signed_body: bytes, _signature: str) -> bool:
        asked.append(signed_body)
        return True

    # When it is read
    refusal = read_delivery(as_the_handler_reads(github_headers(body, "ping")), body, records_being_asked)
    # Then it is refused for its size and no HMAC was computed over it
    assert refusal == Refusal(
        413, f"body of {MAX_BODY_BYTES + 1} bytes is over the limit of {MAX_BODY_BYTES}"
    )
    assert asked == []


def test_an_unsigned_body_is_refused_with_401_before_it_is_parsed() -> None:
    # Given a body that is not JSON either, without a signature
    outcome = read(b"not json", X_Hub_Signature_256=None)
    # Then the answer is about the signature, not the body: nothing was parsed
    assert isinstance(outcome, Refusal)
    assert outcome.status == 401


def test_a_signed_form_encoded_delivery_is_refused_with_400() -> None:
    # Given a delivery GitHub would send with content type "application/x-www-form-urlencoded"
    body = b"payload=%7B%7D"
    # When it is read
    outcome = read(body, Content_Type="application/x-www-form-urlencoded")
    # Then it is refused with the fix in the reason
    assert outcome == Refusal(
        400, "Content-Type must be application/json; set the webhook's content type to JSON"
    )


def test_a_json_content_type_with_a_charset_is_accepted() -> None:
    # Given a JSON delivery whose content type carries a charset
    body = encoded(fixture("ping.payload.json"))
    # When it is read / Then it is a delivery
    assert isinstance(read(body, "ping", Content_Type="application/json; charset=utf-8"), Delivery)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"action": "queued", "workflow_job": {"id": 1', "body is not valid JSON"),
        (b"[1, 2]", "body is not a JSON object"),
        (b'"text"', "body is not a JSON object"),
        (b"[" * 5000 + b"]" * 5000, "body is not valid JSON"),
    ],
)
def test_a_signed_body_that_is_not_a_json_object_is_refused_with_400(body: bytes, reason: str) -> None:
    # Given a correctly signed body that is truncated, not an object, or nested beyond reason
    # When it is read / Then it is refused with the reason
    assert read(body) == Refusal(400, reason)


def test_a_workflow_job_payload_without_labels_is_refused_with_the_field_named() -> None:
    # Given a signed workflow_job payload whose job lost its labels
    payload = queued_job(LABEL)
    del payload["workflow_job"]["labels"]
    # When it is read
    outcome = read(encoded(payload))
    # Then the reason names the missing field
    assert outcome == Refusal(400, "not a workflow_job payload: workflow_job.labels: Field required")


def test_a_job_id_given_as_a_string_violates_the_schema() -> None:
    # Given a signed payload with the job id as text (GitHub sends numbers)
    payload = queued_job(LABEL)
    payload["workflow_job"]["id"] = "289782451"
    # When it is read / Then it is refused
    outcome = read(encoded(payload))
    assert isinstance(outcome, Refusal)
    assert outcome.status == 400


def test_a_delivery_without_its_delivery_id_is_refused_with_400() -> None:
    # Given a signed delivery whose X-GitHub-Delivery header is missing
    outcome = read(encoded(fixture("ping.payload.json")), "ping", X_GitHub_Delivery=None)
    # Then it is refused: without it, a repeated delivery could not be recognised
    assert outcome == Refusal(400, "X-GitHub-Delivery is missing or is not a delivery id")


def test_headers_are_found_whatever_their_case() -> None:
    # Given GitHub's headers in lower case, as HTTP/2 proxies pass them
    body = encoded(fixture("ping.payload.json"))
    headers = as_the_handler_reads(
        {name.lower(): value for name, value in github_headers(body, "ping").items()}
    )
    # When read / Then it is a delivery of the ping event
    outcome = read_delivery(headers, body, signed_by_test_secret)
    assert isinstance(outcome, Delivery)
    assert outcome.event == "ping"


# --- what a delivery asks for --------------------------------------------------------------------


def test_a_queued_job_with_our_label_is_one_unit_of_demand() -> None:
    # Given the real queued payload re-labelled for run 4242
    delivery = job_delivery(queued_job(LABEL, job_id=77, run_id=4242, attempt=2))
    # When judged / Then it asks for one runner for that job, under its label and run attempt, says the
    # repository is public, as GitHub's example payload's is (`visibility: public`), and carries the
    # repository's id, by which reuse and runner groups are decided (issue 36, item 5)
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Accepted)
    assert judged.message == JobQueued(
        repository=REPOSITORY,
        run_key=f"{LABEL}@2",
        run_id=4242,
        run_attempt=2,
        job_id=77,
        public=True,
        repository_id=186853002,
    )


@pytest.mark.parametrize(
    ("private", "visibility", "public"),
    [(True, "private", False), (True, "internal", False), (False, "public", True), (None, None, True)],
)
def test_a_queued_jobs_repository_is_public_unless_github_says_it_is_not(
    private: bool | None, visibility: str | None, public: bool
) -> None:
    # Given a queued job whose repository GitHub describes with `private` and `visibility` (or neither)
    payload = queued_job(LABEL)
    for key, value in (("private", private), ("visibility", visibility)):
        if value is None:
            payload["repository"].pop(key)
        else:
            payload["repository"][key] = value
    # When judged / Then its demand is public exactly when GitHub says so, or says nothing (issue 14)
    judged = verdict(job_delivery(payload), StackConfig())
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, JobQueued)
    assert judged.message.public is public


def test_a_queued_job_with_a_label_that_does_not_parse_is_not_served_with_the_reason() -> None:
    # Given a job asking for usage=Spot (the grammar wants lower case)
    delivery = job_delivery(queued_job("pool=4242/usage=Spot"))
    # When judged / Then it is not served, and the reason says what to change
    assert verdict(delivery, StackConfig()) == Unserved(
        "pool=4242/usage=Spot", "usage='Spot' is not allowed; use usage=spot or on-demand"
    )


def test_a_queued_job_with_an_unknown_class_is_not_served() -> None:
    # Given a label that parses but names a class the stack does not define
    delivery = job_delivery(queued_job("pool=4242/class=huge"))
    # When judged / Then it is not served
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Unserved)
    assert "class='huge' is not defined" in judged.reason


def test_a_label_naming_another_run_is_not_served() -> None:
    # Given a job of run 4242 whose label says pool=1 (written by hand, not ${{ github.run_id }})
    delivery = job_delivery(queued_job("pool=1", run_id=4242))
    # When judged / Then it is not served: its runners would be shared with, and released by, run 1
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Unserved)
    assert judged.reason == "pool=1 is not this job's run 4242; use pool=${{ github.run_id }}"


def test_a_job_with_two_pool_labels_is_not_served() -> None:
    # Given a job whose runs-on lists two of our labels
    payload = queued_job(LABEL)
    payload["workflow_job"]["labels"] = [LABEL, "pool=4242/class=xlarge"]
    # When judged / Then it is not served (no runner can carry both run keys)
    assert isinstance(verdict(job_delivery(payload), StackConfig()), Unserved)


def test_a_queued_job_with_our_label_among_others_is_demand_for_all_of_its_labels() -> None:
    # Given runs-on: [self-hosted, Linux, GPU, <our label>]
    payload = queued_job(LABEL)
    payload["workflow_job"]["labels"] = ["self-hosted", "Linux", "GPU", LABEL]
    # When judged
    judged = verdict(job_delivery(payload), StackConfig())
    # Then it is demand under a run key naming every label, compared as GitHub does, without case
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, JobQueued)
    assert judged.message.run_key == f"{LABEL} gpu linux self-hosted"
    assert RunKey.parse(judged.message.run_key).runner_labels == (LABEL, "gpu", "linux", "self-hosted")


@pytest.mark.parametrize(
    ("others", "reason"),
    [
        (["windows"], "the job asks for 'windows'; runner-pool runners are Linux"),
        (["macOS"], "the job asks for 'macos'; runner-pool runners are Linux"),
        (["ARM64"], "the job asks for 'arm64' but its runner is x64; drop 'arm64' or set arch= to match"),
        (["arm"], "the job asks for 'arm' but its runner is x64; drop 'arm' or set arch= to match"),
        ([f"tag-{n}" for n in range(100)], "GitHub registers a runner with at most 100 labels, not 101"),
        (["x" * 1100], "its labels come to more than 1024 bytes; list fewer or shorter ones"),
        ([" "], "the job lists an empty label"),
    ],
)
def test_a_label_set_no_runner_of_ours_can_carry_is_not_served_with_the_reason(
    others: list[str], reason: str
) -> None:
    # Given a job that lists, beside our label, labels our runner could never be registered with
    payload = queued_job(LABEL)
    payload["workflow_job"]["labels"] = [*others, LABEL]
    # When judged / Then it is not served (logged and counted by the handler), with the reason
    assert verdict(job_delivery(payload), StackConfig()) == Unserved(LABEL, reason)


def test_an_arch_label_that_agrees_with_the_runner_is_served() -> None:
    # Given runs-on: [self-hosted, ARM64, pool=…/arch=arm64]
    payload = queued_job("pool=4242/arch=arm64")
    payload["workflow_job"]["labels"] = ["self-hosted", "ARM64", "pool=4242/arch=arm64"]
    # When judged / Then it is demand
    assert isinstance(verdict(job_delivery(payload), StackConfig()), Accepted)


def test_a_job_completed_on_our_runner_releases_that_instance() -> None:
    # Given job 55 completed on the runner we registered for instance i-0123456789abcdef0
    delivery = job_delivery(completed_job(LABEL, runner_name=RUNNER, job_id=55))
    # When judged / Then that instance is released from the job's run key
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Accepted)
    assert judged.message == release_of_runner_5(LABEL, "job-55")


@pytest.mark.parametrize("failed", [True, False])
def test_a_completed_jobs_release_says_whether_it_failed(failed: bool) -> None:
    # Given job 55 completed on our runner, as GitHub's failed or successful example has it
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=55, failed=failed)
    assert payload["workflow_job"]["conclusion"] == ("failure" if failed else "success")
    # When judged / Then its release carries whether it failed (an interrupted one may be re-run)
    judged = verdict(job_delivery(payload), StackConfig())
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, InstanceRelease)
    assert judged.message.request.failed is failed


@pytest.mark.parametrize("action", ["in_progress", "completed"])
def test_a_job_of_another_run_on_our_runner_quarantines_its_instance(action: str) -> None:
    # Given job 57 of run 999 that copied run 4242's label and ran on the runner we registered for 4242
    # (issue 14: run ids are not secret; GitHub gives a job any runner carrying its labels)
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=57, run_id=999)
    payload["action"] = action
    # When judged
    judged = verdict(job_delivery(payload), StackConfig())
    # Then that instance's hand-off (runner 5) is quarantined, naming the foreign job's run key and
    # repository; nothing is released to the pool
    assert isinstance(judged, Accepted)
    assert judged.message == release_of_runner_5(LABEL, "foreign-job-57", quarantine=True)


def test_a_job_of_its_own_run_in_progress_on_our_runner_needs_nothing() -> None:
    # Given job 58 of run 4242 in progress on the runner registered for run 4242
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=58)
    payload["action"] = "in_progress"
    # When judged / Then nothing is asked for: the runner serves its own run
    assert isinstance(verdict(job_delivery(payload), StackConfig()), Ignored)


def test_a_job_of_a_rerun_started_on_our_runner_has_its_runners_attempt_checked() -> None:
    # Given job 59 of attempt 2 of run 4242 in progress on runner 5 of ours: every attempt of a run carries
    # the same label, and only the record knows which attempt runner 5 was registered for
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=59)
    payload["action"] = "in_progress"
    payload["workflow_job"]["run_attempt"] = 2
    # When judged / Then the release is asked to judge it (quarantine if runner 5 is another attempt's),
    # not to release anything
    judged = verdict(job_delivery(payload), StackConfig())
    assert isinstance(judged, Accepted)
    assert judged.message == release_of_runner_5(f"{LABEL}@2", "started-job-59", suspect=True)


def test_a_job_of_a_rerun_completed_on_our_runner_releases_under_that_attempts_run_key() -> None:
    # Given job 56 of attempt 2 of run 4242 completed on runner 5 of ours
    payload = completed_job(LABEL, runner_name=RUNNER, job_id=56)
    payload["workflow_job"]["run_attempt"] = 2
    # When judged / Then the release names attempt 2's run key and runner 5: nothing of attempt 1
    judged = verdict(job_delivery(payload), StackConfig())
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, InstanceRelease)
    assert (judged.message.request.run_key, judged.message.request.runner_id) == (f"{LABEL}@2", 5)


def test_a_job_completed_without_a_runner_cancels_its_demand() -> None:
    # Given job 56 cancelled while queued (completed, no runner)
    delivery = job_delivery(completed_job(LABEL, runner_name=None, job_id=56))
    # When judged / Then its unit of demand is cancelled
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Accepted)
    assert judged.message == JobCancelled(repository=REPOSITORY, run_key=LABEL, job_id=56)


def test_a_job_with_our_label_completed_on_a_runner_not_ours_is_ignored() -> None:
    # Given a completed job whose runner name is not <instance id>-<8 hex>
    delivery = job_delivery(completed_job(LABEL, runner_name="GitHub Actions 5"))
    # When judged / Then nothing is asked for
    assert isinstance(verdict(delivery, StackConfig()), Ignored)


def test_a_job_in_progress_asks_nothing() -> None:
    # Given the real in_progress payload re-labelled with our label
    payload = fixture("workflow_job.in_progress.payload.json")
    payload["workflow_job"]["labels"] = [LABEL]
    # When judged / Then it is ignored
    assert verdict(job_delivery(payload), StackConfig()) == Ignored("workflow_job in_progress needs nothing")


def test_a_completed_run_asks_for_the_release_of_its_attempt() -> None:
    # Given attempt 2 of run 4242 completed
    payload = completed_run(run_id=4242, attempt=2)
    delivery = Delivery("d-1", "workflow_run", WorkflowRunEvent.model_validate(payload))
    # When judged / Then the run's release is asked for, for that attempt
    judged = verdict(delivery, StackConfig())
    assert isinstance(judged, Accepted)
    assert judged.message == RunCompleted(repository="octo-org/octo-repo", run_id=4242, run_attempt=2)


def test_ping_is_answered_pong() -> None:
    # Given a ping delivery / When judged / Then the answer is pong
    assert verdict(Delivery("d-1", "ping", None), StackConfig()) == Ignored("pong")


def test_an_event_we_do_not_use_is_acknowledged() -> None:
    # Given an issues event / When judged / Then it is ignored with the event named
    assert verdict(Delivery("d-1", "issues", None), StackConfig()) == Ignored("event issues is not used")
