"""The provision's Create and CheckFleet steps: launch what the pool could not give, record each instance at
once, hand each its runner as the registration budget allows, and watch them get ready."""

from __future__ import annotations

from collections.abc import Iterable

from runner_pool.domain.class_history import Fact
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.provision import (
    Creation,
    ProvisionPlan,
    Readiness,
    WorkerResult,
)
from runner_pool.domain.registration_budget import REGISTRATION_FLOOR
from runner_pool.domain.runners import GitHubRetryableError
from runner_pool.observability import count, logger
from runner_pool.steps.hand_over import NotTried, Refused, github_wait
from runner_pool.steps.notices import open_queues
from runner_pool.steps.provision_parts import ProvisionPart


class FleetCreation(ProvisionPart):
    """Create and CheckFleet, over the provision's collaborators; each launch's time to ready is noted in
    its class's history, for adaptive sizing."""

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
        launches = self._registrable(shortfall)
        if launches == 0:
            # GitHub's hour is spent: an instance launched now would wait for a runner nobody may
            # register before its validation ends. The jobs stay queued for a later provision.
            return Creation(requested=shortfall)
        spec = provision.spec
        request = LaunchRequest.for_run(spec, launches, idempotency_key=provision.execution)
        fleet = self._fleet()
        self._handing.authenticate_ahead()  # while EC2 launches: in hand for the hand-overs
        outcome = fleet.launch_with_fallback(request, self._config.fleet)
        for facts in outcome.launched:
            # Recorded before anything else can fail: no instance is ever left without a record.
            self._table.create(
                facts,
                spec.run_key,
                repository=provision.holder_repository,
                repository_id=provision.request.repository_id if provision.holder_repository else None,
                single_use=provision.single_use,
                trust=provision.request.trust,
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

    def _registrable(self, shortfall: int) -> int:
        """How many of `shortfall` GitHub's hourly remainder can register (domain/registration_budget.py);
        no more are launched."""
        hourly = self._budget().hourly()
        if hourly is None:
            return shortfall
        room = min(shortfall, hourly.left_above(REGISTRATION_FLOOR, self._clock.now()))
        if room < shortfall:
            count("LaunchesCappedByGitHubHour", shortfall - room)
            logger.warning(
                "GitHub's hourly limit is nearly spent; launching only what it can register",
                shortfall=shortfall,
                launching=room,
                remaining=hourly.remaining,
                reset_at=hourly.reset_at,
            )
        return room

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
                wait = max(github_wait(cause, deferrals, budget) for cause in deferred)
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
            verdict, reason = self._held.readiness(
                view,
                provision=provision,
                claim_token=None,
                handed_over_at=handed_over_at,
                deadline=creation.deadline,
            )
            if verdict is Readiness.READY:
                ready.append(instance_id)
                if self._history is not None and view.record is not None and view.signal is not None:
                    # Launch -> ready as a job's launch waits for it: recorded at launch, registered.
                    self._history.boot(
                        Fact.LAUNCH, view.record.resource_class, instance_id, view.signal.at - handed_over_at
                    )
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
