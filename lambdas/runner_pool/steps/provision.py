"""The provision state machine's steps (infra/statemachines/provision.asl.json), each over the adapters.

Each step is safe to run again with the same input: claims carry a token that names them, creation
launches with a client token that names it, and every record change is a conditional transition
whose replay is recognised. A lost transition means someone else moved the instance: the step
lets go of it and reports, it never raises for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from runner_pool.adapters.fleet import LAUNCH_TAG
from runner_pool.adapters.state_table import InstanceView
from runner_pool.domain.executions import ProvisionRequest, runner_name
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.pickup import StopReason
from runner_pool.domain.provision import (
    ClaimWorker,
    Creation,
    ProvisionPlan,
    ProvisionResult,
    Readiness,
    WorkerResult,
    plan,
    readiness,
)
from runner_pool.domain.records import PoolMessage
from runner_pool.domain.run_keys import RunKey
from runner_pool.observability import count, logger, seconds
from runner_pool.wiring import ControlPlane

INLINE_CHECKS = 4
INLINE_CHECK_PAUSE_SECONDS = 0.25
"""A claimed instance's agent usually registers within a second. The claim step looks for that
in-line a few times before the state machine's first Wait (Step Functions waits whole seconds):
the warm path saves a second and three state transitions, for about a second of Lambda time."""
PICKUPS_PER_CLAIM = 3
"""Pickups one claim step makes when claims are lost to other workers or the queue looked empty once."""


class Provision:
    def __init__(self, plane: ControlPlane) -> None:
        self._plane = plane
        self._table = plane.state_table
        self._clock = plane.clock
        self._timeouts = plane.config.timeouts

    # --- Begin ---------------------------------------------------------------------------------

    def begin(self, request: ProvisionRequest, execution: str) -> ProvisionPlan:
        """Resolve the label (a LabelError fails the execution before anything is held)."""
        spec = request.key.resolve(self._plane.config)
        return plan(request, spec, execution, self._timeouts, self._clock.now())

    # --- claim workers -------------------------------------------------------------------------

    def claim(self, worker: ClaimWorker) -> ClaimWorker:
        """Pick up a warm candidate, claim it and hand it its runner config; or report the pool exhausted."""
        spec = worker.plan.spec
        resumed = self._own_claim(worker)
        if resumed is not None:
            return resumed
        attempt = worker.attempt
        empty_looks = 0
        for _ in range(PICKUPS_PER_CLAIM):
            found = self._plane.pickup.pickup(spec)
            if found.counts.lost:
                logger.warning("pool messages lost in pickup", lost=[m.instance_id for m in found.lost])
            if found.candidate is None:
                if found.stopped is StopReason.EMPTY and empty_looks == 0:
                    # Under load a long poll can come back empty while messages are in flight; look once more.
                    empty_looks += 1
                    continue
                break
            token = worker.plan.claim_token(worker.slot, attempt)
            attempt += 1
            claimed = self._table.claim(found.candidate.instance_id, spec.run_key, token)
            if not claimed.succeeded:
                count("ClaimRacesLost")
                continue
            self._hand_over_claimed(found.candidate, spec.run_key, token)
            return self._check_in_line(self._holding(worker, found.candidate.instance_id, token, attempt))
        count("PoolExhausted")
        return worker.model_copy(
            update={"attempt": attempt, "claimed": False, "instance_id": None, "claim_token": None}
        )

    def _check_in_line(self, worker: ClaimWorker) -> ClaimWorker:
        checked = worker
        for _ in range(INLINE_CHECKS):
            self._plane.pause(INLINE_CHECK_PAUSE_SECONDS)
            checked = self.check_claim(worker)
            if checked.readiness is not Readiness.WAITING:
                break
        return checked

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
            self._hand_over(record.instance_id, record.run_key or "", token or "")
            # The claim set the threshold; the agent may have registered since, so time runs from then.
            claimed_at = (record.threshold or 0.0) - self._timeouts.claimed_threshold_seconds
            holding = self._holding(worker, record.instance_id, token or "", attempt + 1, claimed_at)
            return self._check_in_line(holding)
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
            }
        )

    # --- creation and fleet validation ---------------------------------------------------------

    def create(self, provision: ProvisionPlan, workers: Iterable[WorkerResult]) -> Creation:
        """Launch the slots the pool could not fill; record every launched instance at once."""
        shortfall = len(provision.slots) - sum(1 for worker in workers if worker.instance_id)
        if shortfall <= 0:
            return Creation()
        spec = provision.spec
        request = LaunchRequest.for_run(spec, shortfall, idempotency_key=provision.execution)
        outcome = self._plane.fleet.launch_with_fallback(request, self._plane.config.fleet)
        for facts in outcome.launched:
            # Recorded before anything else can fail: no instance is ever left without a record.
            self._table.create(facts, spec.run_key)
        errors = {code: len(failures) for code, failures in outcome.failures_by_code().items()}
        for code, refused in errors.items():
            count(f"FleetErrors.{code}", refused)
        launched = tuple(facts.instance_id for facts in outcome.launched)
        handed_over: list[str] = []
        failed: dict[str, str] = {}
        for instance_id in launched:
            if self._hand_over(instance_id, spec.run_key, provision.creation_claim):
                handed_over.append(instance_id)
            else:
                failed[instance_id] = "lost its record before its runner config was stored"
        now = self._clock.now()
        return Creation(
            requested=shortfall,
            launched=launched,
            pending=tuple(handed_over),
            failed=failed,
            launch_errors=errors,
            deadline=now + self._timeouts.fleet_validation_seconds,
            wait_seconds=provision.fleet_wait_seconds,
            validating=bool(handed_over),
        )

    def check_fleet(self, provision: ProvisionPlan, creation: Creation) -> Creation:
        ready = list(creation.ready)
        failed = dict(creation.failed)
        pending: list[str] = []
        for instance_id in creation.pending:
            view = self._table.observe(instance_id)
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
                "validating": bool(pending),
            }
        )

    # --- post-provision and dump ---------------------------------------------------------------

    def finish(
        self, provision: ProvisionPlan, workers: Iterable[WorkerResult], creation: Creation
    ) -> ProvisionResult:
        """Ready instances go running; created ones that never got ready are expired and terminated.

        DESIGN.md 6.5 gives claimed instances back to the pool on a shortfall. Demand here is per job,
        and each ready instance's runner serves one job of the run, so it runs whatever the others did.
        """
        spec = provision.spec
        if self._table.run_finished(spec.run_key):
            return self._give_up(provision, workers, creation)
        warm: list[str] = []
        cold: list[str] = []
        lost: list[str] = []
        for worker in workers:
            if worker.instance_id is None or worker.claim_token is None:
                continue
            result = self._table.activate(
                worker.instance_id, spec.run_key, spec.max_runtime_minutes, claim_token=worker.claim_token
            )
            (warm if result.succeeded else lost).append(worker.instance_id)
        for instance_id in creation.ready:
            result = self._table.activate(instance_id, spec.run_key, spec.max_runtime_minutes)
            (cold if result.succeeded else lost).append(instance_id)
        never_ready = list(creation.failed) + list(creation.pending)
        self._expire_and_terminate(never_ready, spec.run_key)
        outcome = ProvisionResult(
            run_key=spec.run_key,
            requested=len(provision.slots),
            warm=tuple(warm),
            cold=tuple(cold),
            expired=tuple(never_ready),
            lost=tuple(lost),
        )
        if warm or cold:
            # Provision's share of a job's queue time: from the dispatcher's start to runners ready.
            seconds("ProvisionToReadySeconds", self._clock.now() - provision.started_at)
        count("WarmHits", len(warm))
        count("ColdStarts", len(cold))
        count("ProvisionShortfall", outcome.shortfall)
        if never_ready:
            logger.warning("instances never got ready", failed=creation.failed, pending=creation.pending)
        return outcome

    def _give_up(
        self, provision: ProvisionPlan, workers: Iterable[WorkerResult], creation: Creation
    ) -> ProvisionResult:
        """The run finished while this provision was under way (its release has begun): nothing is set
        running for it. Everything held is expired and terminated: its agent has already been handed
        the run's config, and release, which cleans an instance for reuse, no longer looks for it."""
        held = [w.instance_id for w in workers if w.instance_id] + list(creation.launched)
        self._expire_and_terminate(held, provision.spec.run_key)
        logger.info("run finished before its runners were ready", instances=held)
        return ProvisionResult(
            run_key=provision.spec.run_key,
            requested=len(provision.slots),
            warm=(),
            cold=(),
            expired=tuple(held),
        )

    def dump(self, provision: ProvisionPlan) -> list[str]:
        """Expire and terminate everything this execution claimed or created; returns their ids.

        Found from the records its claim tokens name and from the instances its launches tagged, not
        from the execution's data, which a failed step may not have written.
        """
        run_key = provision.spec.run_key
        records = {record.instance_id: record for record in self._table.held_by(run_key)}
        claimed = [
            record.instance_id
            for record in records.values()
            if record.state is InstanceState.CLAIMED and provision.claimed_by_this(record.claim_token)
        ]
        # An instance this execution created that already runs for the run (a Finish that failed
        # half-way) serves a job: it is left to release, like every running instance.
        launched = [
            instance_id
            for instance_id in self._plane.fleet.tagged_instances(LAUNCH_TAG, provision.execution)
            if instance_id not in records or records[instance_id].state is InstanceState.CREATED
        ]
        held = list(dict.fromkeys(claimed + launched))
        self._expire_and_terminate(held, run_key)
        logger.error("provision dumped", execution=provision.execution, instances=held)
        return held

    # --- mechanics -----------------------------------------------------------------------------

    def _readiness(
        self,
        view: InstanceView,
        *,
        provision: ProvisionPlan,
        claim_token: str | None,
        handed_over_at: float,
        deadline: float,
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
        )

    def _hand_over_claimed(self, candidate: PoolMessage, run_key: str, token: str) -> None:
        """Hand a claimed instance its config; if that fails, give the instance back before raising."""
        try:
            self._hand_over(candidate.instance_id, run_key, token)
        except Exception:
            returned = self._table.unclaim(candidate.instance_id, run_key, token)
            if returned.succeeded and returned.record is not None:
                self._plane.pool_queues.offer(PoolMessage.for_idle(returned.record))
            else:
                self._table.expire(candidate.instance_id, run_key)
            raise

    def _hand_over(self, instance_id: str, run_key: str, claim: str) -> bool:
        """DESIGN.md 5: register a JIT runner for the run and store its config for this instance only.

        The runner's id is noted last, so a retry that finds it noted knows the hand-off is complete.
        Returns False if the record is no longer held for the run (nothing is handed over then).
        """
        record = self._table.get(instance_id)
        if record is None or record.run_key != run_key:
            return False
        if record.runner_id is not None:
            return True
        github = self._plane.config.github
        # Every label the job asked for: GitHub gives a job only to a runner carrying all of them.
        labels = list(RunKey.parse(run_key).runner_labels)
        runner = self._plane.github.jit_config(
            runner_name(instance_id, claim), labels, runner_group_id=github.runner_group_id
        )
        self._plane.credentials.store(
            instance_id, self._plane.instance_arn(instance_id), run_key, runner.encoded_jit_config
        )
        return self._table.record_runner(instance_id, run_key, runner.runner_id).succeeded

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
            self._plane.fleet.terminate(doomed)
