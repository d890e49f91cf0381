"""The provision's claim workers (its Map): each finds a warm instance for one slot, hot or stopped,
claims it, hands it its runner (steps/hand_over.py) and waits for it to be ready; or leaves the slot
to creation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from runner_pool.domain import stopped_tier
from runner_pool.domain.class_history import Fact
from runner_pool.domain.fleet import Ec2State, Start
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import (
    PICKUP_BUDGET_SECONDS,
    PickupResult,
    StopReason,
)
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.provision import ClaimWorker, ProvisionPlan, Readiness
from runner_pool.domain.records import InstanceView, PoolMessage, TransitionResult
from runner_pool.domain.runners import GitHubRetryableError
from runner_pool.observability import count, logger
from runner_pool.steps.hand_over import RegistrationDeferred, RegistrationRefused, github_wait
from runner_pool.steps.provision_parts import ProvisionPart

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
in a row (Sandbox.Timedout) failed the Map and the execution, with its jobs left to a redrive (a burst
of 1,000 jobs under load did)."""


class ClaimWorkers(ProvisionPart):
    """The Claim, CheckClaim and Discard steps, over the provision's collaborators; each stopped instance's
    time from start to ready is noted in its class's history, for adaptive sizing."""

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
        plan = worker.plan
        pristine_only = plan.single_use and not self._config.keeps_pristine(plan.spec.resource_class)
        if pristine_only or (exhausted and self._config.pool.stopped_maximum == 0):
            # Single use where the class keeps no pristine minimum (Begin's rule), or Begin's pickup looked
            # for this slot already: creation it is.
            return worker.holding_nothing()
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
        return worker.holding_nothing(reason=reason, refused=reason)

    def _claim_one(self, worker: ClaimWorker, *, hot: bool = True) -> ClaimWorker:
        spec = worker.plan.spec
        attempt = worker.attempt
        empty_looks = 0
        for _ in range(PICKUPS_PER_CLAIM if hot else 0):
            if self._time_left() < PICKUP_BUDGET_SECONDS + CLAIM_RESERVE_SECONDS:
                self._budget().give_back(1)
                return self._out_of_time(worker.model_copy(update={"attempt": attempt}))
            found = self._pickup().pickup(spec, worker.plan.taker)
            warn_of(found)
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
            terms = provision.claim_terms(self._config.reuse)
            return self._table.claim(offer.instance_id, run_key, token, terms)
        except Exception:
            self._queues().offer(offer)
            raise

    def _nothing_claimed(self, worker: ClaimWorker, attempt: int) -> ClaimWorker:
        """No instance, hot or stopped: the registration goes back and the slot to creation."""
        self._budget().give_back(1)
        return worker.holding_nothing(attempt=attempt)

    def _start_stopped(self, worker: ClaimWorker, attempt: int) -> ClaimWorker | None:
        """The stopped tier, once the hot pool had nothing: claim a stopped instance that
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
        taker = worker.plan.taker
        now = self._clock.now()
        for partition in PoolPartition.admitting(spec):
            for record in stopped_tier.in_order_of_use(self._table.stopped(partition, now)):
                if not stopped_tier.fits(record, spec, now, taker, self._config):
                    continue
                token = worker.plan.claim_token(worker.slot, attempt)
                attempt += 1
                claimed = self._table.claim(
                    record.instance_id,
                    spec.run_key,
                    token,
                    worker.plan.claim_terms(self._config.reuse, stopped=True),
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
                    self._held.expire_and_terminate([record.instance_id], spec.run_key)
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
        wait = budget_wait if cause is None else github_wait(cause, worker.deferrals, self._budget())
        reason = reason if cause is None else str(cause)
        if self._clock.now() + wait > worker.plan.registration_deadline:
            count("RegistrationsGivenUp")
            logger.warning("no runner registered in time; the slot is left to creation", reason=reason)
            return worker.holding_nothing()
        count("RegistrationsDeferred")
        return worker.holding_nothing(
            readiness=Readiness.DEFERRED, reason=reason, wait_seconds=wait, deferrals=worker.deferrals + 1
        )

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
        verdict, reason = self._held.readiness(
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
        view = self._table.observe(worker.instance_id)
        verdict, reason = self._held.readiness(
            view,
            provision=worker.plan,
            claim_token=worker.claim_token,
            handed_over_at=worker.handed_over_at,
            deadline=worker.deadline,
            starting=worker.starting,
        )
        if verdict is Readiness.READY:
            self._note_ready(worker, view)
        return worker.model_copy(
            update={"readiness": verdict, "reason": reason, "wait_seconds": worker.plan.claim_wait_seconds}
        )

    def _note_ready(self, worker: ClaimWorker, view: InstanceView) -> None:
        """For adaptive sizing: a reused instance's serving, and a started one's start -> ready (started just
        before its hand-over, so as the job waited for it)."""
        record, signal = view.record, view.signal
        if self._history is None or record is None or worker.instance_id is None:
            return
        self._history.reused(record.resource_class, worker.instance_id, record.jobs_served)
        if worker.starting and signal is not None and worker.handed_over_at is not None:
            self._history.boot(
                Fact.START, record.resource_class, worker.instance_id, signal.at - worker.handed_over_at
            )

    def discard(self, worker: ClaimWorker) -> ClaimWorker:
        """The candidate failed a check: expire it (if still ours) and terminate it; one candidate fewer."""
        if worker.instance_id is not None:
            logger.info("discarding candidate", instance_id=worker.instance_id, reason=worker.reason)
            self._held.expire_and_terminate([worker.instance_id], worker.plan.spec.run_key)
        return worker.holding_nothing(candidates_left=worker.remaining - 1)

    def _hand_over_claimed(self, instance_id: str, run_key: str, token: str, attempt: int) -> float | None:
        """Hand a claimed instance its config (steps/hand_over.py); while GitHub defers it, the instance
        is back in the pool and the worker waits (_HandOverDeferred) holding nothing."""
        try:
            return self._handing.claimed(instance_id, run_key, token)
        except RegistrationDeferred as deferred:
            raise _HandOverDeferred(deferred.cause, attempt) from deferred


def warn_of(found: PickupResult) -> None:
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
