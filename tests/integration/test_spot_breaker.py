"""The spot circuit breaker's counts in the state table (moto): one item per interrupted instance, one
conditional opening, with duplicate warnings, lost answers and concurrent writers."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

from emulator.ec2_events import interruption_warning
from emulator.harness.control_plane import stack_config
from emulator.harness.provision_world import output, provision_world
from runner_pool.adapters.spot_breaker import DynamoDbSpotBreaker
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.records import UsageClass
from runner_pool.domain.spot_breaker import SpotBreakerSettings
from tests.conftest import TABLE_NAME
from tests.support.aws_faults import lose_answers
from tests.support.racing import at_once

RUN = "pool=4242"
SETTINGS = SpotBreakerSettings(interruptions=3, window_seconds=600, cooldown_seconds=1800)


def breaker(
    dynamodb: Any, clock: ManualClock, settings: SpotBreakerSettings = SETTINGS
) -> DynamoDbSpotBreaker:
    return DynamoDbSpotBreaker(TABLE_NAME, settings, clock, dynamodb)


def test_the_third_interruption_within_the_window_opens_the_breaker_for_the_cool_down(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two large instances interrupted a minute apart
    counts = breaker(dynamodb, clock)
    assert not counts.note("large", "i-0000000000000001").opened
    clock.advance(60)
    assert not counts.note("large", "i-0000000000000002").opened
    assert counts.open_until("large") is None
    # When a third is interrupted
    clock.advance(60)
    noted = counts.note("large", "i-0000000000000003")
    # Then the breaker opens for the cool-down, for that class only
    assert (noted.opened, noted.interruptions) == (True, 3)
    assert counts.open_until("large") == clock.now() + 1800
    assert counts.open_until("xlarge") is None


def test_a_warning_delivered_again_counts_once(dynamodb: Any, clock: ManualClock) -> None:
    # Given one instance's warning delivered three times, and one other's
    counts = breaker(dynamodb, clock)
    for _ in range(3):
        noted = counts.note("large", "i-0000000000000001")
    noted = counts.note("large", "i-0000000000000002")
    # Then two instances are counted, and the breaker stays shut
    assert (noted.interruptions, noted.opened) == (2, False)
    assert counts.open_until("large") is None


def test_interruptions_that_left_the_window_are_forgotten(dynamodb: Any, clock: ManualClock) -> None:
    # Given two interruptions eleven minutes ago (their items not yet deleted by TTL)
    counts = breaker(dynamodb, clock)
    counts.note("large", "i-0000000000000001")
    counts.note("large", "i-0000000000000002")
    clock.advance(660)
    # When a third comes / Then the window holds one: the breaker stays shut
    assert counts.note("large", "i-0000000000000003").interruptions == 1
    assert counts.open_until("large") is None


def test_after_the_cool_down_one_more_interruption_in_the_window_opens_it_again(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given a breaker opened by three interruptions, with a cool-down shorter than the window
    short = SpotBreakerSettings(interruptions=3, window_seconds=600, cooldown_seconds=120)
    counts = breaker(dynamodb, clock, short)
    for n in range(3):
        counts.note("large", f"i-000000000000000{n}")
    # When the cool-down has passed, and one more instance is interrupted within the window
    clock.advance(121)
    assert counts.open_until("large") is not None
    noted = counts.note("large", "i-0000000000000009")
    # Then it opens again at once: spot was tried, and EC2 is still taking it back
    assert noted.opened
    assert counts.open_until("large") == clock.now() + 120


def test_a_lost_answer_to_the_opening_still_says_this_writer_opened_it(
    dynamodb: Any, clock: ManualClock
) -> None:
    # Given two interruptions counted, and the opening's answer lost after it took effect
    counts = breaker(dynamodb, clock)
    counts.note("large", "i-0000000000000001")
    counts.note("large", "i-0000000000000002")
    lost = lose_answers(dynamodb, "UpdateItem")
    # When the third is counted (botocore retries the opening, which meets its own write)
    noted = counts.note("large", "i-0000000000000003")
    # Then the writer knows it opened the breaker, so the opening is logged and counted once
    assert lost.lost == 1
    assert noted.opened


def test_concurrent_warnings_open_the_breaker_once(dynamodb: Any, clock: ManualClock) -> None:
    # Given six instances of one class interrupted at the same moment, each heard on its own thread
    counts = breaker(dynamodb, clock)
    start = threading.Barrier(6, timeout=30)
    results: list[Any] = []
    lock = threading.Lock()

    def hear(n: int) -> None:
        start.wait()
        noted = counts.note("large", f"i-000000000000000{n}")
        with lock:
            results.append(noted)

    at_once(*(partial(hear, n) for n in range(6)))
    # Then every interruption is counted, and exactly one writer opened the breaker
    assert max(noted.interruptions for noted in results) == 6
    assert sum(noted.opened for noted in results) == 1
    assert counts.open_until("large") == clock.now() + 1800


def test_a_class_ec2_keeps_taking_back_is_provisioned_on_demand_until_the_cool_down_ends() -> None:
    config = stack_config(
        fleet={"spot_breaker": {"interruptions": 3, "window_seconds": 600, "cooldown_seconds": 300}}
    )
    with provision_world(config) as world:
        # Given three spot instances of the class in the pool, each warned of by EC2 (the interruptions
        # function, its calls checked against its synthesized role)
        for n in (1, 2, 3):
            warned = world.warm(n).instance_id
            heard = world.local.hear(interruption_warning(warned, world.clock.now()))
        assert heard["breaker"]["opened"]
        # When a run asks for a spot runner of that class
        first = output(world.provision(RUN, 1))
        # Then it is launched on-demand, spot not even tried
        (instance_id,) = first["cold"]
        assert world.plane.state_table.get(instance_id).usage_class is UsageClass.ON_DEMAND
        assert world.ec2.calls["CreateFleet"] == 1
        # And once the cool-down has passed, the next run's runner is spot again
        world.clock.advance(301)
        second = output(world.provision("pool=4243", 1))
        (instance_id,) = second["cold"]
        assert world.plane.state_table.get(instance_id).usage_class is UsageClass.SPOT
        accounting = world.accounting()
        assert accounting.holds, accounting.problems
