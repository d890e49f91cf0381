"""The follow-up state machine's steps (infra/statemachines/follow_up.asl.json), over explicit collaborators.

The dispatcher that leads a run key's follow-up batch starts this machine instead of waiting for the
window in its own Lambda (domain.follow_up). `gather` seals the follow-up once its window closed and
starts its provisions, or answers how long the machine's Wait state should wait before it looks again;
should the provisions not start, `start` tries again with the jobs it sealed, which the machine's state
carries from one to the other. Each step is idempotent: a step tried again finds its own seal,
reservations and executions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import KW_ONLY, dataclass, field

from runner_pool.domain.demand import RunJobs
from runner_pool.domain.executions import FollowUpRequest
from runner_pool.domain.follow_up import GATHER_PAUSE_SECONDS, FollowUp
from runner_pool.steps.demand_starts import DemandStarts, DispatchReport, Group


@dataclass(frozen=True)
class Gathering:
    """One gather step of a follow-up: gathered (sealed and its provisions started, in `report`; or
    sealed with `follow_up`'s jobs still to start, after `error`; or taken over by another dispatch), or
    still open: look again in `wait_seconds`, with `request` (its window moved by later joins)."""

    request: FollowUpRequest
    gathered: bool
    wait_seconds: int = 0
    follow_up: FollowUp | None = None
    error: str | None = None
    report: DispatchReport = field(default_factory=DispatchReport)
    listed: int = 0
    """Jobs of the follow-up that GitHub listed as queued before their demand reached a dispatcher."""
    listing_error: str | None = None
    """Why GitHub could not be asked for the run's queued jobs (the follow-up took what joined it)."""


@dataclass(frozen=True)
class Listing:
    """The jobs GitHub listed as queued for a follow-up's run key, or why it could not be asked."""

    job_ids: frozenset[int] = frozenset()
    error: str | None = None


class FollowUpNotStartedError(RuntimeError):
    """A sealed follow-up's provisions did not all start; the follow-up machine's start step tries again."""


@dataclass(frozen=True)
class FollowUpSteps:
    """GitHub is reached on first use: only a gather step whose window closes within its pause asks it."""

    starts: DemandStarts
    _: KW_ONLY
    run_jobs: Callable[[], RunJobs] | None = None

    def gather(self, request: FollowUpRequest, lease_seconds: float) -> Gathering:
        """Once the window closed (waiting up to GATHER_PAUSE_SECONDS for it here; a window open longer
        is the machine's Wait state's), seal the follow-up as its leader and mark it started in the same
        write, so the run key's next demand opens the next follow-up at once instead of waiting for this
        one's provisions to start; then start its provisions (`start`). Should that fail, its jobs go on
        in the machine's state to its start step, which tries again: a retry of this step could not find
        them once the ledger's item moved on to the next follow-up.

        A step whose window closes within its pause (the one that seals, unless a join moves the window
        on) first asks GitHub for the run's queued jobs (while the window is still open), and the
        follow-up takes those of its run key that no dispatch counted yet: GitHub creates a matrix's jobs
        together and sends their `queued` deliveries over seconds in a burst, so the deliveries that come
        after the seal find their jobs counted instead of opening another follow-up."""
        listing = Listing()
        if request.closes_at - self.starts.clock.now() <= GATHER_PAUSE_SECONDS:
            listing = self._queued_on_github(request)
        sealing = self.starts.seal_once_closed(
            request.repository,
            request.run_key,
            request.holder,
            request.closes_at,
            started=True,
            wait_limit=GATHER_PAUSE_SECONDS,
        )
        if sealing.follow_up is not None:
            follow_up, listed = self._with_listed(sealing.follow_up, listing)
            try:
                report = self.start(request, follow_up, lease_seconds)
            except Exception as exc:  # any fault: the machine's start step tries again
                return Gathering(
                    request,
                    gathered=True,
                    follow_up=follow_up,
                    error=repr(exc),
                    listed=listed,
                    listing_error=listing.error,
                )
            return Gathering(
                request, gathered=True, report=report, listed=listed, listing_error=listing.error
            )
        if sealing.closes_at is None:
            return Gathering(request, gathered=True)  # another dispatch took it over: it starts it
        remaining = sealing.closes_at - self.starts.clock.now()
        moved = request.model_copy(update={"closes_at": sealing.closes_at})
        return Gathering(moved, gathered=False, wait_seconds=max(1, int(remaining)))

    def start(self, request: FollowUpRequest, follow_up: FollowUp, lease_seconds: float) -> DispatchReport:
        """Start one provision per PROVISION_LIMIT jobs of the follow-up the gather step sealed.
        Idempotent: a step tried again finds its own reservations and executions.
        FollowUpNotStartedError when not every provision started."""
        group = Group(
            request.repository,
            request.run_key,
            known_attempts=request.attempts,
            known_repository_id=request.repository_id,
        )
        report = DispatchReport()
        until = self.starts.clock.now() + lease_seconds
        self.starts.start_sealed(report, group, follow_up, request.holder, until, marked=True)
        if report.failures:
            raise FollowUpNotStartedError("; ".join(f"{f.what}: {f.error}" for f in report.failures))
        return report

    def _queued_on_github(self, request: FollowUpRequest) -> Listing:
        """The jobs GitHub lists as queued in the follow-up's run attempts that ask for its run key;
        none, and why, when GitHub could not be asked (the follow-up then takes what joined it)."""
        if self.run_jobs is None:
            return Listing()
        try:
            github = self.run_jobs()
            queued: set[int] = set()
            for run_id, attempt in request.attempts:
                jobs, _ = github.run_jobs(request.repository, run_id, attempt)
                queued.update(
                    job.job_id for job in jobs if job.queued and job.run_key(attempt) == request.run_key
                )
        except Exception as exc:  # any fault (a rate limit, GitHub down): gather without it, never wait
            return Listing(error=repr(exc))
        return Listing(frozenset(queued))

    def _with_listed(self, follow_up: FollowUp, listing: Listing) -> tuple[FollowUp, int]:
        """The sealed follow-up with the listed jobs no dispatch counted yet, and how many those are."""
        listed = listing.job_ids - follow_up.job_ids
        if not listed:
            return follow_up, 0
        with suppress(Exception):  # reserving each finds the counted ones too (COUNTED), a write each
            listed -= self.starts.ledger.counted(listed)
        return follow_up.with_jobs(listed), len(listed)
