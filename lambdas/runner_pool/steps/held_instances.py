"""The instances a provision holds: whether one is ready for its run; letting go of those it cannot use."""

from __future__ import annotations

from collections.abc import Callable

from runner_pool.domain.clock import Clock
from runner_pool.domain.ports import HeldRecords, Terminations
from runner_pool.domain.provision import ProvisionPlan, Readiness, readiness
from runner_pool.domain.records import InstanceView
from runner_pool.domain.timeouts import Timeouts


class HeldInstances:
    """What Begin, the claim workers, Create, Finish and Dump share about the instances they hold."""

    def __init__(
        self, table: HeldRecords, fleet: Callable[[], Terminations], *, clock: Clock, timeouts: Timeouts
    ) -> None:
        self._table = table
        self._fleet = fleet
        self._clock = clock
        self._timeouts = timeouts

    def readiness(
        self,
        view: InstanceView,
        *,
        provision: ProvisionPlan,
        claim_token: str | None,
        handed_over_at: float,
        deadline: float,
        starting: bool = False,
    ) -> tuple[Readiness, str]:
        """DESIGN.md 6.1's checks of one instance handed a runner for the provision's run."""
        return readiness(
            view.record,
            view.heartbeat,
            view.signal,
            run_key=provision.spec.run_key,
            claim_token=claim_token,
            handed_over_at=handed_over_at,
            deadline=deadline,
            now=self._clock.now(),
            timeouts=self._timeouts,
            starting=starting,
        )

    def expire_and_terminate(self, instance_ids: list[str], run_key: str) -> list[str]:
        """Expire each record still held for the run, then terminate those (and any without a record);
        returns them, the ones this ended.

        An instance whose record another run holds now, or that a release moved on, is left alone: it is
        not ours any more, and not counted as ended here.
        """
        if not instance_ids:
            return []
        doomed: list[str] = []
        for instance_id in instance_ids:
            result = self._table.expire(instance_id, run_key)
            if result.succeeded or result.record is None:
                doomed.append(instance_id)
        if doomed:
            self._fleet().terminate(doomed)
        return doomed
