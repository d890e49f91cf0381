"""One GitHub App installation as the control plane uses it: the RunnerRegistry and the doctor's reads.

It holds the installation's one HTTP client (adapters/github_api.py) and hands each call to the module
of its concern: our runners (github_runners), a run's jobs (github_run_jobs), a run attempt's trigger
(github_runs), failed webhook deliveries (github_deliveries), and what the doctor reads
(github_readings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runner_pool.adapters import github_deliveries, github_readings, github_run_jobs, github_runs
from runner_pool.adapters.github_api import GITHUB_API_URL, GitHubApi
from runner_pool.adapters.github_app_auth import TOKEN_REFRESH_MARGIN_SECONDS
from runner_pool.adapters.github_runners import GitHubRunners
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.doctor import AppGrant, HookConfig, Installation, RunnerPolicy, Unread
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.runner_scope import Registration, RunnerScope
from runner_pool.domain.runners import (
    DEFAULT_RUNNER_GROUP_ID,
    FailedDelivery,
    JitRunner,
    RegisteredRunner,
    RunJob,
    RunnerRemoval,
)
from runner_pool.domain.trust import RunFacts


class GitHubApp:
    """The RunnerRegistry (domain.runners) of one App installation, for the runners of one scope
    (repository or organisation)."""

    def __init__(
        self,
        app_id: int | str,
        private_key: str,
        installation_id: int,
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
        its release, e.g. `2022-11-28`. `app_id` may be the App's id or its client id. `registration`
        is used by an organisation scope only (domain.runner_scope.Registration);
        `groups_allow_public_repositories` lets the runner groups it creates take public repositories'
        jobs, which GitHub refuses by default."""
        self._api = GitHubApi(
            app_id,
            private_key,
            installation_id,
            base_url=base_url,
            api_version=api_version,
            clock=clock,
            timeout_seconds=timeout_seconds,
            token_refresh_margin_seconds=token_refresh_margin_seconds,
            on_hourly_quota=on_hourly_quota,
        )
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

    def authenticate(self) -> None:
        """Have the installation token in hand: asked for now unless held (a fresh environment's first
        call would ask for it), so a step can ask while its own calls run (steps.hand_over)."""
        self._api.authenticate()

    # --- runners (adapters/github_runners.py) ------------------------------------------------------

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
    ) -> JitRunner:
        return self._runners.jit_config(
            name,
            labels,
            runner_group_id,
            work_folder,
            repository,
            repository_id=repository_id,
            instant=instant,
        )

    def registration_scope(self, repository: str | None) -> RunnerScope:
        return self._runners.registration_scope(repository)

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval:
        return self._runners.delete_runner(runner_id, repository)

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]:
        return self._runners.runners(repository)

    # --- workflow jobs and webhook deliveries -------------------------------------------------------

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        return github_run_jobs.run_jobs(self._api, repository, run_id, attempt)

    def run_attempt(self, repository: str, run_id: int, attempt: int) -> RunFacts:
        return github_runs.run_attempt(self._api, repository, run_id, attempt)

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        return github_deliveries.failed_deliveries(self._api, since)

    def redeliver(self, delivery_id: int) -> None:
        github_deliveries.redeliver(self._api, delivery_id)

    # --- what the doctor reads (domain/doctor.py) ---------------------------------------------------

    def app_grant(self) -> AppGrant | Unread:
        return github_readings.app_grant(self._api)

    def installation(self) -> Installation | Unread:
        return github_readings.installation(self._api)

    def hook_config(self) -> HookConfig | Unread:
        return github_readings.hook_config(self._api)

    def runner_policy(self, org: str) -> RunnerPolicy | Unread:
        return github_readings.runner_policy(self._api, org)

    def runner_groups(self, org: str) -> tuple[int, ...] | Unread:
        return github_readings.runner_groups(self._api, org)
