"""What jobs cost (domain/cost.py) and the daily budget (domain/budget.py): the arithmetic, from records."""

from __future__ import annotations

import pytest

from runner_pool.domain.budget import BudgetSettings, budget_passed, spend_today, warm_minimums_dropped
from runner_pool.domain.cost import (
    IDLE,
    Grouping,
    HandOverCost,
    InstanceLife,
    InstanceUse,
    PriceList,
    idle_use,
    price,
    report,
    utc_day,
)
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import HandOverTier, InstanceRecord, UsageClass
from runner_pool.prices import SPOT_PRICE_RATIO, ec2_hourly, gp3_hourly, on_demand_hourly
from tests.support import builders

MIDNIGHT = 1_800_057_600.0
"""2027-01-16 00:00 UTC."""
PRICES = PriceList(gp3_gib_hourly_usd=0.001, control_plane_per_job_usd={"warm": 0.0005, "cold": 0.0006})


def priced(instance: str) -> dict[str, object]:
    """An instance's part of every cost item: a $0.36/h on-demand instance with a 10 GiB volume."""
    return {
        "instance_id": instance,
        "resource_class": "large",
        "instance_type": "c7i.large",
        "usage_class": "on-demand",
        "ec2_hourly_usd": 0.36,
        "volume_gib": 10,
    }


def hand_over(instance: str = "i-1", tier: HandOverTier = HandOverTier.HOT, **fields: object) -> HandOverCost:
    values: dict[str, object] = {
        **priced(instance),
        "repository": "octo/app",
        "tier": tier,
        "started_at": MIDNIGHT + 3600,
        "ended_at": MIDNIGHT + 3600 + 600,
    }
    return HandOverCost.model_validate(values | fields)


def life(instance: str = "i-1", **fields: object) -> InstanceLife:
    values: dict[str, object] = {
        **priced(instance),
        "launched_at": MIDNIGHT,
        "ended_at": MIDNIGHT + 7200,
    }
    return InstanceLife.model_validate(values | fields)


def record(state: InstanceState = InstanceState.IDLE, **fields: object) -> InstanceRecord:
    values: dict[str, object] = {
        **builders.facts().model_dump(),
        "state": state,
        "threshold": MIDNIGHT + 86_400,
        "created_at": MIDNIGHT,
        "updated_at": MIDNIGHT,
    }
    return InstanceRecord.model_validate(values | fields)


def test_a_hand_over_pays_its_seconds_its_volume_and_its_jobs_control_plane() -> None:
    # Given a 10-minute warm hand-over on a $0.36/h instance with a 10 GiB volume
    charges = price([hand_over().use()], PRICES)
    # Then EC2 is 600 s of the hour's price, the volume 600 s of 10 GiB, and one warm job's control plane
    assert charges.ec2_usd == pytest.approx(0.06)
    assert charges.ebs_usd == pytest.approx(600 / 3600 * 10 * 0.001)
    assert charges.control_plane_usd == pytest.approx(0.0005)
    assert charges.jobs == 1
    # And a cold one pays the cold job's
    assert price([hand_over(tier=HandOverTier.COLD).use()], PRICES).control_plane_usd == pytest.approx(0.0006)


def test_a_type_the_price_list_lacks_is_shown_unpriced_never_free() -> None:
    # Given a hand-over on a type without a price
    charges = price([hand_over(ec2_hourly_usd=None).use()], PRICES)
    # Then its EC2 seconds are counted apart, and its volume and control plane are still priced
    assert charges.ec2_usd == 0
    assert charges.unpriced_seconds == 600
    assert charges.ebs_usd > 0


def test_the_idle_share_is_an_instances_life_less_its_hand_overs_stopped_time_at_ebs_only() -> None:
    # Given a 2-hour life with a 10-minute hand-over, and one from the stopped tier stopped 30 min before it
    from_stopped = hand_over(
        tier=HandOverTier.STOPPED,
        started_at=MIDNIGHT + 5400,
        ended_at=MIDNIGHT + 6000,
        stopped_before_seconds=1800,
    )
    idle = idle_use(life(), [hand_over(), from_stopped, hand_over("i-other")])
    # Then the volume paid 2 h less 20 min, EC2 that less the 30 min stopped; another instance's is not its
    assert idle.ebs_seconds == 7200 - 1200
    assert idle.ec2_seconds == 7200 - 1200 - 1800
    assert idle.jobs == 0


def test_the_report_groups_jobs_and_keeps_the_idle_share_apart() -> None:
    # Given two repositories' hand-overs on one instance and its life
    hand_overs = [
        hand_over(),
        hand_over(repository="octo/lib", started_at=MIDNIGHT + 4200, ended_at=MIDNIGHT + 4500),
    ]
    found = report(hand_overs, [life()], PRICES, Grouping.REPOSITORY)
    # Then each repository has its job, the idle share is apart, and the whole is their sum
    assert sorted(found.groups) == ["octo/app", "octo/lib"]
    assert [charges.jobs for charges in found.groups.values()] == [1, 1]
    assert found.idle.jobs == 0
    assert found.idle.ec2_usd == pytest.approx((7200 - 900) / 3600 * 0.36)
    assert found.total.total_usd == pytest.approx(found.jobs.total_usd + found.idle.total_usd)
    # And by class, the idle share is the class's; by day, the day's
    assert list(report(hand_overs, [life()], PRICES, Grouping.CLASS).idle_by_group) == ["large"]
    assert list(report(hand_overs, [life()], PRICES, Grouping.DAY).groups) == [utc_day(MIDNIGHT)]
    assert IDLE not in found.groups


def test_a_released_record_tells_its_hand_over_and_its_tier() -> None:
    # Given an instance taken from the stopped tier at 01:00, stopped since 00:30, released at 01:10
    released = record(
        handed_over_at=MIDNIGHT + 3600,
        handed_over_from=HandOverTier.STOPPED,
        stopped_at=MIDNIGHT + 1800,
        updated_at=MIDNIGHT + 4200,
        repository="octo/app",
    )
    cost = HandOverCost.of(released, 40, ec2_hourly)
    # Then the hand-over ran 10 minutes after 30 stopped, at the type's price in force
    assert cost is not None
    assert (cost.seconds, cost.stopped_before_seconds, cost.tier) == (600, 1800, HandOverTier.STOPPED)
    assert cost.ec2_hourly_usd == ec2_hourly(released.instance_type, released.usage_class.value)
    assert cost.day == utc_day(MIDNIGHT)
    # And a record from before hand-overs were timed records none
    assert HandOverCost.of(record(), 40, ec2_hourly) is None


def test_spot_is_priced_at_the_published_ratio_of_on_demand() -> None:
    on_demand = on_demand_hourly("c7i.large")
    assert on_demand is not None
    assert ec2_hourly("c7i.large", UsageClass.SPOT.value) == pytest.approx(on_demand * SPOT_PRICE_RATIO)
    assert ec2_hourly("z9.huge", UsageClass.ON_DEMAND.value) is None


def test_an_instance_that_ends_stopped_pays_its_last_stretch_at_ebs_only() -> None:
    # Given an instance stopped at 01:00 (after its hand-over at 00:10) and ended at 02:00
    stopped = record(InstanceState.STOPPED, handed_over_at=MIDNIGHT + 600, stopped_at=MIDNIGHT + 3600)
    ended = InstanceLife.of(stopped, MIDNIGHT + 7200, 40, ec2_hourly)
    # Then its life is two hours, its last hour stopped
    assert (ended.seconds, ended.stopped_seconds) == (7200, 3600)
    # And one stopped before its latest hand-over ended running: that stretch is the hand-over's to tell
    taken = record(handed_over_at=MIDNIGHT + 3600, stopped_at=MIDNIGHT + 600)
    assert InstanceLife.of(taken, MIDNIGHT + 7200, 40, ec2_hourly).stopped_seconds == 0


def test_todays_spend_counts_instance_time_since_midnight_and_the_jobs_control_plane() -> None:
    # Given at 02:00: an instance launched yesterday still running, one stopped since 01:00, one that
    # ended at 01:00 after launching at 00:00, and one hand-over that ended today
    now = MIDNIGHT + 7200
    facts = builders.facts()
    rate = ec2_hourly(facts.instance_type, facts.usage_class.value) or 0.0
    running = record(InstanceState.RUNNING, run_key="pool=1", created_at=MIDNIGHT - 86_400)
    stopped = record(InstanceState.STOPPED, instance_id="i-0000000000000002", stopped_at=MIDNIGHT + 3600)
    ended = life("i-3", ec2_hourly_usd=rate, volume_gib=40, ended_at=MIDNIGHT + 3600)
    spend = spend_today(
        now,
        [hand_over("i-3", volume_gib=40)],
        [ended],
        [running, stopped],
        PRICES,
        volume_gib=40,
        hourly=ec2_hourly,
    )
    # Then EC2 is 2 h + 1 h + 1 h at the rate, the volumes 2 h + 2 h + 1 h, and one warm job's control plane
    assert spend.ec2_usd == pytest.approx(4 * rate)
    assert spend.ebs_usd == pytest.approx(5 * 40 * 0.001)
    assert spend.control_plane_usd == pytest.approx(0.0005)


def test_the_budget_drops_warm_minimums_only_past_it_and_when_asked() -> None:
    spend = price([InstanceUse(3600, 0, 10.0, 1)], PRICES)  # $10
    assert budget_passed(spend, BudgetSettings(daily_usd=9.99))
    assert not budget_passed(spend, BudgetSettings(daily_usd=10))
    assert not budget_passed(spend, BudgetSettings())
    assert not warm_minimums_dropped(spend, BudgetSettings(daily_usd=5))
    assert warm_minimums_dropped(spend, BudgetSettings(daily_usd=5, drop_warm_minimums=True))
    assert not warm_minimums_dropped(spend, BudgetSettings(daily_usd=50, drop_warm_minimums=True))


def test_the_gp3_price_list_is_per_gib_hour() -> None:
    assert gp3_hourly(40) == pytest.approx(40 * gp3_hourly(1))
