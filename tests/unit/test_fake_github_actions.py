"""The fake GitHub's Actions: runs and jobs, jobs handed to matching runners, and the webhooks about them.

Driven directly (no server): each webhook is delivered at once to the default receiver, which
accepts it, and kept as a delivery, so a test reads what GitHub would have sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulator.fake_github import (
    Conclusion,
    FakeDelivery,
    FakeGitHub,
    FakeRunner,
    FakeWorkflowRun,
    JobSpec,
    JobStatus,
)
from emulator.fake_github.actions import JobGoneError
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import OrganizationScope, RepositoryScope

REPOSITORY = f"{OWNER}/{REPO}"
LABEL = "pool=${{ github.run_id }}/class=large"
LOST_AFTER = 30.0


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> FakeGitHub:
    github = FakeGitHub(APP_ID, app_key.public_pem, clock=clock, lost_runner_seconds=LOST_AFTER)
    github.state.add_installation(INSTALLATION_ID, OWNER)
    return github


def events(fake: FakeGitHub) -> list[tuple[str, str | None]]:
    return [(d.event, d.action) for d in sorted(fake.state.deliveries.values(), key=lambda d: d.delivery_id)]


def payloads(fake: FakeGitHub, event: str, action: str) -> list[dict[str, Any]]:
    return [
        json.loads(d.payload)
        for d in sorted(fake.state.deliveries.values(), key=lambda d: d.delivery_id)
        if (d.event, d.action) == (event, action)
    ]


def runner_for(fake: FakeGitHub, run: FakeWorkflowRun, name: str = "i-0abc-1234abcd") -> FakeRunner:
    """A JIT runner registered for the run's label, connected."""
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo=REPO), name, [f"pool={run.run_id}/class=large"]
    )
    fake.actions.connect(runner)
    return runner


def test_a_matrix_run_is_requested_then_queues_one_job_per_entry(fake: FakeGitHub) -> None:
    # Given a workflow with a matrix of 3 and one plain job
    jobs = [JobSpec("test", LABEL, matrix=3), JobSpec("lint", "ubuntu-latest")]

    # When it runs
    run = fake.actions.start_run(REPOSITORY, "ci", jobs)

    # Then GitHub announced the run, then each of its 4 jobs as queued, with their own names
    assert events(fake) == [("workflow_run", "requested")] + [("workflow_job", "queued")] * 4
    names = [p["workflow_job"]["name"] for p in payloads(fake, "workflow_job", "queued")]
    assert names == ["test (1)", "test (2)", "test (3)", "lint"]
    assert all(fake.state.jobs[j].status is JobStatus.QUEUED for j in run.job_ids)


def test_a_connected_runner_gets_the_oldest_queued_job_its_labels_fit(
    fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given two runs queued one after the other, and a runner registered for the second run's label
    fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    clock.advance(1)
    second = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, matrix=2)])
    runner = runner_for(fake, second)

    # When it asks for work
    job = fake.actions.next_job(runner)

    # Then it gets the first job of its own run, and GitHub says the job and the run are in progress
    assert job is not None
    assert job.job_id == second.job_ids[0]
    assert (job.status, job.runner_name) == (JobStatus.IN_PROGRESS, runner.name)
    assert runner.busy
    assert events(fake)[-2:] == [("workflow_job", "in_progress"), ("workflow_run", "in_progress")]


def test_a_runner_whose_labels_do_not_fit_gets_no_job(fake: FakeGitHub) -> None:
    # Given a queued job and a runner registered for another run's label
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo=REPO), "other", ["pool=1/class=large"]
    )
    fake.actions.connect(runner)

    # When it asks for work
    # Then there is none for it, and the job is still queued
    assert fake.actions.next_job(runner) is None
    assert fake.state.jobs[run.job_ids[0]].status is JobStatus.QUEUED


def test_a_runner_of_another_repository_gets_no_job(fake: FakeGitHub) -> None:
    # Given a queued job and a runner with the right label, registered to another repository
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo="elsewhere"), "r", [f"pool={run.run_id}/class=large"]
    )
    fake.actions.connect(runner)

    # When it asks for work
    # Then GitHub does not hand it the job
    assert fake.actions.next_job(runner) is None


def test_an_organisation_runner_serves_the_organisations_repositories(fake: FakeGitHub) -> None:
    # Given a queued job and an organisation runner with the job's label
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = fake.state.register_runner(OrganizationScope(org=OWNER), "r", [f"pool={run.run_id}/class=large"])
    fake.actions.connect(runner)

    # When it asks for work
    job = fake.actions.next_job(runner)

    # Then it gets the job
    assert job is not None
    assert job.job_id == run.job_ids[0]


def group_runner(fake: FakeGitHub, run: FakeWorkflowRun, repositories: set[int], **group: Any) -> FakeRunner:
    """An organisation runner for the run's label in a group of `selected` visibility, connected."""
    chosen = fake.state.add_runner_group(
        OWNER, 77, "runner-pool-77", visibility="selected", selected_repository_ids=repositories, **group
    )
    runner = fake.state.register_runner(
        OrganizationScope(org=OWNER), "r", [f"pool={run.run_id}/class=large"], chosen.runner_group_id
    )
    fake.actions.connect(runner)
    return runner


def test_a_runner_of_a_group_that_selects_the_repository_gets_its_job(fake: FakeGitHub) -> None:
    # Given a queued job and an organisation runner in a group that selects the job's repository
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = group_runner(fake, run, {fake.state.repository_id(REPOSITORY)})

    # When it asks for work
    job = fake.actions.next_job(runner)

    # Then it gets the job
    assert job is not None
    assert job.job_id == run.job_ids[0]


def test_a_runner_of_another_repositorys_group_gets_no_job(fake: FakeGitHub) -> None:
    # Given a queued job and an organisation runner with its label, in a group that selects only
    # another repository of the organisation
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = group_runner(fake, run, {fake.state.repository_id(f"{OWNER}/elsewhere")})

    # When it asks for work
    # Then GitHub does not hand it the job, which stays queued
    assert fake.actions.next_job(runner) is None
    assert fake.state.jobs[run.job_ids[0]].status is JobStatus.QUEUED


@pytest.mark.parametrize("allows_public", [False, True])
def test_a_groups_runner_gets_a_public_repositorys_job_only_if_the_group_allows_it(
    fake: FakeGitHub, allows_public: bool
) -> None:
    # Given a public repository's queued job and a runner of a group that selects the repository
    fake.state.public_repositories.add(REPOSITORY.lower())
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = group_runner(
        fake, run, {fake.state.repository_id(REPOSITORY)}, allows_public_repositories=allows_public
    )

    # When it asks for work
    # Then it gets the job only when its group allows public repositories
    assert (fake.actions.next_job(runner) is not None) is allows_public


def test_a_runner_waiting_before_its_job_is_given_any_runs_job_that_asks_for_its_labels(
    fake: FakeGitHub,
) -> None:
    # Given an organisation runner registered with a generic label and listening, in a group every
    # repository may use, before any job is queued
    group = fake.state.add_runner_group(OWNER, 78, "runner-pool-instant", visibility="all")
    runner = fake.state.register_runner(
        OrganizationScope(org=OWNER), "r", ["pool=instant/class=large"], group.runner_group_id
    )
    fake.actions.connect(runner)
    assert fake.actions.next_job(runner) is None
    # When two runs queue jobs: one listing the label in another case beside a default label, one also
    # asking for a label the runner lacks ("jobs will be queued on runners that have all the labels that
    # you specify"; "Labels are case-insensitive": docs.github.com, Actions, "Using self-hosted runners in
    # a workflow" and "Using labels with self-hosted runners")
    lacking = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("gpu", ("pool=instant/class=large", "gpu"))])
    fitting = fake.actions.start_run(
        REPOSITORY, "ci", [JobSpec("build", ("self-hosted", "Pool=Instant/Class=Large"))]
    )
    # Then the waiting runner is given the job whose every label it carries, and only that one
    job = fake.actions.next_job(runner)
    assert job is not None
    assert job.job_id == fitting.job_ids[0]
    assert fake.state.jobs[lacking.job_ids[0]].status is JobStatus.QUEUED


def test_the_last_job_finishing_completes_the_run_and_removes_the_jit_runner(fake: FakeGitHub) -> None:
    # Given a run of one job, taken by a runner
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = runner_for(fake, run)
    job = fake.actions.next_job(runner)
    assert job is not None

    # When the runner reports success
    fake.actions.finish(runner, job.job_id, Conclusion.SUCCESS)

    # Then the job and the run completed, in that order, and GitHub removed the one-job runner
    assert events(fake)[-2:] == [("workflow_job", "completed"), ("workflow_run", "completed")]
    assert payloads(fake, "workflow_run", "completed")[0]["workflow_run"]["conclusion"] == "success"
    assert runner.runner_id not in fake.state.runners


def test_cancelling_a_run_completes_its_queued_jobs_without_a_runner(fake: FakeGitHub) -> None:
    # Given a run of two queued jobs
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, matrix=2)])

    # When it is cancelled
    fake.actions.cancel_run(run.run_id)

    # Then both jobs completed as cancelled with no runner, and the run completed as cancelled
    completed = payloads(fake, "workflow_job", "completed")
    assert [(c["workflow_job"]["conclusion"], c["workflow_job"]["runner_name"]) for c in completed] == [
        ("cancelled", None),
        ("cancelled", None),
    ]
    assert payloads(fake, "workflow_run", "completed")[0]["workflow_run"]["conclusion"] == "cancelled"


def test_cancelling_a_run_takes_the_running_job_from_its_runner(fake: FakeGitHub) -> None:
    # Given a job in progress on a runner
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = runner_for(fake, run)
    job = fake.actions.next_job(runner)
    assert job is not None

    # When the run is cancelled
    fake.actions.cancel_run(run.run_id)

    # Then the job is cancelled, and the runner learns at its next renewal that the job is gone
    assert job.conclusion is Conclusion.CANCELLED
    with pytest.raises(JobGoneError):
        fake.actions.renew(runner, job.job_id)


def test_a_runner_silent_for_too_long_is_lost_and_its_job_fails(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a job in progress on a runner that then stops talking (its instance crashed)
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = runner_for(fake, run)
    job = fake.actions.next_job(runner)
    assert job is not None

    # When GitHub looks after the lost-runner time has passed
    clock.advance(LOST_AFTER + 1)
    lost = fake.actions.notice_lost_runners()

    # Then the runner is lost and the job completed as failed, naming the runner
    assert lost == [runner]
    completed = payloads(fake, "workflow_job", "completed")[0]["workflow_job"]
    assert (completed["conclusion"], completed["runner_name"]) == ("failure", runner.name)
    assert job.failed_because == f"its runner was silent for {LOST_AFTER:g} s"


def test_a_runner_that_renews_its_job_is_not_lost(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a job in progress whose runner renews it now and then
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    runner = runner_for(fake, run)
    job = fake.actions.next_job(runner)
    assert job is not None
    for _ in range(3):
        clock.advance(LOST_AFTER - 1)
        fake.actions.renew(runner, job.job_id)

    # When GitHub looks for lost runners
    # Then there are none, and the job is still in progress
    assert fake.actions.notice_lost_runners() == []
    assert job.status is JobStatus.IN_PROGRESS


def test_a_dropped_webhook_is_recorded_as_failed_and_never_received(fake: FakeGitHub) -> None:
    # Given a receiver that records what reaches it, and GitHub told to drop the next queued event
    received: list[str] = []

    def receive(delivery: FakeDelivery) -> int:
        received.append(delivery.guid)
        return 200

    fake.state.webhook_receiver = receive
    fake.webhooks.drop_next("workflow_job", "queued")

    # When a run of two jobs is queued
    fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, matrix=2)])

    # Then the first queued event failed to arrive, the second arrived
    queued = [d for d in fake.state.deliveries.values() if d.action == "queued"]
    assert [d.succeeded for d in sorted(queued, key=lambda d: d.delivery_id)] == [False, True]
    assert queued[0].guid not in received


def test_a_redelivery_sends_the_same_event_again(fake: FakeGitHub) -> None:
    # Given a dropped queued event
    received: list[tuple[str, bytes]] = []

    def receive(delivery: FakeDelivery) -> int:
        received.append((delivery.guid, delivery.payload))
        return 200

    fake.state.webhook_receiver = receive
    fake.webhooks.drop_next("workflow_job", "queued")
    fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    dropped = next(d for d in fake.state.deliveries.values() if d.action == "queued")

    # When it is redelivered
    again = fake.state.redeliver(dropped.delivery_id)

    # Then the receiver got the very same event (guid and bytes), recorded as a successful redelivery
    assert received[-1] == (dropped.guid, dropped.payload)
    assert (again.redelivery, again.succeeded, again.guid) == (True, True, dropped.guid)
