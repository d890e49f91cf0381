"""Demand: the messages the webhook puts on the demand queue, and how the dispatcher turns a batch of them
into provision and release executions.

One message per webhook delivery that asks for something:

    job-queued     a job with our label is waiting: one unit of demand
    job-cancelled  a job with our label completed without ever getting a runner (cancelled while queued)
    release        a job completed on one of our runners: release that instance
    run-completed  a workflow run completed: release whatever its run keys still hold

The dispatcher counts each job once, ever, in a ledger (a conditional write per job id), before it
starts anything, because Express workflows do not refuse a second execution of the same name and
SQS and webhook redelivery both repeat messages. A job is first *reserved* for the length of one
dispatcher invocation, then marked *started* once its provision execution is; a dispatcher that dies
in between lets its reservation lapse, and the message, redelivered by SQS, reserves it again. A
message whose job another invocation holds right now is handed back to SQS (a partial batch
failure), not dropped: that holder may still die, and the job would then never get a runner.

A run key's first demand is dispatched at once; what arrives in the next moments joins ONE follow-up
batch. Lambda reads a standard queue with five concurrent pollers (and more under load), so the
`queued` deliveries of a matrix, sent a moment apart, reach the dispatcher as several batches at the
same time; a batching window per poller does not bring them together (issue 15 measured 5 runs of 4
jobs become 14 executions). The ledger does, with one item per (repository, run key) and conditional
writes (DynamoDbLedger.take_turn):

    first      no follow-up of this run key is open or pending, and its last one started (or its
               window closed unjoined) BURST_QUIET_SECONDS ago or more: start its provision now, and
               open the follow-up window (FOLLOW_UP_WINDOW_SECONDS; each job that joins keeps it open
               that much longer, or FOLLOW_UP_PACE_FACTOR times the run's mean gap between joins when its
               jobs come slower, at most FOLLOW_UP_PACE_CAP_SECONDS; up to FOLLOW_UP_LIMIT_SECONDS after
               the first: follow_up_closes_at)
    joined     the window is open and another dispatch leads the follow-up: the jobs are added to it
               and the messages are done
    leader     the window is open and nobody leads the follow-up yet, or the run key's last follow-up
               started (or its window closed) less than BURST_QUIET_SECONDS ago, so the same burst goes
               on and these jobs open the next follow-up: the jobs are added, and this dispatch starts
               the follow-up state machine, which gathers it (Dispatcher.gather): waits for the window
               to close, seals the follow-up (no job joins after) and starts one provision for every
               job in it. Should that start fail, this dispatch gathers it itself, waiting here.
    taken over the follow-up's leader died before starting it (its lease passed): this dispatch adds
               its jobs, seals it and starts it at once
    alone      the follow-up is sealed and being started right now: wait for that start to end
               (looking again every SEALED_LOOK_SECONDS), then take a turn again; after
               SEALED_WAIT_SECONDS (its leader died while starting it) start these jobs apart

So a matrix whose jobs arrive within the window costs two provisions however the pollers split it
(and one follow-up execution, which gathers the second), and a run's demand that keeps coming past the
window costs one more follow-up each time a window closes, not an execution per batch that met a
follow-up being started (issue 15's 1,000-job burst saw 36 for a 50-job run). A job queued later, once
the run's burst is over (one that `needs` the matrix), is a first again, started at once.

Past the window, GitHub's own list keeps a run's burst together: the gather step that seals a
follow-up first asks GitHub for the run attempt's jobs (RunJobs; while the window is still open) and
takes every job queued for the follow-up's run key that no dispatch counted yet. GitHub creates a
matrix's jobs from one job definition ("A matrix strategy lets you use variables in a single job
definition to automatically create multiple job runs", docs.github.com, "Running variations of jobs in
a workflow"), but in a burst delivers their `queued` events over seconds (issue 15's 1,000 jobs: 4-5 s
for a 50-job run, and a window that closed before the last made a second follow-up, three
provisions); a delivery that comes after the seal finds its job counted, since the dispatcher reads
the ledger (`counted`) before it takes a turn, and is a repeat. No document says how soon a job is
listed once its `queued` event is sent: a job the list does not hold yet joins the window as before,
or opens the next follow-up. Should GitHub not answer, the follow-up takes what joined it, as the
window alone would.

The leader does not wait for the window in its Lambda: the demand queue's only readers are Lambda's
five pollers, and a leader waiting there holds one (issue 15's 1,000-job burst: with leaders waiting up
to 5 s, a run's deliveries came over up to 15 s and cost up to 10 provisions). The follow-up state
machine waits in Wait states instead, which hold no poller and no Lambda, so a window can stay open as
long as a large matrix's deliveries keep coming (FOLLOW_UP_LIMIT_SECONDS).

A joined message is acknowledged before its job is started: what makes that safe is the leader's own
messages, which stay unacknowledged until its follow-up execution has started (or, gathered here, until
the follow-up has), so a leader that dies first has them delivered again, and that delivery takes the
follow-up over once its lease passed. From its start the execution is the guarantee: its steps are
retried, and each is idempotent (sealing, reserving, starting by name all find their own earlier
writes). Should it fail for good, the run's first provision has recorded the run as recent demand and
refresh's reconciliation asks GitHub for its jobs still queued. Every job of a follow-up is reserved
and counted in the ledger like any other, so a job in both a first batch and a follow-up (a repeated
delivery) is started once.

Cancellation works by job id, which is exact where "one unit of demand" would be a guess: a cancel
that reaches the ledger before the job's demand marks the job cancelled, so the demand is never
counted (this nets the two out within one batch, and across batches whatever the order). A cancel
that arrives after the job's provision started cannot stop it: the extra runner can still take
another queued job with the same label, and the run's release gives it back when the run completes.

The run keys a run attempt used are remembered in the ledger as its demand is dispatched: a
`workflow_run` payload carries no labels, and the state table's by-run-key index is keyed by the
exact run key, so it cannot be asked for every key of one run. A run key names its run attempt (see
domain.run_keys), and the ledger keeps one item per (run, attempt), so a re-run's demand is never
refused by its earlier attempt's completion, and a late completion of one attempt releases only that
attempt's runners. The same conditional write refuses demand of a run attempt that has completed, so
a late `queued` message never provisions runners for a finished attempt. A completion is written
whether or not the attempt's demand has been seen yet (a redelivery after an outage can bring the
completion first): demand that arrives after it is dropped as stale. Every `workflow_run completed`
is queued, ours or not, because only the ledger knows which runs are ours, and a completion must
never be lost to demand still in the queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.executions import PROVISION_LIMIT, FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import RunJob

FOLLOW_UP_WINDOW_SECONDS = 0.3
"""How long a run key's follow-up stays open after its first dispatch, and after each job that joins
it. GitHub sends a matrix's `queued` deliveries side by side, each its own POST (no order is promised
between them), and the webhook turns each into one SQS message within tens of milliseconds, so they
reach the dispatchers a moment apart: a run's first job is dispatched at once, the rest in one
provision once 0.3 s pass with no more. Every job after a run's first waits this out (issue 15: at
1 s it was most of the warm path's 1.45 s); deliveries spread wider only cost more executions, one
per quiet gap, never a job. It used to be the event source's batching window, in front of every job
and per poller."""
FOLLOW_UP_PACE_FACTOR = 4.0
"""How many of its run's mean gaps between the dispatches that joined a follow-up it stays open after the
last, when that is longer than FOLLOW_UP_WINDOW_SECONDS: a run whose deliveries come at a slower pace (a
large matrix, a loaded receiver) is not cut into an execution at every gap a little longer than 0.3 s.
Gaps between arrivals that come independently are about exponential: a window of twice the mean gap
closes at one gap in seven (the 300-job burst made up to 5 executions of a 30-job run, 2026-11-27), of
four times the mean at one in fifty. Dispatches, not jobs: five pollers take the demand queue in
batches, so the jobs come in clumps, and the gaps that close a window are those between clumps."""
FOLLOW_UP_PACE_CAP_SECONDS = 3.0
"""The longest quiet gap the pace keeps a follow-up open for. Capped at 1 s while leaders waited in the
dispatcher (the uncapped pace held Lambda's five pollers: 1,048 s for the 1,000-job burst, up to 17
executions for one run, 2026-11-27); the follow-up state machine waits in Wait states, which hold no
poller, so the cap is only what a run's jobs may wait for a straggler."""
FOLLOW_UP_AGE_FACTOR = 0.5
"""How much of the time a follow-up has been open it waits, at least, for its next job after the last
(at most FOLLOW_UP_PACE_CAP_SECONDS). Jobs that come in clumps make a mean gap far shorter than the
stall between two clumps: in the 1,000-job burst (2026-11-28) runs whose deliveries came over 5-8 s
closed their follow-up early and made a second one (3 provisions for a run, every extra one a second
follow-up). A follow-up seconds old has kept its jobs waiting that long already; a matrix's, joined
within a tenth of a second, is not held by this."""
FOLLOW_UP_LIMIT_SECONDS = 20.0
"""The longest a follow-up stays open after the first dispatch, however its demand keeps coming: long
enough for a 50-job run's deliveries in issue 15's 1,000-job burst (up to 15 s apart), short beside the
minutes GitHub's rate limit takes to register that many runners. A small matrix's window closes on its
first quiet gap, long before."""
GATHER_PAUSE_SECONDS = 1.0
"""The longest the follow-up state machine's gather step waits in its Lambda for the window to close;
longer waits are its Wait state's, in whole seconds: a Wait state's Seconds (or SecondsPath's value) is
an integer number of seconds (AWS Step Functions Developer Guide, "Wait workflow state"), and moto's
executor truncates a wait to whole seconds too (moto/stepfunctions/parser/.../wait_function)."""
BURST_QUIET_SECONDS = 5.0
"""How long after a run key's follow-up started (or its window closed with nobody joining) its next
demand is still the same burst, and joins a follow-up instead of starting at once. GitHub delivers a
large matrix's `queued` events over seconds, and a delivery that failed comes again later; a job that
`needs` others is queued only once they completed, long after."""
SEALED_WAIT_SECONDS = 2.0
"""How long demand that finds its run key's follow-up being started waits for that start to end. The
start is one conditional write per job (at most PROVISION_LIMIT), a StartExecution and two writes: a
few hundred milliseconds on AWS. A leader that died while starting keeps its lease much longer, so
past this the waiting jobs are started apart rather than held for it."""
SEALED_LOOK_SECONDS = 0.1
"""How often waiting demand looks whether the follow-up has started (one conditional write a look)."""
LEASE_MARGIN_SECONDS = 60
"""A reservation (and a follow-up's lead) outlives the invocation that holds it by this much, so it
never lapses while the invocation runs."""


def lease_seconds(remaining_seconds: float) -> float:
    """How long an invocation with `remaining_seconds` left holds what it reserves."""
    return remaining_seconds + LEASE_MARGIN_SECONDS


def follow_up_closes_at(
    now: Epoch,
    *,
    closes_at: Epoch,
    limit_at: Epoch,
    joined_at: Epoch | None,
    joined: int,
    window_seconds: float,
    opened_at: Epoch | None = None,
) -> Epoch:
    """When a follow-up closes once another dispatch joins it at `now`: after a quiet gap of
    `window_seconds`, or of FOLLOW_UP_PACE_FACTOR times the mean gap between the `joined` dispatches that
    joined it since its first join (`joined_at`), or of FOLLOW_UP_AGE_FACTOR times how long it has been
    open (since `opened_at`), whichever is longest (the last two up to FOLLOW_UP_PACE_CAP_SECONDS);
    never sooner than it was to close (`closes_at`), never past its limit."""
    gap = window_seconds
    if joined > 0 and joined_at is not None:
        paced = FOLLOW_UP_PACE_FACTOR * max(0.0, now - joined_at) / joined
        gap = max(gap, min(paced, FOLLOW_UP_PACE_CAP_SECONDS))
    if opened_at is not None:
        gap = max(gap, min(FOLLOW_UP_AGE_FACTOR * max(0.0, now - opened_at), FOLLOW_UP_PACE_CAP_SECONDS))
    return min(max(closes_at, now + gap), limit_at)


def next_follow_up_closes_at(
    now: Epoch, *, last_closed_at: Epoch, limit_at: Epoch, window_seconds: float
) -> Epoch:
    """When a run's next follow-up closes unless more jobs join, opened at `now` by demand of a burst that
    goes on after its last follow-up closed at `last_closed_at`: that demand came after the run's previous
    job by at least the quiet gap that closed the window (`window_seconds`) plus the time since it closed,
    a sample of the run's pace, so the new window is paced by it from the start (follow_up_closes_at, as
    one join) instead of
    closing at the next gap longer than the bare window (the 1,000-job burst, 2026-11-28: runs of 50 whose
    deliveries came over 5 s cost 3 provisions where 2 would do)."""
    return follow_up_closes_at(
        now,
        closes_at=now + window_seconds,
        limit_at=limit_at,
        joined_at=last_closed_at - window_seconds,
        joined=1,
        window_seconds=window_seconds,
    )


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JobQueued(_Message):
    kind: Literal["job-queued"] = "job-queued"
    repository: str = Field(min_length=1)
    run_key: str = Field(min_length=1, description="the job's run key: label, run attempt, other labels")
    run_id: int = Field(gt=0)
    run_attempt: int = Field(gt=0)
    job_id: int = Field(gt=0)
    public: bool = False
    """The job's repository is public: its jobs never share an instance (unless the config allows)."""

    @model_validator(mode="after")
    def _of_its_attempt(self) -> JobQueued:
        if RunKey.parse(self.run_key).attempt != self.run_attempt:
            raise ValueError(f"run key {self.run_key!r} is not of run attempt {self.run_attempt}")
        return self


class JobCancelled(_Message):
    kind: Literal["job-cancelled"] = "job-cancelled"
    repository: str = Field(min_length=1)
    run_key: str = Field(min_length=1)
    job_id: int = Field(gt=0)


class RunFromFork(_Message):
    """A workflow run whose head repository is not its repository (a fork's pull request, issue 14):
    its jobs never share an instance, like a public repository's. Its `requested` webhook comes before
    its jobs' `queued` ones, so the mark is usually in the ledger before the run's demand."""

    kind: Literal["run-from-fork"] = "run-from-fork"
    repository: str = Field(min_length=1)
    head_repository: str = Field(min_length=1)
    run_id: int = Field(gt=0)
    run_attempt: int = Field(gt=0)


class InstanceRelease(_Message):
    kind: Literal["release"] = "release"
    request: ReleaseRequest


class RunCompleted(_Message):
    kind: Literal["run-completed"] = "run-completed"
    repository: str = Field(min_length=1)
    run_id: int = Field(gt=0)
    run_attempt: int = Field(gt=0)

    @property
    def cause(self) -> str:
        return f"run-{self.run_id}-attempt-{self.run_attempt}"


DemandMessage = Annotated[
    JobQueued | JobCancelled | InstanceRelease | RunCompleted | RunFromFork, Field(discriminator="kind")
]
_MESSAGES: TypeAdapter[DemandMessage] = TypeAdapter(DemandMessage)


def to_body(message: DemandMessage) -> str:
    return message.model_dump_json()


def from_body(body: str) -> DemandMessage:
    """The message a queue body holds; ValueError for one that is not a demand message."""
    try:
        return _MESSAGES.validate_json(body)
    except ValidationError as exc:
        raise ValueError(
            f"not a demand message: {exc.error_count()} errors, first: {exc.errors()[0]['msg']}"
        ) from None


# --- what the dispatcher needs from the world ----------------------------------------------------------


class Reservation(StrEnum):
    RESERVED = "reserved"
    """Ours until the lease ends."""
    COUNTED = "counted"
    """Started or cancelled already: nothing more to do for this job, ever."""
    HELD = "held"
    """Another dispatch holds it now; ask again once that has started it or let it lapse."""


class RunMark(StrEnum):
    """What the ledger knows of a run attempt when its demand is dispatched."""

    OPEN = "open"
    FROM_FORK = "from-fork"
    """Open, and its head repository is a fork: its jobs are single use."""
    COMPLETED = "completed"


SEAL_ATTEMPTS = 100
"""A leader looks again each time a join moved the window; the limit ends that long before this."""


class BatchRole(StrEnum):
    """What one dispatch does with a run key's demand (see the module's docstring)."""

    FIRST = "first"
    JOINED = "joined"
    LEADER = "leader"
    TAKEN_OVER = "taken-over"
    ALONE = "alone"


@dataclass(frozen=True)
class FollowUp:
    """The jobs of a sealed follow-up batch, and which of them are a public repository's."""

    job_ids: frozenset[int]
    public_ids: frozenset[int] = frozenset()

    def with_jobs(self, job_ids: Collection[int]) -> FollowUp:
        """This follow-up with `job_ids` added; they are a public repository's when its jobs are (a
        follow-up's jobs are all one repository's)."""
        added = frozenset(job_ids) - self.job_ids
        return FollowUp(self.job_ids | added, self.public_ids | (added if self.public_ids else frozenset()))


@dataclass(frozen=True)
class BatchTurn:
    role: BatchRole
    closes_at: Epoch = 0.0
    """When the follow-up window closes, unless another job joins (FIRST, LEADER, JOINED)."""
    follow_up: FollowUp | None = None
    """TAKEN_OVER: every job of the follow-up, this dispatch's too."""


@dataclass(frozen=True)
class Sealing:
    """What sealing a follow-up found: sealed (its jobs), still open (a job joined since: try again at
    `closes_at`), or neither (another dispatch took it over)."""

    follow_up: FollowUp | None = None
    closes_at: Epoch | None = None


class DemandLedger(Protocol):
    """Which jobs have been counted, and which run keys each run used (DynamoDB in production)."""

    def reserve(self, job_id: int, holder: str, until: Epoch) -> Reservation:
        """Reserve a job nobody has counted or cancelled, or whose reservation lapsed."""
        ...

    def counted(self, job_ids: Collection[int]) -> frozenset[int]:
        """Those of the jobs already counted (started) or cancelled, as a consistent read finds them."""
        ...

    def confirm(self, job_ids: Sequence[int], holder: str, execution_name: str) -> None: ...

    def free(self, job_ids: Sequence[int], holder: str) -> None: ...

    def cancel(self, job_id: int) -> bool:
        """Mark a job nobody has counted as cancelled; False when it was counted (or cancelled) already."""
        ...

    def remember_run_key(self, run_id: int, run_key: str, attempt: int) -> RunMark:
        """Note that the run attempt's demand uses `run_key`, unless that attempt has completed."""
        ...

    def mark_fork(self, run_id: int, attempt: int) -> None:
        """Note that the run attempt comes from a fork, whenever its demand comes."""
        ...

    def complete_run(self, run_id: int, attempt: int) -> frozenset[str]:
        """Note the run attempt completed, even before any of its demand; the run keys its demand used
        (empty for a run not ours, or whose demand has not come yet)."""
        ...

    def take_turn(
        self,
        repository: str,
        run_key: str,
        *,
        job_ids: Sequence[int],
        public_ids: Sequence[int],
        holder: str,
        lease_until: Epoch,
        window_seconds: float,
        limit_seconds: float,
        quiet_seconds: float,
    ) -> BatchTurn:
        """Open the run key's follow-up window (a first, when its last burst ended `quiet_seconds` ago or
        more; else the next follow-up, which `holder` leads), or add the jobs to its follow-up batch
        (keeping it open `window_seconds` more, up to `limit_seconds` after it opened), or take over a
        follow-up whose leader's lease passed; `holder` leads a follow-up until `lease_until`."""
        ...

    def seal(self, repository: str, run_key: str, holder: str, *, started: bool = False) -> Sealing:
        """Close the follow-up `holder` leads to further jobs, if its window has closed; `started` marks
        it started in the same write (its jobs are then the caller's to start, whatever the ledger
        holds next)."""
        ...

    def follow_up_started(self, repository: str, run_key: str, holder: str) -> None:
        """Note that the follow-up `holder` leads has started: the run key's next demand is a first again."""
        ...


class RunJobs(Protocol):
    """GitHub's list of a run attempt's jobs, and how many requests it took
    (domain.runners.RunnerRegistry.run_jobs)."""

    def run_jobs(self, repository: str, run_id: int, attempt: int) -> tuple[list[RunJob], int]: ...


class ExecutionStarter(Protocol):
    """Starts the state machines by the requests' execution names; False when the name already existed,
    which counts as started (Standard workflows keep names, so that is the same request again)."""

    def provision(self, request: ProvisionRequest) -> bool: ...

    def release(self, request: ReleaseRequest) -> bool: ...

    def follow_up(self, request: FollowUpRequest) -> bool:
        """Start the follow-up state machine, which gathers the follow-up (Dispatcher.gather)."""
        ...


# --- the dispatcher --------------------------------------------------------------------------------------


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
    handed_over: list[FollowUpRequest] = field(default_factory=list)
    """Follow-ups this dispatch leads, handed to the follow-up state machine to gather."""
    gathered_here: list[str] = field(default_factory=list)
    """Why a follow-up this dispatch leads was not handed over (it gathered it itself)."""
    failures: list[Failure] = field(default_factory=list)

    @property
    def failed_message_ids(self) -> set[str]:
        """Messages for SQS to deliver again: those whose work failed, and those held elsewhere."""
        return {message_id for failure in self.failures for message_id in failure.message_ids} | self.held


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


@dataclass
class _Turns:
    """What one dispatch still has to do once every group took its turn."""

    waiting: list[tuple[_Group, list[JobQueued]]] = field(default_factory=list)
    """Groups that met their follow-up being started, with their current jobs."""
    led: list[tuple[_Group, Epoch]] = field(default_factory=list)
    """Follow-ups this dispatch leads, with when their window closes."""


@dataclass
class _Group:
    """The queued jobs of one (repository, run key) in a batch, each with the messages that asked for it:
    one run attempt's jobs that ask for the same labels, so one provision serves them all."""

    repository: str
    run_key: str
    jobs: dict[int, JobQueued] = field(default_factory=dict)
    messages: dict[int, list[str]] = field(default_factory=dict)
    from_fork: bool = False
    known_attempts: tuple[tuple[int, int], ...] = ()
    """Run attempts of its jobs besides those of `jobs` (a follow-up gathered with none of its messages)."""

    def add(self, message_id: str, job: JobQueued) -> None:
        self.jobs.setdefault(job.job_id, job)
        self.messages.setdefault(job.job_id, []).append(message_id)

    def message_ids(self, job_ids: Iterable[int]) -> tuple[str, ...]:
        """This batch's messages for these jobs (a follow-up's jobs that others added have none here)."""
        return tuple(message_id for job_id in job_ids for message_id in self.messages.get(job_id, ()))

    @property
    def attempts(self) -> list[tuple[int, int]]:
        return sorted(
            {(job.run_id, job.run_attempt) for job in self.jobs.values()} | set(self.known_attempts)
        )

    @property
    def repeated_messages(self) -> int:
        """Messages in the batch for a job another message of the batch already asked for."""
        return sum(len(ids) - 1 for ids in self.messages.values())


class Dispatcher:
    def __init__(
        self,
        ledger: DemandLedger,
        starter: ExecutionStarter,
        clock: Clock,
        pause: Callable[[float], None],
        *,
        window_seconds: float = FOLLOW_UP_WINDOW_SECONDS,
        limit_seconds: float = FOLLOW_UP_LIMIT_SECONDS,
        sealed_wait_seconds: float = SEALED_WAIT_SECONDS,
        run_jobs: Callable[[], RunJobs] | None = None,
    ) -> None:
        self._ledger = ledger
        self._starter = starter
        self._run_jobs = run_jobs
        """GitHub, asked by the follow-up's gather step for the run's queued jobs (made when first needed)."""
        self._clock = clock
        self._pause = pause
        """How the leader of a follow-up waits for its window to close (time.sleep in a Lambda)."""
        self._window = window_seconds
        self._limit = limit_seconds
        self._sealed_wait = sealed_wait_seconds

    def dispatch(
        self, batch: Sequence[tuple[str, DemandMessage]], holder: str, lease_seconds: float
    ) -> DispatchReport:
        """Act on one batch of (message id, message); what failed is in the report, nothing raises.

        Cancellations go first, so a job cancelled in the same batch as its demand is never counted;
        run completions next, so a run that completed refuses the rest of its demand. `holder` names
        this dispatch in the ledger; its reservations lapse `lease_seconds` from now.
        """
        report = DispatchReport()
        for message_id, message in batch:
            if isinstance(message, JobCancelled):
                with _failing(report, [message_id], f"cancel job {message.job_id}"):
                    self._cancel(report, message)
            elif isinstance(message, RunFromFork):
                with _failing(report, [message_id], f"mark run {message.run_id} as a fork's"):
                    self._ledger.mark_fork(message.run_id, message.run_attempt)
        for message_id, message in batch:
            if isinstance(message, RunCompleted):
                with _failing(report, [message_id], f"release {message.cause}"):
                    self._complete(report, message)
        until = self._clock.now() + lease_seconds
        turns = _Turns()
        for group in _groups(batch):
            self._provision(report, group, holder, until, turns)
        for message_id, message in batch:
            if isinstance(message, InstanceRelease):
                request = message.request
                with _failing(report, [message_id], f"release {request.instance_id} ({request.cause})"):
                    self._release(report, request)
        # Last, so nothing else of the batch waits: for a follow-up being started, then for a window.
        for group, current in turns.waiting:
            self._wait_for_start(report, group, current, holder, until, turns)
        for group, closes_at in turns.led:
            self._hand_over(report, group, closes_at, holder, until)
        return report

    def gather(self, request: FollowUpRequest, lease_seconds: float) -> Gathering:
        """The follow-up state machine's first step: once the window closed (waiting up to
        GATHER_PAUSE_SECONDS for it here; a window open longer is the machine's Wait state's), seal the
        follow-up as its leader and mark it started in the same write, so the run key's next demand
        opens the next follow-up at once instead of waiting for this one's provisions to start (up to
        SEALED_WAIT_SECONDS, holding a poller, then starting apart); then start its provisions
        (start_gathered). Should that fail, its jobs go on in the machine's state to its start step,
        which tries again: a retry of this step could not find them once the ledger's item moved on to
        the next follow-up.

        A step whose window closes within its pause (the one that seals, unless a join moves the window
        on) first asks GitHub for the run's queued jobs (while the window is still open), and the
        follow-up takes those of its run key that no dispatch counted yet: GitHub creates
        a matrix's jobs together and sends their `queued` deliveries over seconds in a burst, so the
        deliveries that come after the seal find their jobs counted (Dispatcher._provision) instead of
        opening another follow-up, one provision more for the run."""
        listing = Listing()
        if request.closes_at - self._clock.now() <= GATHER_PAUSE_SECONDS:
            listing = self._queued_on_github(request)
        sealing = self._seal_once_closed(
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
                report = self.start_gathered(request, follow_up, lease_seconds)
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
        remaining = sealing.closes_at - self._clock.now()
        moved = request.model_copy(update={"closes_at": sealing.closes_at})
        return Gathering(moved, gathered=False, wait_seconds=max(1, int(remaining)))

    def _queued_on_github(self, request: FollowUpRequest) -> Listing:
        """The jobs GitHub lists as queued in the follow-up's run attempts that ask for its run key;
        none, and why, when GitHub could not be asked (the follow-up then takes what joined it)."""
        if self._run_jobs is None:
            return Listing()
        try:
            github = self._run_jobs()
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
            listed -= self._ledger.counted(listed)
        return follow_up.with_jobs(listed), len(listed)

    def start_gathered(
        self, request: FollowUpRequest, follow_up: FollowUp, lease_seconds: float
    ) -> DispatchReport:
        """The follow-up state machine's second step: start one provision per PROVISION_LIMIT jobs of the
        follow-up its gather step sealed. Idempotent: a step tried again finds its own reservations and
        executions. FollowUpNotStartedError when not every provision started."""
        group = _Group(request.repository, request.run_key, known_attempts=request.attempts)
        report = DispatchReport()
        until = self._clock.now() + lease_seconds
        self._start_follow_up(report, group, follow_up, request.holder, until, marked=True)
        if report.failures:
            raise FollowUpNotStartedError("; ".join(f"{f.what}: {f.error}" for f in report.failures))
        return report

    def _cancel(self, report: DispatchReport, message: JobCancelled) -> None:
        if self._ledger.cancel(message.job_id):
            report.cancelled += 1

    def _complete(self, report: DispatchReport, message: RunCompleted) -> None:
        for run_key in sorted(self._ledger.complete_run(message.run_id, message.run_attempt)):
            self._release(report, ReleaseRequest(run_key=run_key, cause=message.cause))

    def _release(self, report: DispatchReport, request: ReleaseRequest) -> None:
        self._starter.release(request)
        report.releases.append(request)

    def _provision(
        self,
        report: DispatchReport,
        group: _Group,
        holder: str,
        until: Epoch,
        turns: _Turns,
    ) -> None:
        report.duplicates += group.repeated_messages
        try:
            # Remembered before anything starts, in the same write that checks the run is not over:
            # a run completed later finds the key, one completed earlier refuses its demand.
            live = self._live_attempts(group)
            current = [job for job in group.jobs.values() if (job.run_id, job.run_attempt) in live]
            report.stale += len(group.jobs) - len(current)
            # A job a follow-up took from GitHub's list (gather) is counted before its delivery comes:
            # that delivery is a repeat, and must not open another follow-up.
            counted = self._ledger.counted([job.job_id for job in current]) if current else frozenset()
            report.duplicates += len(counted)
            current = [job for job in current if job.job_id not in counted]
            if not current:
                return
            turn = self._take_turn(group, current, holder, until)
        except Exception as exc:  # any fault fails the group's messages, for SQS to retry them
            what = f"batch the demand of {group.run_key}"
            report.failures.append(Failure(group.message_ids(group.jobs), what, repr(exc)))
            return
        self._act(report, group, current, turn, holder, until, turns)

    def _take_turn(self, group: _Group, current: list[JobQueued], holder: str, until: Epoch) -> BatchTurn:
        return self._ledger.take_turn(
            group.repository,
            group.run_key,
            job_ids=[job.job_id for job in current],
            public_ids=[job.job_id for job in current if job.public],
            holder=holder,
            lease_until=until,
            window_seconds=self._window,
            limit_seconds=self._limit,
            quiet_seconds=BURST_QUIET_SECONDS,
        )

    def _act(  # noqa: PLR0917 - one turn and everything it acts with
        self,
        report: DispatchReport,
        group: _Group,
        current: list[JobQueued],
        turn: BatchTurn,
        holder: str,
        until: Epoch,
        turns: _Turns,
    ) -> None:
        match turn.role:
            case BatchRole.FIRST:
                self._start_apart(report, group, current, holder, until)
            case BatchRole.ALONE:
                turns.waiting.append((group, current))
            case BatchRole.JOINED:
                report.joined += len(current)
            case BatchRole.LEADER:
                turns.led.append((group, turn.closes_at))
            case BatchRole.TAKEN_OVER if turn.follow_up is not None:
                self._start_follow_up(report, group, turn.follow_up, holder, until)

    def _start_apart(
        self, report: DispatchReport, group: _Group, current: list[JobQueued], holder: str, until: Epoch
    ) -> None:
        public = {job.job_id for job in current if job.public}
        job_ids = [job.job_id for job in current]
        for start in range(0, len(job_ids), PROVISION_LIMIT):
            chunk = job_ids[start : start + PROVISION_LIMIT]
            self._provision_chunk(report, group, chunk, public_ids=public, holder=holder, until=until)

    def _wait_for_start(  # noqa: PLR0917 - the group's turn and everything it acts with
        self,
        report: DispatchReport,
        group: _Group,
        current: list[JobQueued],
        holder: str,
        until: Epoch,
        turns: _Turns,
    ) -> None:
        """Take a turn again once the follow-up being started has started; past SEALED_WAIT_SECONDS, or
        should the ledger fail meanwhile, start these jobs apart (as before the wait)."""
        give_up_at = min(self._clock.now() + self._sealed_wait, until)
        while self._clock.now() < give_up_at:
            self._pause(SEALED_LOOK_SECONDS)
            try:
                turn = self._take_turn(group, current, holder, until)
            except Exception:  # the jobs are still ours: start them apart below
                break
            if turn.role is not BatchRole.ALONE:
                self._act(report, group, current, turn, holder, until, turns)
                return
        self._start_apart(report, group, current, holder, until)

    def _live_attempts(self, group: _Group) -> set[tuple[int, int]]:
        """The group's run attempts that have not completed (noting its run key for each); marks the
        group a fork's when its run is."""
        marks = {
            (run_id, attempt): self._ledger.remember_run_key(run_id, group.run_key, attempt)
            for run_id, attempt in group.attempts
        }
        group.from_fork = any(mark is RunMark.FROM_FORK for mark in marks.values())
        return {attempt for attempt, mark in marks.items() if mark is not RunMark.COMPLETED}

    def _hand_over(
        self, report: DispatchReport, group: _Group, closes_at: Epoch, holder: str, until: Epoch
    ) -> None:
        """Start the follow-up state machine to gather the follow-up this dispatch leads; should that
        start fail, gather it here."""
        request = FollowUpRequest(
            repository=group.repository,
            run_key=group.run_key,
            holder=holder,
            attempts=tuple(group.attempts),
            closes_at=closes_at,
        )
        try:
            self._starter.follow_up(request)
        except Exception as exc:  # any fault: this dispatch gathers it, waiting for its window here
            report.gathered_here.append(f"{request.execution_name}: {exc!r}")
            self._lead(report, group, closes_at, holder, until)
            return
        report.handed_over.append(request)

    def _lead(
        self, report: DispatchReport, group: _Group, closes_at: Epoch, holder: str, until: Epoch
    ) -> None:
        """Wait for the follow-up's window to close (each join moves it, up to its limit), seal, start it."""
        with _failing(report, group.message_ids(group.jobs), f"seal the follow-up of {group.run_key}"):
            sealing = self._seal_once_closed(group.repository, group.run_key, holder, closes_at)
            if sealing.follow_up is not None:
                self._start_follow_up(report, group, sealing.follow_up, holder, until)
            # else another dispatch took it over (our lease passed): it starts these jobs

    def _seal_once_closed(
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
            remaining = closes_at - self._clock.now()
            if remaining > wait_limit:
                return Sealing(closes_at=closes_at)
            self._pause(max(0.0, remaining))
            sealing = self._ledger.seal(repository, run_key, holder, started=started)
            if sealing.follow_up is not None or sealing.closes_at is None:
                return sealing
            closes_at = sealing.closes_at
        raise RuntimeError(f"the follow-up was still open after {SEAL_ATTEMPTS} looks")

    def _start_follow_up(
        self,
        report: DispatchReport,
        group: _Group,
        follow_up: FollowUp,
        holder: str,
        until: Epoch,
        *,
        marked: bool = False,
    ) -> None:
        """Start one provision (per PROVISION_LIMIT jobs) for a sealed follow-up, then mark it started.

        Until it is marked, this dispatch's own messages are its guarantee: any failure fails them, so
        SQS delivers them again and that delivery takes the follow-up over (its jobs already started
        are counted in the ledger and not started twice).
        """
        own = group.message_ids(group.jobs)
        try:
            live = self._live_attempts(group)  # the run may have completed while the window was open
        except Exception as exc:  # any fault fails our messages, for SQS to retry them
            report.failures.append(Failure(own, f"start the follow-up of {group.run_key}", repr(exc)))
            return
        if not live:
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
        if marked:  # sealed and marked started in one write (gather)
            return
        with _failing(report, [], f"mark the follow-up of {group.run_key} started"):
            # Unmarked, the follow-up is taken over once our lease passes, and finds its jobs counted.
            self._ledger.follow_up_started(group.repository, group.run_key, holder)

    def _provision_chunk(
        self,
        report: DispatchReport,
        group: _Group,
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
                match self._ledger.reserve(job_id, holder, until):
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
                public=group.from_fork or any(job_id in public_ids for job_id in reserved),
            )
            self._starter.provision(request)
        except Exception as exc:  # any fault fails the chunk's messages, for SQS to retry them
            self._let_go(reserved, holder)
            what = f"provision {len(job_ids)} runners for {group.run_key}"
            report.failures.append(Failure(group.message_ids(job_ids), what, repr(exc)))
            return False
        report.provisions.append(request)
        # The execution runs from here on: a failed confirmation fails no message (a redelivery would
        # count the jobs twice); it leaves the reservation to lapse instead, and is reported.
        with _failing(report, [], f"confirm {request.execution_name}"):
            self._ledger.confirm(reserved, holder, request.execution_name)
        return True

    def _let_go(self, job_ids: list[int], holder: str) -> None:
        """Free what a failed chunk reserved, so its redelivered messages can reserve it again at once."""
        if not job_ids:
            return
        with suppress(Exception):  # the reservation lapses on its own; the chunk's failure is reported
            self._ledger.free(job_ids, holder)


@contextmanager
def _failing(report: DispatchReport, message_ids: Iterable[str], what: str) -> Iterator[None]:
    """Any fault inside fails these messages (SQS redelivers them) and goes into the report; none escapes."""
    try:
        yield
    except Exception as exc:
        report.failures.append(Failure(tuple(message_ids), what, repr(exc)))


def _groups(batch: Sequence[tuple[str, DemandMessage]]) -> list[_Group]:
    """Queued jobs grouped by (repository, run key), in order of first appearance; a job counted once."""
    groups: dict[tuple[str, str], _Group] = {}
    for message_id, message in batch:
        if isinstance(message, JobQueued):
            key = (message.repository, message.run_key)
            groups.setdefault(key, _Group(message.repository, message.run_key)).add(message_id, message)
    return list(groups.values())
