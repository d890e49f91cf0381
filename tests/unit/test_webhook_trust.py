"""What a delivery says about a job's level of trust: a requested run's facts, a job's environment, and a
public repository's job that runner groups would never serve."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.harness.webhooks import (
    completed_job,
    fixture,
    queued_job,
    requested_run,
    with_deployment,
)
from runner_pool.domain.config import GitHubSettings, StackConfig
from runner_pool.domain.demand import InstanceRelease, JobQueued, RunFromFork, RunRequested, from_body
from runner_pool.domain.executions import runner_name
from runner_pool.domain.runner_scope import Registration
from runner_pool.domain.trust import WORKFLOW_EVENTS, TrustLevel, run_trust
from runner_pool.domain.webhooks import (
    Accepted,
    Delivery,
    Unserved,
    WorkflowJobEvent,
    WorkflowRunEvent,
    verdict,
)
from tests.support.builders import release_of_runner_5

LABEL = "pool=4242/class=large"
RUNNER = runner_name("i-0123456789abcdef0", "claim-1")
LOGINS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9-]{0,20}(\[bot\])?", fullmatch=True)


def judged_run(payload: dict[str, Any]) -> RunRequested:
    judged = verdict(Delivery("d-1", "workflow_run", WorkflowRunEvent.model_validate(payload)), StackConfig())
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, RunRequested)
    return judged.message


def judged_job(payload: dict[str, Any], config: StackConfig | None = None) -> Any:
    event = WorkflowJobEvent.model_validate(payload)
    return verdict(Delivery("d-1", "workflow_job", event), config or StackConfig())


# --- workflow_run requested -----------------------------------------------------------------------


def test_the_real_requested_payload_carries_its_event_actors_and_head() -> None:
    # Given GitHub's own `workflow_run requested` example
    payload = fixture("workflow_run.requested.payload.json")
    # When judged
    message = judged_run(payload)
    # Then the message carries what GitHub said, under GitHub's field names
    assert (message.event, message.actor, message.triggering_actor, message.head_repository) == (
        "repository_dispatch",
        "Codertocat",
        "Codertocat",
        "octo-org/octo-repo",
    )
    assert (message.repository, message.run_id, message.run_attempt) == ("octo-org/octo-repo", 289782451, 1)


@given(
    event=st.sampled_from(sorted(WORKFLOW_EVENTS)) | st.from_regex(r"[a-z_]{1,30}", fullmatch=True),
    actor=LOGINS,
    triggering_actor=LOGINS,
    fork=st.booleans(),
    attempt=st.integers(1, 50),
)
def test_every_requested_run_is_queued_with_the_facts_its_level_is_decided_from(
    event: str, actor: str, triggering_actor: str, fork: bool, attempt: int
) -> None:
    # Given a requested run of any event, actors, head and attempt
    head = "someone/octo-repo" if fork else None
    payload = requested_run(
        77, attempt, event=event, actor=actor, triggering_actor=triggering_actor, head_repository=head
    )
    # When judged
    message = judged_run(payload)
    # Then it is queued (ours or not: only the ledger knows), it survives the queue, and the level
    # decided from it is the one decided from the payload's own fields
    assert from_body(message.model_dump_json()) == message
    assert message.run_attempt == attempt
    assert run_trust(message.facts) is run_trust(message.facts.__class__(**vars(message.facts)))
    if fork or "dependabot[bot]" in (actor, triggering_actor):
        assert run_trust(message.facts) is TrustLevel.UNTRUSTED


def test_a_requested_run_without_a_head_repository_is_read_as_a_forks() -> None:
    # Given a requested run whose payload names no head repository
    payload = requested_run(77)
    payload["workflow_run"]["head_repository"] = None
    # When judged / Then the message says none, which decides untrusted (the side that never shares)
    message = judged_run(payload)
    assert message.head_repository is None
    assert run_trust(message.facts) is TrustLevel.UNTRUSTED


def test_a_requested_run_without_an_event_is_untrusted() -> None:
    # Given a requested run whose payload has no event field
    payload = requested_run(77)
    del payload["workflow_run"]["event"]
    # When judged / Then its level is untrusted: no table names what GitHub did not say
    assert run_trust(judged_run(payload).facts) is TrustLevel.UNTRUSTED


def test_a_run_from_fork_message_of_an_earlier_release_is_still_read() -> None:
    # Given the body an earlier release queued for a fork's run
    body = (
        '{"kind": "run-from-fork", "repository": "octo-org/octo-repo", '
        '"head_repository": "someone/octo-repo", "run_id": 5, "run_attempt": 1}'
    )
    # When read / Then it is a RunFromFork (the dispatcher decides it untrusted)
    assert isinstance(from_body(body), RunFromFork)


# --- workflow_job deployment -------------------------------------------------------------------------


def test_the_real_payload_with_a_deployment_is_read_as_a_job_with_an_environment() -> None:
    # Given GitHub's `queued` example of a job that refers to an environment
    event = WorkflowJobEvent.model_validate(fixture("workflow_job.queued.with-deployment.payload.json"))
    # When read / Then its deployment names the environment, and the job is privileged
    assert event.deployment is not None
    assert event.deployment.environment == "Test"
    assert event.privileged


def test_a_queued_job_with_an_environment_is_privileged_demand() -> None:
    # Given our label's queued job with a deployment
    judged = judged_job(with_deployment(queued_job(LABEL, job_id=301)))
    # When judged / Then its demand is marked privileged
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, JobQueued)
    assert judged.message.privileged


def test_a_queued_job_without_an_environment_is_not_privileged() -> None:
    # Given our label's queued job, GitHub's example without deployment
    judged = judged_job(queued_job(LABEL, job_id=302))
    # When judged / Then its demand is not privileged
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, JobQueued)
    assert not judged.message.privileged


def test_a_job_with_an_environment_starting_on_our_runner_is_sent_to_be_judged() -> None:
    # Given job 303 of attempt 1, with an environment, in progress on runner 5 of ours
    payload = with_deployment(completed_job(LABEL, runner_name=RUNNER, job_id=303))
    payload["action"] = "in_progress"
    # When judged / Then the release is asked to judge its instance's hand-over, not to release it
    judged = judged_job(payload)
    assert isinstance(judged, Accepted)
    assert judged.message == release_of_runner_5(LABEL, "started-job-303", suspect=True, privileged=True)


def test_a_job_with_an_environment_completed_on_our_runner_releases_it_as_privileged() -> None:
    # Given job 304, with an environment, completed on runner 5 of ours
    judged = judged_job(with_deployment(completed_job(LABEL, runner_name=RUNNER, job_id=304)))
    # When judged / Then the release is marked privileged (its instance is never pooled)
    assert isinstance(judged, Accepted)
    assert isinstance(judged.message, InstanceRelease)
    assert judged.message.request.privileged
    assert not judged.message.request.suspect


# --- runner groups that take no public repository ------------------------------------------------------


def runner_groups(*, allow_public: bool, chosen: bool = True) -> StackConfig:
    """An organisation's stack registering in runner groups: chosen, or its default when left out."""
    github = GitHubSettings(
        scope="octo-org",
        registration=Registration.RUNNER_GROUP if chosen else None,
        runner_groups_allow_public_repositories=allow_public,
    )
    return StackConfig(github=github)


@pytest.mark.parametrize("chosen", [True, False], ids=["chosen", "organisation-default"])
def test_a_public_repositorys_job_is_refused_when_runner_groups_take_no_public_repository(
    chosen: bool,
) -> None:
    # Given runner-group registration whose groups take no public repository, and a public repository's job
    payload = queued_job(LABEL, job_id=305)
    assert payload["repository"]["private"] is False
    # When judged
    judged = judged_job(payload, runner_groups(allow_public=False, chosen=chosen))
    # Then it is unserved up front, the reason naming the setting to change
    assert isinstance(judged, Unserved)
    assert "github.runner_groups_allow_public_repositories" in judged.reason


@pytest.mark.parametrize(
    ("config", "private"),
    [
        (runner_groups(allow_public=True), False),
        (runner_groups(allow_public=False), True),
        (StackConfig(github=GitHubSettings(scope="octo-org", registration=Registration.REPOSITORY)), False),
        (StackConfig(github=GitHubSettings(scope="octo-org/octo-repo")), False),
    ],
    ids=["groups-take-public", "private-repository", "repository-registration", "repository-scope"],
)
def test_a_job_runner_groups_can_serve_is_accepted(config: StackConfig, private: bool) -> None:
    # Given a job a runner of ours can be given
    payload = queued_job(LABEL, job_id=306)
    payload["repository"].update(private=private, visibility="private" if private else "public")
    # When judged / Then its demand is queued
    assert isinstance(judged_job(payload, config), Accepted)
