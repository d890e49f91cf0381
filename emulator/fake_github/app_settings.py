"""The GitHub REST endpoints `runner-pool doctor` reads: the App's settings, an organisation's runner policy.

    GET /app                                                   App JWT
    GET /app/installations/{installation_id}                   App JWT
    GET /app/hook/config                                       App JWT
    GET /orgs/{org}/actions/permissions/self-hosted-runners    installation token
    (and the runner groups, in runner_groups.py)

Each answers from GitHubState, which a test sets to each way a deployment goes wrong: the App's
permissions and events (`app_permissions`, `app_events`), an installation's accepted permissions, the
webhook (`webhooks.url`, `webhooks.secret`, `hook_content_type`), an organisation's policy
(`runner_policies`).

Where GitHub's documentation is silent the fake makes a choice and says so: the runner policy is read
with the organisation's `organization_administration` permission (read), as GitHub documents for the
organisation's other Actions permission endpoints ("GitHub Apps must have the administration
organization permission", GET /orgs/{org}/actions/permissions); the runner groups with
`organization_self_hosted_runners` ("GitHub Apps must have ... the organization_self_hosted_runners
permission for organizations", REST API endpoints for self-hosted runner groups).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from emulator.fake_github.payloads import API, WEB, account_json
from emulator.fake_github.routes import Answer, Auth, Refusal, Request, iso, route, whole
from emulator.fake_github.state import FakeInstallation

if TYPE_CHECKING:
    from emulator.fake_github.server import FakeGitHub

APP_SLUG = "runner-pool"
CREATED_AT = 1_700_000_000.0
HIDDEN_SECRET = "********"  # noqa: S105 - how GitHub shows a set secret, not one
"""GitHub's answer for a webhook secret that is set ("Get a webhook configuration for an app": the
`secret` "will be redacted")."""


@route("GET", "/app", Auth.APP)
def get_app(github: FakeGitHub, request: Request) -> Answer:
    """ "Get the authenticated app" (docs.github.com/rest/apps/apps#get-the-authenticated-app): the App,
    with its `permissions` and the `events` it is subscribed to."""
    state = github.state
    with state.lock:
        return Answer(
            200,
            {
                "id": state.app_id,
                "slug": APP_SLUG,
                "node_id": f"A_{state.app_id}",
                "owner": account_json("octo-org", 9000, "Organization"),
                "name": APP_SLUG,
                "description": "warm-pool runners",
                "external_url": WEB,
                "html_url": f"{WEB}/apps/{APP_SLUG}",
                "created_at": iso(CREATED_AT),
                "updated_at": iso(CREATED_AT),
                "permissions": dict(state.app_permissions),
                "events": list(state.app_events),
                "installations_count": len(state.installations),
            },
        )


@route("GET", "/app/installations/{installation_id}", Auth.APP)
def get_installation(github: FakeGitHub, request: Request) -> Answer:
    """ "Get an installation for the authenticated app" (docs.github.com/rest/apps/apps#get-an-installation-
    for-the-authenticated-app): whose it is and the permissions its owner accepted."""
    installation_id = whole(request.params["installation_id"])
    state = github.state
    with state.lock:
        installation = state.installations.get(installation_id)
        if installation is None:
            raise Refusal(404, "Not Found")
        return Answer(200, installation_json(installation, state.app_id, state.app_events))


@route("GET", "/app/hook/config", Auth.APP)
def get_hook_config(github: FakeGitHub, request: Request) -> Answer:
    """ "Get a webhook configuration for an app" (docs.github.com/rest/apps/webhooks#get-a-webhook-
    configuration-for-an-app): where deliveries go (the fake's Webhooks), in which content type, and
    whether a secret is set (redacted)."""
    webhooks = github.webhooks
    return Answer(
        200,
        {
            "url": webhooks.url or "",
            "content_type": github.state.hook_content_type,
            "secret": HIDDEN_SECRET if webhooks.secret else None,
            "insecure_ssl": "0",
        },
    )


@route("GET", "/orgs/{org}/actions/permissions/self-hosted-runners", Auth.INSTALLATION)
def get_runner_policy(github: FakeGitHub, request: Request) -> Answer:
    """ "Get self-hosted runners settings for an organization" (docs.github.com/rest/actions/permissions#get-
    self-hosted-runners-settings-for-an-organization): `enabled_repositories`, all, selected or none."""
    org = organization(request, "organization_administration")
    policy = github.state.runner_policies.get(org.lower(), "all")
    body: dict[str, Any] = {"enabled_repositories": policy}
    if policy == "selected":
        body["selected_repositories_url"] = (
            f"{API}/orgs/{org}/actions/permissions/self-hosted-runners/repositories"
        )
    return Answer(200, body)


# --- shapes ---------------------------------------------------------------------------------------


def organization(
    request: Request, permission: str, access: tuple[str, ...] = ("read", "write", "admin")
) -> str:
    """The organisation a route names, if the calling installation is its and may read this."""
    installation = request.installation
    if installation is None:
        raise Refusal(401, "Bad credentials")
    org = request.params["org"]
    if not installation.owns(org) or not installation.organization:
        raise Refusal(404, "Not Found")
    if installation.permissions.get(permission) not in access:
        raise Refusal(403, "Resource not accessible by integration")
    return org


def installation_json(installation: FakeInstallation, app_id: int, events: list[str]) -> dict[str, Any]:
    kind = "Organization" if installation.organization else "User"
    account_id = 9000 + installation.installation_id
    settings = (
        f"{WEB}/organizations/{installation.account}/settings/installations/{installation.installation_id}"
        if installation.organization
        else f"{WEB}/settings/installations/{installation.installation_id}"
    )
    return {
        "id": installation.installation_id,
        "account": account_json(installation.account, account_id, kind),
        "repository_selection": installation.repository_selection,
        "access_tokens_url": f"{API}/app/installations/{installation.installation_id}/access_tokens",
        "repositories_url": f"{API}/installation/repositories",
        "html_url": settings,
        "app_id": app_id,
        "target_id": account_id,
        "target_type": kind,
        "permissions": dict(installation.permissions),
        "events": list(events),
        "created_at": iso(CREATED_AT),
        "updated_at": iso(CREATED_AT),
        "single_file_name": None,
        "app_slug": APP_SLUG,
        "suspended_by": None,
        "suspended_at": None,
    }
