"""Refresh's job 5b, the instant tier (domain/instant.py): each class's tier kept at its size, its runner
group kept to the installation's repositories, and waiting runners beyond the size taken back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import ExecutionStarter
from runner_pool.domain.executions import PROVISION_LIMIT, ProvisionRequest
from runner_pool.domain.instant import keeps_tier_group, surplus_waiting, tier_holds, tier_shortfall
from runner_pool.domain.labels import instant_label
from runner_pool.domain.ports import InstantTierRecords
from runner_pool.domain.records import InstanceRecord
from runner_pool.domain.refresh import RefreshReport
from runner_pool.domain.runners import GitHubError, RunnerRegistry, RunnerRemoval
from runner_pool.observability import logger


@dataclass(frozen=True)
class InstantTier:
    """Without `executions`, a shortfall is not asked for (the group and the take-back still run)."""

    table: InstantTierRecords
    registry: Callable[[], RunnerRegistry]
    _: KW_ONLY
    clock: Clock
    config: StackConfig
    executions: Callable[[], ExecutionStarter] | None

    def keep(self, report: RefreshReport, tick: int) -> None:
        """Ask for each class's instant-tier shortfall (domain/instant.py) in one provision, which takes
        pristine instances from the pool or launches them and registers their runners with the class's
        generic label. Named after the tick, so two runs at once ask once."""
        if keeps_tier_group(self.config):
            try:
                self.registry().keep_instant_group_in_step()
            except GitHubError:
                logger.warning("instant tier group not set to the installation's repositories; next run")
        if self.executions is None:
            return
        now = self.clock.now()
        for name in self.config.resource_classes:
            size = self.config.instant_tier(name, now)
            minimum = self.config.warm_pool_minimum.get(name)
            if minimum is None or not minimum.keeps_instant():
                continue
            # A tier of 0 (its window closed) is looked at too: its waiting runners are taken back then,
            # not left up until their max runtime.
            label = instant_label(name)
            records = self.table.held_by(label)
            held = tier_holds(records, name, now)
            report.instant[name] = held
            held -= self._take_back(records, name, size, now)
            short = min(tier_shortfall(size, held), PROVISION_LIMIT)
            if short == 0:
                continue
            request = ProvisionRequest(
                repository=str(self.config.github.scope or "instant-tier"),
                run_key=label,
                count=short,
                origin=f"instant-tier-{tick}",
            )
            self.executions().provision(request)
            report.instant_asked[name] += short

    def _take_back(self, records: list[InstanceRecord], name: str, size: int, now: Epoch) -> int:
        """End the tier's waiting instances beyond its size: each runner deleted at GitHub first, which
        GitHub refuses for a runner that has taken a job meanwhile (it is then left to its job). How
        many were ended."""
        ended = 0
        for instance_id in surplus_waiting(records, name, size, now):
            record = next(r for r in records if r.instance_id == instance_id)
            if record.runner_id is None:
                continue
            try:
                removal = self.registry().delete_runner(record.runner_id)
            except GitHubError:
                logger.warning("surplus instant runner not deleted; next run", instance_id=instance_id)
                continue
            if removal is RunnerRemoval.BUSY:
                continue
            if self.table.expire(instance_id, run_key=record.run_key).succeeded:
                ended += 1
        return ended
