"""The fake's check runs: how the control plane tells a job's author why the job waits.

    POST  /repos/{owner}/{repo}/check-runs                   installation token, `checks: write`
    PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}    installation token, `checks: write`

As GitHub documents them (docs.github.com, "REST API endpoints for check runs", "Create a check run" and
"Update a check run"): `name` and `head_sha` are required to create one; `status` is `queued`,
`in_progress` or `completed` (default `queued`), a completed one needs a `conclusion` (`action_required`,
`cancelled`, `failure`, `neutral`, `success`, `skipped`, `stale` or `timed_out`), and `output` carries a
`title` and a `summary` (both required when `output` is given). The fine-grained permission of both is
"Checks" repository permissions (write); "To create a check run, you must use a GitHub App". Created is
201, updated 200, each with the check run; a check run of another repository, or none, is 404. A check run
is its App's ("A check suite is a collection of the check runs created by a single GitHub App", "Using
the REST API to interact with checks"): another App's update is refused 403 with "Invalid app_id `<id>` -
check run can only be modified by the GitHub App that created it.", as GitHub answers it (quoted in
int128/argocd-commenter#631 and OP5dev/TF-via-PR#538).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from emulator.fake_github.rest import permitted_repository
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, invalid, iso, route, whole

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

STATUSES = ("queued", "in_progress", "completed")
CONCLUSIONS = (
    "action_required",
    "cancelled",
    "failure",
    "neutral",
    "success",
    "skipped",
    "stale",
    "timed_out",
)


@route("POST", "/repos/{owner}/{repo}/check-runs", Auth.INSTALLATION)
def create_check_run(github: FakeGitHub, request: Request) -> Answer:
    repository = permitted_repository(request, "checks", "write")
    body = _body(request)
    name, head_sha = body.get("name"), body.get("head_sha")
    if not isinstance(name, str) or not name:
        raise invalid("name", name)
    if not isinstance(head_sha, str) or not head_sha:
        raise invalid("head_sha", head_sha)
    state = github.state
    check_run: dict[str, Any] = {
        "id": state.new_id(),
        "name": name,
        "head_sha": head_sha,
        "repository": repository,
        "status": "queued",
        "conclusion": None,
        "started_at": iso(state.clock.now()),
        "completed_at": None,
        "output": {"title": None, "summary": None, "text": None},
        "updates": 0,
        "app_id": _app_of(request),
    }
    _apply(check_run, body, state.clock.now())
    with state.lock:
        state.check_runs[check_run["id"]] = check_run
        return Answer(201, _shown(check_run))


@route("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}", Auth.INSTALLATION)
def update_check_run(github: FakeGitHub, request: Request) -> Answer:
    repository = permitted_repository(request, "checks", "write")
    body = _body(request)
    state = github.state
    with state.lock:
        check_run = state.check_runs.get(whole(request.params["check_run_id"]))
        if check_run is None or check_run["repository"].lower() != repository.lower():
            raise Refusal(404, "Not Found")
        if check_run["app_id"] != _app_of(request):
            raise Refusal(
                403,
                f"Invalid app_id `{_app_of(request)}` - check run can only be modified by the GitHub App "
                "that created it.",
            )
        _apply(check_run, body, state.clock.now())
        check_run["updates"] += 1
        return Answer(200, _shown(check_run))


def _app_of(request: Request) -> int:
    return 0 if request.installation is None else request.installation.app_id


def _body(request: Request) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise Refusal(400, "Problems parsing JSON")
    return body


def _apply(check_run: dict[str, Any], body: dict[str, Any], now: float) -> None:
    """The fields a create or an update sets, validated as GitHub validates them, before any is set."""
    status = body.get("status", check_run["status"])
    conclusion = body.get("conclusion", check_run["conclusion"])
    if status not in STATUSES:
        raise invalid("status", status)
    if conclusion is not None and conclusion not in CONCLUSIONS:
        raise invalid("conclusion", conclusion)
    if status == "completed" and conclusion is None:
        raise invalid("conclusion", None)
    output = body.get("output")
    if output is not None and (
        not isinstance(output, dict) or not output.get("title") or not output.get("summary")
    ):
        raise invalid("output", output)
    if conclusion is not None:
        status = (
            "completed"  # "Providing conclusion will automatically set the status parameter to completed"
        )
    check_run["status"], check_run["conclusion"] = status, conclusion
    if status == "completed" and check_run["completed_at"] is None:
        check_run["completed_at"] = iso(now)
    if output is not None:
        check_run["output"] = {key: output.get(key) for key in ("title", "summary", "text")}


def _shown(check_run: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in check_run.items() if key not in ("repository", "updates", "app_id")}
