"""The fake GitHub behaves as GitHub documents it: each test names its source.

Sources (docs.github.com, Actions, unless said otherwise):
- "Re-running workflows and jobs": re-run all jobs, or failed jobs, up to 30 days after the run; the
  run id stays, `run_attempt` counts up.
- "Using self-hosted runners in a workflow": a job goes to a runner with all of its labels; the
  default labels (self-hosted, linux/windows/macOS, x64/ARM/ARM64); a job assigned to a runner that
  does not pick it up within 60 seconds is queued again (Routing precedence).
- "Using labels with self-hosted runners": "Labels are case-insensitive."
- "Usage limits for self-hosted runners": a job queued for 24 hours is cancelled/failed.
- github-aws-runners/terraform-aws-github-runner#3491: whether JIT runners get the default labels is
  undocumented and reported both ways, so the fake has a switch.
- actions/runner#2040: a runner that loses its connection fails the job it runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulator.fake_github import (
    Conclusion,
    FakeGitHub,
    FakeRunner,
    FakeWorkflowRun,
    JobSpec,
    JobStatus,
    Refusal,
)
from emulator.fake_github.actions import RERUN_WINDOW_SECONDS, JobGoneError, RerunRefusedError
from emulator.fake_github.routes import Request
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import RepositoryScope

REPOSITORY = f"{OWNER}/{REPO}"
LABEL = "pool=${{ github.run_id }}/class=large"
REQUEUE_AFTER = 60.0
QUEUE_EXPIRY = 300.0
"""24 hours on GitHub, scaled down."""
SCOPE = RepositoryScope(owner=OWNER, repo=REPO)


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> FakeGitHub:
    github = FakeGitHub(
        APP_ID,
        app_key.public_pem,
        clock=clock,
        requeue_after_seconds=REQUEUE_AFTER,
        queue_expiry_seconds=QUEUE_EXPIRY,
    )
    github.state.add_installation(INSTALLATION_ID, OWNER)
    return github


def sent(fake: FakeGitHub, event: str, action: str) -> list[dict[str, Any]]:
    return [
        json.loads(d.payload)
        for d in sorted(fake.state.deliveries.values(), key=lambda d: d.delivery_id)
        if (d.event, d.action) == (event, action)
    ]


def runner(fake: FakeGitHub, *labels: str, name: str = "i-0abc-1234abcd") -> FakeRunner:
    registered = fake.state.register_runner(SCOPE, name, list(labels))
    fake.actions.connect(registered)
    return registered


def serve(fake: FakeGitHub, run: FakeWorkflowRun) -> None:
    """One runner per queued job of the run's latest attempt, each reporting what its steps came to."""
    for job_id in list(run.job_ids):
        job = fake.state.jobs[job_id]
        if job.status is not JobStatus.QUEUED:
            continue
        taker = runner(fake, *job.labels, name=f"i-0abc-{job_id:08x}")
        taken = fake.actions.next_job(taker)
        assert taken is not None
        fake.actions.finish(taker, taken.job_id, Conclusion.FAILURE if taken.fails else Conclusion.SUCCESS)


def two_jobs_one_failing(fake: FakeGitHub) -> FakeWorkflowRun:
    run = fake.actions.start_run(
        REPOSITORY, "ci", [JobSpec("build", LABEL), JobSpec("test", LABEL, fail_attempts=(1,))]
    )
    serve(fake, run)
    assert run.conclusion is Conclusion.FAILURE
    return run


# --- attempts and re-runs ("Re-running workflows and jobs") ------------------------------------------


def test_rerun_failed_jobs_keeps_the_run_id_counts_up_the_attempt_and_queues_only_the_failed_job(
    fake: FakeGitHub,
) -> None:
    # Given a completed run whose "test" job failed and "build" passed
    run = two_jobs_one_failing(fake)
    first_jobs = list(run.job_ids)
    # When its failed jobs are re-run
    fake.actions.rerun_failed_jobs(run.run_id)
    # Then attempt 2 of the same run is requested, and only "test" is queued again, as a new job
    (requested,) = sent(fake, "workflow_run", "requested")[1:]
    assert (requested["workflow_run"]["id"], requested["workflow_run"]["run_attempt"]) == (run.run_id, 2)
    assert requested["workflow_run"]["previous_attempt_url"].endswith(f"/runs/{run.run_id}/attempts/1")
    queued = sent(fake, "workflow_job", "queued")[2:]
    assert [(q["workflow_job"]["name"], q["workflow_job"]["run_attempt"]) for q in queued] == [("test", 2)]
    assert queued[0]["workflow_job"]["run_id"] == run.run_id
    assert queued[0]["workflow_job"]["id"] not in first_jobs
    assert first_jobs[0] in run.job_ids  # "build" keeps its attempt-1 result


def test_rerun_all_jobs_queues_every_job_again_under_the_next_attempt(fake: FakeGitHub) -> None:
    # Given a completed run of two jobs
    run = two_jobs_one_failing(fake)
    # When all its jobs are re-run
    fake.actions.rerun_all_jobs(run.run_id)
    # Then both are queued again, in attempt 2, with the same labels
    queued = sent(fake, "workflow_job", "queued")[2:]
    assert sorted(q["workflow_job"]["name"] for q in queued) == ["build", "test"]
    assert {q["workflow_job"]["run_attempt"] for q in queued} == {2}
    assert {tuple(q["workflow_job"]["labels"]) for q in queued} == {(f"pool={run.run_id}/class=large",)}


def test_a_rerun_attempt_completes_with_its_own_attempt_number(fake: FakeGitHub) -> None:
    # Given attempt 2 of a run whose failed job now passes
    run = two_jobs_one_failing(fake)
    fake.actions.rerun_failed_jobs(run.run_id)
    # When its job is served
    serve(fake, run)
    # Then the run completes again, a success, as attempt 2
    completed = sent(fake, "workflow_run", "completed")
    assert [(c["workflow_run"]["run_attempt"], c["workflow_run"]["conclusion"]) for c in completed] == [
        (1, "failure"),
        (2, "success"),
    ]


def test_a_run_is_rerun_only_once_completed_and_within_30_days(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a run still in progress / When re-run / Then refused
    running = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    with pytest.raises(RerunRefusedError):
        fake.actions.rerun_all_jobs(running.run_id)
    # Given a completed run with no failed job / When its failed jobs are re-run / Then refused
    serve(fake, running)
    with pytest.raises(RerunRefusedError):
        fake.actions.rerun_failed_jobs(running.run_id)
    # Given a completed run 30 days and a second old / When re-run / Then refused
    clock.advance(RERUN_WINDOW_SECONDS + 1)
    with pytest.raises(RerunRefusedError):
        fake.actions.rerun_all_jobs(running.run_id)


# --- labels ("Using self-hosted runners in a workflow", "Using labels with self-hosted runners") ------


@pytest.mark.parametrize("defaults", [True, False], ids=["jit-default-labels", "no-default-labels"])
def test_a_runner_carrying_every_label_of_the_job_in_any_case_takes_it(
    fake: FakeGitHub, defaults: bool
) -> None:
    # Given a job asking [self-hosted, Linux, gpu, pool=…], whether or not JIT runners get default labels
    fake.state.jit_default_labels = defaults
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", ("self-hosted", "Linux", "gpu", LABEL))])
    # When a runner registered with all of them, in lower case, asks for work
    taker = runner(fake, "self-hosted", "linux", "gpu", f"pool={run.run_id}/class=large")
    # Then it takes the job
    assert fake.actions.next_job(taker) is not None


def test_without_default_labels_a_runner_registered_with_our_label_alone_gets_no_multi_label_job(
    fake: FakeGitHub,
) -> None:
    # Given JIT runners get no default labels, and a job asking [self-hosted, linux, pool=…]
    fake.state.jit_default_labels = False
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", ("self-hosted", "linux", LABEL))])
    # When a runner registered with the pool label alone asks for work
    taker = runner(fake, f"pool={run.run_id}/class=large")
    # Then it gets nothing: it lacks labels the job asks for
    assert fake.actions.next_job(taker) is None
    assert {label.name for label in taker.labels} == {f"pool={run.run_id}/class=large"}


def test_with_default_labels_a_jit_runner_also_carries_self_hosted_linux_and_x64(fake: FakeGitHub) -> None:
    # Given JIT runners get the default labels / When one is registered with our label and "LINUX"
    fake.state.jit_default_labels = True
    registered = fake.state.register_runner(SCOPE, "i-0abc-1234abcd", ["pool=1", "LINUX"])
    # Then it carries the defaults as read-only labels, once each, and ours as custom
    assert [(label.name, label.type) for label in registered.labels] == [
        ("self-hosted", "read-only"),
        ("Linux", "read-only"),
        ("X64", "read-only"),
        ("pool=1", "custom"),
    ]


# --- a job not picked up is queued again ("Using self-hosted runners in a workflow", Routing) --------


def test_a_job_offered_to_a_runner_that_does_not_pick_it_up_in_60_s_goes_to_another(
    fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given a job offered to a runner that never picks it up
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    label = f"pool={run.run_id}/class=large"
    silent, other = runner(fake, label, name="i-0abc-00000001"), runner(fake, label, name="i-0abc-00000002")
    job = fake.actions.offer(silent)
    assert job is not None
    assert fake.actions.offer(other) is None  # offered to one runner at a time
    # When 60 seconds pass
    clock.advance(REQUEUE_AFTER)
    fake.actions.tick()
    # Then any runner may have it: the other takes it, and the first runner's late pick-up is refused
    assert fake.actions.next_job(other) == job
    with pytest.raises(JobGoneError):
        fake.actions.acquire(silent, job.job_id)
    assert job.runner_name == other.name


def test_a_job_picked_up_in_time_stays_with_its_runner(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a job offered to a runner
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    taker = runner(fake, f"pool={run.run_id}/class=large")
    job = fake.actions.offer(taker)
    assert job is not None
    # When it picks it up just inside 60 seconds
    clock.advance(REQUEUE_AFTER - 1)
    fake.actions.tick()
    # Then the job is in progress on it
    assert fake.actions.acquire(taker, job.job_id).status is JobStatus.IN_PROGRESS


# --- a busy runner that disconnects fails its job (actions/runner#2040) ------------------------------


def test_a_busy_runner_that_disconnects_fails_its_job(fake: FakeGitHub) -> None:
    # Given a runner running a job
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL, seconds=60)])
    taker = runner(fake, f"pool={run.run_id}/class=large")
    job = fake.actions.next_job(taker)
    assert job is not None
    # When the runner disconnects (stopped, or its machine went away)
    fake.actions.disconnect(taker)
    # Then the job fails, the run completes, and GitHub removes the JIT runner
    assert (job.status, job.conclusion) == (JobStatus.COMPLETED, Conclusion.FAILURE)
    assert run.conclusion is Conclusion.FAILURE
    assert taker.runner_id not in fake.state.runners
    # And the fake notes why, for a report of jobs not served
    assert job.failed_because == "its runner disconnected"


# --- queued jobs expire ("Usage limits for self-hosted runners") ---------------------------------------


def test_a_job_queued_too_long_fails_without_a_runner(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given a job no runner ever takes
    run = fake.actions.start_run(REPOSITORY, "ci", [JobSpec("build", LABEL)])
    # When the queue time limit passes (24 hours on GitHub)
    clock.advance(QUEUE_EXPIRY)
    fake.actions.tick()
    # Then the job completes as failed, naming no runner, and so does the run
    (completed,) = sent(fake, "workflow_job", "completed")
    assert (completed["workflow_job"]["conclusion"], completed["workflow_job"]["runner_name"]) == (
        "failure",
        None,
    )
    assert run.conclusion is Conclusion.FAILURE


# --- the seam for limits on the REST endpoints -------------------------------------------------------


def test_a_gate_refuses_a_rest_request_before_its_route_answers(fake: FakeGitHub) -> None:
    # Given a gate that refuses runner registrations with a retry-after, as secondary rate limits do
    seen: list[str] = []

    def limit(route: str, request: Request) -> None:
        seen.append(route)
        raise Refusal(429, "You have exceeded a secondary rate limit.", headers={"retry-after": "7"})

    fake.gates.append(limit)
    token, _ = fake.state.issue_token(INSTALLATION_ID)
    # When a JIT config is asked for
    answer = fake.handle(
        "POST",
        f"/repos/{OWNER}/{REPO}/actions/runners/generate-jitconfig",
        {"Authorization": f"Bearer {token}"},
        json.dumps({"name": "r", "runner_group_id": 1, "labels": ["pool=1"]}).encode(),
    )
    # Then the gate's answer is GitHub's, and no runner was registered
    assert (answer.status, answer.headers.get("retry-after")) == (429, "7")
    assert seen == ["POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"]
    assert fake.state.runners == {}
