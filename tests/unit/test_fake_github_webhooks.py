"""Every webhook the fake GitHub sends validates against githubkit's webhook models, and names no other key.

githubkit's webhook models are generated from GitHub's own description of its webhooks, so a body
that validates, with no key the models leave out, is one the webhook Lambda will meet on GitHub.
The fake is driven directly (no server), so each event is delivered at once and kept as a delivery.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from githubkit.webhooks import parse_obj

from emulator.fake_github import Conclusion, FakeDelivery, FakeGitHub, JobSpec
from emulator.fake_github.installations import select_repositories
from emulator.fake_github.state import RunTrigger
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import RepositoryScope
from tests.unit.test_fake_github_shapes import unknown_keys

REPOSITORY = f"{OWNER}/{REPO}"
LABEL = "pool=${{ github.run_id }}/class=large"


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> FakeGitHub:
    github = FakeGitHub(APP_ID, app_key.public_pem, clock=clock)
    github.state.add_installation(INSTALLATION_ID, OWNER)
    return github


def one_job_served(fake: FakeGitHub, conclusion: Conclusion) -> None:
    """A run of one job that a runner takes and finishes with `conclusion`."""
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo=REPO), "i-0abc-1234abcd", [f"pool={run.run_id}/class=large"]
    )
    fake.actions.connect(runner)
    job = fake.actions.next_job(runner)
    assert job is not None
    fake.actions.finish(runner, job.job_id, conclusion)


def one_job_cancelled_while_queued(fake: FakeGitHub) -> None:
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    fake.actions.cancel_run(run.run_id)


def a_deploy_job_of_a_forks_pull_request(fake: FakeGitHub) -> None:
    """A fork's pull request, by Dependabot, whose job refers to an environment, served."""
    trigger = RunTrigger("pull_request", "dependabot[bot]", head_repository=f"someone/{REPO}")
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("deploy", LABEL, environment="Test")], trigger)
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo=REPO), "i-0abc-1234abcd", [f"pool={run.run_id}/class=large"]
    )
    fake.actions.connect(runner)
    job = fake.actions.next_job(runner)
    assert job is not None
    fake.actions.finish(runner, job.job_id, Conclusion.SUCCESS)


def the_installation_narrowed_then_widened(fake: FakeGitHub) -> None:
    """The owner selects one repository for the App, then adds another (installation_repositories)."""
    select_repositories(fake, OWNER, {REPOSITORY})
    select_repositories(fake, OWNER, {REPOSITORY, f"{OWNER}/other"})


Story = Callable[[FakeGitHub], None]

STORIES: dict[str, Story] = {
    "a job served successfully": lambda fake: one_job_served(fake, Conclusion.SUCCESS),
    "a job that failed": lambda fake: one_job_served(fake, Conclusion.FAILURE),
    "a run cancelled while its job was queued": one_job_cancelled_while_queued,
    "a deploy job of a fork's pull request by Dependabot": a_deploy_job_of_a_forks_pull_request,
    "the installation narrowed, then widened": the_installation_narrowed_then_widened,
}


def sent(fake: FakeGitHub) -> list[FakeDelivery]:
    return sorted(fake.state.deliveries.values(), key=lambda d: d.delivery_id)


@pytest.mark.parametrize("story", STORIES)
def test_each_webhook_has_githubs_shape(fake: FakeGitHub, story: str) -> None:
    # Given a run that goes through one of its stories
    STORIES[story](fake)

    # When each webhook it caused is parsed as githubkit parses GitHub's
    deliveries = sent(fake)
    for delivery in deliveries:
        payload: dict[str, Any] = json.loads(delivery.payload)
        model = parse_obj(delivery.event, payload)

        # Then it validates, as the model of its action, and carries nothing the model does not name
        assert type(model).__name__.lower().endswith(f"{delivery.action}".replace("_", ""))
        assert unknown_keys(model, payload) == [], (delivery.event, delivery.action)
    assert deliveries


def test_a_job_webhook_carries_the_label_with_the_run_id_filled_in(fake: FakeGitHub) -> None:
    # Given a workflow whose job runs on our label, written with `${{ github.run_id }}`
    # When it runs
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])

    # Then the queued webhook names the label as GitHub expands it, and the App's installation
    queued = json.loads(sent(fake)[-1].payload)
    assert queued["workflow_job"]["labels"] == [f"pool={run.run_id}/class=large"]
    assert queued["installation"]["id"] == INSTALLATION_ID
    assert queued["repository"]["full_name"] == REPOSITORY


def test_a_completed_job_webhook_names_the_runner_that_ran_it(fake: FakeGitHub) -> None:
    # Given a job a runner took
    # When it completes
    one_job_served(fake, Conclusion.SUCCESS)

    # Then the completed event names that runner (release finds the instance by the name)
    completed = [
        json.loads(d.payload) for d in sent(fake) if d.action == "completed" and d.event == "workflow_job"
    ]
    assert [c["workflow_job"]["runner_name"] for c in completed] == ["i-0abc-1234abcd"]
    assert completed[0]["workflow_job"]["conclusion"] == "success"


def test_a_runs_webhooks_carry_its_trigger_and_its_jobs_environment(fake: FakeGitHub) -> None:
    # Given a fork's pull request run by Dependabot, whose job refers to an environment
    a_deploy_job_of_a_forks_pull_request(fake)
    deliveries = [json.loads(d.payload) for d in sent(fake)]
    # When its requested and job webhooks are read
    (requested,) = [p for p in deliveries if p.get("action") == "requested"]
    jobs = [p for p in deliveries if "workflow_job" in p]
    # Then they say what GitHub would: the event, the actors, the fork, and each job's deployment
    run = requested["workflow_run"]
    assert (run["event"], run["actor"]["login"], run["triggering_actor"]["login"]) == (
        "pull_request",
        "dependabot[bot]",
        "dependabot[bot]",
    )
    assert run["head_repository"]["full_name"] == f"someone/{REPO}"
    assert run["actor"]["type"] == "Bot"
    assert [job["deployment"]["environment"] for job in jobs] == ["Test"] * 3


def test_a_dropped_requested_delivery_never_reaches_the_receiver(fake: FakeGitHub) -> None:
    # Given the run's requested delivery dropped, as a scenario loses it
    fake.webhooks.drop_next("workflow_run", "requested")
    # When a run starts
    fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    # Then it is recorded as a failed attempt (for redelivery), and its job's queued one went
    requested = [d for d in sent(fake) if d.action == "requested"]
    assert [d.status_code for d in requested] != [200]
    assert any(d.action == "queued" for d in sent(fake))
