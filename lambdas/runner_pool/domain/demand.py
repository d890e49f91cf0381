"""Demand: the messages the webhook puts on the demand queue, and the ports the dispatcher turns them
into provision and release executions through.

One message per webhook delivery that asks for something:

    job-queued     a job with our label is waiting: one unit of demand
    job-cancelled  a job with our label completed without ever getting a runner (cancelled while queued)
    release        a job completed on one of our runners: release that instance
    run-completed  a workflow run completed: release whatever its run keys still hold
    run-requested  a workflow run attempt was requested: what GitHub says about it (event, actors, head
                   repository), from which the dispatcher decides its jobs' level of trust
    run-from-fork  (from an earlier release, still read) a workflow run's head repository is a fork: its
                   jobs are untrusted
    instant-queued a job of a class's instant tier is waiting: one more runner for the tier
    tier-group     the repositories the App's installation covers changed: the instant tier's runner group
                   is set to them again (domain/instant.py `TierGroupAccess`)

The dispatcher counts each job once, ever, in a ledger (a conditional write per job id), before it
starts anything, because Express workflows do not refuse a second execution of the same name and
SQS and webhook redelivery both repeat messages. A job is first *reserved* for the length of one
dispatcher invocation, then marked *started* once its provision execution is; a dispatcher that dies
in between lets its reservation lapse, and the message, redelivered by SQS, reserves it again. A
message whose job another invocation holds right now is handed back to SQS (a partial batch
failure), not dropped: that holder may still die, and the job would then never get a runner.

A run key's demand that arrives close together is batched into one follow-up (domain.follow_up: its
states, transitions and window). A joined message is acknowledged before its job is started: what makes
that safe is the leader's own messages, which stay unacknowledged until its follow-up execution has
started (or, gathered in the dispatcher, until the follow-up has), so a leader that dies first has them
delivered again, and that delivery takes the follow-up over once its lease passed. From its start the
execution is the guarantee: its steps are retried, and each is idempotent (sealing, reserving, starting
by name all find their own earlier writes). Should it fail for good, the run's first provision has
recorded the run as recent demand and refresh's reconciliation asks GitHub for its jobs still queued.
Every job of a follow-up is reserved and counted in the ledger like any other, so a job in both a first
batch and a follow-up (a repeated delivery) is started once.

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

A job's level of trust (domain.trust) is decided per provision: privileged when one of its jobs targets
an environment, or when its pool label had such a job earlier in the same run attempt (privileged_label);
else its run attempt's level, which the ledger keeps as first decided from the run's `requested`
delivery (queued for every run, like its completion) or, when that never came, from GitHub's answer
about the run (steps.run_trust); None when neither is at hand, and then the jobs are served single use.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from runner_pool.domain.clock import Epoch
from runner_pool.domain.executions import FollowUpRequest, ProvisionRequest, ReleaseRequest
from runner_pool.domain.follow_up import Arrival, BatchTurn, Sealing, WindowSpan
from runner_pool.domain.run_keys import RunKey
from runner_pool.domain.runners import RunJob
from runner_pool.domain.trust import RunFacts, TrustLevel

LEASE_MARGIN_SECONDS = 60
"""A reservation (and a follow-up's lead) outlives the invocation that holds it by this much, so it
never lapses while the invocation runs."""


def lease_seconds(remaining_seconds: float) -> float:
    """How long an invocation with `remaining_seconds` left holds what it reserves."""
    return remaining_seconds + LEASE_MARGIN_SECONDS


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
    repository_id: int | None = Field(None, gt=0)
    """The repository's id (the webhook's `repository.id`); None from a message of an older release."""
    privileged: bool = False
    """The job targets an environment (its `workflow_job` delivery carries `deployment`): its level is
    privileged whatever its run's (domain.trust.job_trust)."""

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


class RunRequested(_Message):
    """A workflow run attempt GitHub requested, with what its `workflow_run` delivery says about it: the
    facts its jobs' level of trust is decided from (domain.trust.run_trust). Its `requested` delivery
    comes before its jobs' `queued` ones, so the level is usually in the ledger before the run's demand;
    the first level decided for a run attempt stands."""

    kind: Literal["run-requested"] = "run-requested"
    repository: str = Field(min_length=1)
    run_id: int = Field(gt=0)
    run_attempt: int = Field(gt=0)
    event: str = Field(min_length=1, max_length=100)
    actor: str | None = None
    triggering_actor: str | None = None
    head_repository: str | None = None
    """None when the delivery names none: treated as a fork's (domain.trust.RunFacts)."""

    @property
    def facts(self) -> RunFacts:
        return RunFacts(
            repository=self.repository,
            event=self.event,
            actor=self.actor,
            triggering_actor=self.triggering_actor,
            head_repository=self.head_repository,
        )


class RunFromFork(_Message):
    """What an earlier release queued for a run whose head repository is not its repository: read still,
    so that messages in flight during an upgrade keep their meaning (the run's jobs are untrusted)."""

    kind: Literal["run-from-fork"] = "run-from-fork"
    repository: str = Field(min_length=1)
    head_repository: str = Field(min_length=1)
    run_id: int = Field(gt=0)
    run_attempt: int = Field(gt=0)


class InstantQueued(_Message):
    """A job queued for a class's instant tier (domain/instant.py): one more runner asked for the tier."""

    kind: Literal["instant-queued"] = "instant-queued"
    repository: str = Field(min_length=1)
    resource_class: str = Field(min_length=1)
    job_id: int = Field(gt=0)


class TierGroupChanged(_Message):
    """The installation's repositories changed (an `installation_repositories` delivery): the instant
    tier's runner group is set to the repositories it covers now, read whole from GitHub, so deliveries
    that come twice or out of order all end at the same list."""

    kind: Literal["tier-group"] = "tier-group"
    installation_id: int = Field(gt=0)


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
    JobQueued
    | JobCancelled
    | InstanceRelease
    | RunCompleted
    | RunRequested
    | RunFromFork
    | InstantQueued
    | TierGroupChanged,
    Field(discriminator="kind"),
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
    """Whether a run attempt's demand is still served when it is dispatched."""

    OPEN = "open"
    COMPLETED = "completed"


@dataclass(frozen=True)
class RunAttempt:
    """What the ledger knows of a run attempt when its demand is dispatched."""

    mark: RunMark
    trust: TrustLevel | None = None
    """The level decided for its jobs (before any job's own environment); None: not decided yet."""
    privileged_labels: frozenset[str] = frozenset()
    """Its pool labels that a job with an environment asked for (see `privileged_label`)."""
    from_fork: bool = False
    """Its head repository is not its repository (or GitHub did not say): its jobs are single use, as a
    public repository's are."""
    on_demand: frozenset[str] = frozenset()
    """Label sets it serves on-demand: it is this stack's re-run of their interrupted jobs
    (domain/reruns.py)."""


def privileged_label(run_key: str) -> str:
    """The pool label a run key's privilege is kept by in its run attempt.

    GitHub gives a job to any runner that carries all of the job's labels ("Using labels with
    self-hosted runners"; "Choosing the runner for a job": "a job will only run on a runner with all the
    labels"), so a job of one run key can take a runner of any run key of the same pool label whose
    other labels include its own, and the other way round. Once one job of a pool label targets an
    environment, every later provision of that pool label in that run attempt is privileged, so no
    runner that job may take was reused or is left to the pool."""
    return RunKey.parse(run_key).label


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

    def remember_run_key(
        self, run_id: int, run_key: str, attempt: int, *, privileged: bool = False
    ) -> RunAttempt:
        """Note that the run attempt's demand uses `run_key`, unless that attempt has completed; with
        `privileged`, note in the same write that its pool label had a job with an environment."""
        ...

    def decide_trust(self, run_id: int, attempt: int, level: TrustLevel, *, from_fork: bool) -> TrustLevel:
        """Note the run attempt's level (and whether it comes from a fork), whenever its demand comes,
        unless one was decided already: the level that stands (the first one written)."""
        ...

    def complete_run(self, run_id: int, attempt: int) -> frozenset[str]:
        """Note the run attempt completed, even before any of its demand; the run keys its demand used
        (empty for a run not ours, or whose demand has not come yet)."""
        ...

    def take_turn(self, repository: str, run_key: str, *, arrival: Arrival, span: WindowSpan) -> BatchTurn:
        """Open the run key's follow-up window (a first, when its last burst is quiet; else the next
        follow-up, which the arrival's holder leads), or add the arrival's jobs to its follow-up batch
        (keeping its window open a little longer), or take over a follow-up whose leader's lease passed."""
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


class RunReader(Protocol):
    """GitHub's word on one run attempt (domain.runners-style errors when it does not answer)."""

    def run_attempt(self, repository: str, run_id: int, attempt: int) -> RunFacts: ...


class ExecutionStarter(Protocol):
    """Starts the state machines by the requests' execution names; False when the name already existed,
    which counts as started (Standard workflows keep names, so that is the same request again)."""

    def provision(self, request: ProvisionRequest) -> bool: ...

    def release(self, request: ReleaseRequest) -> bool: ...

    def follow_up(self, request: FollowUpRequest) -> bool:
        """Start the follow-up state machine, which gathers the follow-up (steps.follow_up)."""
        ...
