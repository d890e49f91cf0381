"""The fake's own runner protocol: how a runner started from a JIT config connects, takes its job and reports.

Not GitHub's protocol (the real runner talks to the Actions service's message broker), only as much
of it as the emulator's runner program needs, kept small. The runner authenticates with the token
in its JIT config (`.credentials`); a runner GitHub has removed is refused with 401.

    POST   /_runner/session                connect: the runner is online
    DELETE /_runner/session                disconnect: offline (the runner was stopped)
    GET    /_runner/job                    200 with the job offered to the runner, or 204: nothing yet
    POST   /_runner/jobs/{job_id}/acquire  pick up the job offered; 410 once it was offered elsewhere
    POST   /_runner/jobs/{job_id}/renew    still working on it; 410 when the job is not its own any more
    POST   /_runner/jobs/{job_id}/result   {"conclusion": "success" | "failure"}; the job is over
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from emulator.fake_github.actions import JobGoneError
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, route, whole
from emulator.fake_github.state import Conclusion, FakeRunner

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

SESSION = "/_runner/session"
JOB = "/_runner/job"


@route("POST", SESSION, Auth.RUNNER)
def connect(github: FakeGitHub, request: Request) -> Answer:
    runner = _runner(request)
    github.actions.connect(runner)
    return Answer(201, {"runner_id": runner.runner_id, "name": runner.name})


@route("DELETE", SESSION, Auth.RUNNER)
def disconnect(github: FakeGitHub, request: Request) -> Answer:
    github.actions.disconnect(_runner(request))
    return Answer(204)


@route("GET", JOB, Auth.RUNNER)
def next_job(github: FakeGitHub, request: Request) -> Answer:
    job = github.actions.offer(_runner(request))
    if job is None:
        return Answer(204)
    # What the job's steps come to: the emulator's runner reports it as the job's result.
    conclusion = Conclusion.FAILURE if job.fails else Conclusion.SUCCESS
    body = {
        "job_id": job.job_id,
        "run_id": job.run_id,
        "name": job.name,
        "seconds": job.seconds,
        "conclusion": conclusion.value,
    }
    return Answer(200, body)


@route("POST", "/_runner/jobs/{job_id}/acquire", Auth.RUNNER)
def acquire(github: FakeGitHub, request: Request) -> Answer:
    return _on_job(request, github.actions.acquire, "The job is no longer offered to this runner")


@route("POST", "/_runner/jobs/{job_id}/renew", Auth.RUNNER)
def renew(github: FakeGitHub, request: Request) -> Answer:
    return _on_job(request, github.actions.renew, "The job is no longer assigned to this runner")


@route("POST", "/_runner/jobs/{job_id}/result", Auth.RUNNER)
def report(github: FakeGitHub, request: Request) -> Answer:
    body = request.json()
    if not isinstance(body, dict) or body.get("conclusion") not in ("success", "failure"):
        raise Refusal(422, "conclusion must be success or failure", [])
    conclusion = Conclusion(body["conclusion"])
    return _on_job(
        request,
        lambda runner, job_id: github.actions.finish(runner, job_id, conclusion),
        "The job is no longer assigned to this runner",
    )


def _on_job(request: Request, act: Callable[[FakeRunner, int], object], gone: str) -> Answer:
    """`act` on the job the path names, as the request's runner; 410 with `gone` when the job is not the
    runner's to act on any more (the same answer for each of the runner's calls about its job)."""
    try:
        act(_runner(request), whole(request.params["job_id"]))
    except JobGoneError:
        raise Refusal(410, gone) from None
    return Answer(204)


def _runner(request: Request) -> FakeRunner:
    if request.runner is None:
        raise Refusal(401, "Bad credentials")
    return request.runner
