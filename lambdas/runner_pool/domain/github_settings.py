"""The GitHub App settings of DESIGN.md section 9 (`github`): which App or Apps the control plane acts as,
and where its runners are registered."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from runner_pool.domain.github_apps import GitHubAppEntry, repeated
from runner_pool.domain.runner_scope import (
    Registration,
    RepositoryScope,
    RunnerScopeSetting,
    registration_for,
)
from runner_pool.domain.settings import SettingError, Settings


class GitHubSettings(Settings):
    """The GitHub App the control plane acts as, and where its runners are registered."""

    app_id: str | None = None
    """The App's id (or client id); required to deploy."""
    installation_id: int | None = Field(None, gt=0)
    """The App's installation on the organisation or repository; required to deploy."""
    scope: RunnerScopeSetting | None = None
    """`org` for organisation runners, `owner/repo` for one repository's; required to deploy."""
    api_url: str = "https://api.github.com/"
    """`https://<host>/api/v3/` for GitHub Enterprise Server."""
    api_version: str | None = None
    """The `X-GitHub-Api-Version` to send; GitHub Enterprise Server answers only its release's."""
    runner_group_id: int = Field(1, gt=0)
    registration: Registration | None = None
    """Where each job's runner is registered so that only its repository can take it. Left out, it follows
    the scope with the least privilege (`effective_registration`): an organisation's registers in
    `runner-group`s, at the organisation in a runner group of the job's repository alone, made on first use
    (the App needs only `organization_self_hosted_runners: write`; `runner_group_id` is then not used); a
    repository's at that `repository` (the App needs repository `administration: write`: the only way for a
    personal account, which has no runner groups). `repository` on an organisation is the choice to
    register at each job's repository instead."""
    runner_groups_allow_public_repositories: bool = False
    """Whether the runner groups `runner-group` creates take public repositories' jobs (GitHub's default
    for a group is no)."""
    registrations_per_minute: float = Field(150, gt=0)
    """JIT runner registrations the stack makes a minute on average, shared by every provision; GitHub's
    secondary rate limits allow about 180 (900 points a minute per endpoint, 5 points a POST)."""
    registration_burst: int = Field(20, ge=1)
    """How many registrations may go at once after a quiet spell, within the average."""
    private_key_secret_name: str = "runner-pool/github-app-private-key"  # noqa: S105 - a name, not a secret
    webhook_secret_name: str = "runner-pool/github-webhook-secret"  # noqa: S105 - a name, not a secret
    apps: tuple[GitHubAppEntry, ...] = ()
    """Several Apps installed on the scope (domain/github_apps.py), in place of `app_id`, `installation_id`
    and the two secret names: each registration goes through the one with the most budget left."""

    @property
    def every_app(self) -> tuple[GitHubAppEntry, ...]:
        """`apps`, or the one App of the single-App settings (none while its ids are unset)."""
        if self.apps or self.app_id is None or self.installation_id is None:
            return self.apps
        return (
            GitHubAppEntry(
                app_id=self.app_id,
                installation_id=self.installation_id,
                private_key_secret_name=self.private_key_secret_name,
                webhook_secret_name=self.webhook_secret_name,
            ),
        )

    @property
    def webhook_secret_names(self) -> tuple[str, ...]:
        """Every App's webhook secret: a delivery signed with any of them is GitHub's."""
        return tuple(app.webhook_secret_name for app in self.every_app) or (self.webhook_secret_name,)

    @model_validator(mode="after")
    def _one_form_of_apps(self) -> Self:
        if self.apps and (self.app_id is not None or self.installation_id is not None):
            raise SettingError(
                "apps",
                "is set together with app_id or installation_id",
                "list every App under apps (the first as well), or keep the single-App settings",
            )
        shared = repeated(self.apps)
        if shared is not None:
            raise SettingError(
                "apps",
                f"lists {shared[0]} {shared[1]!r} twice",
                "give each App its own id, installation and secrets",
            )
        return self

    @model_validator(mode="after")
    def _runner_groups_are_an_organisations(self) -> Self:
        if self.registration is Registration.RUNNER_GROUP and isinstance(self.scope, RepositoryScope):
            raise SettingError(
                "registration",
                f"runner groups are an organisation's, and the scope {self.scope} is one repository",
                "set scope to the organisation, or leave registration out to register at the repository",
            )
        return self

    @property
    def effective_registration(self) -> Registration:
        """The registration in use: the one set, else the least privileged the scope allows."""
        return registration_for(self.scope, self.registration)
