"""What a provision holds that it cannot use: Dump after an unhandled error, Finish when the run finished
first, and the runners still missing asked for again (DESIGN.md 6.5)."""

from __future__ import annotations

from collections.abc import Iterable

from runner_pool.domain.executions import ReleaseRequest
from runner_pool.domain.fleet import LAUNCH_TAG
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.provision import (
    REDRIVE_LIMIT,
    Creation,
    ProvisionPlan,
    ProvisionResult,
    Readiness,
    WorkerResult,
)
from runner_pool.observability import count, logger
from runner_pool.steps.provision_parts import ProvisionPart


class Leftovers(ProvisionPart):
    """Keeps what can serve the run, gives back what never got a runner, expires and terminates the rest."""

    def redrive(self, provision: ProvisionPlan, unserved: int, machine: str | None) -> None:
        """Ask again, at once, for the runners this provision could not serve, so that no job is
        ever stranded: the dispatcher counted these jobs already and will not start them twice, and
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

    def give_up(
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
        take one of the run's jobs. A claimed one that was never handed a runner is clean,
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
            self._held.expire_and_terminate(held, run_key)
        logger.error("provision dumped", execution=provision.execution, instances=held, kept=kept)
        if not finished:
            self.redrive(provision, len(provision.slots) - len(set(kept)), machine)
        return held

    def _end_for_finished_run(self, provision: ProvisionPlan, instance_ids: Iterable[str]) -> list[str]:
        """What a provision holds when its run has finished: an instance whose runner is noted goes to a
        release of the run (named by this execution, so a retried step starts it once); the rest are
        expired and terminated. Returns those."""
        run_key = provision.spec.run_key
        held = list(dict.fromkeys(instance_ids))
        handed = [instance_id for instance_id in held if self._runner_noted(instance_id, run_key)]
        doomed = [instance_id for instance_id in held if instance_id not in handed]
        self._held.expire_and_terminate(doomed, run_key)
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
        verdict, _ = self._held.readiness(
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
