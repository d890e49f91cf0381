"""API Gateway's stage throttle as the emulator plays it (emulator/api_gateway.py): a token bucket that
starts full, refills at the rate and refuses a request that finds it empty ("Throttle requests to your
REST APIs for better throughput", api-gateway-request-throttling.html)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from emulator.api_gateway import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_over_the_limit_is_throttled_past_the_buckets_size() -> None:
    # Given a full bucket of 5 that refills at 2 a second
    clock = Clock()
    bucket = TokenBucket(burst=5, rate_per_second=2, clock=clock)
    # When 8 requests come at the same instant
    taken = [bucket.take() for _ in range(8)]
    # Then the first 5 pass and the other 3 are throttled
    assert taken == [True] * 5 + [False] * 3


def test_the_refill_lets_later_requests_through_at_the_rate() -> None:
    # Given a bucket of 5 at 2 a second, emptied
    clock = Clock()
    bucket = TokenBucket(burst=5, rate_per_second=2, clock=clock)
    assert all(bucket.take() for _ in range(5))
    # When 1.5 s pass
    clock.now += 1.5
    # Then 3 tokens came back (2 a second, whole tokens only), and no more
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_an_idle_bucket_refills_only_up_to_its_burst() -> None:
    # Given a bucket of 5 at 2 a second, idle for an hour
    clock = Clock()
    bucket = TokenBucket(burst=5, rate_per_second=2, clock=clock)
    clock.now += 3600
    # When 7 requests come at once / Then only its burst passes
    assert [bucket.take() for _ in range(7)] == [True] * 5 + [False] * 2


@given(
    burst=st.integers(1, 50),
    rate=st.floats(0.5, 100),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_what_passes_never_exceeds_the_burst_plus_the_rate_over_the_time_elapsed(
    burst: int, rate: float, gaps: list[float]
) -> None:
    # Given any bucket, and requests at any instants
    clock = Clock()
    bucket = TokenBucket(burst=burst, rate_per_second=rate, clock=clock)
    began = clock.now
    passed = 0
    for gap in gaps:
        clock.now += gap
        passed += bucket.take()
        # Then what has passed so far is within the burst and what the rate refilled since
        assert passed <= burst + rate * (clock.now - began) + 1e-6
