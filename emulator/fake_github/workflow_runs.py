"""The fake's workflow run routes: how the dispatcher learns a run's trigger when its `requested` delivery
never came, and how the control plane re-runs a run whose job an interruption failed.

    GET  /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}   installation token
    GET  /repos/{owner}/{repo}/actions/runs/{run_id}                             installation token
    POST /repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs           installation token

As GitHub documents it (docs.github.com, "REST API endpoints for workflow runs", "Get a workflow run
attempt": "Gets a specific workflow run attempt"): the run in the shape of a `workflow_run` webhook's
`workflow_run`, with its `event`, `actor`, `triggering_actor` and `head_repository`; 404 for a run or an
attempt that does not exist. A scenario can make it fail for one run (RunTrigger.read_fails): 503, as
GitHub answers when it is unavailable.

"Get a workflow run" answers the run as its latest attempt has it (`run_attempt`, `status`, `conclusion`).
"Re-run failed jobs from a workflow run" ("Re-run all of the failed jobs and their dependent jobs in a
workflow run using the id of the workflow run"; fine-grained permission "Actions" repository permissions
(write)) answers 201 with an empty object, and the run's next attempt begins as "Re-running workflows and
jobs" says (actions.Actions.rerun_failed_jobs: the same run id, `run_attempt` counted up, only the failed
jobs queued again); a run GitHub will not re-run (not completed, older than 30 days, re-run 50 times
already, nothing failed) is refused with 403, as GitHub refuses a re-run it does not allow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emulator.fake_github import payloads
from emulator.fake_github.actions import RerunRefusedError
from emulator.fake_github.rest import readable_runs
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, route, whole

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub
    from emulator.fake_github.state import FakeWorkflowRun


@route("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}", Auth.INSTALLATION)
def get_run_attempt(github: FakeGitHub, request: Request) -> Answer:
    with github.state.lock:
        run, attempt = run_attempt_of(github, request)
        if not 1 <= attempt <= run.run_attempt:
            raise Refusal(404, "Not Found")
        if run.trigger.read_fails:
            raise Refusal(503, "Service Unavailable")
        body = payloads.run_attempt(run, github.state.repository_id(run.repository))
    # The fake keeps only a run's latest attempt; an earlier one differs in its attempt's own fields.
    body["run_attempt"] = attempt
    return Answer(200, body)


@route("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}", Auth.INSTALLATION)
def get_run(github: FakeGitHub, request: Request) -> Answer:
    state = github.state
    with state.lock:
        run = run_of(github, request)
        return Answer(200, payloads.run_attempt(run, state.repository_id(run.repository)))


@route("POST", "/repos/{owner}/{repo}/actions/runs/{run_id}/rerun-failed-jobs", Auth.INSTALLATION)
def rerun_failed_jobs(github: FakeGitHub, request: Request) -> Answer:
    with github.state.lock:
        run_id = run_of(github, request, "write").run_id
    try:
        github.actions.rerun_failed_jobs(run_id)
    except RerunRefusedError as exc:
        raise Refusal(403, str(exc)) from None
    return Answer(201, {})


def run_attempt_of(github: FakeGitHub, request: Request) -> tuple[FakeWorkflowRun, int]:
    """The run the route names (run_of), and the attempt number its path asks for: whether the run has
    that attempt is the route's to say. Under the state's lock."""
    return run_of(github, request), whole(request.params["attempt_number"])


def run_of(github: FakeGitHub, request: Request, level: str = "read") -> FakeWorkflowRun:
    """The run the route's `run_id` names, if it is the route's repository's and the calling installation
    may read its Actions (or write them, at `level` `write`: rest.readable_runs); else 404 or 403, as GitHub
    answers. Under the state's lock."""
    repository = readable_runs(request, level)
    run = github.state.runs.get(whole(request.params["run_id"]))
    if run is None or run.repository.lower() != repository.lower():
        raise Refusal(404, "Not Found")
    return run
