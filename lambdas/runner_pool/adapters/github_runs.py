"""GitHub's word on a workflow run: what its jobs' level of trust is decided from, and its re-run.

GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number} (docs.github.com, "REST API
endpoints for workflow runs", "Get a workflow run attempt": "Gets a specific workflow run attempt";
"Anyone with read access to the repository can use this endpoint", so `actions: read` suffices). Its
answer is a workflow run as the `workflow_run` webhook carries it: `event`, `actor`, `triggering_actor`
and `head_repository` are what a run's level of trust is decided from (domain.trust).

GET /repos/{owner}/{repo}/actions/runs/{run_id} ("Get a workflow run") answers the run as its latest
attempt has it: `status`, `conclusion` and `run_attempt`, what a re-run is decided from (domain.reruns).
POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs ("Re-run failed jobs from a workflow
run": "Re-run all of the failed jobs and their dependent jobs in a workflow run using the id of the
workflow run"; 201 with no content) needs "Actions" repository permissions (write).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner_pool.adapters.github_api import GitHubApi
from runner_pool.domain.reruns import RunNow
from runner_pool.domain.runners import GitHubError
from runner_pool.domain.trust import RunFacts


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Login(_Read):
    login: str = Field(min_length=1)


class _Repository(_Read):
    full_name: str = Field(min_length=3)


class _Run(_Read):
    status: str = Field(min_length=1)
    conclusion: str | None = None
    run_attempt: int = Field(gt=0)


class _RunAttempt(_Read):
    event: str = Field(min_length=1)
    actor: _Login | None = None
    triggering_actor: _Login | None = None
    head_repository: _Repository | None = None


def run_attempt(api: GitHubApi, repository: str, run_id: int, attempt: int) -> RunFacts:
    """What GitHub says about one attempt of a run of `repository` (`owner/repo`); a GitHubError when it
    does not answer, or when its answer lacks what a level is decided from. Only the fields read are
    checked: the rest of a run's description is none of this read's business."""
    owner, _, repo = repository.partition("/")
    rest = api.rest

    def get() -> dict[str, Any]:
        response = rest.actions.get_workflow_run_attempt(
            owner, repo, run_id, attempt, exclude_pull_requests=True, headers=api.headers
        )
        body: dict[str, Any] = response.raw_response.json()
        return body

    body = api.call(get)
    try:
        run = _RunAttempt.model_validate(body)
    except ValidationError as exc:
        raise GitHubError(f"run {run_id} attempt {attempt} of {repository}: {exc}") from None
    return RunFacts(
        repository=repository,
        event=run.event,
        actor=None if run.actor is None else run.actor.login,
        triggering_actor=None if run.triggering_actor is None else run.triggering_actor.login,
        head_repository=None if run.head_repository is None else run.head_repository.full_name,
    )


def run_now(api: GitHubApi, repository: str, run_id: int) -> RunNow:
    """What GitHub says of a run of `repository` now, as its latest attempt has it; a GitHubError when it
    does not answer, or answers without the fields a re-run is decided from."""
    owner, _, repo = repository.partition("/")
    rest = api.rest

    def get() -> dict[str, Any]:
        response = rest.actions.get_workflow_run(
            owner, repo, run_id, exclude_pull_requests=True, headers=api.headers
        )
        body: dict[str, Any] = response.raw_response.json()
        return body

    try:
        run = _Run.model_validate(api.call(get))
    except ValidationError as exc:
        raise GitHubError(f"run {run_id} of {repository}: {exc}") from None
    return RunNow(status=run.status, conclusion=run.conclusion, latest_attempt=run.run_attempt)


def rerun_failed_jobs(api: GitHubApi, repository: str, run_id: int) -> None:
    """Ask GitHub to re-run the failed jobs of a run of `repository` as its next attempt."""
    owner, _, repo = repository.partition("/")
    rest = api.rest
    api.call(lambda: rest.actions.re_run_workflow_failed_jobs(owner, repo, run_id, headers=api.headers))
