"""The GitHub REST endpoints runner-pool calls, as the fake answers them.

    POST   /app/installations/{installation_id}/access_tokens        App JWT
    GET    /app/hook/deliveries                                       App JWT
    POST   /app/hook/deliveries/{delivery_id}/attempts                App JWT
    POST   /repos/{owner}/{repo}/actions/runners/generate-jitconfig   installation token
    GET    /repos/{owner}/{repo}/actions/runners                      installation token
    DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}          installation token
    ... and the same three runner endpoints under /orgs/{org}

A request its token's permissions do not cover is refused 403 "Resource not accessible by integration",
GitHub's answer to an installation token without the endpoint's permission (each endpoint's reference
names its "Fine-grained access tokens" permission); a token narrowed at its request has only the
permissions it asked for.

Where GitHub's documentation is silent the fake makes a choice and says so: an unknown runner
group in a JIT request is a 422. A JIT request names 1 to 100 labels (the REST reference's `labels`:
"Minimum items: 1. Maximum items: 100."). Limits on the runner endpoints (GitHub's secondary rate
limits) are not modelled here: FakeGitHub.gates check each request before its route answers it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from emulator.fake_github.routes import Answer, Auth, Refusal, Request, invalid, iso, per_page, route, whole
from emulator.fake_github.state import FakeDelivery, FakeRunner
from runner_pool.domain.runner_scope import OrganizationScope, RepositoryScope, RunnerScope

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

ACCESS_TOKENS = "/app/installations/{installation_id}/access_tokens"


LEVELS = ("read", "write", "admin")
"""A permission's levels, each including the one before ("Permissions required for GitHub Apps": write
access includes read)."""


@route("POST", ACCESS_TOKENS, Auth.APP)
def create_installation_token(github: FakeGitHub, request: Request) -> Answer:
    """ "Create an installation access token for an app" (docs.github.com/rest/apps/apps#create-an-
    installation-access-token-for-an-app; "Generating an installation access token for a GitHub App"):
    the token expires after an hour; `permissions` narrows it to a subset of the installation's. A
    permission the installation was not granted, or at a higher level, is refused with 422, one of the
    statuses the reference lists for the endpoint (the message is the fake's). The answer's
    `permissions` are the token's. `repositories`/`repository_ids` are not modelled (every token covers
    all of the installation's repositories)."""
    installation = github.state.installations.get(whole(request.params["installation_id"]))
    if installation is None or (request.app_id is not None and installation.app_id != request.app_id):
        raise Refusal(404, "Not Found")  # another App's installation is none of this App's
    body = request.json()
    if body is not None and not isinstance(body, dict):
        raise Refusal(400, "Problems parsing JSON")
    asked = (body or {}).get("permissions")
    if asked is not None:
        if not isinstance(asked, dict) or not all(level in LEVELS for level in asked.values()):
            raise invalid("permissions", asked)
        if not all(covers(installation.permissions.get(name), level) for name, level in asked.items()):
            raise Refusal(422, "The permissions requested are not granted to this installation.")
    token, expires_at = github.state.issue_token(installation.installation_id, asked)
    return Answer(
        201,
        {
            "token": token,
            "expires_at": iso(expires_at),
            "permissions": dict(installation.permissions if asked is None else asked),
            "repository_selection": "all",
        },
    )


def covers(granted: str | None, needed: str) -> bool:
    """Whether a permission at level `granted` allows what `needed` does."""
    return granted in LEVELS and LEVELS.index(granted) >= LEVELS.index(needed)


def readable_runs(request: Request, level: str = "read") -> str:
    """The repository (`owner/repo`) a run route names, if the calling installation owns it and its token
    may read Actions ("Actions" repository permissions (read), the fine-grained permission of the workflow
    run and job endpoints), or write them at `level` `write` (re-running); else 404 or 403 as GitHub
    answers."""
    return permitted_repository(request, "actions", level)


def permitted_repository(request: Request, permission: str, level: str) -> str:
    """The repository (`owner/repo`) a route names, if the calling installation owns it and its token has
    `permission` at `level` or above; else 404 or 403 as GitHub answers."""
    installation = request.installation
    params = request.params
    if installation is None or not installation.covers(f"{params['owner']}/{params['repo']}"):
        raise Refusal(404, "Not Found")
    if not covers(installation.permissions.get(permission), level):
        raise Refusal(403, "Resource not accessible by integration")
    return f"{params['owner']}/{params['repo']}"


@route("POST", "/repos/{owner}/{repo}/actions/runners/generate-jitconfig", Auth.INSTALLATION)
@route("POST", "/orgs/{org}/actions/runners/generate-jitconfig", Auth.INSTALLATION)
def generate_jitconfig(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    body = request.json()
    if not isinstance(body, dict):
        raise Refusal(400, "Problems parsing JSON")
    name, group, labels = body.get("name"), body.get("runner_group_id"), body.get("labels")
    if not isinstance(name, str) or not name:
        raise invalid("name", name)
    if not isinstance(group, int) or isinstance(group, bool):
        raise invalid("runner_group_id", group)
    if not isinstance(labels, list) or not 1 <= len(labels) <= 100:
        raise invalid("labels", labels)
    if not all(isinstance(label, str) and label for label in labels):
        raise invalid("labels", labels)
    work_folder = body.get("work_folder", "_work")
    state = github.state
    with state.lock:
        if not state.has_runner_group(scope, group):
            raise Refusal(422, f"Invalid request.\n\nNo runner group with id {group}.", [])
        if state.runners_in(scope, name):
            raise Refusal(409, f"Already exists - A runner with the name {name} already exists.")
        runner = state.register_runner(scope, name, labels, group, work_folder)
    return Answer(201, {"runner": _runner_json(runner), "encoded_jit_config": github.jit_config_for(runner)})


@route("GET", "/repos/{owner}/{repo}/actions/runners", Auth.INSTALLATION)
@route("GET", "/orgs/{org}/actions/runners", Auth.INSTALLATION)
def list_runners(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    runners = github.state.runners_in(scope, request.query.get("name"))
    size = per_page(request)
    page = max(1, whole(request.query.get("page", "1")))
    shown = runners[(page - 1) * size : page * size]
    last = max(1, -(-len(runners) // size))
    links = {"next": page + 1, "last": last} if page < last else {}
    if page > 1:
        links = {"prev": page - 1, "first": 1, **links}
    headers = {}
    if links:
        keep = {k: v for k, v in request.query.items() if k != "page"} | {"per_page": str(size)}
        headers["Link"] = ", ".join(
            f'<{github.link(request.path, keep | {"page": str(number)})}>; rel="{rel}"'
            for rel, number in links.items()
        )
    body = {"total_count": len(runners), "runners": [_runner_json(runner) for runner in shown]}
    return Answer(200, body, headers)


@route("DELETE", "/repos/{owner}/{repo}/actions/runners/{runner_id}", Auth.INSTALLATION)
@route("DELETE", "/orgs/{org}/actions/runners/{runner_id}", Auth.INSTALLATION)
def delete_runner(github: FakeGitHub, request: Request) -> Answer:
    scope = _runner_scope(request)
    state = github.state
    with state.lock:
        runner = state.runners.get(whole(request.params["runner_id"]))
        if runner is None or runner.scope != scope:
            raise Refusal(404, "Not Found")
        if runner.busy:
            raise Refusal(422, f'Bad request - Runner "{runner.name}" is still running a job"', [])
        del state.runners[runner.runner_id]
    return Answer(204)


@route("GET", "/app/hook/deliveries", Auth.APP)
def list_deliveries(github: FakeGitHub, request: Request) -> Answer:
    """Newest first, a page at a time; the `next` link carries an opaque cursor, as GitHub's does."""
    size = per_page(request)
    cursor = request.query.get("cursor")
    before = None
    if cursor is not None:
        if not re.fullmatch(r"v1_\d+", cursor):
            raise Refusal(400, "Invalid cursor")
        before = int(cursor.removeprefix("v1_"))
    with github.state.lock:
        newest_first = sorted(github.state.deliveries.values(), key=lambda d: d.delivery_id, reverse=True)
    matching = [d for d in newest_first if before is None or d.delivery_id < before]
    shown = matching[:size]
    headers = {}
    if len(matching) > size:
        keep = {k: v for k, v in request.query.items() if k != "cursor"} | {"per_page": str(size)}
        next_url = github.link(request.path, keep | {"cursor": f"v1_{shown[-1].delivery_id}"})
        headers["Link"] = f'<{next_url}>; rel="next"'
    return Answer(200, [_delivery_json(delivery) for delivery in shown], headers)


@route("POST", "/app/hook/deliveries/{delivery_id}/attempts", Auth.APP)
def redeliver(github: FakeGitHub, request: Request) -> Answer:
    delivery_id = whole(request.params["delivery_id"])
    if delivery_id not in github.state.deliveries:
        raise Refusal(404, "Not Found")
    github.webhooks.redeliver(delivery_id)
    return Answer(202, {})


# --- shapes ---------------------------------------------------------------------------------------


def _runner_scope(request: Request) -> RunnerScope:
    """The scope a runner route names, if the calling installation may manage its runners."""
    installation = request.installation
    if installation is None:
        raise Refusal(401, "Bad credentials")
    params = request.params
    if "org" in params:
        scope: RunnerScope = OrganizationScope(org=params["org"])
        account, permission = params["org"], "organization_self_hosted_runners"
    else:
        scope = RepositoryScope(owner=params["owner"], repo=params["repo"])
        account, permission = params["owner"], "administration"
    if not installation.owns(account):
        raise Refusal(404, "Not Found")
    if installation.permissions.get(permission) != "write":
        raise Refusal(403, "Resource not accessible by integration")
    return scope


def _runner_json(runner: FakeRunner) -> dict[str, Any]:
    return {
        "id": runner.runner_id,
        "runner_group_id": runner.runner_group_id,
        "name": runner.name,
        "os": runner.os,
        "status": "online" if runner.online else "offline",
        "busy": runner.busy,
        "ephemeral": True,
        "labels": [{"id": label.label_id, "name": label.name, "type": label.type} for label in runner.labels],
    }


def _delivery_json(delivery: FakeDelivery) -> dict[str, Any]:
    return {
        "id": delivery.delivery_id,
        "guid": delivery.guid,
        "delivered_at": iso(delivery.delivered_at),
        "redelivery": delivery.redelivery,
        "duration": 0.27,
        "status": delivery.status,
        "status_code": delivery.status_code,
        "event": delivery.event,
        "action": delivery.action,
        "installation_id": delivery.installation_id,
        "repository_id": delivery.repository_id,
        "throttled_at": None,
    }
