"""Jobs waiting for capacity: EC2's reason for a shortfall, and the back-off between tries."""

from __future__ import annotations

from runner_pool.domain.capacity_waits import CapacityWait, Shortfall, backoff_seconds, shortfall_reason
from runner_pool.domain.config import FleetSettings


def test_each_try_waits_twice_as_long_up_to_a_quarter_of_an_hour() -> None:
    first = FleetSettings().capacity_retry_seconds
    assert [backoff_seconds(tries, first) for tries in range(1, 7)] == [60, 120, 240, 480, 900, 900]
    assert backoff_seconds(50, first) == 900


def test_a_shorter_first_wait_doubles_up_to_fifteen_times_itself() -> None:
    assert [backoff_seconds(tries, 4.0) for tries in range(1, 7)] == [4, 8, 16, 32, 60, 60]


def test_the_reason_is_ec2s_codes_with_the_pools_each_refused() -> None:
    # Given a creation that launched 1 of 3, EC2 refusing four pools / Then the reason names each code
    reason = shortfall_reason(3, 1, {"UnfulfillableCapacity": 2, "InsufficientInstanceCapacity": 1})
    assert reason == "InsufficientInstanceCapacity (1 pool), UnfulfillableCapacity (2 pools)"
    # And a creation that launched everything, or one EC2 said nothing about, has none
    assert shortfall_reason(3, 3, {"InsufficientInstanceCapacity": 2}) is None
    assert shortfall_reason(3, 1, {}) is None


def shortfall(
    execution: str, *, jobs: int = 2, reason: str = "InsufficientInstanceCapacity (2 pools)"
) -> Shortfall:
    """A short provision of one run key's jobs."""
    return Shortfall(
        execution=execution,
        repository="octo-org/app",
        run_key="pool=1/class=large",
        resource_class="large",
        usage="spot",
        jobs=jobs,
        reason=reason,
    )


def test_another_short_provision_backs_off_longer_and_a_retried_note_counts_once() -> None:
    # Given a wait after one short provision
    first = CapacityWait.begun(shortfall("provision-a"), now=1000.0, first_backoff=60)
    assert not first.due(1059.0)
    assert first.due(1060.0)
    # When another provision ends short at 1100 / Then it waits two minutes, from the same start
    second = first.tried_again(
        shortfall("provision-b", jobs=1, reason="UnfulfillableCapacity (1 pool)"), now=1100, first_backoff=60
    )
    assert (second.tries, second.next_try, second.since, second.jobs) == (2, 1220.0, 1000.0, 1)
    # And the same provision's Finish, retried, counts no second try
    assert (
        second.tried_again(shortfall("provision-b", jobs=1, reason="x"), now=1200, first_backoff=60) is second
    )
