"""One GitHub App installation as the control plane uses it: the RunnerRegistry and the doctor's reads.

It holds the installation's HTTP client (adapters/github_api.py), narrowed per concern to the permissions
that concern needs (domain/github_tokens.py), and hands each call to the module of its concern: our runners
(github_runners, the registration permission), a run's jobs and trigger (github_run_jobs, github_runs:
`actions: read`), a run's re-run (github_runs: `actions: write`), the check run of jobs waiting for
capacity (github_check_runs: `checks: write`), and what the doctor reads (github_readings). Its tokens and
the App's own failed webhook deliveries come from an AppIdentity: the App's key (adapters/github_app_key.py)
where it is held, else the token function (adapters/github_token_function.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner_pool.adapters import github_check_runs, github_readings, github_run_jobs, github_runs
from runner_pool.adapters.github_api import GITHUB_API_URL, GitHubApi
from runner_pool.adapters.github_app_auth import TOKEN_REFRESH_MARGIN_SECONDS
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.github_runners import GitHubRunners
from runner_pool.domain.capacity_waits import CheckRun, Conclusion
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.doctor_readings import AppGrant, HookConfig, Installation, RunnerPolicy, Unread
from runner_pool.domain.github_tokens import (
    CHECK_WRITES,
    RUN_READS,
    RUN_RERUNS,
    AppIdentity,
    registration_permissions,
)
from runner_pool.domain.instant import TierGroupAccess
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.reruns import RunNow
from runner_pool.domain.runner_scope import OrganizationScope, Registration, RunnerScope
from runner_pool.domain.runners import (
    FailedDelivery,
    JitRunner,
    RegisteredRunner,
    RunJob,
    RunnerRemoval,
)
from runner_pool.domain.trust import RunFacts

NOT_THE_KEY = Unread("the App's own settings are read with its key, which this client does not hold")


class GitHubApp:
    """The RunnerRegistry (domain.runners) of one App installation, for the runners of one scope
    (repository or organisation)."""

    def __init__(
        self,
        identity: AppIdentity,
        scope: RunnerScope,
        *,
        base_url: str = GITHUB_API_URL,
        api_version: str | None = None,
        clock: Clock | None = None,
        timeout_seconds: float = 10.0,
        token_refresh_margin_seconds: float = TOKEN_REFRESH_MARGIN_SECONDS,
        registration: Registration = Registration.REPOSITORY,
        groups_allow_public_repositories: bool = False,
        on_hourly_quota: Callable[[HourlyQuota], None] | None = None,
    ) -> None:
        """`base_url` is `https://<host>/api/v3/` for GitHub Enterprise Server. `api_version` overrides
        the `X-GitHub-Api-Version` githubkit sends (its newest); GHES answers only the versions of
        its release, e.g. `2022-11-28`. `identity` issues its installation tokens, one per permission set
        (domain/github_tokens.py). `registration` is used by an organisation scope only
        (domain.runner_scope.Registration);
        `groups_allow_public_repositories` lets the runner groups it creates take public repositories'
        jobs, which GitHub refuses by default."""
        self._identity = identity
        self._app_api = identity.api if isinstance(identity, GitHubAppKey) else None
        """The App's own routes the doctor reads (`GET /app`, ...): only where the key is held."""
        self._api = GitHubApi(
            identity.installation_token,
            identity.installation_id,
            permissions=registration_permissions(
                registration if isinstance(scope, OrganizationScope) else Registration.REPOSITORY
            ),
            base_url=base_url,
            api_version=api_version,
            clock=clock,
            timeout_seconds=timeout_seconds,
            token_refresh_margin_seconds=token_refresh_margin_seconds,
            on_hourly_quota=on_hourly_quota,
        )
        self._runs = self._api.narrowed(RUN_READS)
        self._reruns = self._api.narrowed(RUN_RERUNS)
        self._checks = self._api.narrowed(CHECK_WRITES)
        self._installation = self._api.narrowed(None)
        """Everything the installation was granted: the doctor's reads of its settings."""
        self._runners = GitHubRunners(
            self._api,
            scope,
            registration=registration,
            groups_allow_public_repositories=groups_allow_public_repositories,
        )

    @property
    def scope(self) -> RunnerScope:
        return self._runners.scope

    @property
    def hourly_quota(self) -> HourlyQuota | None:
        """GitHub's hourly limit as its last answer to this client reported it."""
        return self._api.hourly_quota

    def close(self) -> None:
        self._api.close()
        if isinstance(self._identity, GitHubAppKey):
            self._identity.close()

    def authenticate(self) -> None:
        """Have the registration's installation token in hand: asked for now unless held (a fresh
        environment's first call would ask for it), so a step can ask while its own calls run
        (steps.hand_over)."""
        self._api.authenticate()

    # --- runners (adapters/github_runners.py) ------------------------------------------------------

    def jit_config(self, *arguments: Any, **named: Any) -> JitRunner:
        """The RunnerRegistry port's registration, passed on as given (its parameters are stated once, by
        the port and by GitHubRunners, which makes it)."""
        return self._runners.jit_config(*arguments, **named)

    def registration_scope(self, repository: str | None) -> RunnerScope:
        return self._runners.registration_scope(repository)

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval:
        return self._runners.delete_runner(runner_id, repository)

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]:
        return self._runners.runners(repository)

    def keep_instant_group_in_step(self) -> TierGroupAccess | None:
        return self._runners.keep_instant_group_in_step()

    # --- workflow jobs and webhook deliveries -------------------------------------------------------

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        return github_run_jobs.run_jobs(self._runs, repository, run_id, attempt)

    def run_attempt(self, repository: str, run_id: int, attempt: int) -> RunFacts:
        return github_runs.run_attempt(self._runs, repository, run_id, attempt)

    def run_now(self, repository: str, run_id: int) -> RunNow:
        return github_runs.run_now(self._reruns, repository, run_id)

    def rerun_failed_jobs(self, repository: str, run_id: int) -> None:
        github_runs.rerun_failed_jobs(self._reruns, repository, run_id)

    def create_check_run(
        self, repository: str, *, head_sha: str, name: str, title: str, summary: str
    ) -> CheckRun:
        return CheckRun(
            github_check_runs.create_check_run(
                self._checks, repository, head_sha=head_sha, name=name, title=title, summary=summary
            )
        )

    def complete_check_run(
        self, repository: str, check_run: CheckRun, *, conclusion: Conclusion, title: str, summary: str
    ) -> None:
        github_check_runs.complete_check_run(
            self._checks,
            repository,
            check_run.check_run_id,
            conclusion=conclusion,
            title=title,
            summary=summary,
        )

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        return self._identity.failed_deliveries(since)

    def redeliver(self, delivery_id: int) -> None:
        self._identity.redeliver(delivery_id)

    # --- what the doctor reads (domain/doctor_readings.py) ------------------------------------------

    def app_grant(self) -> AppGrant | Unread:
        if self._app_api is None:
            return NOT_THE_KEY
        return github_readings.app_grant(self._app_api)

    def installation(self) -> Installation | Unread:
        if self._app_api is None:
            return NOT_THE_KEY
        return github_readings.installation(self._app_api)

    def hook_config(self) -> HookConfig | Unread:
        if self._app_api is None:
            return NOT_THE_KEY
        return github_readings.hook_config(self._app_api)

    def runner_policy(self, org: str) -> RunnerPolicy | Unread:
        return github_readings.runner_policy(self._installation, org)

    def runner_groups(self, org: str) -> tuple[int, ...] | Unread:
        return github_readings.runner_groups(self._installation, org)
