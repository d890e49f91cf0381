"""Several GitHub Apps as one RunnerRegistry and one RegistrationBudget (domain/app_choice.py).

A take goes to the App with the most registrations left now (each App's bucket, read afresh), and what
it granted is held in this process as that App's until a registration spends it or it is given back: a
registration goes through an App whose tokens are held, so it is paced by the budget it was taken from.
Begin, a claim worker and Create each take and register in one invocation; a registration whose token
was taken in another process (a claim worker finishing Begin's hand-over) goes through the App with the
most left, as a new take would.

An App GitHub refuses a token for (its key is wrong, its installation gone: AppUnusableError) is skipped
for SKIP_SECONDS, logged and counted (`GitHubAppsSkipped`), and the registration is made through the next
App: a batch never fails for one App. Reads (runners, a run's jobs) and deletions go through the first App
not skipped: any App installed on the scope may make them. A capacity wait's check run is created as a
registration is made, through the App with the most left, and completed through that App. Each App's
failed webhook deliveries are its own, and are redelivered through it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.registration_budget import DynamoDbRegistrationBudget
from runner_pool.domain.app_choice import SKIP_SECONDS, AppUnusableError, with_most_left
from runner_pool.domain.capacity_waits import CheckRun, Conclusion
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.github_tokens import AppIdentity, InstallationToken, Permissions
from runner_pool.domain.instant import TierGroupAccess
from runner_pool.domain.registration_budget import Grant, HourlyQuota, wait_seconds
from runner_pool.domain.reruns import RunNow
from runner_pool.domain.runner_scope import RunnerScope
from runner_pool.domain.runners import (
    FailedDelivery,
    GitHubAuthError,
    GitHubNotFoundError,
    GitHubRateLimitedError,
    JitRunner,
    RegisteredRunner,
    RunJob,
    RunnerRemoval,
)
from runner_pool.domain.trust import RunFacts
from runner_pool.observability import count, logger

_T = TypeVar("_T")


class UsableOrNot:
    """An App's identity whose token refusals say the App is unusable (AppUnusableError): a 401 (GitHub
    does not take its key) or a 404 (no such installation) to the token request itself."""

    def __init__(self, identity: AppIdentity) -> None:
        self._identity = identity

    @property
    def installation_id(self) -> int:
        return self._identity.installation_id

    def installation_token(self, permissions: Permissions | None) -> InstallationToken:
        try:
            return self._identity.installation_token(permissions)
        except (GitHubAuthError, GitHubNotFoundError) as exc:
            raise AppUnusableError(f"GitHub refused the App a token: {exc}", exc.status) from exc

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        try:
            return self._identity.failed_deliveries(since)
        except GitHubAuthError as exc:  # the App's JWT refused: its key is wrong
            raise AppUnusableError(f"GitHub refused the App's JWT: {exc}", exc.status) from exc

    def redeliver(self, delivery_id: int) -> None:
        self._identity.redeliver(delivery_id)


class GitHubApps:
    """The RunnerRegistry and RegistrationBudget of several Apps; `apps` and `budgets` by App id, in the
    config's order."""

    def __init__(
        self,
        apps: Mapping[str, Callable[[], GitHubApp]],
        budgets: Mapping[str, DynamoDbRegistrationBudget],
        clock: Clock,
    ) -> None:
        self._apps = dict(apps)
        self._made: dict[str, GitHubApp] = {}
        self._budgets = dict(budgets)
        self._clock = clock
        self._held: Counter[str] = Counter()
        self._limited: set[str] = set()
        self._skipped: dict[str, Epoch] = {}
        self._delivered_by: dict[int, str] = {}
        self._lock = threading.Lock()

    def app(self, app_id: str) -> GitHubApp:
        with self._lock:
            if app_id not in self._made:
                self._made[app_id] = self._apps[app_id]()
            return self._made[app_id]

    # --- the budget ---------------------------------------------------------------------------------

    def take(self, wanted: int) -> Grant:
        left = {app_id: budget.left() for app_id, budget in self._budgets.items()}
        for each, amount in left.items():
            count(f"RegistrationBudgetLeft.{each}", amount)
        app_id = with_most_left(left, self._skipped_now())
        if app_id is None:
            return Grant(0, wait_seconds(SKIP_SECONDS))
        grant = self._budgets[app_id].take(wanted)
        if grant.granted:
            with self._lock:
                self._held[app_id] += grant.granted
            count(f"RegistrationsTaken.{app_id}", grant.granted)
        return grant

    def give_back(self, count: int) -> None:
        """To the Apps whose tokens this process holds, most held first; the rest to the first App."""
        returned: Counter[str] = Counter()
        with self._lock:
            for app_id, held in self._held.most_common():
                back = min(held, count - sum(returned.values()))
                if back > 0:
                    returned[app_id] += back
                    self._held[app_id] -= back
            rest = count - sum(returned.values())
        if rest > 0:
            returned[next(iter(self._budgets))] += rest
        for app_id, back in returned.items():
            self._budgets[app_id].give_back(back)

    def hold_off(self, seconds: float) -> None:
        """GitHub rate-limited a registration: that App is held off (every App when it is not known which)."""
        with self._lock:
            limited, self._limited = self._limited or set(self._budgets), set()
        for app_id in limited:
            self._budgets[app_id].hold_off(seconds)

    def hourly(self) -> HourlyQuota | None:
        """The Apps' hours together (None until each has been read): their limits and remainders summed,
        reset when the first of them resets."""
        quotas = [budget.hourly() for budget in self._budgets.values()]
        known = [quota for quota in quotas if quota is not None]
        if len(known) < len(quotas):
            return None
        now = self._clock.now()
        return HourlyQuota(
            limit=sum(quota.limit for quota in known),
            remaining=sum(quota.limit if now >= quota.reset_at else quota.remaining for quota in known),
            reset_at=min(quota.reset_at for quota in known),
        )

    def observe(self, app_id: str, quota: HourlyQuota) -> None:
        self._budgets[app_id].observe(quota)

    # --- registrations ------------------------------------------------------------------------------

    def jit_config(self, *arguments: Any, **named: Any) -> JitRunner:
        """The RunnerRegistry port's registration, through the App whose tokens are held (else the one with
        the most left); an unusable App is skipped and the next one asked, until none is left, when the
        last refusal is raised."""
        while True:
            app_id = self._registering()
            try:
                runner = self.app(app_id).jit_config(*arguments, **named)
            except AppUnusableError as unusable:
                if not self._skip(app_id, unusable):
                    raise
                continue
            except GitHubRateLimitedError:
                with self._lock:
                    self._limited.add(app_id)
                raise
            with self._lock:
                if self._held[app_id] > 0:
                    self._held[app_id] -= 1
            count(f"RegistrationsMade.{app_id}")
            return runner

    def _registering(self) -> str:
        skipped = self._skipped_now()
        with self._lock:
            held = [(n, app_id) for app_id, n in self._held.items() if n > 0 and app_id not in skipped]
        if held:
            return max(held)[1]
        return self._most_left(skipped) or next(iter(self._budgets))

    def _most_left(self, skipped: frozenset[str]) -> str | None:
        return with_most_left({app_id: budget.left() for app_id, budget in self._budgets.items()}, skipped)

    def _skip(self, app_id: str, unusable: AppUnusableError) -> bool:
        """Leave the App out for SKIP_SECONDS; whether another App is left to ask."""
        until = self._clock.now() + SKIP_SECONDS
        with self._lock:
            self._skipped[app_id] = until
            self._held.pop(app_id, None)
        logger.error("GitHub App skipped: GitHub refuses it a token", app_id=app_id, reason=str(unusable))
        count(f"GitHubAppsSkipped.{app_id}")
        return len(self._skipped_now()) < len(self._budgets)

    def _skipped_now(self) -> frozenset[str]:
        now = self._clock.now()
        with self._lock:
            return frozenset(app_id for app_id, until in self._skipped.items() if now < until)

    def _any(self, call: Callable[[GitHubApp], _T]) -> _T:
        """`call` through the first App not skipped, for what any App on the scope may do."""
        return self._through(
            call, lambda skipped: next((a for a in self._budgets if a not in skipped), None)
        )[1]

    def _through(
        self, call: Callable[[GitHubApp], _T], choose: Callable[[frozenset[str]], str | None]
    ) -> tuple[str, _T]:
        """`call` through the App `choose` picks of those not skipped (the first when all are), and that
        App; an App found unusable on the way is skipped and the next one asked."""
        while True:
            app_id = choose(self._skipped_now()) or next(iter(self._budgets))
            try:
                return app_id, call(self.app(app_id))
            except AppUnusableError as unusable:
                if not self._skip(app_id, unusable):
                    raise

    # --- what any App may do -----------------------------------------------------------------------

    @property
    def scope(self) -> RunnerScope:
        return self.app(next(iter(self._budgets))).scope

    def authenticate(self) -> None:
        self.app(self._registering()).authenticate()

    def registration_scope(self, repository: str | None) -> RunnerScope:
        return self.app(next(iter(self._budgets))).registration_scope(repository)

    def delete_runner(self, runner_id: int, repository: str | None = None) -> RunnerRemoval:
        return self._any(lambda app: app.delete_runner(runner_id, repository))

    def runners(self, repository: str | None = None) -> list[RegisteredRunner]:
        return self._any(lambda app: app.runners(repository))

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]:
        return self._any(lambda app: app.run_jobs(repository, run_id, attempt))

    def run_attempt(self, repository: str, run_id: int, attempt: int) -> RunFacts:
        return self._any(lambda app: app.run_attempt(repository, run_id, attempt))

    def run_now(self, repository: str, run_id: int) -> RunNow:
        return self._any(lambda app: app.run_now(repository, run_id))

    def rerun_failed_jobs(self, repository: str, run_id: int) -> None:
        self._any(lambda app: app.rerun_failed_jobs(repository, run_id))

    def keep_instant_group_in_step(self) -> TierGroupAccess | None:
        return self._any(lambda app: app.keep_instant_group_in_step())

    # A check run is its App's: "A check suite is a collection of the check runs created by a single GitHub
    # App for a specific commit" (docs.github.com, "Using the REST API to interact with checks"), and GitHub
    # refuses another App's update with a 403 ("check run can only be modified by the GitHub App that
    # created it"). One is created through the App a registration would go through (most left, not
    # skipped), which the CheckRun names, and completed through that App alone: if it is unusable by then,
    # completing fails, is logged, and the check run stays in progress.
    def create_check_run(
        self, repository: str, *, head_sha: str, name: str, title: str, summary: str
    ) -> CheckRun:
        app_id, created = self._through(
            lambda app: app.create_check_run(
                repository, head_sha=head_sha, name=name, title=title, summary=summary
            ),
            self._most_left,
        )
        return CheckRun(created.check_run_id, app_id)

    def complete_check_run(
        self, repository: str, check_run: CheckRun, *, conclusion: Conclusion, title: str, summary: str
    ) -> None:
        def complete(app: GitHubApp) -> None:
            app.complete_check_run(repository, check_run, conclusion=conclusion, title=title, summary=summary)

        if check_run.app_id in self._budgets:
            complete(self.app(check_run.app_id))
        else:  # created before its App was named, or by an App no longer listed
            self._any(complete)

    # --- each App's own deliveries -----------------------------------------------------------------

    def failed_deliveries(self, since: Epoch) -> list[FailedDelivery]:
        """Every usable App's; an App found unusable is skipped (its deliveries wait for its fix)."""
        found: list[FailedDelivery] = []
        for app_id in self._budgets:
            if app_id in self._skipped_now():
                continue
            try:
                deliveries = self.app(app_id).failed_deliveries(since)
            except AppUnusableError as unusable:
                self._skip(app_id, unusable)
                continue
            with self._lock:
                self._delivered_by |= {delivery.delivery_id: app_id for delivery in deliveries}
            found += deliveries
        return found

    def redeliver(self, delivery_id: int) -> None:
        with self._lock:
            app_id = self._delivered_by.get(delivery_id, next(iter(self._budgets)))
        self.app(app_id).redeliver(delivery_id)

    def close(self) -> None:
        for app in self._made.values():
            app.close()
