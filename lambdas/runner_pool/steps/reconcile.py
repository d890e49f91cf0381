"""Refresh's jobs that read GitHub on behalf of runs with recent demand (DESIGN.md section 8).

Three jobs of steps.refresh, kept apart from the jobs over EC2 and the state table: our offline runners
deleted (6), runners that died before their job replaced (8), and queued jobs no runner of ours serves
provisioned again (9). Jobs 6 and 9 take their share of GitHub's hourly limit: they stop reading
while the hour's remainder is below REFRESH_FLOOR, which is kept for registrations. Each stops between
two of its GitHub reads once the run's time is short, and the next run goes on (domain/refresh.py
`JOB_RESERVE_SECONDS`). A run whose registration GitHub refused for
good is not provisioned again until `REFUSAL_BACKOFF_SECONDS` have passed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import ExecutionStarter
from runner_pool.domain.executions import (
    PROVISION_LIMIT,
    ProvisionRequest,
    ReleaseRequest,
    instance_of_runner,
)
from runner_pool.domain.instant import waited_offline
from runner_pool.domain.lifecycle import InstanceState
from runner_pool.domain.ports import ReconcileRecords
from runner_pool.domain.provision import busy_seconds
from runner_pool.domain.records import Signal
from runner_pool.domain.refresh import (
    JOB_RESERVE_SECONDS,
    RECENT_DEMAND_SECONDS,
    RECONCILE_GRACE_SECONDS,
    RECONCILE_REQUESTS_PER_RUN,
    RUNNERS_MARKER,
    RecentRun,
    RecentRuns,
    RefreshReport,
    in_turn,
    may_still_start,
    refusal_stands,
)
from runner_pool.domain.registration_budget import REFRESH_FLOOR, RegistrationBudget
from runner_pool.domain.runner_scope import OrganizationScope, Registration
from runner_pool.domain.runners import RunJob, RunnerRegistry, RunnerRemoval, RunnerStatus
from runner_pool.observability import logger
from runner_pool.steps.capacity_waits import CapacityWaitSteps

TimeLeft = Callable[[], float]
"""Seconds the run has left before its Lambda's timeout."""


class RunReconciliation:
    def __init__(
        self,
        table: ReconcileRecords,
        registry: Callable[[], RunnerRegistry],
        *,
        clock: Clock,
        config: StackConfig,
        recent_demand: RecentRuns | None,
        executions: Callable[[], ExecutionStarter] | None,
        time_left: TimeLeft,
        budget: Callable[[], RegistrationBudget] | None = None,
        capacity_waits: CapacityWaitSteps | None = None,
    ) -> None:
        """Without `recent_demand` and `executions` (both needed), jobs 8 and 9 do nothing. With `budget`,
        jobs 6 and 9 read GitHub only while its hourly remainder is above refresh's floor. With
        `capacity_waits`, job 9 leaves a run key that waits for capacity alone until its next try."""
        self._table = table
        self._registry = registry
        self._clock = clock
        self._config = config
        self._recent = recent_demand
        self._executions = executions
        self._time_left = time_left
        self._budget = budget
        self._capacity_waits = capacity_waits

    def _out_of_time(self, report: RefreshReport, job: str) -> bool:
        """Whether the job stops here, its rest left to the next run (and noted as cut short)."""
        if self._time_left() >= JOB_RESERVE_SECONDS:
            return False
        if job not in report.cut_short:
            report.cut_short.append(job)
        return True

    def _hour_share(self, report: RefreshReport, job: str) -> float:
        """GitHub requests the job may make before it leaves the hour's remainder to registrations
        (domain/registration_budget.py REFRESH_FLOOR); noted in the report when there are none."""
        hourly = None if self._budget is None else self._budget().hourly()
        if hourly is None:
            return math.inf
        share = hourly.left_above(REFRESH_FLOOR, self._clock.now())
        if share < 1:
            report.hour_short.append(job)
        return share

    # --- 6. GitHub's offline runners -----------------------------------------------------------

    def delete_offline_runners(self, report: RefreshReport) -> None:
        github = self._registry()
        now = self._clock.now()
        places = self._runner_places()
        # A large organisation's repositories may not all fit in one run's time: each run begins where the
        # last one stopped (RUNNERS_MARKER), so every repository's list is read within a few runs.
        seen = self._table.read_marker(RUNNERS_MARKER)
        start = int(seen or 0) % max(1, len(places))
        hour_left = self._hour_share(report, "runners")
        for done, repository in enumerate(in_turn(places, start)):
            if self._out_of_time(report, "runners") or hour_left < 1:
                self._table.move_marker(RUNNERS_MARKER, (start + done) % len(places), expected=seen)
                return
            hour_left -= 1  # a page of runners; a deletion is rare
            for runner in github.runners(repository):
                instance_id = instance_of_runner(runner.name)
                if runner.status is not RunnerStatus.OFFLINE or instance_id is None:
                    continue
                record = self._table.get(instance_id)
                if waited_offline(record, runner, now) and record is not None:
                    # Ended, for the instant tier to launch its replacement (refresh job 5b).
                    logger.warning(
                        "instant runner went offline while it waited; its instance is ended",
                        instance_id=instance_id,
                        runner_id=runner.runner_id,
                    )
                    if self._table.expire(instance_id, run_key=record.run_key).succeeded:
                        report.runners_replaced += 1
                elif may_still_start(record, runner, now):
                    continue
                if github.delete_runner(runner.runner_id, repository) is RunnerRemoval.DELETED:
                    report.runners_deleted += 1

    def _runner_places(self) -> Sequence[str | None]:
        """Where our runners are registered: the App's repository (None), or, for an organisation,
        each repository with recent demand (runners are registered at the job's repository, and an
        organisation's list does not hold its repositories' runners). Registered in runner groups (an
        organisation's default), every runner is the organisation's, so its one list holds them all."""
        github = self._config.github
        if (
            not isinstance(github.scope, OrganizationScope)
            or github.effective_registration is Registration.RUNNER_GROUP
        ):
            return [None]
        if self._recent is None:
            return []
        return sorted({run.repository for run in self._recent.runs()})

    # --- 8. runners that died before their job --------------------------------------------------

    def replace_dead_runners(self, report: RefreshReport) -> None:
        if self._recent is None or self._executions is None:
            return
        now = self._clock.now()
        running = [
            record
            for record in self._table.live()
            if record.state is InstanceState.RUNNING and record.run_key and not record.threshold_passed(now)
        ]
        if not running:
            return
        repositories = {key: run for run in self._recent.runs() for key in run.run_keys}
        executions = self._executions()
        for record in running:
            run_key = record.run_key or ""
            signal = self._table.read_signal(record.instance_id)
            if signal is None or not signal.confirms(Signal.UD_REG_FAILED, run_key):
                continue
            logger.warning(
                "runner exited before it took a job; releasing its instance and asking for another",
                instance_id=record.instance_id,
                runner_id=record.runner_id,
                reason=signal.reason,
            )
            # Named by the runner that died: a second refresh (or a retried one) starts nothing twice.
            cause = f"runner-{record.runner_id}-exited"
            executions.release(
                ReleaseRequest(
                    run_key=run_key,
                    instance_id=record.instance_id,
                    cause=cause,
                    runner_id=record.runner_id,
                )
            )
            run = repositories.get(run_key)
            if run is not None:
                executions.provision(
                    ProvisionRequest(
                        repository=run.repository,
                        run_key=run_key,
                        count=1,
                        origin=f"replace-{record.runner_id}",
                        public=run.single_use,
                        repository_id=run.repository_id,
                        trust=run.trust_of(run_key),
                        on_demand=run_key in run.on_demand_keys,
                    )
                )
            report.runners_replaced += 1

    # --- 9. queued jobs nobody serves -------------------------------------------------------------

    def reconcile(self, report: RefreshReport, tick: int) -> None:
        if self._recent is None or self._executions is None:
            return
        now = self._clock.now()
        requests_left = min(RECONCILE_REQUESTS_PER_RUN, self._hour_share(report, "reconcile"))
        for run in self._recent.runs():
            if self._out_of_time(report, "reconcile"):
                return  # the rest first next time: they are the least recently reconciled
            if now - run.demand_at > RECENT_DEMAND_SECONDS or all(
                self._table.run_finished(run_key) for run_key in run.run_keys
            ):
                if self._waits_ended(run, now):
                    continue
                self._recent.forget(run)
                continue
            if now < run.busy_until:
                continue  # a provision for it may still be claiming or creating
            if run.refused_at is not None and refusal_stands(run.refused_at, now):
                # Asked again, GitHub would refuse again: the jobs stay unserved, with GitHub's reason.
                logger.warning(
                    "run's registration refused by GitHub; not provisioned again until the back-off passes",
                    run=run.key,
                    reason=run.refused_reason,
                )
                report.runs_refused += 1
                continue
            if requests_left <= 0:
                return  # the rest first next time: they are the least recently reconciled
            jobs, requests = self._registry().run_jobs(run.repository, run.run_id, run.attempt)
            requests_left -= requests
            self._recent.reconciled(run)
            report.runs_reconciled += 1
            if self._reprovision(report, run, jobs, self._executions(), tick=tick, now=now):
                self._recent.busy(run, busy_seconds(self._config.timeouts))

    def _waits_ended(self, run: RecentRun, now: Epoch) -> bool:
        """End the finished run's waits for capacity, unserved; True when one is left to the provision
        asked for it after its back-off (it began after the wait's next try, and may still be at work):
        that provision's Finish ends it, served or not, and a later run forgets the run."""
        if self._capacity_waits is None:
            return False
        left = False
        for run_key in run.run_keys:
            wait = self._capacity_waits.waiting(run.repository, run_key)
            if wait is not None and now < run.busy_until and run.demand_at >= wait.next_try:
                left = True
                continue
            self._capacity_waits.run_finished(run.repository, run_key, served=False)
        return left

    def _backing_off(self, repository: str, run_key: str, now: Epoch) -> bool:
        """Whether the run key waits for capacity and its next try has not come (domain/capacity_waits.py)."""
        if self._capacity_waits is None:
            return False
        wait = self._capacity_waits.waiting(repository, run_key)
        if wait is None or wait.due(now):
            return False
        logger.warning(
            "queued jobs wait for capacity; not provisioned again until the back-off passes",
            run_key=run_key,
            reason=wait.reason,
            tries=wait.tries,
            next_try=wait.next_try,
        )
        return True

    def _reprovision(
        self,
        report: RefreshReport,
        run: RecentRun,
        jobs: Sequence[RunJob],
        executions: ExecutionStarter,
        *,
        tick: int,
        now: Epoch,
    ) -> bool:
        """Provision the run's queued jobs that no runner of ours is free to take; whether it did."""
        # A runner named by a job that is not queued any more has (or had) its job: it is not free.
        taken = {job.runner_id for job in jobs if not job.queued and job.runner_id is not None}
        started = False
        for run_key in sorted(run.run_keys):
            waiting = sorted(
                (
                    job
                    for job in jobs
                    if job.queued
                    and job.run_key(run.attempt) == run_key
                    and now - job.created_at >= RECONCILE_GRACE_SECONDS
                ),
                key=lambda job: (job.created_at, job.job_id),
            )
            if not waiting:
                continue
            free = [
                record
                for record in self._table.held_by(run_key)
                if not record.threshold_passed(now) and record.runner_id not in taken
            ]
            # One provision's worth a run at a time (Step Functions' quotas); the rest at the next refresh.
            missing = min(len(waiting) - len(free), PROVISION_LIMIT)
            if missing <= 0 or self._backing_off(run.repository, run_key, now):
                continue
            logger.warning(
                "queued jobs have no runner of ours; provisioning them again",
                run_key=run_key,
                queued=len(waiting),
                free_runners=len(free),
            )
            executions.provision(
                ProvisionRequest(
                    repository=run.repository,
                    run_key=run_key,
                    count=missing,
                    job_ids=tuple(job.job_id for job in waiting[:missing]),
                    origin=f"reconcile-{tick}",
                    public=run.single_use,
                    repository_id=run.repository_id,
                    trust=run.trust_of(run_key),
                    on_demand=run_key in run.on_demand_keys,
                )
            )
            report.jobs_reprovisioned += missing
            started = True
        return started
