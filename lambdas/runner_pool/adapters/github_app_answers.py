"""What the token function is asked and answers: one request of three kinds, GitHub's errors as data.

Both ends read these models (handlers/github_token.py answers, adapters/github_token_function.py asks),
so a field added on one side is known to the other.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runner_pool.domain.clock import Epoch
from runner_pool.domain.github_tokens import AppIdentity, InstallationToken
from runner_pool.domain.runners import GITHUB_ERRORS, FailedDelivery, GitHubError, GitHubRateLimitedError

ERROR_KINDS: dict[str, type[GitHubError]] = {kind.__name__: kind for kind in GITHUB_ERRORS}
"""The errors of ours a GitHub call can end in, by name: raised again by the caller as they were met."""


class AppRequest(BaseModel):
    """Exactly one of: a token narrowed to `permissions` (an empty mapping is refused: GitHub would grant
    everything), the failed deliveries since a moment, or one delivery's redelivery."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    permissions: dict[str, str] | None = None
    app_id: str | None = None
    """Which of the stack's Apps to act as (github.apps); None: the first."""
    failed_deliveries_since: Epoch | None = None
    redeliver: int | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> AppRequest:
        asked = [self.permissions, self.failed_deliveries_since, self.redeliver]
        if sum(value is not None for value in asked) != 1:
            raise ValueError("ask for exactly one of permissions, failed_deliveries_since, redeliver")
        if self.permissions is not None and not self.permissions:
            raise ValueError("permissions must name at least one permission")
        return self


class IssuedToken(BaseModel):
    model_config = ConfigDict(frozen=True)

    value: str = Field(repr=False)
    expires_at: Epoch
    permissions: dict[str, str]

    def issued(self) -> InstallationToken:
        return InstallationToken(self.value, self.expires_at, self.permissions)


class AnsweredError(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    message: str
    status: int | None = None
    retry_after_seconds: float | None = None


class AppAnswer(BaseModel):
    model_config = ConfigDict(frozen=True)

    token: IssuedToken | None = None
    deliveries: list[FailedDelivery] | None = None
    error: AnsweredError | None = None


def answer(identity: AppIdentity, request: AppRequest) -> AppAnswer:
    """Do what `request` asks as the App; a GitHub error is answered, not raised, so the caller sees it
    as its own (`raised`) and not as the function's failure."""
    try:
        if request.permissions is not None:
            token = identity.installation_token(request.permissions)
            return AppAnswer(
                token=IssuedToken(
                    value=token.value, expires_at=token.expires_at, permissions=dict(token.permissions)
                )
            )
        if request.failed_deliveries_since is not None:
            return AppAnswer(deliveries=identity.failed_deliveries(request.failed_deliveries_since))
        if request.redeliver is not None:
            identity.redeliver(request.redeliver)
        return AppAnswer()
    except GitHubError as exc:
        return refusal(exc)


def refusal(exc: GitHubError) -> AppAnswer:
    """GitHub's error (or ours, e.g. a key that does not load) as the answer's data."""
    return AppAnswer(
        error=AnsweredError(
            kind=type(exc).__name__ if type(exc).__name__ in ERROR_KINDS else GitHubError.__name__,
            message=str(exc),
            status=exc.status,
            retry_after_seconds=getattr(exc, "retry_after_seconds", None),
        )
    )


def raised(error: AnsweredError) -> GitHubError:
    kind = ERROR_KINDS.get(error.kind, GitHubError)
    if kind is GitHubRateLimitedError:
        return GitHubRateLimitedError(error.message, error.status or 403, error.retry_after_seconds or 60.0)
    return kind(error.message, error.status)
