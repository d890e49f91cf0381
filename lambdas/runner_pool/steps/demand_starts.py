"""Starting the provisions of a run key's demand, shared by the dispatcher and the follow-up machine's steps.

Jobs are reserved in the demand ledger, one provision is started per PROVISION_LIMIT reserved jobs, and
the reservations are confirmed with the execution's name, so a job is counted once whoever starts it. A
follow-up is sealed once its window closed and started the same way. Any fault fails the messages whose
work did not happen (SQS delivers them again) and goes into the report: none escapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.demand import (
    DemandLedger,
    ExecutionStarter,
    JobQueued,
    Reservation,
    RunAttempt,
    RunMark,
    privileged_label,
)
from runner_pool.domain.executions import PROVISION_LIMIT, FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.follow_up import SEAL_ATTEMPTS, FollowUp, Sealing
from runner_pool.domain.labels import instant_class
from runner_pool.domain.reruns import served_on_demand
from runner_pool.domain.trust import TrustLevel, least_trusted
from runner_pool.steps.run_trust import RunTrust


@dataclass(frozen=True)
class Failure:
    """Messages whose work did not happen; SQS redelivers them."""

    message_ids: tuple[str, ...]
    what: str
    error: str


@dataclass
class DispatchReport:
    provisions: list[ProvisionRequest] = field(default_factory=list)
    releases: list[ReleaseRequest] = field(default_factory=list)
    duplicates: int = 0
    """Queued jobs already counted or cancelled, and repeats within the batch."""
    held: set[str] = field(default_factory=set)
    """Messages of jobs another dispatch holds: handed back to SQS to try again later."""
    stale: int = 0
    """Queued jobs of a run attempt that had already completed (or whose completion came first)."""
    cancelled: int = 0
    """Jobs cancelled before their demand was counted."""
    joined: int = 0
    """Jobs added to a follow-up batch that another dispatch starts."""
    follow_up_machines: list[FollowUpRequest] = field(default_factory=list)
    """Follow-ups this dispatch leads, given to the follow-up state machine to gather."""
    gathered_here: list[str] = field(default_factory=list)
    """Why the follow-up state machine did not start for a follow-up this dispatch leads (it gathered
    the follow-up itself)."""
    tier_groups: int = 0
    """Times the instant tier's runner group was set to the installation's repositories."""
    failures: list[Failure] = field(default_factory=list)

    @property
    def failed_message_ids(self) -> set[str]:
        """Messages for SQS to deliver again: those whose work failed, and those held elsewhere."""
        return {message_id for failure in self.failures for message_id in failure.message_ids} | self.held


@dataclass
class Group:
    """The queued jobs of one (repository, run key) in a batch, each with the messages that asked for it:
    one run attempt's jobs that ask for the same labels, so one provision serves them all."""

    repository: str
    run_key: str
    jobs: dict[int, JobQueued] = field(default_factory=dict)
    messages: dict[int, list[str]] = field(default_factory=dict)
    runs: dict[tuple[int, int], RunAttempt] = field(default_factory=dict)
    """What the ledger knew of its live run attempts when they were last remembered (live_attempts)."""
    known_attempts: tuple[tuple[int, int], ...] = ()
    """Run attempts of its jobs besides those of `jobs` (a follow-up gathered with none of its messages)."""
    known_repository_id: int | None = None
    """The repository's id, for a follow-up gathered with none of its messages."""

    def add(self, message_id: str, job: JobQueued) -> None:
        self.jobs.setdefault(job.job_id, job)
        self.ask(message_id, job.job_id)

    def ask(self, message_id: str, job_id: int) -> None:
        """Note a message that asked for the job (an instant tier's jobs are known by this alone)."""
        self.messages.setdefault(job_id, []).append(message_id)

    @property
    def instant(self) -> bool:
        """An instant tier's demand (domain/instant.py): no run's, so no run attempt can have ended it."""
        return instant_class(self.run_key) is not None

    def message_ids(self, job_ids: Iterable[int]) -> tuple[str, ...]:
        """This batch's messages for these jobs (a follow-up's jobs that others added have none here)."""
        return tuple(message_id for job_id in job_ids for message_id in self.messages.get(job_id, ()))

    @property
    def repository_id(self) -> int | None:
        """The repository's id, as its jobs' webhooks gave it (None if none did and none is known)."""
        given = (job.repository_id for job in self.jobs.values() if job.repository_id)
        return next(given, self.known_repository_id)

    @property
    def attempts(self) -> list[tuple[int, int]]:
        return sorted(
            {(job.run_id, job.run_attempt) for job in self.jobs.values()} | set(self.known_attempts)
        )

    @property
    def repeated_messages(self) -> int:
        """Messages in the batch for a job another message of the batch already asked for."""
        return sum(len(ids) - 1 for ids in self.messages.values())


@contextmanager
def failing(report: DispatchReport, message_ids: Iterable[str], what: str) -> Iterator[None]:
    """Any fault inside fails these messages (SQS redelivers them) and goes into the report; none escapes."""
    try:
        yield
    except Exception as exc:
        report.failures.append(Failure(tuple(message_ids), what, repr(exc)))


@dataclass(frozen=True)
class DemandStarts:
    """Reserves, starts and confirms the provisions of a dispatch's (or a follow-up's) jobs, and seals
    the follow-up its holder leads."""

    ledger: DemandLedger
    starter: ExecutionStarter
    clock: Clock
    pause: Callable[[float], None]
    """How the leader of a follow-up waits for its window to close (time.sleep in a Lambda)."""
    run_trust: RunTrust

    def live_attempts(self, group: Group) -> set[tuple[int, int]]:
        """The group's run attempts that have not completed (noting its run key for each, and, when one of
        its jobs has an environment, that its pool label is privileged in that attempt); what the ledger
        knows of each is kept in `group.runs`."""
        privileged = {(job.run_id, job.run_attempt) for job in group.jobs.values() if job.privileged}
        runs = {
            (run_id, attempt): self.ledger.remember_run_key(
                run_id, group.run_key, attempt, privileged=(run_id, attempt) in privileged
            )
            for run_id, attempt in group.attempts
        }
        group.runs = {attempt: run for attempt, run in runs.items() if run.mark is not RunMark.COMPLETED}
        return set(group.runs)

    def trust(self, group: Group, job_ids: Collection[int]) -> TrustLevel | None:
        """The level of these jobs of the group: privileged when any of them has an environment or their
        pool label had one in their run attempt (domain.demand.privileged_label); else their runs' level,
        asked of GitHub when no `requested` delivery brought it; None when not known (single use)."""
        label = privileged_label(group.run_key)
        if any(group.jobs[job_id].privileged for job_id in job_ids if job_id in group.jobs) or any(
            label in run.privileged_labels for run in group.runs.values()
        ):
            return TrustLevel.PRIVILEGED
        return least_trusted(
            run.trust
            if run.trust is not None
            else self.run_trust.undelivered(group.repository, run_id, attempt)
            for (run_id, attempt), run in group.runs.items()
        )

    def start_apart(
        self,
        report: DispatchReport,
        group: Group,
        job_ids: Sequence[int],
        *,
        public_ids: Collection[int],
        holder: str,
        until: Epoch,
    ) -> None:
        """Start one provision per PROVISION_LIMIT of these jobs, with no follow-up."""
        for start in range(0, len(job_ids), PROVISION_LIMIT):
            chunk = list(job_ids[start : start + PROVISION_LIMIT])
            self._provision_chunk(report, group, chunk, public_ids=public_ids, holder=holder, until=until)

    def seal_once_closed(
        self,
        repository: str,
        run_key: str,
        holder: str,
        closes_at: Epoch,
        *,
        started: bool = False,
        wait_limit: float = math.inf,
    ) -> Sealing:
        """Wait for the window of the follow-up `holder` leads to close (each join moves it, up to its
        limit) and seal it (`started`: marked started in the same write): sealed (its jobs), taken over
        by another dispatch (neither), or, once it closes more than `wait_limit` from now, still open
        (when it closes)."""
        for _ in range(SEAL_ATTEMPTS):
            remaining = closes_at - self.clock.now()
            if remaining > wait_limit:
                return Sealing(closes_at=closes_at)
            self.pause(max(0.0, remaining))
            sealing = self.ledger.seal(repository, run_key, holder, started=started)
            if sealing.follow_up is not None or sealing.closes_at is None:
                return sealing
            closes_at = sealing.closes_at
        raise RuntimeError(f"the follow-up was still open after {SEAL_ATTEMPTS} looks")

    def start_sealed(
        self,
        report: DispatchReport,
        group: Group,
        follow_up: FollowUp,
        holder: str,
        until: Epoch,
        *,
        marked: bool = False,
    ) -> None:
        """Start one provision (per PROVISION_LIMIT jobs) for a sealed follow-up, then mark it started
        (`marked`: sealed and marked started in one write already).

        Until it is marked, this dispatch's own messages are its guarantee: any failure fails them, so
        SQS delivers them again and that delivery takes the follow-up over (its jobs already started
        are counted in the ledger and not started twice).
        """
        own = group.message_ids(group.jobs)
        try:
            live = self.live_attempts(group)  # the run may have completed while the window was open
        except Exception as exc:  # any fault fails our messages, for SQS to retry them
            report.failures.append(Failure(own, f"start the follow-up of {group.run_key}", repr(exc)))
            return
        if not live and not group.instant:
            report.stale += len(follow_up.job_ids)
        else:
            job_ids = sorted(follow_up.job_ids)
            started = [
                self._provision_chunk(
                    report,
                    group,
                    job_ids[start : start + PROVISION_LIMIT],
                    public_ids=follow_up.public_ids,
                    holder=holder,
                    until=until,
                )
                for start in range(0, len(job_ids), PROVISION_LIMIT)
            ]
            if not all(started):
                # Jobs others added have no message here: ours come back, and take the follow-up over.
                report.failures.append(
                    Failure(own, f"start the follow-up of {group.run_key}", "not all started")
                )
                return
        if marked:
            return
        with failing(report, [], f"mark the follow-up of {group.run_key} started"):
            # Unmarked, the follow-up is taken over once our lease passes, and finds its jobs counted.
            self.ledger.follow_up_started(group.repository, group.run_key, holder)

    def _provision_chunk(
        self,
        report: DispatchReport,
        group: Group,
        job_ids: list[int],
        *,
        public_ids: Collection[int],
        holder: str,
        until: Epoch,
    ) -> bool:
        """Reserve the jobs and start one provision for those reserved; False when it failed."""
        reserved: list[int] = []
        try:
            for job_id in job_ids:
                match self.ledger.reserve(job_id, holder, until):
                    case Reservation.RESERVED:
                        reserved.append(job_id)
                    case Reservation.COUNTED:
                        report.duplicates += 1
                    case Reservation.HELD:
                        # Our message goes back to SQS; a job another dispatch added to a follow-up is
                        # that dispatch's message's to retry.
                        report.held.update(group.message_ids([job_id]))
            if not reserved:
                return True
            request = ProvisionRequest(
                repository=group.repository,
                run_key=group.run_key,
                count=len(reserved),
                job_ids=tuple(reserved),
                public=any(run.from_fork for run in group.runs.values())
                or any(job_id in public_ids for job_id in reserved),
                repository_id=group.repository_id,
                trust=self.trust(group, reserved),
                on_demand=any(served_on_demand(group.run_key, run.on_demand) for run in group.runs.values()),
            )
            self.starter.provision(request)
        except Exception as exc:  # any fault fails the chunk's messages, for SQS to retry them
            self._let_go(reserved, holder)
            what = f"provision {len(job_ids)} runners for {group.run_key}"
            report.failures.append(Failure(group.message_ids(job_ids), what, repr(exc)))
            return False
        report.provisions.append(request)
        # The execution runs from here on: a failed confirmation fails no message (a redelivery would
        # count the jobs twice); it leaves the reservation to lapse instead, and is reported.
        with failing(report, [], f"confirm {request.execution_name}"):
            self.ledger.confirm(reserved, holder, request.execution_name)
        return True

    def _let_go(self, job_ids: list[int], holder: str) -> None:
        """Free what a failed chunk reserved, so its redelivered messages can reserve it again at once."""
        if not job_ids:
            return
        with suppress(Exception):  # the reservation lapses on its own; the chunk's failure is reported
            self.ledger.free(job_ids, holder)
