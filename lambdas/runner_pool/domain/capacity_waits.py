"""Jobs waiting for capacity: what EC2 refused a provision, and when to ask again.

A provision whose creation launched fewer instances than it asked for, with EC2's reasons in the fleet's
`Errors` (CreateFleet reports a pool it could not launch in instead of failing the call: EC2 API
Reference, CreateFleet, response element `Errors`), ends short after the on-demand fallback. Asking again
at once would meet the same answer: the run key's wait is noted instead, with EC2's error codes, and
refresh's reconciliation provisions the still-queued jobs again only once `next_try` has come, each try
waiting twice as long as the one before, from `fleet.capacity_retry_seconds` (a minute) up to fifteen times
that (a quarter of an hour). A provision that serves
every job of the run key ends the wait. Until then the operator sees it in `runner-pool status`, the
`JobsWaitingForCapacity` metric and its alarm, and the job's author a check run on the run's head commit
that names the jobs, the class and EC2's error (`waiting_check`), completed when they are served
(`served_check`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from runner_pool.domain.clock import Epoch

Conclusion = Literal["success", "neutral"]
"""How the control plane concludes a check run: its jobs served, or their run finished first."""

CHECK_RUN_NAME = "runner-pool: waiting for EC2 capacity"
"""The check run's name, one per run key and commit, beside the workflow's own checks."""
MAX_JOB_NAMES = 5
LONGEST_BACKOFF = 15
"""The longest wait between tries, in first waits: at the default minute, capacity that comes back is used
within a quarter of an hour, and a class out of capacity for hours costs four CreateFleet calls an hour per
run key, not sixty."""


def backoff_seconds(tries: int, first: float) -> float:
    """How long after its `tries`-th short provision a run key is tried again, `first` after the first."""
    return min(LONGEST_BACKOFF * first, first * float(2 ** max(0, tries - 1)))


def shortfall_reason(requested: int, launched: int, launch_errors: Mapping[str, int]) -> str | None:
    """EC2's reason for a creation that launched fewer than it asked for, as its error codes with the
    number of pools each refused; None when EC2 launched everything, or said nothing."""
    if launched >= requested or not launch_errors:
        return None
    return ", ".join(
        f"{code} ({pools} pool{'s' if pools != 1 else ''})" for code, pools in sorted(launch_errors.items())
    )


@dataclass(frozen=True)
class CheckRun:
    """A check run the control plane created, and the App it went through (of several; None for the
    one App): only that App may complete it, as GitHub answers any other App's update "check run can
    only be modified by the GitHub App that created it" (a 403)."""

    check_run_id: int
    app_id: str | None = None


@dataclass(frozen=True)
class Shortfall:
    """One provision (`execution`) that EC2 left short: the jobs of its run key it could not serve, and why.
    Each is noted (adapters/capacity_waits.py `note`): it begins the run key's wait, or tries it again."""

    execution: str
    repository: str
    run_key: str
    resource_class: str
    usage: str
    jobs: int
    reason: str
    """EC2's error codes (`shortfall_reason`)."""


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
    check_run: CheckRun | None = None
    """The check run that tells the jobs' author why they wait; None until one is created."""

    def due(self, now: Epoch) -> bool:
        return now >= self.next_try

    @classmethod
    def begun(cls, shortfall: Shortfall, now: Epoch, first_backoff: float) -> CapacityWait:
        """The wait a run key's first short provision begins: tried once, tried again after a back-off."""
        return cls(
            repository=shortfall.repository,
            run_key=shortfall.run_key,
            resource_class=shortfall.resource_class,
            usage=shortfall.usage,
            reason=shortfall.reason,
            jobs=shortfall.jobs,
            since=now,
            tries=1,
            next_try=now + backoff_seconds(1, first_backoff),
            last_execution=shortfall.execution,
        )

    def tried_again(self, shortfall: Shortfall, *, now: Epoch, first_backoff: float) -> CapacityWait:
        """This wait after another short provision, unless `shortfall` is the one noted already."""
        if shortfall.execution == self.last_execution:
            return self
        tries = self.tries + 1
        return replace(
            self,
            reason=shortfall.reason,
            jobs=shortfall.jobs,
            tries=tries,
            next_try=now + backoff_seconds(tries, first_backoff),
            last_execution=shortfall.execution,
        )


def _named(job_names: Sequence[str], jobs: int) -> str:
    shown = [f"`{name}`" for name in job_names[:MAX_JOB_NAMES]]
    more = jobs - len(shown)
    if not shown:
        return f"{jobs} job{'s' if jobs != 1 else ''}"
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def waiting_check(wait: CapacityWait, job_names: Sequence[str]) -> tuple[str, str]:
    """The check run's title and summary while the jobs wait: the jobs, their class and EC2's error."""
    jobs = _named(job_names, wait.jobs)
    verb = "waits" if wait.jobs == 1 else "wait"
    title = f"{jobs} {verb} for a `{wait.resource_class}` runner: EC2 has no capacity"
    summary = (
        f"EC2 could not launch an instance of resource class `{wait.resource_class}` ({wait.usage}, then "
        f"on-demand) for {jobs}: {wait.reason}. runner-pool asks again with a back-off, from a minute up to "
        f"a quarter of an hour ({wait.tries} tr{'ies' if wait.tries != 1 else 'y'} so far), and completes "
        "this check when the jobs have their runners. Other instance types (`types=`), another class, or "
        "more subnets give EC2 more pools to choose from."
    )
    return title, summary


def served_check(wait: CapacityWait, now: float) -> tuple[str, str]:
    """The check run's title and summary once the jobs are served."""
    minutes = max(0, round((now - wait.since) / 60))
    title = f"Capacity is back: the `{wait.resource_class}` jobs have their runners"
    summary = (
        f"EC2 launched the jobs' instances after {minutes} minute{'s' if minutes != 1 else ''} of waiting."
    )
    return title, summary


def finished_check(wait: CapacityWait) -> tuple[str, str]:
    """The check run's title and summary when the run finished before capacity came back."""
    title = "The run finished while its jobs waited for capacity"
    summary = f"runner-pool stopped waiting for `{wait.resource_class}` capacity for it: {wait.reason}."
    return title, summary
