"""Several GitHub Apps as one registry and budget (adapters/github_apps.py), their buckets on moto."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_apps import GitHubApps
from runner_pool.adapters.registration_budget import DynamoDbRegistrationBudget
from runner_pool.domain.app_choice import AppUnusableError, with_most_left
from runner_pool.domain.capacity_waits import CheckRun
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runners import GitHubError, GitHubRateLimitedError, JitRunner
from tests.conftest import TABLE_NAME


class App:
    """Stands in for one App's GitHubApp: registers and writes check runs through itself, or fails as told."""

    def __init__(self, app_id: str, fails: Exception | None = None) -> None:
        self.app_id = app_id
        self.fails = fails
        self.registered: list[str] = []
        self.check_runs: dict[int, str] = {}

    def jit_config(self, name: str, labels: Sequence[str], *_: Any, **__: Any) -> JitRunner:
        if self.fails is not None:
            raise self.fails
        self.registered.append(name)
        return JitRunner(len(self.registered), name, "config")

    def create_check_run(self, repository: str, **_: Any) -> CheckRun:
        if self.fails is not None:
            raise self.fails
        check_run_id = 100 * int(self.app_id) + len(self.check_runs)
        self.check_runs[check_run_id] = "in_progress"
        return CheckRun(check_run_id)

    def complete_check_run(self, repository: str, check_run: CheckRun, **_: Any) -> None:
        if check_run.check_run_id not in self.check_runs:  # GitHub's 403: another App's check run
            raise GitHubError("check run can only be modified by the GitHub App that created it", 403)
        self.check_runs[check_run.check_run_id] = "completed"


def connecting(fake: App) -> Callable[[], GitHubApp]:
    """How GitHubApps connects to an App, here to the fake standing in for it."""
    return lambda: cast(GitHubApp, fake)


def apps(dynamodb: Any, clock: ManualClock, *fakes: App) -> GitHubApps:
    return GitHubApps(
        {fake.app_id: connecting(fake) for fake in fakes},
        {
            fake.app_id: DynamoDbRegistrationBudget(
                TABLE_NAME, fake.app_id, per_minute=60, burst=5, clock=clock, client=dynamodb
            )
            for fake in fakes
        },
        clock,
    )


def test_the_app_with_most_left_is_chosen_and_ties_go_to_the_first() -> None:
    assert with_most_left({"a": 3.0, "b": 4.5}) == "b"
    assert with_most_left({"a": 4.0, "b": 4.0}) == "a"
    assert with_most_left({"a": 4.0, "b": 9.0}, skipped=frozenset({"b"})) == "a"
    assert with_most_left({"a": 4.0}, skipped=frozenset({"a"})) is None


def test_takes_and_registrations_go_to_the_app_with_most_budget_left(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two Apps of 5 a burst each, the first with 4 of its 5 spent
    first, second = App("1"), App("2")
    both = apps(dynamodb, clock, first, second)
    DynamoDbRegistrationBudget(TABLE_NAME, "1", per_minute=60, burst=5, clock=clock, client=dynamodb).take(4)
    # When 3 registrations are taken and made
    grant = both.take(3)
    for n in range(grant.granted):
        both.jit_config(f"runner-{n}", ["pool=1"])
    # Then they came from the second App's budget and went through it
    assert grant.granted == 3
    assert (first.registered, len(second.registered)) == ([], 3)
    # And the next take, both Apps now near even (1 left and 2), goes to the second still, then the first
    assert both.take(2).granted == 2
    assert both.take(5).granted == 1


def test_an_app_github_refuses_a_token_is_skipped_and_the_registration_made_by_another(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two Apps, the one with the most left (the first, ties go first) refused its token: its key is wrong
    broken = App("1", fails=AppUnusableError("GitHub refused the App a token: bad credentials", 401))
    working = App("2")
    both = apps(dynamodb, clock, broken, working)
    # When a registration is taken and made
    assert both.take(1).granted == 1
    runner = both.jit_config("runner-0", ["pool=1"])
    # Then it went through the other App, and from then on takes go to the working App only
    assert runner.name == "runner-0"
    assert working.registered == ["runner-0"]
    assert both.take(5).granted == 5
    both.jit_config("runner-1", ["pool=1"])
    assert working.registered == ["runner-0", "runner-1"]


def test_when_every_app_is_unusable_the_refusal_is_raised_and_takes_wait(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two Apps whose installations are gone
    gone = [App(n, fails=AppUnusableError("no such installation", 404)) for n in ("1", "2")]
    both = apps(dynamodb, clock, *gone)
    # When a registration is made: Then GitHub's refusal is raised (the hand-over gives the instance back)
    try:
        both.jit_config("runner-0", ["pool=1"])
    except AppUnusableError as refused:
        assert refused.status == 404
    else:
        raise AssertionError("a registration with no usable App must fail")
    # And a take is refused with a wait, so no instance is claimed for a registration no App can make
    assert both.take(1).refused


def test_a_rate_limit_holds_off_only_the_app_github_limited(dynamodb: Any, clock: ManualClock) -> None:
    # Given two Apps, the second rate-limited by GitHub
    first, limited = App("1"), App("2", fails=GitHubRateLimitedError("secondary rate limit", 403, 30))
    both = apps(dynamodb, clock, first, limited)
    DynamoDbRegistrationBudget(TABLE_NAME, "1", per_minute=60, burst=5, clock=clock, client=dynamodb).take(1)
    assert both.take(1).granted == 1
    try:
        both.jit_config("runner-0", ["pool=1"])
    except GitHubRateLimitedError as exc:
        # When the hand-over honours GitHub's wait (steps/hand_over.py github_wait)
        both.hold_off(exc.retry_after_seconds)
    # Then the second App grants nothing during the wait, and the first still does
    assert both.take(10).granted == 4
    assert both.take(1).refused


def budget_of(dynamodb: Any, clock: ManualClock, app_id: str) -> DynamoDbRegistrationBudget:
    return DynamoDbRegistrationBudget(
        TABLE_NAME, app_id, per_minute=60, burst=5, clock=clock, client=dynamodb
    )


def test_a_check_run_goes_through_the_app_with_most_left_and_is_completed_through_it(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two Apps, the first (listed first, which any App's reads go through) with 4 of its 5 spent
    first, second = App("1"), App("2")
    both = apps(dynamodb, clock, first, second)
    budget_of(dynamodb, clock, "1").take(4)
    # When a capacity wait's check run is created
    check_run = both.create_check_run("octo-org/app", head_sha="abc", name="n", title="t", summary="s")
    # Then it went through the second App, as a registration would, and says so
    assert (first.check_runs, list(second.check_runs)) == ({}, [check_run.check_run_id])
    assert check_run.app_id == "2"
    # When the second App has since spent more than the first / Then it is still completed through it
    budget_of(dynamodb, clock, "2").take(5)
    both.complete_check_run("octo-org/app", check_run, conclusion="success", title="t", summary="s")
    assert second.check_runs[check_run.check_run_id] == "completed"


def test_a_check_run_skips_an_app_github_refuses_a_token(dynamodb: Any, clock: ManualClock) -> None:
    # Given two Apps, the one with the most left refused its token: its installation is gone
    gone, working = App("1", fails=AppUnusableError("no such installation", 404)), App("2")
    both = apps(dynamodb, clock, gone, working)
    # When a check run is created / Then it went through the other App
    check_run = both.create_check_run("octo-org/app", head_sha="abc", name="n", title="t", summary="s")
    assert check_run.app_id == "2"
    assert list(working.check_runs) == [check_run.check_run_id]
