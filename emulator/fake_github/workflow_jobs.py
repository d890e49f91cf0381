"""The fake's "List jobs for a workflow run attempt": how refresh finds a run's jobs still queued.

    GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}/jobs   installation token

As GitHub documents it (docs.github.com, "REST API endpoints for workflow jobs", "List jobs for a
workflow run attempt"): `{"total_count": N, "jobs": [...]}`, `per_page` up to 100 and `page`, each
job in the shape of a `workflow_job` webhook's job, 404 for a run or attempt that does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from emulator.fake_github import payloads
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, per_page, route, whole
from emulator.fake_github.workflow_runs import run_attempt_of

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub


@route("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}/jobs", Auth.INSTALLATION)
def list_jobs_for_attempt(github: FakeGitHub, request: Request) -> Answer:
    state = github.state
    with state.lock:
        run, attempt = run_attempt_of(github, request)
        jobs = [state.jobs[job_id] for job_id in run.job_ids]
        # Attempts are the fake's only where it models re-runs; a run without them has attempt 1.
        of_attempt = [job for job in jobs if getattr(job, "run_attempt", 1) == attempt]
        if not of_attempt and attempt != 1:
            raise Refusal(404, "Not Found")
        size, page = per_page(request), max(1, whole(request.query.get("page", "1")))
        shown = of_attempt[(page - 1) * size : page * size]
        repository_id = state.repository_id(run.repository)
        body: dict[str, Any] = {
            "total_count": len(of_attempt),
            "jobs": [
                payloads.workflow_job(job.status.value, job, run, repository_id, None)["workflow_job"]
                for job in shown
            ],
        }
    return Answer(200, body)
