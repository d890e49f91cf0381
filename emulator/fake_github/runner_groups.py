"""An organisation's self-hosted runner groups, as the fake answers them (docs.github.com, REST API
endpoints for self-hosted runner groups):

    GET  /orgs/{org}/actions/runner-groups                                     installation token
    POST /orgs/{org}/actions/runner-groups                                     installation token
    PATCH /orgs/{org}/actions/runner-groups/{runner_group_id}                  installation token
    PUT  /orgs/{org}/actions/runner-groups/{runner_group_id}/repositories      installation token

"GitHub Apps must have the administration permission for repositories or the
organization_self_hosted_runners permission for organizations": reading needs that permission's read,
a change its write. "All organizations have a single default runner group" ("Managing access to
self-hosted runners using groups"); the others are state.FakeRunnerGroup, whose `admits` is what
actions.Actions checks before it offers a job to a runner of the group.

Where GitHub's documentation is silent the fake makes a choice and says so: a group name the
organisation already has is refused with 409 (the documentation names no answer for it); an unknown
visibility or a repository id that is not a number is a 422, and so is setting the repositories of a
group whose visibility is not `selected` ("The runner group must have visibility set to selected", Add
repository access to a self-hosted runner group in an organization).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from emulator.fake_github.app_settings import organization
from emulator.fake_github.payloads import API
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, invalid, per_page, route, whole
from emulator.fake_github.state import DEFAULT_RUNNER_GROUP_ID, FakeRunnerGroup

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

GROUPS = "/orgs/{org}/actions/runner-groups"
VISIBILITIES = ("all", "selected", "private")
"""`visibility`: "Can be one of: all, selected, private" ("Create a self-hosted runner group for an
organization")."""
_WRITE = ("write", "admin")


@route("GET", GROUPS, Auth.INSTALLATION)
def list_runner_groups(github: FakeGitHub, request: Request) -> Answer:
    """ "List self-hosted runner groups for an organization": the Default group and the organisation's
    others, a page at a time (`per_page`, `page`)."""
    org = organization(request, "organization_self_hosted_runners")
    default = FakeRunnerGroup(DEFAULT_RUNNER_GROUP_ID, org, "Default")
    groups = [default, *github.state.groups_of(org)]
    size = per_page(request)
    page = max(1, whole(request.query.get("page", "1")))
    shown = groups[(page - 1) * size : page * size]
    return Answer(200, {"total_count": len(groups), "runner_groups": [_group_json(g) for g in shown]})


@route("POST", GROUPS, Auth.INSTALLATION)
def create_runner_group(github: FakeGitHub, request: Request) -> Answer:
    """ "Create a self-hosted runner group for an organization": `name` (required), `visibility` (default
    `all`), `selected_repository_ids`, `allows_public_repositories` (default false); 201 with the group."""
    org = organization(request, "organization_self_hosted_runners", _WRITE)
    body, name = _named(request)
    visibility, allows_public = _settings(body, visibility="all", allows_public=False)
    selected = _repository_ids(body.get("selected_repository_ids", []))
    state = github.state
    with state.lock:
        if name.lower() == "default" or any(g.name.lower() == name.lower() for g in state.groups_of(org)):
            raise Refusal(409, f"Runner group name {name} already exists")
        group = state.add_runner_group(
            org,
            state.new_id(),
            name,
            visibility=visibility,
            selected_repository_ids=selected,
            allows_public_repositories=allows_public,
        )
    return Answer(201, _group_json(group))


@route("PATCH", GROUPS + "/{runner_group_id}", Auth.INSTALLATION)
def update_runner_group(github: FakeGitHub, request: Request) -> Answer:
    """ "Update a self-hosted runner group for an organization": `name` (required), `visibility`,
    `allows_public_repositories`; 200 with the group. A group that becomes `selected` keeps the
    repositories it had selected (none for one created `all`)."""
    org = organization(request, "organization_self_hosted_runners", _WRITE)
    body, name = _named(request)
    visibility, allows_public = _settings(body, visibility=None, allows_public=None)
    with github.state.lock:
        group = _group(github, request, org)
        group.name = name
        group.visibility = visibility or group.visibility
        if allows_public is not None:
            group.allows_public_repositories = allows_public
    return Answer(200, _group_json(group))


@route("PUT", GROUPS + "/{runner_group_id}/repositories", Auth.INSTALLATION)
def set_group_repositories(github: FakeGitHub, request: Request) -> Answer:
    """ "Set repository access for a self-hosted runner group in an organization": replaces the group's
    list of repositories (`selected_repository_ids`, required); 204."""
    org = organization(request, "organization_self_hosted_runners", _WRITE)
    body = request.json()
    if not isinstance(body, dict) or "selected_repository_ids" not in body:
        raise invalid("selected_repository_ids", None)
    selected = _repository_ids(body["selected_repository_ids"])
    with github.state.lock:
        group = _group(github, request, org)
        if group.visibility != "selected":
            raise Refusal(422, "The runner group must have visibility set to selected.", [])
        group.selected_repository_ids = selected
    return Answer(204)


def _group(github: FakeGitHub, request: Request, org: str) -> FakeRunnerGroup:
    """The organisation's group the route names (under the state's lock); 404 for another's or none."""
    group = github.state.runner_groups.get(whole(request.params["runner_group_id"]))
    if group is None or group.org.lower() != org.lower():
        raise Refusal(404, "Not Found")
    return group


def _named(request: Request) -> tuple[dict[str, Any], str]:
    """The request's JSON object and the group `name` it must give."""
    body = request.json()
    if not isinstance(body, dict):
        raise Refusal(400, "Problems parsing JSON")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("name", name)
    return body, name


def _settings(body: dict[str, Any], *, visibility: Any, allows_public: Any) -> tuple[Any, Any]:
    """The body's `visibility` and `allows_public_repositories`, each checked, else the defaults given."""
    visibility = body.get("visibility", visibility)
    if visibility is not None and visibility not in VISIBILITIES:
        raise invalid("visibility", visibility)
    allows_public = body.get("allows_public_repositories", allows_public)
    if allows_public is not None and not isinstance(allows_public, bool):
        raise invalid("allows_public_repositories", allows_public)
    return visibility, allows_public


def _repository_ids(value: Any) -> set[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise invalid("selected_repository_ids", value)
    return set(value)


def _group_json(group: FakeRunnerGroup) -> dict[str, Any]:
    url = f"{API}/orgs/{group.org}/actions/runner-groups/{group.runner_group_id}"
    body: dict[str, Any] = {
        "id": group.runner_group_id,
        "name": group.name,
        "visibility": group.visibility,
        "default": group.runner_group_id == DEFAULT_RUNNER_GROUP_ID,
        "runners_url": f"{url}/runners",
        "inherited": False,
        "allows_public_repositories": group.allows_public_repositories,
        "restricted_to_workflows": False,
        "selected_workflows": [],
    }
    if group.visibility == "selected":
        body["selected_repositories_url"] = f"{url}/repositories"
    return body
