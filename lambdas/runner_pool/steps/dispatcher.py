"""The dispatcher's step: one batch of demand messages in, provision and release executions out.

Cancellations and requested runs (whose level of trust is decided then, steps.run_trust) go first, so a job
cancelled in the same batch as its demand is never counted and a run's level is there before its demand; run
completions next, so a run that completed refuses the rest of its demand; then each run key's queued jobs take
a turn in the ledger (domain.follow_up: first, joined, leader, taken over, waiting), and so do each instant
tier's, under the tier's label per owner; an installation's changed repositories set the tier's runner group
once; releases after. Last, so nothing else of the batch waits: demand that met its follow-up being started
waits for that start, and each follow-up this dispatch leads is given to the follow-up state machine (or,
should that not start, gathered here). What failed is in the report, for SQS to deliver again; nothing raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runner_pool.domain.clock import Epoch
from runner_pool.domain.demand import (
    DemandMessage,
    InstanceRelease,
    InstantQueued,
    JobCancelled,
    JobQueued,
    RunCompleted,
    RunFromFork,
    RunRequested,
    TierGroupChanged,
)
from runner_pool.domain.executions import FollowUpRequest, ReleaseRequest
from runner_pool.domain.follow_up import (
    FOLLOW_UP_LIMIT_SECONDS,
    FOLLOW_UP_WINDOW_SECONDS,
    SEALED_LOOK_SECONDS,
    SEALED_WAIT_SECONDS,
    Arrival,
    BatchRole,
    BatchTurn,
    WindowSpan,
)
from runner_pool.domain.labels import instant_label
from runner_pool.steps.class_history import HistoryNotes
from runner_pool.steps.demand_starts import DemandStarts, DispatchReport, Failure, Group, failing
from runner_pool.steps.reruns import Reruns


@dataclass(frozen=True)
class _Jobs:
    """The jobs of a group that take a turn in the ledger: their ids, and which are a public repository's."""

    job_ids: list[int]
    public_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, jobs: Sequence[JobQueued]) -> _Jobs:
        return cls([job.job_id for job in jobs], frozenset(job.job_id for job in jobs if job.public))


@dataclass
class _Turns:
    """What one dispatch still has to do once every group took its turn."""

    waiting: list[tuple[Group, _Jobs]] = field(default_factory=list)
    """Groups that met their follow-up being started, with their current jobs."""
    led: list[tuple[Group, Epoch]] = field(default_factory=list)
    """Follow-ups this dispatch leads, with when their window closes."""


class Dispatcher:
    """The ledger counts each job once and brings a run key's demand together; the starter starts the
    executions by name."""

    def __init__(
        self,
        starts: DemandStarts,
        *,
        window_seconds: float = FOLLOW_UP_WINDOW_SECONDS,
        limit_seconds: float = FOLLOW_UP_LIMIT_SECONDS,
        sealed_wait_seconds: float = SEALED_WAIT_SECONDS,
        reruns: Reruns | None = None,
        tier_group: Callable[[], object] | None = None,
        history: HistoryNotes | None = None,
    ) -> None:
        """`starts` holds the ledger, the starter, the clock, how demand waits (for a follow-up being
        started, or, gathered here, for a window to close) and the runs' levels of trust; `reruns` re-runs
        a completed run whose job an interruption failed (without it: none is); `tier_group` sets the
        instant tier's runner group to the installation's repositories
        (domain.runners.RunnerRegistry.keep_instant_group_in_step; without it that is left to refresh);
        `history` notes each queued job's arrival in its class, for adaptive sizing (without it: none is)."""
        self._starts = starts
        self._reruns = reruns
        self._history = history
        self._span = WindowSpan(window_seconds, limit_seconds)
        self._sealed_wait = sealed_wait_seconds
        self._tier_group = tier_group

    def dispatch(
        self, batch: Sequence[tuple[str, DemandMessage]], holder: str, lease_seconds: float
    ) -> DispatchReport:
        """Act on one batch of (message id, message); what failed is in the report, nothing raises.
        `holder` names this dispatch in the ledger; its reservations lapse `lease_seconds` from now."""
        report = DispatchReport()
        for message_id, message in batch:
            if isinstance(message, JobCancelled):
                with failing(report, [message_id], f"cancel job {message.job_id}"):
                    self._cancel(report, message)
            elif isinstance(message, RunRequested | RunFromFork):
                with failing(report, [message_id], f"decide the level of run {message.run_id}"):
                    self._starts.run_trust.requested(message)
        for message_id, message in batch:
            if isinstance(message, RunCompleted):
                with failing(report, [message_id], f"release {message.cause}"):
                    self._complete(report, message)
        self._note_arrivals(batch)
        until = self._starts.clock.now() + lease_seconds
        turns = _Turns()
        for group in _groups(batch):
            self._provision(report, group, holder, until, turns)
        for tier in _tiers(batch):
            self._instant(report, tier, holder, until, turns)
        self._keep_tier_group(report, batch)
        for message_id, message in batch:
            if isinstance(message, InstanceRelease):
                request = message.request
                with failing(report, [message_id], f"release {request.instance_id} ({request.cause})"):
                    self._release(report, request)
        for group, jobs in turns.waiting:
            self._wait_for_start(report, group, jobs, holder, until, turns)
        for group, closes_at in turns.led:
            self._start_follow_up_machine(report, group, closes_at, holder, until)
        return report

    def _keep_tier_group(self, report: DispatchReport, batch: Sequence[tuple[str, DemandMessage]]) -> None:
        """Set the instant tier's runner group to the installation's repositories once for every change in
        the batch: one read of the whole list serves them all, whatever order they came in."""
        changed = [message_id for message_id, message in batch if isinstance(message, TierGroupChanged)]
        if not changed or self._tier_group is None:
            return
        with failing(report, changed, "set the instant tier's runner group to the installation's"):
            self._tier_group()
            report.tier_groups += 1

    def _note_arrivals(self, batch: Sequence[tuple[str, DemandMessage]]) -> None:
        """Every delivery of a job, repeated or stale too: the history keeps each job once, and a job
        queued is demand on its class even when its run has completed since."""
        if self._history is not None:
            self._history.arrivals(message for _, message in batch if isinstance(message, JobQueued))

    def _cancel(self, report: DispatchReport, message: JobCancelled) -> None:
        if self._starts.ledger.cancel(message.job_id):
            report.cancelled += 1

    def _complete(self, report: DispatchReport, message: RunCompleted) -> None:
        for run_key in sorted(self._starts.ledger.complete_run(message.run_id, message.run_attempt)):
            self._release(report, ReleaseRequest(run_key=run_key, cause=message.cause))
        if self._reruns is not None:
            # After the releases, which a failure here (SQS delivers the completion again) starts again
            # by the same names: nothing twice.
            self._reruns.completed(message.repository, message.run_id, message.run_attempt)

    def _instant(self, report: DispatchReport, tier: Group, holder: str, until: Epoch, turns: _Turns) -> None:
        """The tier's queued jobs of this batch, each one more runner for the tier (domain/instant.py),
        batched as a run key's demand is: the jobs of a burst take turns in the ledger under the tier's
        label, so they are served by one provision at once and one follow-up, not one provision each; each
        job is counted once (a conditional write), so a repeated delivery asks for none again whatever
        the state machines' type. No run attempt is remembered: the jobs are no run's demand, and their
        level of trust decides nothing, since the tier's instances are pristine and single use."""
        report.duplicates += tier.repeated_messages
        job_ids = sorted(tier.messages)
        try:
            counted = self._starts.ledger.counted(job_ids)
            report.duplicates += len(counted)
            current = _Jobs([job_id for job_id in job_ids if job_id not in counted])
            if not current.job_ids:
                return
            turn = self._take_turn(tier, current, holder, until)
        except Exception as exc:  # any fault fails the tier's messages, for SQS to retry them
            report.failures.append(
                Failure(tier.message_ids(job_ids), f"batch the demand of {tier.run_key}", repr(exc))
            )
            return
        self._act(report, tier, current, turn, holder, until, turns)

    def _release(self, report: DispatchReport, request: ReleaseRequest) -> None:
        self._starts.starter.release(request)
        report.releases.append(request)

    def _provision(
        self, report: DispatchReport, group: Group, holder: str, until: Epoch, turns: _Turns
    ) -> None:
        report.duplicates += group.repeated_messages
        try:
            # Remembered before anything starts, in the same write that checks the run is not over:
            # a run completed later finds the key, one completed earlier refuses its demand.
            live = self._starts.live_attempts(group)
            current = [job for job in group.jobs.values() if (job.run_id, job.run_attempt) in live]
            report.stale += len(group.jobs) - len(current)
            # A job a follow-up took from GitHub's list (gather) is counted before its delivery comes:
            # that delivery is a repeat, and must not open another follow-up.
            counted = self._starts.ledger.counted([job.job_id for job in current]) if current else frozenset()
            report.duplicates += len(counted)
            jobs = _Jobs.of([job for job in current if job.job_id not in counted])
            if not jobs.job_ids:
                return
            turn = self._take_turn(group, jobs, holder, until)
        except Exception as exc:  # any fault fails the group's messages, for SQS to retry them
            what = f"batch the demand of {group.run_key}"
            report.failures.append(Failure(group.message_ids(group.jobs), what, repr(exc)))
            return
        self._act(report, group, jobs, turn, holder, until, turns)

    def _take_turn(self, group: Group, jobs: _Jobs, holder: str, until: Epoch) -> BatchTurn:
        arrival = Arrival(jobs.job_ids, sorted(jobs.public_ids), holder, until)
        ledger = self._starts.ledger
        return ledger.take_turn(group.repository, group.run_key, arrival=arrival, span=self._span)

    def _act(  # noqa: PLR0917 - one turn and everything it acts with
        self,
        report: DispatchReport,
        group: Group,
        jobs: _Jobs,
        turn: BatchTurn,
        holder: str,
        until: Epoch,
        turns: _Turns,
    ) -> None:
        match turn.role:
            case BatchRole.FIRST:
                self._starts.start_apart(
                    report, group, jobs.job_ids, public_ids=jobs.public_ids, holder=holder, until=until
                )
            case BatchRole.WAITING:
                turns.waiting.append((group, jobs))
            case BatchRole.JOINED:
                report.joined += len(jobs.job_ids)
            case BatchRole.LEADER:
                turns.led.append((group, turn.closes_at))
            case BatchRole.TAKEN_OVER if turn.follow_up is not None:
                self._starts.start_sealed(report, group, turn.follow_up, holder, until)

    def _wait_for_start(  # noqa: PLR0917 - the group's turn and everything it acts with
        self,
        report: DispatchReport,
        group: Group,
        jobs: _Jobs,
        holder: str,
        until: Epoch,
        turns: _Turns,
    ) -> None:
        """Take a turn again once the follow-up being started has started; past SEALED_WAIT_SECONDS, or
        should the ledger fail meanwhile, start these jobs apart (as before the wait)."""
        give_up_at = min(self._starts.clock.now() + self._sealed_wait, until)
        while self._starts.clock.now() < give_up_at:
            self._starts.pause(SEALED_LOOK_SECONDS)
            try:
                turn = self._take_turn(group, jobs, holder, until)
            except Exception:  # the jobs are still ours: start them apart below
                break
            if turn.role is not BatchRole.WAITING:
                self._act(report, group, jobs, turn, holder, until, turns)
                return
        self._starts.start_apart(
            report, group, jobs.job_ids, public_ids=jobs.public_ids, holder=holder, until=until
        )

    def _start_follow_up_machine(
        self, report: DispatchReport, group: Group, closes_at: Epoch, holder: str, until: Epoch
    ) -> None:
        """Start the follow-up state machine to gather the follow-up this dispatch leads; should that
        start fail, gather it here."""
        request = FollowUpRequest(
            repository=group.repository,
            run_key=group.run_key,
            holder=holder,
            attempts=tuple(group.attempts),
            closes_at=closes_at,
            repository_id=group.repository_id,
        )
        try:
            self._starts.starter.follow_up(request)
        except Exception as exc:  # any fault: this dispatch gathers it, waiting for its window here
            report.gathered_here.append(f"{request.execution_name}: {exc!r}")
            self._gather_here(report, group, closes_at, holder, until)
            return
        report.follow_up_machines.append(request)

    def _gather_here(
        self, report: DispatchReport, group: Group, closes_at: Epoch, holder: str, until: Epoch
    ) -> None:
        """Wait for the follow-up's window to close (each join moves it, up to its limit), seal, start it."""
        with failing(report, group.message_ids(group.jobs), f"seal the follow-up of {group.run_key}"):
            sealing = self._starts.seal_once_closed(group.repository, group.run_key, holder, closes_at)
            if sealing.follow_up is not None:
                self._starts.start_sealed(report, group, sealing.follow_up, holder, until)
            # else another dispatch took it over (our lease passed): it starts these jobs


def _groups(batch: Sequence[tuple[str, DemandMessage]]) -> list[Group]:
    """Queued jobs grouped by (repository, run key), in order of first appearance; a job counted once."""
    groups: dict[tuple[str, str], Group] = {}
    for message_id, message in batch:
        if isinstance(message, JobQueued):
            key = (message.repository, message.run_key)
            groups.setdefault(key, Group(message.repository, message.run_key)).add(message_id, message)
    return list(groups.values())


def _tiers(batch: Sequence[tuple[str, DemandMessage]]) -> list[Group]:
    """Instant tiers' queued jobs grouped by (owner, class): the tier's runners wait for any repository's
    job of the owner, so every repository's jobs of a class are one tier's demand."""
    tiers: dict[tuple[str, str], Group] = {}
    for message_id, message in batch:
        if isinstance(message, InstantQueued):
            owner = message.repository.split("/", 1)[0]
            label = instant_label(message.resource_class)
            tiers.setdefault((owner.lower(), label), Group(owner, label)).ask(message_id, message.job_id)
    return list(tiers.values())
