"""Provision's data and decisions (DESIGN.md section 6): what each step of the state machine carries, and
when an instance handed a runner config counts as ready, still coming, or failed.

The state machine passes these models from step to step as JSON; every step reads one, acts through
conditional writes, and returns the next, so a retried step repeats nothing but reads.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runner_pool.domain.capacity_waits import Shortfall
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import ReuseSettings
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.labels import INSTANT_RUN_ID, RunnerSpec
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import ClaimTerms, Taker
from runner_pool.domain.records import REGISTERED_SIGNALS, Heartbeat, InstanceRecord, Signal, WorkerSignal
from runner_pool.domain.timeouts import Timeouts
from runner_pool.domain.trust import reuses

CANDIDATES_PER_SLOT = 3
"""How many warm candidates one claim worker may try (and discard) before leaving its slot to creation."""
FIRST_CLAIM_WAIT_SECONDS = 1
"""Step Functions waits whole seconds; an agent that answers at once has registered within one."""
REDRIVE_LIMIT = 3
"""Provisions that may follow one that ended short for the same jobs; after them refresh reconciles."""
UNAVAILABLE_WAIT_CAP_SECONDS = 30
"""The longest wait between two tries at GitHub while it answers 5xx or not at all."""


class Readiness(StrEnum):
    READY = "ready"
    WAITING = "waiting"
    FAILED = "failed"
    DEFERRED = "deferred"
    """No runner could be registered yet (the budget is spent, GitHub rate-limits or is down): the
    worker holds nothing and claims again after `wait_seconds`."""


def busy_seconds(timeouts: Timeouts) -> float:
    """How long one provision may be at work: claims deferred up to the registration deadline, then
    creation's validation; refresh leaves a run's queued jobs alone while one may still serve them."""
    return 2 * timeouts.fleet_validation_seconds + timeouts.claim_registration_seconds


def unavailable_wait_seconds(deferrals: int) -> int:
    """How long to leave GitHub alone after its `deferrals`-th failure in a row: 1, 2, 4 ... up to 30 s."""
    return int(min(UNAVAILABLE_WAIT_CAP_SECONDS, 2 ** min(deferrals, 5)))


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProvisionPlan(_Step):
    """What Begin makes of a request; every later step carries it."""

    execution: str
    request: ProvisionRequest
    spec: RunnerSpec
    slots: tuple[int, ...]
    claim_wait_seconds: int = Field(gt=0)
    fleet_wait_seconds: int = Field(gt=0)
    candidates_per_slot: int = Field(gt=0)
    started_at: Epoch = 0.0
    """When Begin ran: Finish reports the time from there to the runners being ready."""
    registration_deadline: Epoch = 0.0
    """A claim worker that could not register a runner by then leaves its slot to creation."""
    single_use: bool = False
    """The jobs must neither take a used instance nor leave theirs to the pool (`single_use`): they take
    a pristine one from the pool, or a new one."""
    pre_claims: tuple[str | None, ...] = ()
    """Per slot, the instance Begin's one pickup claimed for it (with the slot's attempt-0 token), if any:
    the slot's worker hands it over without a pickup of its own."""
    pool_exhausted: bool = False
    """Begin's pickup looked for every slot and found fewer instances than slots: a slot it claimed
    nothing for goes to creation without a look of its own."""
    creation_only: bool = False
    """Begin knows no claim worker could add anything: every slot goes to creation (the jobs are single
    use and their class keeps no pristine minimum, or the pool had nothing for any slot and there is no
    stopped tier), so the state machine goes straight to Create. A cold request then makes no Claim
    invocation per slot and no Map transitions before its launch."""
    refused: str | None = None
    """GitHub refused a registration for this run for good (domain/runners.py `refused_for_good`), in its
    words: no later step of this provision asks again, claims, or launches for it."""

    @property
    def holder_repository(self) -> str | None:
        """The repository its instances are recorded as held for: the jobs' own, but none for an instant
        tier's, whose runner waits for any repository's job (and is deleted where it was registered)."""
        return None if self.spec.run_id == INSTANT_RUN_ID else self.request.repository

    def pre_claim(self, slot: int) -> str | None:
        return self.pre_claims[slot] if slot < len(self.pre_claims) else None

    @property
    def taker(self) -> Taker:
        """Whose instances these jobs may take, as pickup and the stopped tier judge it."""
        request = self.request
        return Taker(
            repository=request.repository,
            repository_id=request.repository_id,
            trust=request.trust,
            single_use=self.single_use,
        )

    def claim_terms(self, reuse: ReuseSettings, *, stopped: bool = False) -> ClaimTerms:
        """What a claim worker's claim of an instance for these jobs asks and writes: held for
        `holder_repository`, by its reuse rules and the jobs' level of trust."""
        holder = self.holder_repository
        return ClaimTerms(
            repository=holder,
            repository_id=self.request.repository_id if holder else None,
            reuse=reuse,
            single_use=self.single_use,
            trust=self.request.trust,
            stopped=stopped,
        )

    def shortfall(self, unserved: int, reason: str) -> Shortfall:
        """This provision as EC2 left it short: `unserved` of its jobs, for `reason` (its error codes)."""
        spec = self.spec
        return Shortfall(
            execution=self.execution,
            repository=self.request.repository,
            run_key=spec.run_key,
            resource_class=spec.resource_class,
            usage=spec.usage.value,
            jobs=unserved,
            reason=reason,
        )

    def claim_token(self, slot: int, attempt: int) -> str:
        """Names one claim: a retried claim step recognises its own claim by it, and nobody else's."""
        return f"{self.execution}#{slot}#{attempt}"

    def claimed_by_this(self, token: str | None) -> bool:
        """Whether a claim token names a claim of this execution (any slot, any attempt)."""
        return bool(token) and str(token).startswith(f"{self.execution}#")

    def claim_attempt(self, token: str, slot: int) -> int | None:
        """The attempt a claim token of this execution's `slot` names; None for anyone else's token."""
        prefix = f"{self.execution}#{slot}#"
        attempt = token.removeprefix(prefix)
        return int(attempt) if token.startswith(prefix) and attempt.isdigit() else None

    @property
    def creation_claim(self) -> str:
        """What the runner names of instances this execution created are derived from."""
        return f"{self.execution}#create"


def single_use(request: ProvisionRequest, spec: RunnerSpec, reuse: ReuseSettings) -> bool:
    """Whether the jobs must neither take a used instance nor leave theirs to the pool: a public
    repository's (unless `reuse.public_repositories`), jobs whose level never reuses (privileged, or not
    known: fail closed), `fresh=true`, an instant tier's (domain/instant.py), `reuse.max_jobs: 1`, or a class
    (or stack) configured single use."""
    return (
        (request.public and not reuse.public_repositories)
        or not reuses(request.trust)
        or spec.fresh
        or spec.run_id == INSTANT_RUN_ID
        or reuse.max_jobs == 1
        or reuse.single_use_class(spec.resource_class)
    )


def plan(
    request: ProvisionRequest,
    spec: RunnerSpec,
    execution: str,
    timeouts: Timeouts,
    now: Epoch,
    *,
    reuse: ReuseSettings | None = None,
) -> ProvisionPlan:
    return ProvisionPlan(
        started_at=now,
        registration_deadline=now + timeouts.fleet_validation_seconds,
        execution=execution,
        request=request,
        spec=spec,
        slots=tuple(range(request.count)),
        claim_wait_seconds=FIRST_CLAIM_WAIT_SECONDS,
        fleet_wait_seconds=max(1, math.ceil(timeouts.fleet_validation_poll_seconds)),
        candidates_per_slot=CANDIDATES_PER_SLOT,
        single_use=single_use(request, spec, reuse or ReuseSettings()),
    )


class ClaimWorker(_Step):
    """One Map iteration's state: the slot it fills and the candidate it holds, if any."""

    plan: ProvisionPlan
    slot: int
    attempt: int = 0
    """Claims this worker has made so far; each has its own claim token."""
    candidates_left: int | None = None
    claimed: bool = False
    instance_id: str | None = None
    claim_token: str | None = None
    handed_over_at: Epoch | None = None
    deadline: Epoch | None = None
    readiness: Readiness | None = None
    reason: str | None = None
    wait_seconds: int = 1
    deferrals: int = 0
    """Times this worker was told to wait for a registration (budget, rate limit, GitHub down)."""
    starting: bool = False
    """Its instance was claimed from the stopped tier and started: it boots before it can register."""
    refused: str | None = None
    """GitHub refused the slot's registration for good, in its words: no instance is launched for it."""

    @property
    def remaining(self) -> int:
        return self.plan.candidates_per_slot if self.candidates_left is None else self.candidates_left

    def holding_nothing(self, **update: Any) -> ClaimWorker:
        """This worker with no instance, claim or wait of its own; `update` on top."""
        let_go: dict[str, Any] = {
            "claimed": False,
            "instance_id": None,
            "claim_token": None,
            "handed_over_at": None,
            "deadline": None,
            "starting": False,
            "readiness": None,
        }
        return self.model_copy(update=let_go | update)


class WorkerResult(_Step):
    """What a finished claim worker leaves for the rest of the machine: its instance, if it got one."""

    slot: int
    instance_id: str | None = None
    claim_token: str | None = None
    handed_over_at: Epoch | None = None
    """When its instance was handed its runner: what Finish judges whether it served since."""
    refused: str | None = None


class Creation(_Step):
    """Creation's and fleet validation's state: what was launched and where each instance stands."""

    requested: int = 0
    launched: tuple[str, ...] = ()
    awaiting: tuple[str, ...] = ()
    """Launched and recorded, but not yet handed a runner config: the budget ran out, or GitHub
    rate-limited or failed part-way. Handed over at the next look, until the deadline."""
    deferrals: int = 0
    pending: tuple[str, ...] = ()
    ready: tuple[str, ...] = ()
    failed: dict[str, str] = Field(default_factory=dict)
    """Instance id → why it never got ready."""
    launch_errors: dict[str, int] = Field(default_factory=dict)
    """EC2 error code → how many instances CreateFleet could not launch for it."""
    deadline: Epoch = 0.0
    wait_seconds: int = 1
    validating: bool = False
    refused: str | None = None
    """GitHub refused a registration for good, in its words: nothing more is launched or handed over."""


class ProvisionResult(_Step):
    run_key: str
    requested: int
    warm: tuple[str, ...]
    """Claimed from the pool and now running for the run."""
    cold: tuple[str, ...]
    """Created for the run and now running."""
    expired: tuple[str, ...]
    """Created or claimed but not ready in time: expired and terminated."""
    lost: tuple[str, ...] = ()
    """Ready, then moved on by a release after their runner served the run (the agent cleaned up after
    this run since the hand-over): a short job's instance, released before Finish."""
    moved_on: tuple[str, ...] = ()
    """Ready, then moved on by someone else with nothing served for this run: their jobs are unserved."""
    refused: str | None = None
    """Why GitHub refused the run's registrations for good: the unserved jobs are not asked for again."""

    @property
    def shortfall(self) -> int:
        return self.requested - len(self.warm) - len(self.cold)

    @property
    def unserved(self) -> int:
        """Jobs no runner of this provision will take: a lost instance was moved on by someone else,
        most often the release of a short job it already served, so it is not one of them."""
        return max(0, self.shortfall - len(self.lost))


def readiness(
    record: InstanceRecord | None,
    heartbeat: Heartbeat | None,
    signal: WorkerSignal | None,
    *,
    run_key: str,
    claim_token: str | None,
    handed_over_at: Epoch,
    deadline: Epoch,
    now: Epoch,
    timeouts: Timeouts,
    starting: bool = False,
) -> tuple[Readiness, str]:
    """Whether an instance handed a runner config for `run_key` is ready, still coming, or failed.

    Ready means DESIGN.md 6.1's two checks: a heartbeat within the healthy window and `UD_REG_OK` for
    this run key, written after this hand-off (an instance the same run held before carries an
    older `UD_REG_OK` for the same key). A claimed instance was vetted idle, so its heartbeat must
    be fresh from the start; a created one may still be booting until the deadline. One claimed from
    the stopped tier (`starting`) boots like a created one: its heartbeat counts only from the start on
    (the one it wrote before its stop may still look fresh), and must stay fresh once it has begun.
    One whose runner registered and which a release has made idle since counts as ready too: Finish
    finds it moved on and counts it lost, a runner that served, not one still missing.
    """
    expected = InstanceState.CLAIMED if claim_token else InstanceState.CREATED
    current = signal is not None and signal.run_key == run_key and signal.at >= handed_over_at
    if (
        record is None
        or record.state is not expected
        or record.run_key != run_key
        or record.claim_token != claim_token
        or record.threshold_passed(now)
    ):
        return _moved_on(record, signal, current)
    failure = _signalled_failure(signal, current)
    if failure:
        return Readiness.FAILED, failure
    beat_since = heartbeat is not None and (not starting or heartbeat.beat_at >= handed_over_at)
    fresh = beat_since and heartbeat is not None and heartbeat.is_fresh(now, timeouts.healthy_window_seconds)
    if fresh and current and signal is not None and signal.signal is Signal.UD_REG_OK:
        return Readiness.READY, "registered"
    if not fresh and ((claim_token and not starting) or beat_since):
        # A vetted idle instance beats from the start; a booting one that began to beat must go on.
        return Readiness.FAILED, "heartbeat stale: the agent is not running"
    if now >= deadline:
        return Readiness.FAILED, f"not registered for the run within {deadline - handed_over_at:g} s"
    return Readiness.WAITING, "registering"


def _moved_on(
    record: InstanceRecord | None, signal: WorkerSignal | None, current: bool
) -> tuple[Readiness, str]:
    """An instance this hand-off no longer holds: failed, unless a release made it idle after its runner
    registered for the run (the agent's current signal says so).

    That is the release of a short job it ran (seen at this look rather than at
    Finish), or of its run: ready then, so that Finish's activate loses it and counts it lost, not
    unserved. Failed would ask again for a runner for a job this one has already run, and the provision
    asked would read the pool, holding the misfits it receives out of every other request's sight.
    Only a release, or a give-back of a hand-over that stored no config (so no runner registered),
    makes a held record idle.
    """
    if (
        record is not None
        and record.state is InstanceState.IDLE
        and record.run_key is None
        and current
        and signal is not None
        and signal.signal in REGISTERED_SIGNALS
    ):
        return Readiness.READY, "registered, and released already (its short job ended, or its run)"
    state = "gone" if record is None else f"{record.state} for {record.run_key!r}"
    return Readiness.FAILED, f"no longer held by this provision (now {state})"


def _signalled_failure(signal: WorkerSignal | None, current: bool) -> str | None:
    """A signal that rules the instance out: its runner failed for this hand-off, or its boot failed."""
    if signal is None:
        return None
    if current and signal.signal is Signal.UD_REG_FAILED:
        return f"runner failed to start: {signal.reason or 'no reason given'}"
    if signal.signal is Signal.UD_FAILED:
        return f"boot failed: {signal.reason or 'no reason given'}"
    return None
