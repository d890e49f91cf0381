"""The provision state machine's steps (infra/statemachines/provision.asl.json), over explicit collaborators.

Each step is safe to run again with the same input: claims carry a token that names them, creation
launches with a client token that names it, and every record change is a conditional transition
whose replay is recognised. A lost transition means someone else moved the instance: the step
lets go of it and reports, it never raises for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TypeVar

from runner_pool.adapters.executions import Executions
from runner_pool.adapters.fleet import LAUNCH_TAG, Fleet
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.recent_demand import RecentDemand
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.side_by_side import in_background
from runner_pool.adapters.state_table import InstanceView, StateTable, TransitionResult
from runner_pool.domain import stopped_tier
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import ProvisionRequest, ReleaseRequest
from runner_pool.domain.fleet import Ec2State, LaunchRequest, Start
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import (
    PICKUP_BUDGET_SECONDS,
    PickupManager,
    PickupResult,
    PoolQueue,
    StopReason,
)
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.provision import (
    REDRIVE_LIMIT,
    ClaimWorker,
    Creation,
    ProvisionPlan,
    ProvisionResult,
    Readiness,
    WorkerResult,
    busy_seconds,
    plan,
    readiness,
    unavailable_wait_seconds,
)
from runner_pool.domain.records import REGISTERED_SIGNALS, PoolMessage
from runner_pool.domain.registration_budget import RegistrationBudget, wait_seconds
from runner_pool.domain.runners import GitHubRateLimitedError, GitHubRetryableError, RunnerRegistry
from runner_pool.observability import count, logger, seconds
from runner_pool.steps.hand_over import (
    HandOver,
    NotTried,
    Refused,
    RegistrationDeferred,
    RegistrationRefused,
)
from runner_pool.steps.hand_over import Outcome as HandOverOutcome
from runner_pool.steps.notices import NoticeSource, no_notices, open_queues

INLINE_CHECKS = 4
INLINE_CHECK_PAUSE_SECONDS = 0.25
"""A claimed instance's agent usually registers within a second. The claim step looks for that
in-line a few times before the state machine's first Wait (Step Functions waits whole seconds):
the warm path saves a second and three state transitions, for about a second of Lambda time."""
_Claimed = TypeVar("_Claimed", ClaimWorker, ClaimWorker | None)

PICKUPS_PER_CLAIM = 3
"""Pickups one claim step makes when claims are lost to other workers or the queue looked empty once."""
CLAIM_RESERVE_SECONDS = 10.0
"""What a claim step keeps of its Lambda's time for a hand-over (GitHub's JIT call, KMS, a few writes)
and its in-line checks. A pickup begins only with its whole budget and this left, and the in-line
checks run only while this is left: a slow step (a loaded region, a long pool queue) returns what it
has, to be claimed again or checked by the state machine's loop, instead of timing out. Three timeouts
in a row (Sandbox.Timedout) failed the Map and the execution, with its jobs left to a redrive: issue
15's 1,000-job burst under load, 2026-11-27."""


class Provision:
    """The table is built with the steps; every other adapter is built on first use, so a step's Lambda
    creates only the clients that step calls, and reads the App's key only when it reaches GitHub."""

    def __init__(
        self,
        table: StateTable,
        *,
        clock: Clock,
        config: StackConfig,
        arns: InstanceArns,
        pickup: Callable[[], PickupManager],
        queues: Callable[[], PoolQueue],
        fleet: Callable[[], Fleet],
        budget: Callable[[], RegistrationBudget],
        registry: Callable[[], RunnerRegistry],
        credentials: Callable[[], RunnerCredentials],
        recent_demand: Callable[[], RecentDemand],
        executions: Callable[[str | None], Executions],
        notices: NoticeSource = no_notices,
        pause: Callable[[float], None] = time.sleep,
        time_left: Callable[[], float] | None = None,
    ) -> None:
        """`executions(machine)` starts provisions on `machine` (a step's own state machine), else on the
        configured one. `pause` is how a step waits briefly in-line; `time_left`, the seconds its Lambda
        has left (the invocation's context; None: no limit)."""
        self._table = table
        self._clock = clock
        self._config = config
        self._timeouts = config.timeouts
        self._arns = arns
        self._pickup = pickup
        self._queues = queues
        self._fleet = fleet
        self._budget = budget
        self._registry = registry
        self._credentials = credentials
        self._recent_demand = recent_demand
        self._executions = executions
        self._notices = notices
        self._pause = pause
        self._time_left = time_left or (lambda: math.inf)
        self._handing = HandOver(
            table,
            github=config.github,
            arns=arns,
            registry=registry,
            credentials=credentials,
            queues=queues,
            notices=notices,
        )

    # --- Begin ---------------------------------------------------------------------------------

    def begin(self, request: ProvisionRequest, execution: str) -> ProvisionPlan:
        """Resolve the label (a LabelError fails the execution before anything is held), and note the run's
        demand for refresh's reconciliation."""
        config = self._config
        spec = request.key.resolve(config)
        planned = plan(request, spec, execution, self._timeouts, self._clock.now())
        if request.public and not config.reuse.public_repositories:
            planned = planned.model_copy(update={"single_use": True})
        if spec.run_id.isdigit():
            try:
                self._recent_demand().note(
                    request.repository,
                    int(spec.run_id),
                    request.key.attempt,
                    spec.run_key,
                    busy_seconds(self._timeouts),
                    single_use=request.public,
                )
            except Exception:  # a backstop's bookkeeping never holds up a provision
                logger.exception("run's demand not noted; refresh will not reconcile it")
        if planned.fresh:
            # A fresh or single-use job never takes a pooled instance, hot or stopped: creation it is.
            return planned.model_copy(update={"creation_only": True})
        return self._pick_up(planned)

    def _pick_up(self, provision: ProvisionPlan) -> ProvisionPlan:
        """One pickup for every slot, before the claim workers start (issue 15, item 2), each instance it
        finds claimed for a slot with that slot's first token: the workers then only hand over, never
        take offers from each other, and an empty pool is known after this one look.

        Registrations are taken from the budget here for the instances claimed. Whatever fails (the
        budget spent, a queue error) leaves the rest to the workers' own pickups, as before; the claims
        made so far are in the plan. A retried Begin finds its own claims first (`_own_pre_claims`).
        """
        slots = len(provision.slots)
        pre_claims: list[str | None] = list(self._own_pre_claims(provision))
        if any(pre_claims):
            # As the earlier try answered, but for a budget that granted fewer than the slots: then the
            # slots it claimed nothing for go to creation without a look (they would have found little).
            exhausted = sum(1 for claim in pre_claims if claim) < slots
            return provision.model_copy(update={"pre_claims": tuple(pre_claims), "pool_exhausted": exhausted})
        grant = self._budget().take(slots)
        if grant.refused or grant.granted == 0:
            return provision
        claimed = 0
        candidates: list[PoolMessage] = []
        try:
            self._ask_for_token_ahead()  # while the pool is read: in hand for the hand-overs
            found = self._pickup().pickup(provision.spec, provision.request.repository, wanted=grant.granted)
            _warn_of(found)
            candidates = list(found.candidates)
            for slot, candidate in zip(provision.slots, found.candidates, strict=False):
                # Taken off the list to offer again only once its claim answered: a claim that raised
                # (its answer lost, or AWS busy) leaves it to be offered again below. Offered again
                # although the claim took effect, the offer is a harmless duplicate: pickup checks the
                # record, which is claimed, and drops it.
                result = self._table.claim(
                    candidate.instance_id,
                    provision.spec.run_key,
                    provision.claim_token(slot, 0),
                    repository=provision.request.repository,
                    reuse=self._config.reuse,
                    single_use=provision.single_use,
                )
                candidates.remove(candidate)
                if result.succeeded:
                    pre_claims[slot] = candidate.instance_id
                    claimed += 1
                else:
                    count("ClaimRacesLost")
        except Exception:
            logger.exception("the request's pickup failed; each claim worker looks for itself")
            for unclaimed in candidates:  # taken off the queue, never claimed: offered again
                self._queues().offer(unclaimed)
            return provision.model_copy(update={"pre_claims": tuple(pre_claims)})
        finally:
            self._budget().give_back(grant.granted - claimed)
        exhausted = grant.granted == slots and len(found.candidates) < slots
        if exhausted:
            count("PoolExhausted")
        # With no stopped tier, an exhausted slot's worker would only pass it on to creation.
        creation_only = exhausted and claimed == 0 and self._config.pool.stopped_maximum == 0
        planned = provision.model_copy(
            update={
                "pre_claims": tuple(pre_claims),
                "pool_exhausted": exhausted,
                "creation_only": creation_only,
            }
        )
        return self._hand_over_pre_claims(planned)

    def _hand_over_pre_claims(self, provision: ProvisionPlan) -> ProvisionPlan:
        """Hand the instances just claimed their configs, side by side, before the claim workers start:
        a warm runner's config is then stored one Map start and one Lambda invocation sooner, and a Map
        of 40 workers at a time no longer holds the 41st slot's hand-over until a worker ends (issue 15,
        item 5). Each slot's worker then finds its hand-over done (`_hand_over` recognises it) and only
        checks readiness.

        Only a head start: whatever fails here (GitHub deferring, its record moved on, any error) is left
        as it is, claimed, for the slot's worker to hand over or give back as it always did. Once GitHub
        defers one, no more are begun here. Once GitHub refuses one for good, every claim not handed over
        goes back to the pool and the plan carries the refusal: no worker asks GitHub again.
        """
        claimed = [
            (instance_id, provision.claim_token(slot, 0))
            for slot, instance_id in enumerate(provision.pre_claims)
            if instance_id is not None
        ]
        if not claimed:
            return provision
        run_key = provision.spec.run_key

        def hand_over(claim: tuple[str, str]) -> float | None:
            instance_id, token = claim
            return self._handing.register(instance_id, run_key, token)

        try:
            outcomes = self._handing.side_by_side(hand_over, claimed)
            limited = [outcome for outcome in outcomes if isinstance(outcome, GitHubRateLimitedError)]
            if limited:  # every registration honours GitHub's wait from now on
                self._budget().hold_off(max(cause.retry_after_seconds for cause in limited))
        except Exception:  # the workers hand over what is left, with their own retries and give-backs
            logger.exception("Begin's hand-overs failed; the claim workers hand over instead")
            return provision
        done = sum(1 for outcome in outcomes if isinstance(outcome, float))
        count("HandedOverByBegin", done)
        refusal = next((outcome for outcome in outcomes if isinstance(outcome, Refused)), None)
        if refusal is not None:
            return self._refused_before_the_workers(provision, claimed, outcomes, refusal)
        if done < len(claimed):
            logger.info("left hand-overs to the claim workers", handed_over=done, claimed=len(claimed))
        return provision

    def _refused_before_the_workers(
        self,
        provision: ProvisionPlan,
        claimed: list[tuple[str, str]],
        outcomes: list[HandOverOutcome],
        refusal: Refused,
    ) -> ProvisionPlan:
        """GitHub refused Begin's registrations for good: the claims it handed nothing go back to the pool
        with their registrations, and the plan carries GitHub's reason to every worker."""
        run_key = provision.spec.run_key
        pre_claims = list(provision.pre_claims)
        returned = 0
        for (instance_id, token), outcome in zip(claimed, outcomes, strict=True):
            if isinstance(outcome, float):
                continue  # handed over before the refusal: its worker checks it as usual
            self._handing.give_back(instance_id, run_key, token)
            pre_claims[pre_claims.index(instance_id)] = None
            returned += 1
        self._budget().give_back(returned)
        logger.error("GitHub refused the run's registration; nothing more is asked", reason=refusal.reason)
        return provision.model_copy(update={"pre_claims": tuple(pre_claims), "refused": refusal.reason})

    def _own_pre_claims(self, provision: ProvisionPlan) -> list[str | None]:
        """The instances an earlier try of this Begin claimed, per slot (their attempt-0 tokens)."""
        found: list[str | None] = [None] * len(provision.slots)
        firsts = {provision.claim_token(slot, 0): slot for slot in provision.slots}
        for record in self._table.held_by(provision.spec.run_key):
            slot = firsts.get(record.claim_token or "")
            if slot is not None and record.state is InstanceState.CLAIMED:
                found[slot] = record.instance_id
        return found

    # --- claim workers -------------------------------------------------------------------------

    def claim(self, worker: ClaimWorker) -> ClaimWorker:
        """Pick up a warm candidate, claim it and hand it its runner config; or report the pool exhausted.

        A registration is taken from the App's budget first: while there is none, or GitHub rate-limits
        or fails, the worker holds no instance and is told how long to wait before it claims again.
        """
        resumed = self._as_claimed(worker, lambda: self._pre_claimed(worker) or self._own_claim(worker))
        if resumed is not None:
            return resumed
        if worker.plan.refused is not None:
            return self._refused(worker, worker.plan.refused)
        exhausted = worker.attempt == 0 and worker.plan.pool_exhausted
        if worker.plan.fresh or (exhausted and self._config.pool.stopped_maximum == 0):
            # Fresh or single-use: never a pooled instance. Exhausted: Begin's pickup looked for this slot.
            # A fresh or single-use job never takes a pooled instance, hot or stopped: creation it is.
            return worker.model_copy(
                update={"claimed": False, "instance_id": None, "claim_token": None, "readiness": None}
            )
        grant = self._budget().take(1)
        if grant.refused:
            return self._deferred(worker, None, grant.wait_seconds)
        # Exhausted: Begin looked at the hot pool for this slot; the stopped tier, then creation.
        return self._as_claimed(worker, lambda: self._claim_one(worker, hot=not exhausted))

    def _as_claimed(self, worker: ClaimWorker, claiming: Callable[[], _Claimed]) -> _Claimed | ClaimWorker:
        """What `claiming` came to, with GitHub deferring or refusing its hand-over as the worker's wait
        or refusal (the instance is back in the pool either way)."""
        try:
            return claiming()
        except _HandOverDeferred as deferred:
            return self._deferred(worker.model_copy(update={"attempt": deferred.attempt}), deferred.cause)
        except RegistrationRefused as refused:
            self._budget().give_back(1)  # a refused call returns its token
            return self._refused(worker, refused.reason)

    def _refused(self, worker: ClaimWorker, reason: str) -> ClaimWorker:
        """GitHub refused the slot's registration for good: the worker holds nothing, and no instance is
        launched for the slot (Create reads `refused`)."""
        logger.error("GitHub refused the slot's registration", slot=worker.slot, reason=reason)
        return worker.model_copy(
            update={
                "claimed": False,
                "instance_id": None,
                "claim_token": None,
                "readiness": None,
                "reason": reason,
                "refused": reason,
            }
        )

    def _claim_one(self, worker: ClaimWorker, *, hot: bool = True) -> ClaimWorker:
        spec = worker.plan.spec
        attempt = worker.attempt
        empty_looks = 0
        for _ in range(PICKUPS_PER_CLAIM if hot else 0):
            if self._time_left() < PICKUP_BUDGET_SECONDS + CLAIM_RESERVE_SECONDS:
                self._budget().give_back(1)
                return self._out_of_time(worker.model_copy(update={"attempt": attempt}))
            found = self._pickup().pickup(spec, worker.plan.request.repository)
            _warn_of(found)
            if found.candidate is None:
                if found.stopped is StopReason.EMPTY and empty_looks == 0:
                    # Under load a long poll can come back empty while messages are in flight; look once more.
                    empty_looks += 1
                    continue
                break
            token = worker.plan.claim_token(worker.slot, attempt)
            attempt += 1
            claimed = self._claim_offer(found.candidate, spec.run_key, token, worker.plan)
            if not claimed.succeeded:
                count("ClaimRacesLost")
                continue
            self._hand_over_claimed(found.candidate.instance_id, spec.run_key, token, attempt)
            return self._check_in_line(self._holding(worker, found.candidate.instance_id, token, attempt))
        if hot:
            count("PoolExhausted")
        return self._start_stopped(worker, attempt) or self._nothing_claimed(worker, attempt)

    def _claim_offer(
        self, offer: PoolMessage, run_key: str, token: str, provision: ProvisionPlan
    ) -> TransitionResult:
        """Claim an instance pickup took off its queue. A claim that raises offers it again before the
        step fails (whose retry finds its own claim if the write took effect): an offer taken off the
        queue is never lost. A duplicate offer of a claimed instance is harmless: pickup drops it."""
        try:
            return self._table.claim(
                offer.instance_id,
                run_key,
                token,
                repository=provision.request.repository,
                reuse=self._config.reuse,
                single_use=provision.single_use,
            )
        except Exception:
            self._queues().offer(offer)
            raise

    def _nothing_claimed(self, worker: ClaimWorker, attempt: int) -> ClaimWorker:
        """No instance, hot or stopped: the registration goes back and the slot to creation."""
        self._budget().give_back(1)
        return worker.model_copy(
            update={
                "attempt": attempt,
                "claimed": False,
                "instance_id": None,
                "claim_token": None,
                "readiness": None,
            }
        )

    def _start_stopped(self, worker: ClaimWorker, attempt: int) -> ClaimWorker | None:
        """The stopped tier (issue 16, item 2), once the hot pool had nothing: claim a stopped instance that
        fits, start it, hand it its config; None if there is none that fits and starts.

        The claim (stopped → claimed, a conditional write) comes before StartInstances, so two workers
        never start one instance; the start before the hand-over, so an instance given back (GitHub
        deferring the registration) goes to the hot pool running. An instance EC2 will not start (no
        capacity of its type in its zone now, or gone) is expired and terminated like a candidate that
        failed a check, and the next one is tried; the slot falls back to creation after the last.
        """
        if self._config.pool.stopped_maximum == 0:
            return None
        spec = worker.plan.spec
        repository = worker.plan.request.repository
        now = self._clock.now()
        for partition in PoolPartition.admitting(spec):
            for record in self._table.stopped(partition, now):
                if not stopped_tier.fits(record, spec, now, repository, self._config):
                    continue
                token = worker.plan.claim_token(worker.slot, attempt)
                attempt += 1
                claimed = self._table.claim(
                    record.instance_id,
                    spec.run_key,
                    token,
                    repository=repository,
                    reuse=self._config.reuse,
                    single_use=worker.plan.single_use,
                    stopped=True,
                )
                if not claimed.succeeded:
                    count("ClaimRacesLost")
                    continue
                started = self._fleet().start(record.instance_id)
                if started is not Start.STARTING:
                    logger.warning(
                        "stopped instance not started", instance_id=record.instance_id, ec2=started
                    )
                    count(f"StartsRefused.{started.value}")
                    self._expire_and_terminate([record.instance_id], spec.run_key)
                    continue
                count("StartedFromStopped")
                self._hand_over_claimed(record.instance_id, spec.run_key, token, attempt)
                return self._starting(self._holding(worker, record.instance_id, token, attempt))
        return None

    def _started_again(self, instance_id: str) -> bool:
        """Whether a claimed instance is still coming up from the stopped tier (started again if it is
        still stopped); False without a tier, where no claimed instance ever was stopped."""
        if self._config.pool.stopped_maximum == 0:
            return False
        state = self._fleet().states([instance_id]).get(instance_id)
        if state is Ec2State.STOPPED:
            self._fleet().start(instance_id)
        return state in (Ec2State.STOPPED, Ec2State.PENDING)

    def _starting(self, holding: ClaimWorker) -> ClaimWorker:
        """A started instance's wait: EC2's start, the OS's boot and the agent's, then its registration."""
        since = holding.handed_over_at or self._clock.now()
        return holding.model_copy(
            update={"starting": True, "deadline": since + self._timeouts.start_registration_seconds}
        )

    def _deferred(
        self,
        worker: ClaimWorker,
        cause: GitHubRetryableError | None,
        budget_wait: int = 1,
        reason: str = "the registration budget is spent",
    ) -> ClaimWorker:
        """Wait before claiming again; past the registration deadline, leave the slot to creation."""
        wait = budget_wait if cause is None else self._wait_for(cause, worker.deferrals)
        reason = reason if cause is None else str(cause)
        if self._clock.now() + wait > worker.plan.registration_deadline:
            count("RegistrationsGivenUp")
            logger.warning("no runner registered in time; the slot is left to creation", reason=reason)
            return worker.model_copy(
                update={"claimed": False, "instance_id": None, "claim_token": None, "readiness": None}
            )
        count("RegistrationsDeferred")
        return worker.model_copy(
            update={
                "claimed": False,
                "instance_id": None,
                "claim_token": None,
                "handed_over_at": None,
                "deadline": None,
                "readiness": Readiness.DEFERRED,
                "reason": reason,
                "wait_seconds": wait,
                "deferrals": worker.deferrals + 1,
            }
        )

    def _wait_for(self, cause: GitHubRetryableError, deferrals: int) -> int:
        """GitHub's own wait for a rate limit, which every other registration then honours too
        (docs.github.com, "Rate limits for the REST API", "Exceeding the rate limit"); a growing one
        while GitHub fails."""
        if isinstance(cause, GitHubRateLimitedError):
            self._budget().hold_off(cause.retry_after_seconds)
            count("GitHubRateLimited")
            return wait_seconds(cause.retry_after_seconds)
        count("GitHubUnavailable")
        return unavailable_wait_seconds(deferrals)

    def _out_of_time(self, worker: ClaimWorker) -> ClaimWorker:
        """Holding nothing, claim again in a fresh invocation (after the state machine's shortest wait):
        too little of this one is left for a whole pickup and a hand-over."""
        count("ClaimsOutOfTime")
        logger.warning("too little time left for a pickup; claiming again", seconds_left=self._time_left())
        return self._deferred(worker, None, reason="too little time left for a pickup")

    def _check_in_line(self, worker: ClaimWorker) -> ClaimWorker:
        checked = worker
        for _ in range(INLINE_CHECKS):
            if self._time_left() < CLAIM_RESERVE_SECONDS:
                break  # the state machine's Wait and CheckClaim loop looks on
            self._pause(INLINE_CHECK_PAUSE_SECONDS)
            checked = self.check_claim(worker)
            if checked.readiness is not Readiness.WAITING:
                break
        return checked

    def _pre_claimed(self, worker: ClaimWorker) -> ClaimWorker | None:
        """The instance Begin's pickup claimed for this worker's slot, handed over (a first try, or a
        retried one: the hand-over recognises its own earlier work). None if there is none, or if the
        claim is no longer this slot's (then the registration Begin took for it is given back)."""
        instance_id = worker.plan.pre_claim(worker.slot)
        if worker.attempt != 0 or instance_id is None:
            return None
        token = worker.plan.claim_token(worker.slot, 0)
        record = self._table.get(instance_id)
        if record is None or record.state is not InstanceState.CLAIMED or record.claim_token != token:
            served = self._served_before_it_began(worker, instance_id, token)
            if served is None:
                self._budget().give_back(1)
            return served
        handed_over_at = self._hand_over_claimed(instance_id, worker.plan.spec.run_key, token, 1)
        # Time runs from the hand-over, not from Begin's claim (a Map starts its workers in waves), and
        # from the same moment for a retried step, which finds the hand-over done.
        return self._check_in_line(self._holding(worker, instance_id, token, 1, handed_over_at))

    def _served_before_it_began(
        self, worker: ClaimWorker, instance_id: str, token: str
    ) -> ClaimWorker | None:
        """The pre-claimed instance, held for Finish to count lost, if its runner registered on Begin's
        hand-over and its job ran and was released before this worker began (a Map starts its workers
        in waves): it served, so no other is claimed or launched for a job that ran. None otherwise."""
        verdict, reason = self._readiness(
            self._table.observe(instance_id),
            provision=worker.plan,
            claim_token=token,
            handed_over_at=worker.plan.started_at,
            deadline=self._clock.now(),
        )
        if verdict is not Readiness.READY:
            return None
        served = self._holding(worker, instance_id, token, 1, worker.plan.started_at)
        return served.model_copy(update={"readiness": verdict, "reason": reason})

    def _own_claim(self, worker: ClaimWorker) -> ClaimWorker | None:
        """A claim this worker made in an earlier try of this same step (a retried Lambda), resumed.

        Without it a retry would claim a second instance and strand the first until its claim expired.
        """
        for record in self._table.held_by(worker.plan.spec.run_key):
            token = record.claim_token
            attempt = worker.plan.claim_attempt(token, worker.slot) if token else None
            # An attempt below the worker's own is an earlier candidate, already discarded.
            if record.state is not InstanceState.CLAIMED or attempt is None or attempt < worker.attempt:
                continue
            # A claim of the stopped tier whose try died before StartInstances: started now (a start of a
            # pending or running instance is accepted again, so this never starts anything twice).
            starting = self._started_again(record.instance_id)
            self._hand_over_claimed(record.instance_id, record.run_key or "", token or "", attempt + 1)
            # The claim set the threshold; the agent may have registered since, so time runs from then.
            claimed_at = (record.threshold or 0.0) - self._timeouts.claimed_threshold_seconds
            holding = self._holding(worker, record.instance_id, token or "", attempt + 1, claimed_at)
            return self._check_in_line(self._starting(holding) if starting else holding)
        return None

    def _holding(
        self, worker: ClaimWorker, instance_id: str, token: str, attempt: int, since: float | None = None
    ) -> ClaimWorker:
        handed_over_at = self._clock.now() if since is None else since
        return worker.model_copy(
            update={
                "attempt": attempt,
                "claimed": True,
                "instance_id": instance_id,
                "claim_token": token,
                "handed_over_at": handed_over_at,
                "deadline": handed_over_at + self._timeouts.claim_registration_seconds,
                "readiness": Readiness.WAITING,
                "starting": False,
                "reason": None,
                "wait_seconds": worker.plan.claim_wait_seconds,
            }
        )

    def check_claim(self, worker: ClaimWorker) -> ClaimWorker:
        if worker.instance_id is None or worker.handed_over_at is None or worker.deadline is None:
            raise ValueError(f"slot {worker.slot} holds no claimed instance to check")
        verdict, reason = self._readiness(
            self._table.observe(worker.instance_id),
            provision=worker.plan,
            claim_token=worker.claim_token,
            handed_over_at=worker.handed_over_at,
            deadline=worker.deadline,
            starting=worker.starting,
        )
        return worker.model_copy(
            update={"readiness": verdict, "reason": reason, "wait_seconds": worker.plan.claim_wait_seconds}
        )

    def discard(self, worker: ClaimWorker) -> ClaimWorker:
        """The candidate failed a check: expire it (if still ours) and terminate it; one candidate fewer."""
        if worker.instance_id is not None:
            logger.info("discarding candidate", instance_id=worker.instance_id, reason=worker.reason)
            self._expire_and_terminate([worker.instance_id], worker.plan.spec.run_key)
        return worker.model_copy(
            update={
                "candidates_left": worker.remaining - 1,
                "claimed": False,
                "instance_id": None,
                "claim_token": None,
                "handed_over_at": None,
                "deadline": None,
                "starting": False,
            }
        )

    # --- creation and fleet validation ---------------------------------------------------------

    def create(self, provision: ProvisionPlan, workers: Iterable[WorkerResult]) -> Creation:
        """Launch the slots the pool could not fill; record every launched instance at once."""
        workers = list(workers)
        shortfall = len(provision.slots) - sum(1 for worker in workers if worker.instance_id)
        if shortfall <= 0:
            return Creation()
        refused = provision.refused or next((w.refused for w in workers if w.refused), None)
        if refused is not None:
            # GitHub refused the run's registration for good: an instance launched now would wait for
            # a runner GitHub will not register, and be terminated unused.
            count("LaunchesRefusedByGitHub", shortfall)
            return Creation(requested=shortfall, refused=refused)
        spec = provision.spec
        request = LaunchRequest.for_run(spec, shortfall, idempotency_key=provision.execution)
        fleet = self._fleet()
        self._ask_for_token_ahead()  # while EC2 launches: in hand for the hand-overs
        outcome = fleet.launch_with_fallback(request, self._config.fleet)
        for facts in outcome.launched:
            # Recorded before anything else can fail: no instance is ever left without a record.
            self._table.create(
                facts,
                spec.run_key,
                repository=provision.request.repository,
                single_use=provision.single_use,
            )
        # After the records: a notice queue without a record is refresh's to delete (domain/notices.py).
        open_queues(self._notices, (facts.instance_id for facts in outcome.launched))
        errors = {code: len(failures) for code, failures in outcome.failures_by_code().items()}
        for code, failures in errors.items():
            count(f"FleetErrors.{code}", failures)
        launched = tuple(facts.instance_id for facts in outcome.launched)
        now = self._clock.now()
        created = Creation(
            requested=shortfall,
            launched=launched,
            awaiting=launched,
            launch_errors=errors,
            deadline=now + self._timeouts.fleet_validation_seconds,
            wait_seconds=provision.fleet_wait_seconds,
        )
        return self._hand_over_created(provision, created)

    def _hand_over_created(self, provision: ProvisionPlan, creation: Creation) -> Creation:
        """Hand runner configs to launched instances as the registration budget allows.

        A rate limit or a GitHub failure part-way stops the hand-overs, never the execution: every
        launched instance is recorded already, the ones handed over are validated, and the rest wait
        for the next look (after GitHub's wait), until the validation deadline expires them.
        """
        awaiting = list(creation.awaiting)
        pending = list(creation.pending)
        failed = dict(creation.failed)
        deferrals = creation.deferrals
        wait = provision.fleet_wait_seconds
        refused = creation.refused
        if awaiting and self._clock.now() >= creation.deadline:
            failed |= {instance_id: "no runner was registered for it in time" for instance_id in awaiting}
            awaiting = []
        budget = self._budget()
        run_key = provision.spec.run_key
        while awaiting and refused is None:
            grant = budget.take(len(awaiting))
            if grant.refused:
                wait = grant.wait_seconds
                break
            batch = awaiting[: grant.granted]
            outcomes = self._handing.side_by_side(
                lambda instance_id: self._handing.register(instance_id, run_key, provision.creation_claim),
                batch,
            )
            for instance_id, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, NotTried | GitHubRetryableError | Refused):
                    continue  # still awaiting: the next look tries it again, unless GitHub refused
                if outcome is None:
                    failed[instance_id] = "lost its record before its runner config was stored"
                else:
                    pending.append(instance_id)
                awaiting.remove(instance_id)
            # A registration not tried, or refused for good, goes back to the budget; one GitHub
            # rate-limited or failed was spent.
            budget.give_back(sum(1 for outcome in outcomes if isinstance(outcome, NotTried | Refused)))
            refusal = next((outcome for outcome in outcomes if isinstance(outcome, Refused)), None)
            if refusal is not None:
                refused = refusal.reason
                logger.error("GitHub refused the run's registration; nothing more is asked", reason=refused)
                break
            deferred = [outcome for outcome in outcomes if isinstance(outcome, GitHubRetryableError)]
            if deferred:
                logger.warning(
                    "runner configs not all handed over; trying again",
                    error=str(deferred[0]),
                    deferred=len(deferred),
                )
                wait = max(self._wait_for(cause, deferrals) for cause in deferred)
                deferrals += 1
                break
        if refused is not None:
            failed |= {instance_id: f"GitHub refused its runner: {refused}" for instance_id in awaiting}
            awaiting = []
        if pending:
            wait = min(wait, provision.fleet_wait_seconds)
        return creation.model_copy(
            update={
                "awaiting": tuple(awaiting),
                "pending": tuple(pending),
                "failed": failed,
                "deferrals": deferrals,
                "wait_seconds": wait,
                "validating": bool(pending or awaiting),
                "refused": refused,
            }
        )

    def _ask_for_token_ahead(self) -> None:
        """Ask GitHub for the installation token in the background while the step goes on. A fresh Lambda
        environment's first registration would ask for it first (about 200 ms, bench/aws_model.py) after
        the pool's look or the launch; a warm one holds it and asks nothing. Best effort: whatever fails
        here fails again, and is handled, where the token is needed.

        The registry is made in the background too: in a fresh environment that is a Secrets Manager
        call for the App's key, which the step need not wait for (0.1 s before CreateFleet in the
        emulator). Nothing waits for the token either: a step that found nothing to hand over (an empty
        pool) goes on at once, and one that hands over waits for the token where it needs it (the token
        cache's lock), not before."""
        try:
            ahead: Future[None] = in_background(lambda: self._registry().authenticate())
        except Exception:
            logger.debug("no installation token ahead; the first registration asks for it", exc_info=True)
        else:
            ahead.add_done_callback(_note_token_not_ahead)

    def check_fleet(self, provision: ProvisionPlan, creation: Creation) -> Creation:
        if creation.awaiting:
            creation = self._hand_over_created(provision, creation)
        ready = list(creation.ready)
        failed = dict(creation.failed)
        pending: list[str] = []
        views = self._table.observe_many(creation.pending)
        for instance_id in creation.pending:
            view = views[instance_id]
            handed_over_at = view.record.created_at if view.record else 0.0
            verdict, reason = self._readiness(
                view,
                provision=provision,
                claim_token=None,
                handed_over_at=handed_over_at,
                deadline=creation.deadline,
            )
            if verdict is Readiness.READY:
                ready.append(instance_id)
            elif verdict is Readiness.FAILED:
                failed[instance_id] = reason
            else:
                pending.append(instance_id)
        return creation.model_copy(
            update={
                "ready": tuple(ready),
                "pending": tuple(pending),
                "failed": failed,
                "validating": bool(pending or creation.awaiting),
            }
        )

    # --- post-provision and dump ---------------------------------------------------------------

    def finish(
        self,
        provision: ProvisionPlan,
        workers: Iterable[WorkerResult],
        creation: Creation,
        machine: str | None = None,
    ) -> ProvisionResult:
        """Ready instances go running; created ones that never got ready are expired and terminated.

        DESIGN.md 6.5 gives claimed instances back to the pool on a shortfall. Demand here is per job,
        and each ready instance's runner serves one job of the run, so it runs whatever the others did.
        """
        spec = provision.spec
        if self._table.run_finished(spec.run_key):
            return self._give_up(provision, workers, creation)
        workers = list(workers)
        claimed: list[tuple[str, str | None, float]] = [
            (worker.instance_id, worker.claim_token, worker.handed_over_at or provision.started_at)
            for worker in workers
            if worker.instance_id is not None and worker.claim_token is not None
        ]
        warm, lost, moved_on = self._activate(provision, claimed)
        cold, lost_cold, moved_on_cold = self._activate(
            provision, [(instance_id, None, provision.started_at) for instance_id in creation.ready]
        )
        never_ready = list(creation.failed) + list(creation.pending)
        self._expire_and_terminate(never_ready, spec.run_key)
        refused = (
            provision.refused or creation.refused or next((w.refused for w in workers if w.refused), None)
        )
        outcome = ProvisionResult(
            run_key=spec.run_key,
            requested=len(provision.slots),
            warm=warm,
            cold=cold,
            expired=tuple(never_ready),
            lost=lost + lost_cold,
            moved_on=moved_on + moved_on_cold,
            refused=refused,
        )
        if warm or cold:
            # Provision's share of a job's queue time: from the dispatcher's start to runners ready.
            seconds("ProvisionToReadySeconds", self._clock.now() - provision.started_at)
        count("WarmHits", len(warm))
        count("ColdStarts", len(cold))
        count("ProvisionShortfall", outcome.shortfall)
        if never_ready:
            logger.warning("instances never got ready", failed=creation.failed, pending=creation.pending)
        if moved_on:
            logger.warning("ready instances moved on before Finish, serving nothing", instances=moved_on)
        if refused is not None:
            # Asking again would be refused again: the jobs are left unserved, with GitHub's reason.
            count("JobsUnservedRefused", outcome.unserved)
            logger.error("jobs left unserved: GitHub refused their runners", reason=refused)
        else:
            self._redrive(provision, outcome.unserved, machine)
        return outcome

    def _activate(
        self, provision: ProvisionPlan, ready: list[tuple[str, str | None, float]]
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Set running each ready (instance, claim token, handed over at): those set running, those lost
        after serving the run, those moved on with nothing served."""
        spec = provision.spec
        running: list[str] = []
        lost: list[str] = []
        moved_on: list[str] = []
        for instance_id, token, since in ready:
            if self._table.activate(
                instance_id, spec.run_key, spec.max_runtime_minutes, claim_token=token
            ).succeeded:
                running.append(instance_id)
            elif self._served(instance_id, spec.run_key, since):
                lost.append(instance_id)
            else:
                moved_on.append(instance_id)
        return tuple(running), tuple(lost), tuple(moved_on)

    def _served(self, instance_id: str, run_key: str, since: float) -> bool:
        """Whether an instance Finish could not activate served the run: its agent says its runner
        registered for the run since the hand-over, and a release moved it on (a short job's, before
        Finish; a registered hand-over is never given back, steps/hand_over.py). One moved on with no
        runner of the run registered served nothing: its job is still to serve."""
        signal = self._table.observe(instance_id).signal
        return (
            signal is not None
            and signal.run_key == run_key
            and signal.at >= since
            and signal.signal in REGISTERED_SIGNALS
        )

    def _redrive(self, provision: ProvisionPlan, unserved: int, machine: str | None) -> None:
        """Ask again, at once, for the runners this provision could not serve (issue 13, "no job is
        ever stranded"): the dispatcher counted these jobs already and will not start them twice, and
        GitHub keeps them queued for 24 hours. A bounded number of times; then refresh's reconciliation,
        which asks GitHub which jobs still wait, is what is left."""
        if unserved <= 0:
            return
        request = provision.request
        run_key = provision.spec.run_key
        if request.redrives >= REDRIVE_LIMIT:
            count("ProvisionRedrivesExhausted", unserved)
            logger.error(
                "runners still missing after every redrive; refresh reconciles the run's queued jobs",
                run_key=run_key,
                unserved=unserved,
                redrives=request.redrives,
            )
            return
        if self._table.run_finished(run_key):
            return
        again = request.model_copy(update={"count": unserved, "redrives": request.redrives + 1})
        self._executions(machine).provision(again)
        count("ProvisionsRedriven")
        logger.warning(
            "provision ended short; asked again",
            run_key=run_key,
            unserved=unserved,
            execution=again.execution_name,
        )

    def _give_up(
        self, provision: ProvisionPlan, workers: Iterable[WorkerResult], creation: Creation
    ) -> ProvisionResult:
        """The run finished while this provision was under way (its release has begun): nothing is set
        running for it.

        An instance whose runner is noted may already have served one of the run's jobs (a short job
        ends before Finish), and its agent holds the run's config either way: a release of the run ends
        its hand-off as it ends every other (cleaned by the agent and pooled on its receipt, the runner
        deleted), whether or not the run's own release read it before this provision recorded it. The
        rest were never handed a config: expired and terminated here.
        """
        run_key = provision.spec.run_key
        held = [w.instance_id for w in workers if w.instance_id] + list(creation.launched)
        doomed = self._end_for_finished_run(provision, held)
        logger.info("run finished before its runners were ready", expired=doomed)
        return ProvisionResult(
            run_key=run_key,
            requested=len(provision.slots),
            warm=(),
            cold=(),
            expired=tuple(doomed),
        )

    def dump(self, provision: ProvisionPlan, machine: str | None = None) -> list[str]:
        """After an unhandled error: keep what can serve the run, give back what never got a runner,
        expire and terminate the rest, and ask again for the runners still missing. Returns the ids
        expired.

        Found from the records its claim tokens name and from the instances its launches tagged, not
        from the execution's data, which a failed step may not have written. An instance whose runner
        is registered for the run and healthy is set running, never terminated: it may be about to
        take one of the run's jobs (issue 13). A claimed one that was never handed a runner is clean,
        and goes back to the pool.
        """
        run_key = provision.spec.run_key
        finished = self._table.run_finished(run_key)
        records = {record.instance_id: record for record in self._table.held_by(run_key)}
        claimed = [
            record
            for record in records.values()
            if record.state is InstanceState.CLAIMED and provision.claimed_by_this(record.claim_token)
        ]
        # An instance this execution created that already runs for the run (a Finish that failed
        # half-way) serves a job: it is left to release, like every running instance.
        tagged = self._fleet().tagged_instances(LAUNCH_TAG, provision.execution)
        launched = [
            instance_id
            for instance_id in tagged
            if instance_id not in records or records[instance_id].state is InstanceState.CREATED
        ]
        kept = [i for i in tagged if i in records and records[i].state is InstanceState.RUNNING]
        doomed: list[str] = []
        for record in claimed:
            if not finished and self._keep(provision, record.instance_id, record.claim_token):
                kept.append(record.instance_id)
            elif record.runner_id is not None or not self._handing.give_back(
                record.instance_id, run_key, record.claim_token or ""
            ):
                doomed.append(record.instance_id)
        for instance_id in launched:
            if not finished and instance_id in records and self._keep(provision, instance_id, None):
                kept.append(instance_id)
            else:
                doomed.append(instance_id)
        if finished:
            held = self._end_for_finished_run(provision, doomed)
        else:
            held = list(dict.fromkeys(doomed))
            self._expire_and_terminate(held, run_key)
        logger.error("provision dumped", execution=provision.execution, instances=held, kept=kept)
        if not finished:
            self._redrive(provision, len(provision.slots) - len(set(kept)), machine)
        return held

    def _end_for_finished_run(self, provision: ProvisionPlan, instance_ids: Iterable[str]) -> list[str]:
        """What a provision holds when its run has finished: an instance whose runner is noted goes to a
        release of the run (named by this execution, so a retried step starts it once); the rest are
        expired and terminated. Returns those."""
        run_key = provision.spec.run_key
        held = list(dict.fromkeys(instance_ids))
        handed = [instance_id for instance_id in held if self._runner_noted(instance_id, run_key)]
        doomed = [instance_id for instance_id in held if instance_id not in handed]
        self._expire_and_terminate(doomed, run_key)
        if handed:
            request = ReleaseRequest(run_key=run_key, cause=f"gave-up-{provision.execution}")
            self._executions(None).release(request)
            logger.info("hand-offs of a finished run left to its release", instances=handed)
        return doomed

    def _runner_noted(self, instance_id: str, run_key: str) -> bool:
        record = self._table.get(instance_id)
        return record is not None and record.run_key == run_key and record.runner_id is not None

    def _keep(self, provision: ProvisionPlan, instance_id: str, claim_token: str | None) -> bool:
        """Set running an instance this execution holds whose runner is registered for the run and healthy."""
        view = self._table.observe(instance_id)
        record = view.record
        if record is None:
            return False
        if claim_token is None:
            handed_over_at = record.created_at
        else:
            handed_over_at = (record.threshold or 0.0) - self._timeouts.claimed_threshold_seconds
        verdict, _ = self._readiness(
            view,
            provision=provision,
            claim_token=claim_token,
            handed_over_at=handed_over_at,
            deadline=self._clock.now() + 1.0,
        )
        if verdict is not Readiness.READY:
            return False
        spec = provision.spec
        return self._table.activate(
            instance_id, spec.run_key, spec.max_runtime_minutes, claim_token=claim_token
        ).succeeded

    # --- mechanics -----------------------------------------------------------------------------

    def _readiness(
        self,
        view: InstanceView,
        *,
        provision: ProvisionPlan,
        claim_token: str | None,
        handed_over_at: float,
        deadline: float,
        starting: bool = False,
    ) -> tuple[Readiness, str]:
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

    def _hand_over_claimed(self, instance_id: str, run_key: str, token: str, attempt: int) -> float | None:
        """Hand a claimed instance its config (steps/hand_over.py); while GitHub defers it, the instance
        is back in the pool and the worker waits (_HandOverDeferred) holding nothing."""
        try:
            return self._handing.claimed(instance_id, run_key, token)
        except RegistrationDeferred as deferred:
            raise _HandOverDeferred(deferred.cause, attempt) from deferred

    def _expire_and_terminate(self, instance_ids: list[str], run_key: str) -> None:
        """Expire each record still held for the run, then terminate those (and any without a record).

        An instance whose record another run holds now is left alone: it is not ours any more.
        """
        if not instance_ids:
            return
        doomed: list[str] = []
        for instance_id in instance_ids:
            result = self._table.expire(instance_id, run_key)
            if result.succeeded or result.record is None:
                doomed.append(instance_id)
        if doomed:
            self._fleet().terminate(doomed)


def _note_token_not_ahead(ahead: Future[None]) -> None:
    if ahead.exception() is not None:
        logger.info("installation token not obtained ahead", error=repr(ahead.exception()))


def _warn_of(found: PickupResult) -> None:
    """What a pickup could not do as it meant to, said wherever one is made."""
    if found.counts.held:
        # Hidden from every request until their hold ends (pickup.HOLD_SECONDS), never lost.
        logger.warning("pool messages the queue would not release", held=found.counts.held)
    if found.counts.unlooked_partitions:
        # The by-idle index could not be read: the queue was, at the cost of a long poll if empty.
        logger.warning("idle records not looked up", partitions=found.counts.unlooked_partitions)


class _HandOverDeferred(Exception):  # noqa: N818 - an outcome carried out of the hand-over, not an error
    """GitHub rate-limited or failed a claimed instance's hand-over; the instance went back to the pool."""

    def __init__(self, cause: GitHubRetryableError, attempt: int) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.attempt = attempt
