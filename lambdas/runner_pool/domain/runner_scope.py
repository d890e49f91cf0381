"""Where the pool's runners are registered on GitHub: one repository's runners, or one organisation's.

The stack config carries one scope. Written as text it is `owner/repo` for a repository and `org`
for an organisation, the way GitHub's own settings pages name them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

_ACCOUNT = r"^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,38})$"
"""A GitHub user or organisation login; GitHub Enterprise Server also allows '_'."""
_REPOSITORY = r"^[A-Za-z0-9._-]{1,100}$"


class RepositoryScope(BaseModel):
    """Runners registered to one repository (`/repos/{owner}/{repo}/actions/runners`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner: str = Field(pattern=_ACCOUNT)
    repo: str = Field(pattern=_REPOSITORY)

    @field_validator("repo")
    @classmethod
    def _not_a_path_step(cls, repo: str) -> str:
        if repo in (".", ".."):
            raise ValueError(f"{repo!r} is not a repository name")
        return repo

    def __str__(self) -> str:
        return f"{self.owner}/{self.repo}"


class OrganizationScope(BaseModel):
    """Runners registered to an organisation (`/orgs/{org}/actions/runners`), usable by its repositories."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    org: str = Field(pattern=_ACCOUNT)

    def __str__(self) -> str:
        return self.org


RunnerScope = RepositoryScope | OrganizationScope


def runner_scope(text: str) -> RunnerScope:
    """`owner/repo` is a repository's scope, `org` an organisation's; anything else is a ValueError."""
    owner, slash, repo = text.strip().partition("/")
    if slash:
        return RepositoryScope(owner=owner, repo=repo)
    return OrganizationScope(org=owner)


def _from_text(value: Any) -> Any:
    return runner_scope(value) if isinstance(value, str) else value


RunnerScopeSetting = Annotated[RunnerScope, BeforeValidator(_from_text)]
"""A config field holding a scope, written either as text (`owner/repo`, `org`) or as its fields."""


class Registration(StrEnum):
    """Where a job's runner is registered so that only the job's repository can take it."""

    REPOSITORY = "repository"
    """At the job's repository: needs the repository permission `administration: write` on every
    repository, which also lets the App change, transfer and delete them (README, GitHub App). The only
    way on a personal account, which has no runner groups."""
    RUNNER_GROUP = "runner-group"
    """At the organisation, in a runner group of `selected` visibility holding only the job's repository
    (by id): needs only the organisation permission `organization_self_hosted_runners: write`."""


REGISTRATION_PERMISSIONS: Mapping[Registration, tuple[str, str]] = MappingProxyType(
    {
        Registration.REPOSITORY: ("administration", "write"),
        Registration.RUNNER_GROUP: ("organization_self_hosted_runners", "write"),
    }
)
"""The App permission, and its level, each registration needs ("GitHub Apps must have the administration
permission for repositories or the organization_self_hosted_runners permission for organizations",
docs.github.com, REST API endpoints for self-hosted runners and for self-hosted runner groups)."""


def registration_for(scope: RunnerScope | None, chosen: Registration | None) -> Registration:
    """The registration a stack uses: `chosen` when the config sets one, else what its scope allows with
    the least privilege. An organisation's scope registers in runner groups; a repository's (one
    repository, or a personal account's, which has no runner groups) at the repository."""
    if chosen is not None:
        return chosen
    return Registration.RUNNER_GROUP if isinstance(scope, OrganizationScope) else Registration.REPOSITORY
