"""Check runs, the one thing the control plane writes on a repository: why a job waits for capacity.

POST /repos/{owner}/{repo}/check-runs and PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}
(docs.github.com, "REST API endpoints for check runs", "Create a check run", "Update a check run"); both
need "Checks" repository permissions (write) and a GitHub App. A check run shows on its `head_sha`
commit, beside the workflow's own checks, with its `output`'s title and summary.
"""

from __future__ import annotations

from typing import Any

from runner_pool.adapters.github_api import GitHubApi
from runner_pool.domain.capacity_waits import Conclusion
from runner_pool.domain.runners import GitHubError


def create_check_run(
    api: GitHubApi, repository: str, *, head_sha: str, name: str, title: str, summary: str
) -> int:
    """A check run in progress on `head_sha` of `repository` (`owner/repo`); its id."""
    owner, _, repo = repository.partition("/")

    def create() -> dict[str, Any]:
        response = api.rest.checks.create(
            owner,
            repo,
            headers=api.headers,
            data={
                "name": name,
                "head_sha": head_sha,
                "status": "in_progress",
                "output": {"title": title, "summary": summary},
            },
        )
        body: dict[str, Any] = response.raw_response.json()
        return body

    body = api.call(create)
    check_run_id = body.get("id")
    if not isinstance(check_run_id, int):
        raise GitHubError(f"a check run created on {repository} came back without an id")
    return check_run_id


def complete_check_run(
    api: GitHubApi, repository: str, check_run_id: int, *, conclusion: Conclusion, title: str, summary: str
) -> None:
    """The check run completed with `conclusion` and a last word."""
    owner, _, repo = repository.partition("/")

    def update() -> None:
        api.rest.checks.update(
            owner,
            repo,
            check_run_id,
            headers=api.headers,
            status="completed",
            conclusion=conclusion,
            output={"title": title, "summary": summary},
        )

    api.call(update)
