"""GitHub's word on a workflow run attempt: what its jobs' level of trust is decided from.

GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number} (docs.github.com, "REST API
endpoints for workflow runs", "Get a workflow run attempt": "Gets a specific workflow run attempt";
"Anyone with read access to the repository can use this endpoint", so `actions: read` suffices). Its
answer is a workflow run as the `workflow_run` webhook carries it: `event`, `actor`, `triggering_actor`
and `head_repository` are what a run's level of trust is decided from (domain.trust).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner_pool.adapters.github_api import GitHubApi
from runner_pool.domain.runners import GitHubError
from runner_pool.domain.trust import RunFacts


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Login(_Read):
    login: str = Field(min_length=1)


class _Repository(_Read):
    full_name: str = Field(min_length=3)


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
