"""The fake's "Get a workflow run attempt": how the dispatcher learns a run's trigger when its `requested`
delivery never came.

    GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}   installation token

As GitHub documents it (docs.github.com, "REST API endpoints for workflow runs", "Get a workflow run
attempt": "Gets a specific workflow run attempt"): the run in the shape of a `workflow_run` webhook's
`workflow_run`, with its `event`, `actor`, `triggering_actor` and `head_repository`; 404 for a run or an
attempt that does not exist. A scenario can make it fail for one run (RunTrigger.read_fails): 503, as
GitHub answers when it is unavailable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emulator.fake_github import payloads
from emulator.fake_github.rest import readable_runs
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, route, whole

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub


@route("GET", "/repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}", Auth.INSTALLATION)
def get_run_attempt(github: FakeGitHub, request: Request) -> Answer:
    repository = readable_runs(request)
    params = request.params
    state = github.state
    run_id, attempt = whole(params["run_id"]), whole(params["attempt_number"])
    with state.lock:
        run = state.runs.get(run_id)
        if run is None or run.repository.lower() != repository.lower() or not 1 <= attempt <= run.run_attempt:
            raise Refusal(404, "Not Found")
        if run.trigger.read_fails:
            raise Refusal(503, "Service Unavailable")
        body = payloads.run_attempt(run, state.repository_id(run.repository))
    # The fake keeps only a run's latest attempt; an earlier one differs in its attempt's own fields.
    body["run_attempt"] = attempt
    return Answer(200, body)
