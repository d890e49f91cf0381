"""What the stack spends: the cost items a release and refresh write, and refresh's daily budget.

Recording is best effort: a cost item that cannot be written is logged and counted (`CostNotRecorded`),
and the release or termination it describes goes on; the report then misses that hand-over, and its time
shows in the instance's idle share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from runner_pool.domain.budget import spend_today, warm_minimums_dropped
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.cost import HandOverCost, InstanceLife, utc_day
from runner_pool.domain.ports import CostLedger
from runner_pool.domain.records import InstanceRecord
from runner_pool.observability import count, logger
from runner_pool.prices import ec2_hourly, list_prices


class Spend:
    def __init__(self, ledger: Callable[[], CostLedger], clock: Clock, config: StackConfig) -> None:
        """`ledger` is built on first use."""
        self._ledger = ledger
        self._clock = clock
        self._config = config
        self.dropped = False
        """Whether the latest budget check held every warm minimum at 0 (`keep_budget`)."""

    @property
    def _volume_gib(self) -> int:
        return self._config.instances.root_volume_gib

    def hand_over_ended(self, released: InstanceRecord) -> None:
        """Record the hand-over whose release made `released` idle (a replay of the release records the
        same item, which the ledger recognises)."""
        cost = HandOverCost.of(released, self._volume_gib, ec2_hourly)
        if cost is not None:
            self._record(lambda ledger: ledger.hand_over_ended(cost), released.instance_id)

    def instance_ended(self, record: InstanceRecord, ended_at: Epoch) -> None:
        """Record the life of the instance `record` was, ended (marked terminated) at `ended_at`."""
        life = InstanceLife.of(record, ended_at, self._volume_gib, ec2_hourly)
        self._record(lambda ledger: ledger.instance_ended(life), record.instance_id)

    def keep_budget(self, live: Iterable[InstanceRecord]) -> None:
        """Today's spend, emitted as `DailySpendUsd`; `dropped` when the budget is passed and drops the warm
        minimums (logged and counted as `WarmMinimumsDropped` at each run that holds them at 0). Refresh
        lowers them as a schedule's closing window does: nothing is terminated for it."""
        self.dropped = False
        budget = self._config.budget
        if budget.daily_usd is None:
            return
        now = self._clock.now()
        hand_overs, lives = self._ledger().day(utc_day(now))
        spend = spend_today(
            now, hand_overs, lives, live, list_prices(), volume_gib=self._volume_gib, hourly=ec2_hourly
        )
        count("DailySpendUsd", spend.total_usd)
        self.dropped = warm_minimums_dropped(spend, budget)
        if self.dropped:
            count("WarmMinimumsDropped")
            logger.warning(
                "daily budget passed: every warm minimum is 0 until midnight UTC",
                spend_usd=round(spend.total_usd, 4),
                daily_usd=budget.daily_usd,
            )

    def _record(self, write: Callable[[CostLedger], bool], instance_id: str) -> None:
        try:
            recorded = write(self._ledger())
        except Exception:
            logger.exception("cost item not recorded", instance_id=instance_id)
            recorded = False
        if not recorded:
            count("CostNotRecorded")
