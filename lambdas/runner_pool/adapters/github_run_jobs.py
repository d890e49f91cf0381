"""The jobs of a workflow run attempt, as GitHub lists them, for the runs whose demand we serve."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi
from runner_pool.domain.runners import RunJob

if TYPE_CHECKING:
    from githubkit_schemas.latest.models import Job


def run_jobs(api: GitHubApi, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
    """The jobs of one attempt of a workflow run in `repository` (`owner/repo`), and the requests
    it took (one per page of 100): GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/
    {attempt_number}/jobs (docs.github.com, "REST API endpoints for workflow jobs", "List jobs
    for a workflow run attempt"). Needs `actions: read` on the repository."""
    owner, _, repo = repository.partition("/")
    rest = api.rest
    pages = 0

    def listed() -> list[RunJob]:
        nonlocal pages
        jobs: list[RunJob] = []
        page = 1
        while True:
            pages += 1
            response = rest.actions.list_jobs_for_workflow_run_attempt(
                owner, repo, run_id, attempt, per_page=PAGE_SIZE, page=page, headers=api.headers
            )
            data = response.parsed_data
            jobs += [_run_job(job) for job in data.jobs]
            if len(data.jobs) < PAGE_SIZE or len(jobs) >= data.total_count:
                return jobs
            page += 1

    return api.call(listed), pages


def _run_job(job: Job) -> RunJob:
    return RunJob(
        job_id=job.id,
        status=str(job.status),
        labels=tuple(job.labels),
        created_at=job.created_at.timestamp(),
        runner_id=job.runner_id,
        runner_name=job.runner_name,
        name=job.name,
        head_sha=job.head_sha,
    )
