"""The runner scope: a repository or an organisation, read from the text an operator writes."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from runner_pool.domain.runner_scope import (
    OrganizationScope,
    RepositoryScope,
    RunnerScopeSetting,
    runner_scope,
)


class _Settings(BaseModel):
    scope: RunnerScopeSetting


def test_owner_slash_repo_is_a_repository() -> None:
    # Given the text of a repository
    # When it is read as a scope
    scope = runner_scope("octo-org/app.web")

    # Then it names that repository, and reads back as written
    assert scope == RepositoryScope(owner="octo-org", repo="app.web")
    assert str(scope) == "octo-org/app.web"


def test_a_bare_name_is_an_organisation() -> None:
    # Given the text of an organisation
    # When it is read as a scope
    scope = runner_scope("octo-org")

    # Then it names that organisation
    assert scope == OrganizationScope(org="octo-org")


@pytest.mark.parametrize("text", ["", "octo/app/extra", "-octo", "octo/..", "octo/", "oc to"])
def test_text_that_names_no_repository_or_organisation_is_refused(text: str) -> None:
    # Given text GitHub would not accept as an owner or repository name
    # When it is read as a scope
    # Then it is refused
    with pytest.raises(ValueError, match="validation error"):
        runner_scope(text)


@pytest.mark.parametrize(
    ("written", "scope"),
    [
        ("octo-org/app", RepositoryScope(owner="octo-org", repo="app")),
        ({"owner": "octo-org", "repo": "app"}, RepositoryScope(owner="octo-org", repo="app")),
        ({"org": "octo-org"}, OrganizationScope(org="octo-org")),
    ],
)
def test_a_setting_takes_the_text_or_the_fields(written: object, scope: object) -> None:
    # Given a scope written in a config, as text or as fields
    # When the config is validated
    settings = _Settings.model_validate({"scope": written})

    # Then it holds the scope meant
    assert settings.scope == scope
