"""Jobs waiting for capacity: what EC2 refused a provision, and when to ask again.

A provision whose creation launched fewer instances than it asked for, with EC2's reasons in the fleet's
`Errors` (CreateFleet reports a pool it could not launch in instead of failing the call: EC2 API
Reference, CreateFleet, response element `Errors`), ends short after the on-demand fallback. Asking again
at once would meet the same answer: the run key's wait is noted instead, with EC2's error codes, and
refresh's reconciliation provisions the still-queued jobs again only once `next_try` has come, each try
waiting twice as long as the one before, from a minute up to a quarter of an hour. A provision that serves
every job of the run key ends the wait. Until then the operator sees it in `runner-pool status`, the
`JobsWaitingForCapacity` metric and its alarm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner_pool.domain.clock import Epoch

FIRST_BACKOFF_SECONDS = 60.0
"""The first wait after a shortfall: refresh's schedule, the soonest reconciliation looks again anyway."""
MAX_BACKOFF_SECONDS = 900.0
"""The longest wait between tries: capacity that comes back is used within a quarter of an hour, and a
class out of capacity for hours costs four CreateFleet calls an hour per run key, not sixty."""


def backoff_seconds(tries: int) -> float:
    """How long after its `tries`-th short provision a run key is tried again."""
    return min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * float(2 ** max(0, tries - 1)))


def shortfall_reason(requested: int, launched: int, launch_errors: Mapping[str, int]) -> str | None:
    """EC2's reason for a creation that launched fewer than it asked for, as its error codes with the
    number of pools each refused; None when EC2 launched everything, or said nothing."""
    if launched >= requested or not launch_errors:
        return None
    return ", ".join(
        f"{code} ({pools} pool{'s' if pools != 1 else ''})" for code, pools in sorted(launch_errors.items())
    )


@dataclass(frozen=True)
class CapacityWait:
    """The jobs of one run key that a provision could not get capacity for."""

    repository: str
    run_key: str
    resource_class: str
    usage: str
    reason: str
    """EC2's error codes (`shortfall_reason`)."""
    jobs: int
    """Jobs left unserved by the last short provision."""
    since: Epoch
    tries: int
    next_try: Epoch
    last_execution: str
    """The provision that noted it last: a retried Finish of the same execution counts no second try."""

    def due(self, now: Epoch) -> bool:
        return now >= self.next_try

    def tried_again(self, *, execution: str, jobs: int, reason: str, now: Epoch) -> CapacityWait:
        """This wait after another short provision (`execution`), unless it is the one noted already."""
        if execution == self.last_execution:
            return self
        tries = self.tries + 1
        return CapacityWait(
            repository=self.repository,
            run_key=self.run_key,
            resource_class=self.resource_class,
            usage=self.usage,
            reason=reason,
            jobs=jobs,
            since=self.since,
            tries=tries,
            next_try=now + backoff_seconds(tries),
            last_execution=execution,
        )
