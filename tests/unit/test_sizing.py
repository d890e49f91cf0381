"""The sizing rule (domain/sizing.py): how many hot and stopped instances a class holds, from its demand."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner_pool.domain.sizing import HORIZON_SECONDS, HOT_SHARE, SEASON_HOURS, Demand, Holding, pool_size

NOW = 1_800_000_000.0
NONE = Holding()


def demand(arrivals: list[float], **overrides: float) -> Demand:
    settings_ = {
        "watched_since": NOW - 86_400,
        "reuse_rate": 0.0,
        "launch_seconds": 40.0,
        "start_seconds": 20.0,
        "refresh_seconds": 20.0,
    } | overrides
    return Demand(arrivals=arrivals, **settings_)


def poisson(rate: float, seed: int = 1) -> list[float]:
    """Arrivals at `rate` a second over the horizon before NOW, drawn independently."""
    rng = random.Random(seed)
    at = NOW - HORIZON_SECONDS - 120
    found: list[float] = []
    while True:
        at += rng.expovariate(rate)
        if at > NOW:
            return found
        found.append(at)


def test_without_history_the_schedule_is_the_answer() -> None:
    # Given a schedule of 3 hot and 1 stopped in force
    floor = Holding(3, 1)
    # Then with no demand recorded, or one watched for less than a horizon, the rule keeps it
    assert pool_size(None, 15, NOW, floor) == floor
    young = demand(poisson(0.5), watched_since=NOW - HORIZON_SECONDS / 2)
    assert pool_size(young, 15, NOW, floor) == floor


def test_a_class_with_no_recent_job_holds_only_its_floor() -> None:
    assert pool_size(demand([]), 15, NOW, NONE) == NONE
    assert pool_size(demand([NOW - 3 * HORIZON_SECONDS]), 15, NOW, Holding(1, 0)) == Holding(1, 0)


def test_a_launch_within_the_target_needs_no_pool_and_a_start_within_it_only_stopped_instances() -> None:
    busy = poisson(0.1)
    # A launch ready in 40 s meets a 60 s target: nothing held
    assert pool_size(demand(busy), 60, NOW, NONE) == NONE
    # A start ready in 20 s meets a 30 s target: the stopped tier alone holds the stock
    held = pool_size(demand(busy), 30, NOW, NONE)
    assert held.hot == 0
    assert held.stopped > 0
    # Neither meets 15 s: the hot tier holds it, and the stopped tier stands behind
    held = pool_size(demand(busy), 15, NOW, NONE)
    assert held.hot > 0
    assert held.stopped >= 0


def test_steady_arrivals_need_a_pool_near_the_poisson_quantile_of_the_jobs_in_one_lead_time() -> None:
    # Given jobs arriving independently at 0.1 a second, and a lead time of 40 s launch + 20 s refresh
    rate, lead = 0.1, 60.0
    held = pool_size(demand(poisson(rate)), 15, NOW, NONE)
    # Then the hot tier is about the HOT_SHARE quantile of a Poisson count with mean rate x lead
    mean = rate * lead
    cumulative, quantile = 0.0, 0
    while cumulative < HOT_SHARE:
        cumulative += math.exp(-mean) * mean**quantile / math.factorial(quantile)
        quantile += 1
    assert abs(held.hot - (quantile - 1)) <= 2
    # And with the lead time's mean alone (Little's law) it would be too few
    assert held.hot > mean


def test_instances_that_go_back_to_the_pool_count_against_it_only_for_the_share_that_does_not() -> None:
    arrivals = [NOW - HORIZON_SECONDS + n for n in range(0, int(HORIZON_SECONDS), 6)]
    # Arrivals every 6 s in a lead time of 60 s: 10 being replaced at every moment
    assert pool_size(demand(arrivals), 15, NOW, NONE).hot == 10
    # Nine in ten instances come back: one being replaced
    assert pool_size(demand(arrivals, reuse_rate=0.9), 15, NOW, NONE).hot == 1


def test_the_floor_and_the_ceiling_bound_the_answer_and_the_floor_wins() -> None:
    busy = demand(poisson(0.2))
    held = pool_size(busy, 15, NOW, NONE)
    assert held.hot > 2
    assert pool_size(busy, 15, NOW, NONE, ceiling=Holding(2, 1)) == Holding(2, min(held.stopped, 1))
    assert pool_size(busy, 15, NOW, Holding(50, 70)) == Holding(50, 70)
    assert pool_size(busy, 15, NOW, Holding(5, 5), ceiling=Holding(2, 1)) == Holding(5, 5)


times = st.lists(st.floats(min_value=NOW - 2 * HORIZON_SECONDS, max_value=NOW), max_size=60)
boots = st.floats(min_value=16, max_value=300)
reuse = st.floats(min_value=0, max_value=1)


@settings(max_examples=150, deadline=None)
@given(times, times, boots, reuse)
def test_more_arrivals_never_fewer_instances(
    arrivals: list[float], more: list[float], launch: float, reused: float
) -> None:
    fewer = pool_size(demand(arrivals, launch_seconds=launch, reuse_rate=reused), 15, NOW, NONE)
    held = pool_size(demand(arrivals + more, launch_seconds=launch, reuse_rate=reused), 15, NOW, NONE)
    assert held.hot >= fewer.hot
    assert held.hot + held.stopped >= fewer.hot + fewer.stopped


@settings(max_examples=150, deadline=None)
@given(times, boots, boots, st.floats(min_value=0, max_value=200), st.floats(min_value=0, max_value=100))
def test_a_longer_boot_never_fewer_instances(
    arrivals: list[float], launch: float, start: float, longer: float, target: float
) -> None:
    base = demand(arrivals, launch_seconds=launch, start_seconds=min(start, launch))
    for slower in (
        replace(base, launch_seconds=launch + longer),
        replace(base, start_seconds=min(launch, base.start_seconds + longer)),
    ):
        held, quicker = pool_size(slower, target, NOW, NONE), pool_size(base, target, NOW, NONE)
        assert held.hot >= quicker.hot
        assert held.hot + held.stopped >= quicker.hot + quicker.stopped


@settings(max_examples=150, deadline=None)
@given(times, st.tuples(boots, boots), reuse, st.floats(1, 100), st.floats(0, 200))
def test_a_looser_target_never_more_instances(
    arrivals: list[float], launch_and_start: tuple[float, float], reused: float, target: float, looser: float
) -> None:
    # A target a start or a launch meets lets the rule hold instances stopped or none: never more than a
    # tighter one, hot or in all
    launch, start = launch_and_start
    base = demand(arrivals, launch_seconds=launch, start_seconds=min(start, launch), reuse_rate=reused)
    tight, loose = pool_size(base, target, NOW, NONE), pool_size(base, target + looser, NOW, NONE)
    assert loose.hot <= tight.hot
    assert loose.hot + loose.stopped <= tight.hot + tight.stopped


@settings(max_examples=150, deadline=None)
@given(
    times,
    st.builds(Holding, st.integers(0, 20), st.integers(0, 20)),
    st.builds(Holding, st.integers(0, 20), st.integers(0, 20)),
    reuse,
)
def test_the_floor_and_ceiling_hold(
    arrivals: list[float], floor: Holding, ceiling: Holding, reused: float
) -> None:
    held = pool_size(demand(arrivals, reuse_rate=reused), 15, NOW, floor, ceiling)
    assert held.hot >= floor.hot
    assert held.stopped >= floor.stopped
    assert held.hot <= max(floor.hot, ceiling.hot)
    assert held.stopped <= max(floor.stopped, ceiling.stopped)


@pytest.mark.parametrize("reused", [0.0, 0.5])
def test_a_hot_pool_of_the_rules_size_serves_its_share_of_steady_arrivals(reused: float) -> None:
    # Given steady independent arrivals, and the rule's hot tier for them
    arrivals = poisson(0.15, seed=7)
    lead = 60.0
    held = pool_size(demand(arrivals, reuse_rate=reused), 15, NOW, NONE)
    # When each arrival is checked against the instances being replaced as it comes (the jobs of the
    # last lead time whose instance does not come back, the rule's model)
    inside = [at for at in arrivals if at > NOW - HORIZON_SECONDS]
    served = sum(
        1
        for at in inside
        if (1 - reused) * sum(1 for other in arrivals if at - lead < other <= at) <= held.hot
    )
    # Then about the hot tier's share of them find one (the rule covers a share of moments; a job counted
    # with itself comes to a moment one busier, so a little fewer jobs than moments are covered)
    assert served / len(inside) >= HOT_SHARE - 0.06


def test_the_reuse_supply_shrinks_only_the_hot_tier() -> None:
    # Given steady arrivals, with no instance coming back and with nine in ten coming back
    arrivals = poisson(0.15, seed=3)
    alone = pool_size(demand(arrivals), 15, NOW, NONE)
    reused = pool_size(demand(arrivals, reuse_rate=0.9), 15, NOW, NONE)
    # Then fewer are held hot, and the stopped tier stands behind for the rest: a matrix takes its
    # instances at once, and none of theirs comes back within a start
    assert reused.hot < alone.hot
    assert reused.hot + reused.stopped == alone.hot + alone.stopped


def test_a_burst_is_held_for_a_lead_time_after_it_leaves_the_horizon() -> None:
    # Given a burst of 30 jobs whose lead time (40 s launch + 20 s refresh) leaves the horizon at NOW
    lead = 40.0 + 20.0
    burst = demand([NOW - HORIZON_SECONDS - lead] * 30)
    assert pool_size(burst, 15, NOW - 30, NONE).stopped > 0
    # Then the rule still holds for it just after (its answer a refresh ago)
    assert pool_size(burst, 15, NOW + 10, NONE).stopped > 0
    # And once the lower need has lasted a lead time, nothing is held
    assert pool_size(burst, 15, NOW + lead, NONE) == NONE


def test_a_burst_at_the_same_minutes_of_each_of_the_last_hours_is_held_hot_ahead_of_its_repeat() -> None:
    # Given 4 jobs a minute after the top of each of the last SEASON_HOURS hours, and nothing else
    top = NOW - NOW % 3600 + 3600
    hourly = [top - back * 3600 + 60 + n for back in range(1, SEASON_HOURS + 1) for n in range(4)]
    # Then just before the next top of the hour the rule holds them hot (the window ahead is a lead of 60 s
    # and a refresh period of 20 s), where the horizon alone holds them stopped: they fill too few moments
    held = pool_size(demand(hourly), 15, top - 10, NONE)
    assert held.hot == 4
    assert pool_size(demand(hourly[:4]), 15, top - 10, NONE) == Holding(0, held.hot + held.stopped)
    # And once one of those hours had none (the last, or the first), nothing is held hot for them
    assert pool_size(demand(hourly[4:]), 15, top - 10, NONE).hot == 0
    assert pool_size(demand(hourly[:-4]), 15, top - 10, NONE).hot == 0
