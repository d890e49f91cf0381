"""Several GitHub Apps behind one stack: what each is, and which one a registration goes through.

GitHub counts its limits per App installation: an installation's primary limit ("GitHub Apps
authenticating with an installation access token use the installation's minimum rate limit of 5,000
requests per hour") and the secondary ones, which are GitHub's per endpoint and per App (docs.github.com,
"Rate limits for GitHub Apps", Installation access tokens; "Rate limits for the REST API", About
secondary rate limits). One App registers about 180 JIT runners a minute (domain/registration_budget.py);
each App installed on the same owner adds as many. Which App a registration goes through is
domain/app_choice.py's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GitHubAppEntry(BaseModel):
    """One App: its id, its installation on the stack's scope, and the names of its two secrets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    app_id: str = Field(min_length=1)
    """The App's id (or client id)."""
    installation_id: int = Field(gt=0)
    """The App's installation on the organisation or repository of `github.scope`."""
    private_key_secret_name: str = Field(min_length=1)
    webhook_secret_name: str = Field(min_length=1)


def repeated(apps: tuple[GitHubAppEntry, ...]) -> tuple[str, str] | None:
    """The first field two Apps share and its value, if any: each App needs its own id and secrets."""
    for field in ("app_id", "installation_id", "private_key_secret_name", "webhook_secret_name"):
        values = [str(getattr(app, field)) for app in apps]
        twice = next((value for value in values if values.count(value) > 1), None)
        if twice is not None:
            return field, twice
    return None
