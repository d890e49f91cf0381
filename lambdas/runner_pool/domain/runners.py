"""Runners on GitHub as the control plane sees them: the registry port, what it answers, how it fails.

`adapters.github_app` implements the port on a GitHub App installation, and `adapters.github_errors`
translates every githubkit or HTTP failure into the errors below, so no step sees a client library's
exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from runner_pool.domain.clock import Epoch
from runner_pool.domain.labels import LabelError, is_pool_label
from runner_pool.domain.run_keys import RunKey

if TYPE_CHECKING:
    from runner_pool.domain.instant import TierGroupAccess

CONFLICT = 409
DEFAULT_RUNNER_GROUP_ID = 1
"""Every repository and organisation has the Default runner group, id 1; the JIT endpoint requires a group."""


# --- what GitHub answers ----------------------------------------------------------------------------------


class RunnerStatus(StrEnum):
    """A runner as GitHub sees it. BUSY wins over the connection state: a busy runner is never removed."""

    ONLINE = "online"
    OFFLINE = "offline"
    BUSY = "busy"


class RunnerRemoval(StrEnum):
    DELETED = "deleted"
    ALREADY_GONE = "already-gone"
    """GitHub knows no such runner: a JIT runner removes itself after its job. Also what GitHub says
    when the installation has lost access to the repository; the two cannot be told apart."""
    BUSY = "busy"
    """The runner is running a job; GitHub refuses to remove it until the job ends."""


@dataclass(frozen=True)
class JitRunner:
    """A just-in-time runner registration: the runner's id and the config its instance starts it with."""

    runner_id: int
    name: str
    encoded_jit_config: str = field(repr=False)
    """A credential: it lets whoever holds it take a job. Never log it."""


@dataclass(frozen=True)
class RegisteredRunner:
    runner_id: int
    name: str
    status: RunnerStatus
    labels: tuple[str, ...]

    @property
    def run_key(self) -> str | None:
        """The `pool=` label the runner was registered with; None for a runner that is not ours."""
        return next((label for label in self.labels if is_pool_label(label)), None)


@dataclass(frozen=True)
class RunJob:
    """One job of a workflow run attempt, as GitHub lists it."""

    job_id: int
    status: str
    """`queued`, `in_progress`, `completed`, or one of GitHub's other job statuses (`waiting`, ...)."""
    labels: tuple[str, ...]
    created_at: Epoch
    """When the job was queued."""
    runner_id: int | None = None
    runner_name: str | None = None
    name: str = ""
    """The job's name as the workflow run shows it (a matrix job's with its values)."""
    head_sha: str | None = None
    """The commit the job's run is for."""

    @property
    def queued(self) -> bool:
        return self.status == "queued"

    def run_key(self, attempt: int) -> str | None:
        """The run key the job asks for in run attempt `attempt` (domain.run_keys), None for a job no
        runner of ours can take."""
        try:
            return str(RunKey.of_job(self.labels, attempt))
        except LabelError:
            return None


@dataclass(frozen=True)
class FailedDelivery:
    """The latest attempt at delivering one webhook event that has not reached us yet."""

    delivery_id: int
    guid: str
    """GitHub's id of the event (`X-GitHub-Delivery`), the same for every attempt at it."""
    event: str
    action: str | None
    delivered_at: Epoch
    status_code: int


class GitHubError(RuntimeError):
    """GitHub refused or failed a request; `status` is the HTTP status, None when there was no answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RepositoryUnknownError(GitHubError):
    """A registration for a job whose repository (or, for a runner group, its id) is not known: refused
    for good, never registered at the App's scope, where on an organisation every repository's jobs could
    take the runner. Answered as GitHub answers a request it cannot serve (422), so it
    takes the path of GitHub's own refusals (`refused_for_good`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 422)


class GitHubRetryableError(GitHubError):
    """Worth retrying later, unchanged: a rate limit, a GitHub outage, a timeout."""


class GitHubRateLimitedError(GitHubRetryableError):
    def __init__(self, message: str, status: int, retry_after_seconds: float) -> None:
        super().__init__(message, status)
        self.retry_after_seconds = retry_after_seconds


class GitHubUnavailableError(GitHubRetryableError):
    """A 5xx, a timeout, or no connection at all."""


class GitHubAuthError(GitHubError):
    """401: GitHub does not accept the App's credentials (app id, private key, installation id)."""


class GitHubForbiddenError(GitHubError):
    """403, not a rate limit: the App lacks a permission (Administration or Self-hosted runners: write)."""


class GitHubNotFoundError(GitHubError):
    """404: no such resource, or one the installation cannot see (GitHub does not say which)."""


class GitHubRejectedError(GitHubError):
    """409 or 422: GitHub understood the request and will not do it."""


GITHUB_ERRORS: tuple[type[GitHubError], ...] = (
    GitHubError,
    GitHubAuthError,
    GitHubForbiddenError,
    GitHubNotFoundError,
    GitHubRejectedError,
    GitHubUnavailableError,
    GitHubRateLimitedError,
)
"""The errors GitHub's own answers become (adapters/github_errors.py), each a kind a caller may meet."""


def refused_for_good(exc: GitHubError) -> bool:
    """Whether GitHub refused a request for a reason that will not change by asking again: a 4xx that is
    not a rate limit ("Rate limits for the REST API": a 403 or 429 that names a rate limit is one, and
    arrives as GitHubRateLimitedError). A 409 is not: for a registration it says a runner of that name is
    running a job, which ends (`adapters.github_runners.jit_config`)."""
    status = exc.status
    return (
        not isinstance(exc, GitHubRetryableError)
        and status is not None
        and 400 <= status < 500
        and status != CONFLICT
    )


# --- the port ----------------------------------------------------------------------------------


class RunnerRegistry(Protocol):
    """Where our runners are registered (GitHub), as the release, refresh and provision steps use it.

    Every method raises a GitHubError, never a client library's exception.
    """

    def authenticate(self) -> None:
        """Obtain now what the next calls authenticate with (GitHub's installation token), if not held."""
        ...

    def jit_config(
        self,
        name: str,
        labels: Sequence[str],
        runner_group_id: int = DEFAULT_RUNNER_GROUP_ID,
        work_folder: str | None = None,
        repository: str | None = None,
        *,
        repository_id: int | None = None,
        instant: bool = False,
    ) -> JitRunner: ...

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval: ...

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]: ...

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]: ...

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]: ...

    def redeliver(self, delivery_id: int) -> None: ...

    def keep_instant_group_in_step(self) -> TierGroupAccess | None:
        """Set the instant tier's organisation runner group to admit exactly the repositories the App's
        installation covers (domain/instant.py); None where the tier registers in no such group (at a
        repository, or an organisation registering at each job's repository)."""
        ...
