"""The registration budget: one token bucket per App in the state table, moved by conditional writes (moto)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runner_pool.adapters.registration_budget import DynamoDbRegistrationBudget
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.registration_budget import Bucket, take
from tests.conftest import TABLE_NAME
from tests.support.aws_faults import lose_answers
from tests.support.racing import at_once


def budget(
    dynamodb: Any, clock: ManualClock, per_minute: float = 60, burst: int = 5
) -> DynamoDbRegistrationBudget:
    return DynamoDbRegistrationBudget(
        TABLE_NAME, "4242", per_minute=per_minute, burst=burst, clock=clock, client=dynamodb
    )


def test_a_burst_is_granted_at_once_then_registrations_come_at_the_rate(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given a budget of 60 a minute with a burst of 5, never used
    bucket = budget(dynamodb, clock)
    # When 8 registrations are asked for at once: Then the burst's 5 are granted, and the rest wait a second
    grant = bucket.take(8)
    assert (grant.granted, grant.wait_seconds) == (5, 1)
    assert bucket.take(1).refused
    # And a second later one more is due
    clock.advance(1.0)
    assert bucket.take(3).granted == 1


def test_tokens_given_back_can_be_taken_again(dynamodb: Any, clock: ManualClock) -> None:
    bucket = budget(dynamodb, clock)
    assert bucket.take(5).granted == 5
    # Given a claim worker that took a token but found no instance to register a runner for
    bucket.give_back(1)
    # Then another may use it at once
    assert bucket.take(1).granted == 1


def test_a_rate_limit_holds_every_registration_off_until_github_said(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given GitHub answered a registration with retry-after 42
    bucket = budget(dynamodb, clock)
    bucket.take(1)
    bucket.hold_off(42)
    # When anyone asks during the wait: Then nothing is granted, and the wait is what is left of it
    clock.advance(40)
    grant = bucket.take(1)
    assert grant.refused
    assert grant.wait_seconds == 2
    # And a shorter hold asked for meanwhile does not cut it short
    bucket.hold_off(1)
    assert bucket.take(1).refused
    # And after it, registrations start again from an empty bucket at the rate (no burst at once)
    clock.advance(3)
    assert bucket.take(5).granted == 1


def test_takers_racing_never_get_more_than_the_bucket_holds(dynamodb: Any, clock: ManualClock) -> None:
    # Given a burst of 20, and 8 claim workers taking tokens at the same moment from their own Lambdas
    granted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = budget(dynamodb, clock, burst=20)
        for _ in range(10):
            got = mine.take(1).granted
            with lock:
                granted.append(got)

    at_once(*[worker] * 8)
    # Then exactly the bucket's 20 tokens were handed out, never one twice (the clock did not move)
    assert sum(granted) == 20


def test_a_take_whose_answer_was_lost_is_recognised_as_its_own(dynamodb: Any, clock: ManualClock) -> None:
    # Given DynamoDB applying a take's write but the answer getting lost (a 500), so it is retried
    lost = lose_answers(dynamodb, "PutItem")
    bucket = budget(dynamodb, clock)
    # When one registration is taken: Then it is granted once, and only one token is gone
    assert bucket.take(1).granted == 1
    assert (lost.lost, lost.sent) == (1, 2)
    stored = bucket.bucket()
    assert stored is not None
    assert stored.tokens == pytest.approx(4.0)


@pytest.mark.parametrize("wanted", [1, 3, 7])
def test_the_bucket_never_grants_more_than_it_holds(wanted: int) -> None:
    # Given a bucket left with 2.5 tokens a second ago, refilling one a second, holding at most 5
    grant, after = take(Bucket(tokens=2.5, at=100.0), wanted, now=101.0, per_second=1.0, capacity=5.0)
    # Then at most 3 (2.5 + 1, whole) are granted, the rest wait for the next whole token
    assert grant.granted == min(wanted, 3)
    assert after.tokens == pytest.approx(3.5 - grant.granted)
    assert grant.wait_seconds == (0 if wanted <= 3 else 1)
