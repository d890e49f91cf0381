"""The daily budget: what the stack has spent today at list prices, and what refresh does once it is passed.

Today's spend is every instance's time since midnight UTC (those that ended today, from their cost item;
those alive, from their record), priced by domain/cost.py `price`, plus the control plane's share of
each hand-over that ended today. Instance time is counted from instances, never from hand-overs too,
so no second is paid twice. It only grows through a UTC day (an instance that ends moves from its
record to its item at the same seconds), so a budget passed once stays passed until midnight, with no
mark to keep: every refresh run finds it passed again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pydantic import Field

from runner_pool.domain.clock import Epoch
from runner_pool.domain.cost import (
    Charges,
    HandOverCost,
    InstanceLife,
    InstanceUse,
    PriceList,
    day_start,
    price,
)
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.settings import Settings


class BudgetSettings(Settings):
    daily_usd: float | None = Field(None, gt=0)
    """What a UTC day may cost at list prices (EC2, EBS and the control plane): refresh emits today's
    spend as `DailySpendUsd`, and the `DailyBudgetExceeded` alarm fires above it. None: no budget."""
    drop_warm_minimums: bool = False
    """Once today's spend passes `daily_usd`, refresh holds every class's warm minimum at 0 until
    midnight UTC: nothing is launched for the pool, and what is idle runs out its idle time."""


def spend_today(
    now: Epoch,
    hand_overs: Iterable[HandOverCost],
    lives: Iterable[InstanceLife],
    live: Iterable[InstanceRecord],
    prices: PriceList,
    *,
    volume_gib: float,
    hourly: Callable[[str, str], float | None],
) -> Charges:
    """What today (UTC) has cost up to `now`: `hand_overs` and `lives` are the items filed under today,
    `live` the records of instances not yet ended."""
    start = day_start(now)
    ended = list(hand_overs)
    stopped_before: dict[str, float] = {}
    for hand_over in ended:
        stopped_before[hand_over.instance_id] = (
            stopped_before.get(hand_over.instance_id, 0.0) + hand_over.stopped_before_seconds
        )
    uses: list[InstanceUse] = []
    for life in lives:
        existed = max(0.0, life.ended_at - max(life.launched_at, start))
        stopped = min(existed, life.stopped_seconds + stopped_before.get(life.instance_id, 0.0))
        uses.append(InstanceUse(existed - stopped, existed, life.ec2_hourly_usd, life.volume_gib))
    for record in live:
        existed = max(0.0, now - max(record.created_at, start))
        stopped = stopped_before.get(record.instance_id, 0.0)
        if record.state in (InstanceState.STOPPED, InstanceState.STOPPING) and record.stopped_at is not None:
            stopped += now - max(record.stopped_at, start)
        stopped = min(existed, max(0.0, stopped))
        rate = hourly(record.instance_type, record.usage_class.value)
        uses.append(InstanceUse(existed - stopped, existed, rate, volume_gib))
    jobs = [
        InstanceUse(0.0, 0.0, hand_over.ec2_hourly_usd, hand_over.volume_gib, tier=hand_over.tier, jobs=1)
        for hand_over in ended
    ]
    return price([*uses, *jobs], prices)


def budget_passed(spend: Charges, settings: BudgetSettings) -> bool:
    return settings.daily_usd is not None and spend.total_usd > settings.daily_usd


def warm_minimums_dropped(spend: Charges, settings: BudgetSettings) -> bool:
    """Whether refresh holds every warm minimum at 0 now: the budget is passed and the operator asked."""
    return settings.drop_warm_minimums and budget_passed(spend, settings)
