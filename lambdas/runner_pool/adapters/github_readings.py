"""What `runner-pool doctor` reads of the GitHub App: its grant, installation, webhook and organisation.

Each read answers a reading of domain/doctor_readings.py, or an Unread with GitHub's own words when it could
not be made: the doctor reports it instead of stopping.
"""

from __future__ import annotations

from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi, validated
from runner_pool.domain.doctor_readings import AppGrant, HookConfig, Installation, RunnerPolicy, Unread
from runner_pool.domain.runners import GitHubError, GitHubForbiddenError, GitHubNotFoundError


def app_grant(api: GitHubApi) -> AppGrant | Unread:
    """The App's permissions and events: GET /app with the App JWT ("Get the authenticated app",
    docs.github.com/rest/apps/apps#get-the-authenticated-app)."""
    rest = api.rest
    try:
        body = api.call(lambda: validated(rest.apps.get_authenticated(headers=api.headers)))
    except GitHubError as exc:
        return _unread(exc)
    return AppGrant(dict(body.get("permissions") or {}), frozenset(body.get("events") or ()))


def installation(api: GitHubApi) -> Installation | Unread:
    """This installation's account and accepted permissions: GET /app/installations/{installation_id}
    ("Get an installation for the authenticated app", docs.github.com/rest/apps/apps#get-an-
    installation-for-the-authenticated-app)."""
    rest = api.rest
    try:
        body = api.call(
            lambda: validated(rest.apps.get_installation(api.installation_id, headers=api.headers))
        )
    except GitHubError as exc:
        return _unread(exc)
    account = body.get("account") or {}
    return Installation(
        str(account.get("login", "")),
        body.get("target_type") == "Organization",
        dict(body.get("permissions") or {}),
    )


def hook_config(api: GitHubApi) -> HookConfig | Unread:
    """The App's webhook: GET /app/hook/config ("Get a webhook configuration for an app",
    docs.github.com/rest/apps/webhooks#get-a-webhook-configuration-for-an-app); GitHub answers a set
    secret as `********`."""
    rest = api.rest
    try:
        body = api.call(lambda: validated(rest.apps.get_webhook_config_for_app(headers=api.headers)))
    except GitHubError as exc:
        return _unread(exc)
    return HookConfig(body.get("url"), body.get("content_type"), bool(body.get("secret")))


def runner_policy(api: GitHubApi, org: str) -> RunnerPolicy | Unread:
    """Which repositories of `org` may create repository-level self-hosted runners: GET
    /orgs/{org}/actions/permissions/self-hosted-runners ("Get self-hosted runners settings for an
    organization", docs.github.com/rest/actions/permissions#get-self-hosted-runners-settings-for-an-
    organization), `enabled_repositories`."""
    rest = api.rest
    try:
        body = api.call(
            lambda: validated(
                rest.actions.get_self_hosted_runners_permissions_organization(org, headers=api.headers)
            )
        )
    except GitHubError as exc:
        return _unread(exc)
    return RunnerPolicy(body["enabled_repositories"])


def runner_groups(api: GitHubApi, org: str) -> tuple[int, ...] | Unread:
    """The ids of `org`'s runner groups: GET /orgs/{org}/actions/runner-groups ("List self-hosted runner
    groups for an organization", docs.github.com/rest/actions/self-hosted-runner-groups), first page of
    100: enough to find the configured one in any organisation we know of."""
    rest = api.rest
    try:
        body = api.call(
            lambda: validated(
                rest.actions.list_self_hosted_runner_groups_for_org(
                    org, per_page=PAGE_SIZE, headers=api.headers
                )
            )
        )
    except GitHubError as exc:
        return _unread(exc)
    return tuple(int(group["id"]) for group in body.get("runner_groups", []))


def _unread(exc: GitHubError) -> Unread:
    """A read the doctor could not make; refused for want of a permission when GitHub said 403 or 404 (what
    it answers an installation for a resource it may not see)."""
    return Unread(str(exc), forbidden=isinstance(exc, GitHubForbiddenError | GitHubNotFoundError))
