"""GitHub's hourly limit in the registration budget (issue 38, item 4): read off every answer, shared
through the budget's item, and no take grants more than the hour has left above the floor kept for
releases (docs.github.com, "Rate limits for the REST API")."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner_pool.adapters.github_hourly import HourlyWatch, hourly_quota
from runner_pool.domain.registration_budget import (
    REFRESH_FLOOR,
    REGISTRATION_FLOOR,
    Bucket,
    HourlyQuota,
    take,
)

NOW = 1_000_000.0
PER_SECOND = 150 / 60
CAPACITY = 150.0


def test_an_answers_headers_are_read_as_the_hourly_quota() -> None:
    # Given GitHub's headers on an answer / When read / Then they are the hour's limit, remainder and reset
    headers = {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "4321",
        "x-ratelimit-reset": "1000600",
        "x-ratelimit-resource": "core",
    }
    assert hourly_quota(headers) == HourlyQuota(5000, 4321, 1_000_600.0)


def test_another_resources_limit_is_not_the_rest_apis() -> None:
    # Given a search answer's headers / Then they say nothing about the REST API's hour
    headers = {"x-ratelimit-limit": "30", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "1"}
    assert hourly_quota({**headers, "x-ratelimit-resource": "search"}) is None


@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=200))
def test_a_take_never_grants_more_than_the_hour_has_left_above_the_floor(remaining: int, wanted: int) -> None:
    # Given a full bucket and GitHub's hour with `remaining` requests left
    hourly = HourlyQuota(5000, remaining, NOW + 600)
    bucket = Bucket(tokens=CAPACITY, at=NOW, hourly=hourly)
    # When registrations are taken
    grant, after = take(bucket, wanted, NOW, PER_SECOND, CAPACITY)
    # Then no more are granted than the hour allows above the floor, and the hour is counted down
    assert grant.granted <= max(0, remaining - 5000 * REGISTRATION_FLOOR)
    assert after.hourly is not None
    assert after.hourly.remaining == remaining - grant.granted


def test_a_spent_hour_grants_nothing_until_it_resets() -> None:
    # Given an hour whose remainder is at the floor, resetting in ten minutes
    hourly = HourlyQuota(5000, int(5000 * REGISTRATION_FLOOR), NOW + 600)
    # When a registration is asked for / Then none is granted, and the wait is until the reset
    grant, _ = take(Bucket(tokens=CAPACITY, at=NOW, hourly=hourly), 1, NOW, PER_SECOND, CAPACITY)
    assert (grant.granted, grant.wait_seconds) == (0, 600)
    # And once the hour has reset, the registration is granted
    grant, _ = take(Bucket(tokens=CAPACITY, at=NOW, hourly=hourly), 1, NOW + 600, PER_SECOND, CAPACITY)
    assert grant.granted == 1


def test_refresh_stops_reading_before_registrations_stop() -> None:
    # Given an hour a quarter of whose requests are left / Then refresh has none, registrations have some
    hourly = HourlyQuota(5000, int(5000 * REFRESH_FLOOR), NOW + 600)
    assert hourly.left_above(REFRESH_FLOOR, NOW) == 0
    assert hourly.left_above(REGISTRATION_FLOOR, NOW) > 0


def test_the_watch_publishes_the_first_answer_and_then_only_when_the_remainder_moved() -> None:
    # Given a watch over a budget
    published: list[HourlyQuota] = []
    watch = HourlyWatch(published.append)
    # When answers report 5000, 4999 ... 4940 left in one hour
    for remaining in range(5000, 4939, -1):
        watch(HourlyQuota(5000, remaining, NOW + 600))
    # Then the first and the one 50 further on were published, and the last one seen is kept
    assert [quota.remaining for quota in published] == [5000, 4950]
    assert watch.seen == HourlyQuota(5000, 4940, NOW + 600)
