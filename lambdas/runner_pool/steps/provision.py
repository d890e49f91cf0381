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

from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.recent_demand import RecentDemand
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.spot_breaker import DynamoDbSpotBreaker
from runner_pool.domain.capacity_waits import shortfall_reason
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import ExecutionStarter
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.labels import RunnerSpec
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import (
    ClaimTerms,
    PickupManager,
    PoolQueue,
)
from runner_pool.domain.ports import ProvisionFleet, ProvisionRecords
from runner_pool.domain.provision import (
    ClaimWorker,
    Creation,
    ProvisionPlan,
    ProvisionResult,
    WorkerResult,
    busy_seconds,
    plan,
)
from runner_pool.domain.records import PoolMessage, UsageClass
from runner_pool.domain.registration_budget import RegistrationBudget
from runner_pool.domain.runners import GitHubRateLimitedError, RunnerRegistry
from runner_pool.domain.spot_breaker import usage_for
from runner_pool.observability import count, logger, seconds
from runner_pool.steps.capacity_waits import CapacityWaitSteps
from runner_pool.steps.claim_workers import ClaimWorkers, warn_of
from runner_pool.steps.class_history import HistoryNotes
from runner_pool.steps.creation import FleetCreation
from runner_pool.steps.hand_over import (
    HandOver,
    Refused,
)
from runner_pool.steps.hand_over import Outcome as HandOverOutcome
from runner_pool.steps.held_instances import HeldInstances
from runner_pool.steps.leftovers import Leftovers
from runner_pool.steps.notices import NoticeSource, no_notices
from runner_pool.steps.provision_parts import ProvisionPart, ProvisionParts


class Provision(ProvisionPart):
    """The table is built with the steps; every other adapter is built on first use, so a step's Lambda
    creates only the clients that step calls, and reads the App's key only when it reaches GitHub. Begin
    and Finish are here; the claim workers, creation and the leftovers are parts of their own."""

    def __init__(
        self,
        table: ProvisionRecords,
        *,
        clock: Clock,
        config: StackConfig,
        arns: InstanceArns,
        pickup: Callable[[], PickupManager],
        queues: Callable[[], PoolQueue],
        fleet: Callable[[], ProvisionFleet],
        budget: Callable[[], RegistrationBudget],
        registry: Callable[[], RunnerRegistry],
        credentials: Callable[[], RunnerCredentials],
        recent_demand: Callable[[], RecentDemand],
        executions: Callable[[str | None], ExecutionStarter],
        notices: NoticeSource = no_notices,
        pause: Callable[[float], None] = time.sleep,
        time_left: Callable[[], float] | None = None,
        spot_breaker: Callable[[], DynamoDbSpotBreaker] | None = None,
        capacity_waits: CapacityWaitSteps | None = None,
        history: HistoryNotes | None = None,
    ) -> None:
        """`spot_breaker`: which classes' spot demand is served on-demand for now (None: none).
        `capacity_waits`: how a provision EC2 left short has its jobs wait for capacity (None: it asks again
        at once, as for any shortfall). `time_left`: the seconds the step's Lambda has left (the
        invocation's context; None: no limit). The rest is ProvisionParts'."""
        self._recent_demand = recent_demand
        self._spot_breaker = spot_breaker
        self._capacity_waits = capacity_waits
        handing = HandOver(
            table,
            github=config.github,
            arns=arns,
            registry=registry,
            credentials=credentials,
            queues=queues,
            notices=notices,
        )
        parts = ProvisionParts(
            table=table,
            clock=clock,
            config=config,
            pickup=pickup,
            queues=queues,
            fleet=fleet,
            budget=budget,
            executions=executions,
            handing=handing,
            held=HeldInstances(table, fleet, clock=clock, timeouts=config.timeouts),
            notices=notices,
            pause=pause,
            time_left=time_left or (lambda: math.inf),
            history=history,
        )
        super().__init__(parts)
        self._claims = ClaimWorkers(parts)
        self._creation = FleetCreation(parts)
        self._leftovers = Leftovers(parts)

    # --- Begin ---------------------------------------------------------------------------------

    def begin(self, request: ProvisionRequest, execution: str) -> ProvisionPlan:
        """Resolve the label (a LabelError fails the execution before anything is held), and note the run's
        demand for refresh's reconciliation."""
        config = self._config
        spec = request.key.resolve(config)
        if request.on_demand:
            spec = spec.model_copy(update={"usage": UsageClass.ON_DEMAND})
        spec = self._usage(spec)
        planned = plan(request, spec, execution, self._timeouts, self._clock.now(), reuse=config.reuse)
        self._tell_recent_demand(
            planned,
            lambda recent, repository, run_id, attempt: recent.note(
                repository,
                run_id,
                attempt,
                spec.run_key,
                busy_seconds(self._timeouts),
                single_use=request.public,
                repository_id=request.repository_id,
                trust=request.trust,
                on_demand=request.on_demand,
                at=planned.started_at,
            ),
            "run's demand not noted; refresh will not reconcile it",
        )
        if planned.single_use and not config.keeps_pristine(spec.resource_class):
            # Single-use jobs take pristine instances only, and a class that keeps no pristine minimum
            # has few: a look at its pool would mostly read used offers and wait out a long poll on the
            # emptied queue, to launch anyway. Creation it is, as fast as a cold request can be.
            return planned.model_copy(update={"creation_only": True})
        try:
            return self._pick_up(planned)
        finally:
            self._handing.settle()  # nothing of this step left running once it returns

    def _usage(self, spec: RunnerSpec) -> RunnerSpec:
        """The spec with the usage it is served on: on-demand while its class's spot breaker is open
        (domain/spot_breaker.py). Pickup and creation both follow it; the runner keeps the job's labels."""
        if self._spot_breaker is None or spec.usage is not UsageClass.SPOT:
            return spec
        open_until = self._spot_breaker().open_until(spec.resource_class)
        usage = usage_for(spec.usage, open_until, self._clock.now())
        if usage is spec.usage:
            return spec
        count("SpotServedOnDemand")
        logger.info(
            "spot circuit breaker open: served on-demand",
            resource_class=spec.resource_class,
            until=open_until,
        )
        return spec.model_copy(update={"usage": usage})

    def _pick_up(self, provision: ProvisionPlan) -> ProvisionPlan:
        """One pickup for every slot, before the claim workers start, each instance it
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
            self._handing.authenticate_ahead()  # while the pool is read: in hand for the hand-overs
            found = self._pickup().pickup(provision.spec, provision.taker, wanted=grant.granted)
            warn_of(found)
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
                    ClaimTerms(
                        repository=provision.request.repository,
                        repository_id=provision.request.repository_id,
                        reuse=self._config.reuse,
                        single_use=provision.single_use,
                        trust=provision.request.trust,
                    ),
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
        of 40 workers at a time no longer holds the 41st slot's hand-over until a worker ends. Each slot's
        worker then finds its hand-over done (`_hand_over` recognises it) and only checks readiness.

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

    # --- the claim workers, Create and CheckFleet ------------------------------------------------

    def claim(self, worker: ClaimWorker) -> ClaimWorker:
        return self._claims.claim(worker)

    def check_claim(self, worker: ClaimWorker) -> ClaimWorker:
        return self._claims.check_claim(worker)

    def discard(self, worker: ClaimWorker) -> ClaimWorker:
        return self._claims.discard(worker)

    def create(self, provision: ProvisionPlan, workers: Iterable[WorkerResult]) -> Creation:
        try:
            return self._creation.create(provision, workers)
        finally:
            self._handing.settle()  # nothing of this step left running once it returns

    def check_fleet(self, provision: ProvisionPlan, creation: Creation) -> Creation:
        return self._creation.check_fleet(provision, creation)

    # --- Finish and Dump ---------------------------------------------------------------------------

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
        workers = list(workers)
        if self._table.run_finished(spec.run_key):
            if self._capacity_waits is not None:
                # A short job can run and its run finish before Finish: capacity came, if anything held.
                held = creation.launched or any(worker.instance_id for worker in workers)
                self._capacity_waits.run_finished(
                    provision.request.repository, spec.run_key, served=bool(held)
                )
            return self._leftovers.give_up(provision, workers, creation)
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
        expired = self._held.expire_and_terminate(never_ready, spec.run_key)
        # Never ready and no longer ours to expire: a release moved it on first (a late runner's short job).
        lost_late, moved_on_late = self.moved_on(
            spec.run_key, [(i, provision.started_at) for i in never_ready if i not in expired]
        )
        refused = (
            provision.refused or creation.refused or next((w.refused for w in workers if w.refused), None)
        )
        outcome = ProvisionResult(
            run_key=spec.run_key,
            requested=len(provision.slots),
            warm=warm,
            cold=cold,
            expired=tuple(expired),
            lost=lost + lost_cold + lost_late,
            moved_on=moved_on + moved_on_cold + moved_on_late,
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
        short_of_capacity = shortfall_reason(
            creation.requested, len(creation.launched), creation.launch_errors
        )
        if refused is not None:
            # Asking again would be refused again: the jobs are left unserved, with GitHub's reason.
            count("JobsUnservedRefused", outcome.unserved)
            logger.error("jobs left unserved: GitHub refused their runners", reason=refused)
            self._note_refusal(provision, refused)
        elif outcome.unserved > 0 and short_of_capacity is not None and self._capacity_waits is not None:
            self._capacity_waits.wait(provision, outcome.unserved, short_of_capacity)
            self._note_ended_short(provision)
        else:
            self._leftovers.redrive(provision, outcome.unserved, machine)
        if outcome.unserved == 0 and self._capacity_waits is not None:
            self._capacity_waits.served(provision.request.repository, spec.run_key)
        return outcome

    def _note_ended_short(self, provision: ProvisionPlan) -> None:
        """So that refresh's reconciliation asks again when the capacity wait's back-off has passed, not
        when this provision's busy time would have (steps/reconcile.py)."""
        self._tell_recent_demand(
            provision,
            lambda recent, repository, run_id, attempt: recent.provision_ended(
                repository, run_id, attempt, provision.started_at
            ),
            "run's provision not noted ended; refresh asks again after its busy time",
        )

    def _note_refusal(self, provision: ProvisionPlan, reason: str) -> None:
        """So that refresh's reconciliation does not ask again every minute (steps/reconcile.py)."""
        self._tell_recent_demand(
            provision,
            lambda recent, repository, run_id, attempt: recent.refused(repository, run_id, attempt, reason),
            "run's refusal not noted; refresh may ask GitHub again before its back-off",
        )

    def _tell_recent_demand(
        self,
        provision: ProvisionPlan,
        tell: Callable[[RecentDemand, str, int, int], None],
        unnoted: str,
    ) -> None:
        """Tell refresh's reconciliation (the recent demand of the provision's run: its repository, run id
        and attempt) what became of the provision. Only a run's own label has a run id to reconcile by, and
        a backstop's bookkeeping never holds up or fails a provision: a failure is logged as `unnoted`."""
        if not provision.spec.run_id.isdigit():
            return
        try:
            tell(
                self._recent_demand(),
                provision.request.repository,
                int(provision.spec.run_id),
                provision.request.key.attempt,
            )
        except Exception:
            logger.exception(unnoted)

    def _activate(
        self, provision: ProvisionPlan, ready: list[tuple[str, str | None, float]]
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """Set running each ready (instance, claim token, handed over at): those set running, those lost
        after serving the run, those moved on with nothing served."""
        spec = provision.spec
        running: list[str] = []
        gone: list[tuple[str, float]] = []
        for instance_id, token, since in ready:
            if self._table.activate(
                instance_id, spec.run_key, spec.max_runtime_minutes, claim_token=token
            ).succeeded:
                running.append(instance_id)
            else:
                gone.append((instance_id, since))
        lost, moved_on = self.moved_on(spec.run_key, gone)
        return tuple(running), lost, moved_on

    def dump(self, provision: ProvisionPlan, machine: str | None = None) -> list[str]:
        return self._leftovers.dump(provision, machine)
