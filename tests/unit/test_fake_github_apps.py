"""The fake GitHub keeps each App's own apart, as GitHub does: its rate limits and its check runs.

Sources (docs.github.com):
- "Rate limits for the REST API", "Primary rate limit for GitHub App installations": Apps "authenticating
  with an installation access token use the installation's minimum rate limit of 5,000 requests per
  hour"; the `x-ratelimit-*` headers report that limit ("Checking the status of your rate limit"), and
  past it the answer is 403 or 429 with `x-ratelimit-remaining` 0 ("Exceeding the rate limit").
- "Rate limits for GitHub Apps": the limit is on "the number of requests a GitHub App can make", and
  secondary limits come in addition; "About secondary rate limits": "No more than 900 points per minute
  are allowed for REST API endpoints", per endpoint.
- "Using the REST API to interact with checks": "A check suite is a collection of the check runs created by
  a single GitHub App"; another App's update is refused 403 ("check run can only be modified by the GitHub
  App that created it", quoted in int128/argocd-commenter#631).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulator.fake_github import Answer, FakeGitHub
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey, generate_app_key
from runner_pool.domain.clock import ManualClock

RUNNERS = f"/repos/{OWNER}/{REPO}/actions/runners"
CHECK_RUNS = f"/repos/{OWNER}/{REPO}/check-runs"
SECOND_APP_ID = APP_ID + 1
SECOND_INSTALLATION_ID = INSTALLATION_ID + 1


@pytest.fixture
def fake(app_key: AppKey, clock: ManualClock) -> FakeGitHub:
    """Two Apps, each installed on the same owner."""
    github = FakeGitHub(APP_ID, app_key.public_pem, clock=clock)
    github.state.add_app(SECOND_APP_ID, generate_app_key().public_pem)
    github.state.add_installation(INSTALLATION_ID, OWNER)
    github.state.add_installation(SECOND_INSTALLATION_ID, OWNER, app_id=SECOND_APP_ID)
    return github


def request(fake: FakeGitHub, installation_id: int, method: str, target: str, body: Any = None) -> Answer:
    token, _ = fake.state.issue_token(installation_id)
    headers = {"Authorization": f"token {token}", "X-GitHub-Api-Version": "2022-11-28"}
    return fake.handle(method, target, headers, b"" if body is None else json.dumps(body).encode())


def as_installation(fake: FakeGitHub, installation_id: int) -> Answer:
    return request(fake, installation_id, "GET", RUNNERS)


def test_each_installation_has_an_hour_of_its_own(fake: FakeGitHub) -> None:
    # Given the first App's installation with its hour spent
    limit = fake.state.hourly_limit
    fake.state.use_hourly(INSTALLATION_ID, limit)

    # When each App's installation asks
    spent = as_installation(fake, INSTALLATION_ID)
    other = as_installation(fake, SECOND_INSTALLATION_ID)

    # Then the first is refused with nothing left, and the second is answered from an hour of its own
    assert spent.status == 403
    assert spent.headers["x-ratelimit-remaining"] == "0"
    assert other.status == 200
    assert (other.headers["x-ratelimit-used"], other.headers["x-ratelimit-remaining"]) == (
        "1",
        str(limit - 1),
    )
    assert fake.state.hourly_status(INSTALLATION_ID)[0] == limit


def test_an_installations_hour_resets_an_hour_after_it_began(fake: FakeGitHub, clock: ManualClock) -> None:
    # Given an installation whose hour is spent
    fake.state.use_hourly(INSTALLATION_ID, fake.state.hourly_limit)
    _, reset = fake.state.hourly_status(INSTALLATION_ID)

    # When the hour has passed / Then it is answered again, from a fresh hour
    clock.advance(reset - clock.now())
    answer = as_installation(fake, INSTALLATION_ID)
    assert answer.status == 200
    assert answer.headers["x-ratelimit-used"] == "1"
    assert int(answer.headers["x-ratelimit-reset"]) == int(reset + 3600)


def test_each_app_has_its_own_secondary_window_on_an_endpoint(fake: FakeGitHub) -> None:
    # Given the secondary limit at two reads a minute on an endpoint
    fake.limits.enabled = True
    fake.limits.points_per_window = 2
    # When the first App reads it three times, then the second App once
    answers = [as_installation(fake, INSTALLATION_ID).status for _ in range(3)]
    other = as_installation(fake, SECOND_INSTALLATION_ID)
    # Then the first App's third read is refused (with retry-after), and the second App's is answered
    assert answers == [200, 200, 403]
    assert other.status == 200


def test_a_check_run_is_updated_only_by_the_app_that_created_it(fake: FakeGitHub) -> None:
    # Given a check run the first App created
    body = {"name": "n", "head_sha": "abc", "status": "in_progress"}
    created = request(fake, INSTALLATION_ID, "POST", CHECK_RUNS, body)
    assert created.status == 201
    check_run = f"{CHECK_RUNS}/{created.body['id']}"
    # When the second App completes it / Then GitHub refuses: the check run is the first App's
    refused = request(fake, SECOND_INSTALLATION_ID, "PATCH", check_run, {"conclusion": "success"})
    assert refused.status == 403
    assert "can only be modified by the GitHub App that created it" in refused.body["message"]
    # When the first App completes it / Then it is completed
    completed = request(fake, INSTALLATION_ID, "PATCH", check_run, {"conclusion": "success"})
    assert (completed.status, completed.body["status"]) == (200, "completed")
