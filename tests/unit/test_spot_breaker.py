"""The spot circuit breaker's rule: distinct instances within a sliding window against a threshold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_pool.domain.config import ConfigError, load_config
from runner_pool.domain.records import UsageClass
from runner_pool.domain.spot_breaker import (
    Interruption,
    SpotBreakerSettings,
    in_window,
    trips,
    usage_for,
)

SETTINGS = SpotBreakerSettings(interruptions=3, window_seconds=600, cooldown_seconds=1800)
NOW = 10_000.0


def test_the_threshold_within_the_window_trips_the_breaker() -> None:
    # Given three instances interrupted within the last ten minutes / Then the breaker trips
    recent = [Interruption(f"i-{n}", NOW - 60 * n) for n in range(3)]
    assert trips(recent, NOW, SETTINGS)
    # ... but not with two
    assert not trips(recent[:2], NOW, SETTINGS)


def test_interruptions_older_than_the_window_do_not_count() -> None:
    # Given two recent interruptions and one eleven minutes ago / Then the window holds two: no trip
    interruptions = [Interruption("i-1", NOW), Interruption("i-2", NOW - 10), Interruption("i-3", NOW - 660)]
    assert in_window(interruptions, NOW, SETTINGS) == 2
    assert not trips(interruptions, NOW, SETTINGS)


def test_one_instance_warned_twice_counts_once() -> None:
    # Given the same instance's warning delivered three times / Then it is one interruption
    assert in_window([Interruption("i-1", NOW - n) for n in range(3)], NOW, SETTINGS) == 1


def test_a_threshold_of_zero_turns_the_breaker_off() -> None:
    off = SpotBreakerSettings(interruptions=0)
    assert not off.enabled
    assert not trips([Interruption(f"i-{n}", NOW) for n in range(50)], NOW, off)


def test_spot_demand_goes_on_demand_only_while_open() -> None:
    # Given a breaker open until NOW + 5
    until = NOW + 5
    # Then spot demand is served on-demand until then, and spot from then on
    assert usage_for(UsageClass.SPOT, until, NOW) is UsageClass.ON_DEMAND
    assert usage_for(UsageClass.SPOT, until, until) is UsageClass.SPOT
    assert usage_for(UsageClass.SPOT, None, NOW) is UsageClass.SPOT
    # And on-demand demand stays on-demand whatever the breaker says
    assert usage_for(UsageClass.ON_DEMAND, None, NOW) is UsageClass.ON_DEMAND


@given(st.lists(st.tuples(st.integers(0, 9), st.floats(0, 2000)), max_size=30))
def test_the_window_counts_each_instance_at_most_once(warnings: list[tuple[int, float]]) -> None:
    interruptions = [Interruption(f"i-{n}", NOW - ago) for n, ago in warnings]
    counted = in_window(interruptions, NOW, SETTINGS)
    assert counted <= len({n for n, _ in warnings})
    assert counted == len({n for n, ago in warnings if ago <= SETTINGS.window_seconds})


def test_the_stack_config_carries_the_breaker_with_its_defaults() -> None:
    # Given no setting / Then three interruptions in ten minutes open it for half an hour
    defaults = load_config({}).fleet.spot_breaker
    assert (defaults.interruptions, defaults.window_seconds, defaults.cooldown_seconds) == (3, 600, 1800)
    # And an operator sets each, while a negative threshold is refused with the setting's name
    chosen = load_config({"fleet": {"spot_breaker": {"interruptions": 5, "cooldown_seconds": 60}}})
    assert chosen.fleet.spot_breaker.interruptions == 5
    assert chosen.fleet.spot_breaker.cooldown_seconds == 60
    with pytest.raises(ConfigError, match=r"fleet\.spot_breaker\.interruptions"):
        load_config({"fleet": {"spot_breaker": {"interruptions": -1}}})
