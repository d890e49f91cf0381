"""GitHub's secondary rate limits and outages, as the fake plays them (emulator/fake_github/rate_limits.py),
and as the GitHub App client reports them: a product error carrying GitHub's `retry-after`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from emulator.fake_github import FakeGitHub, JobSpec
from emulator.fake_github.rate_limits import CONTENT_PER_MINUTE
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.github_errors import retry_after
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.runner_scope import RepositoryScope
from runner_pool.domain.runners import (
    GitHubRateLimitedError,
    GitHubUnavailableError,
)
from tests.support.builders import run_key

JIT_ROUTE = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig"


@pytest.fixture
def github(fake: FakeGitHub, app_key: AppKey, clock: ManualClock) -> Iterator[GitHubApp]:
    app = GitHubApp(
        GitHubAppKey(APP_ID, app_key.private_pem, INSTALLATION_ID, base_url=fake.url, clock=clock),
        RepositoryScope(owner=OWNER, repo=REPO),
        base_url=fake.url,
        clock=clock,
    )
    yield app
    app.close()


def test_jit_registrations_past_900_points_a_minute_are_refused_withretry_after(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given GitHub's documented secondary limit: 900 points a minute per endpoint, 5 points a POST
    fake.limits.enabled = True
    # When 180 runners are registered within the minute, then one more
    for n in range(180):
        github.jit_config(f"i-0abc{n:04x}-00000000", [run_key(7)])
        clock.advance(0.1)
    with pytest.raises(GitHubRateLimitedError) as limited:
        github.jit_config("i-0abcffff-00000000", [run_key(7)])
    # Then the 181st is refused as a rate limit, with GitHub's wait: until the oldest POST ages out
    assert limited.value.status == 403
    assert limited.value.retry_after_seconds == pytest.approx(60 - 18, abs=1)
    assert fake.limits.refused[JIT_ROUTE] == 1
    # And once that wait has passed, registering works again
    clock.advance(limited.value.retry_after_seconds)
    github.jit_config("i-0abcffff-00000000", [run_key(7)])


def test_reads_cost_one_point_so_listing_runners_is_not_held_back_by_registrations(
    github: GitHubApp, fake: FakeGitHub
) -> None:
    # Given the JIT endpoint at its limit
    fake.limits.enabled = True
    fake.limits.points_per_window = 10
    github.jit_config("i-0abc0001-00000000", [run_key(7)])
    github.jit_config("i-0abc0002-00000000", [run_key(7)])
    with pytest.raises(GitHubRateLimitedError):
        github.jit_config("i-0abc0003-00000000", [run_key(7)])
    # When another endpoint is read: Then it answers, since limits are counted per endpoint
    assert len(github.runners()) == 2


def test_content_creation_switch_limits_registrations_to_80_a_minute(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given the undocumented case that GitHub counts JIT registrations as content creation
    fake.limits.enabled = True
    fake.limits.content_creation = True
    for n in range(CONTENT_PER_MINUTE):
        github.jit_config(f"i-0abc{n:04x}-00000000", [run_key(7)])
    # When one more is asked for within the minute: Then it is refused with a wait
    with pytest.raises(GitHubRateLimitedError) as limited:
        github.jit_config("i-0abcffff-00000000", [run_key(7)])
    assert 1 <= limited.value.retry_after_seconds <= 60


def test_a_429_rate_limit_is_reported_like_a_403(github: GitHubApp, fake: FakeGitHub) -> None:
    # Given GitHub answering its secondary limit with 429 (it documents both)
    fake.limits.enabled = True
    fake.limits.status = 429
    fake.limits.points_per_window = 5
    github.jit_config("i-0abc0001-00000000", [run_key(7)])
    # When the limit is hit: Then it is the same product error
    with pytest.raises(GitHubRateLimitedError) as limited:
        github.jit_config("i-0abc0002-00000000", [run_key(7)])
    assert limited.value.status == 429


def test_an_outage_is_reported_as_github_unavailable(
    github: GitHubApp, fake: FakeGitHub, clock: ManualClock
) -> None:
    # Given GitHub down for a minute
    github.runners()
    fake.limits.outage(clock.now(), clock.now() + 60)
    # When a runner is registered: Then GitHub is unavailable, which is retried later
    with pytest.raises(GitHubUnavailableError):
        github.jit_config("i-0abc0001-00000000", [run_key(7)])
    # And after the minute, it works again
    clock.advance(60)
    github.jit_config("i-0abc0001-00000000", [run_key(7)])


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        # "If the retry-after response header is present, ... that many seconds"
        ({"retry-after": "37", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1000100"}, 37.0),
        # "If the x-ratelimit-remaining header is 0, ... until the time ... x-ratelimit-reset"
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1000100"}, 100.0),
        # "Otherwise, wait for at least one minute before retrying."
        ({"x-ratelimit-remaining": "12", "x-ratelimit-reset": "1000100"}, 60.0),
        ({}, 60.0),
    ],
)
def test_the_wait_follows_githubs_documented_order_of_headers(headers: dict[str, str], wait: float) -> None:
    assert retry_after(httpx.Headers(headers), now=1_000_000.0) == wait


def test_run_jobs_lists_an_attempts_jobs_with_labels_status_and_runner(
    github: GitHubApp, fake: FakeGitHub
) -> None:
    # Given a run of three jobs with our label, one of them taken by a runner
    label = "pool=${{ github.run_id }}/class=large"
    run = fake.actions.start_run(f"{OWNER}/{REPO}", "ci", [JobSpec("test", label, matrix=3)])
    runner = fake.state.register_runner(
        RepositoryScope(owner=OWNER, repo=REPO), "r1", [f"pool={run.run_id}/class=large"]
    )
    fake.actions.connect(runner)
    taken = fake.actions.next_job(runner)
    assert taken is not None
    # When the attempt's jobs are listed
    jobs, requests = github.run_jobs(f"{OWNER}/{REPO}", run.run_id, 1)
    # Then every job is there with its labels; two queued and one in progress on that runner
    assert requests == 1
    assert sorted(job.job_id for job in jobs) == sorted(run.job_ids)
    assert all(job.labels == (f"pool={run.run_id}/class=large",) for job in jobs)
    assert sorted(job.status for job in jobs) == ["in_progress", "queued", "queued"]
    busy = next(job for job in jobs if not job.queued)
    assert (busy.job_id, busy.runner_id, busy.runner_name) == (taken.job_id, runner.runner_id, "r1")
