"""Jobs waiting for capacity (domain/capacity_waits.py): noted and told when a provision ends short, ended
when they are served or their run finishes. Provision's Finish and refresh's reconciliation share it.

The jobs' author is told with a check run on the run's head commit that names the jobs, their class and
EC2's error, created at the first short provision and completed when the wait ends. Where the App may not
write checks (its owner has not accepted `checks: write`), or GitHub fails, the jobs wait all the same: the
next short provision tries the check run again, and the operator still has the metric, the alarm and
`runner-pool status`.
"""

from __future__ import annotations

from collections.abc import Callable

from runner_pool.domain.capacity_waits import (
    CHECK_RUN_NAME,
    CapacityWait,
    Conclusion,
    finished_check,
    served_check,
    waiting_check,
)
from runner_pool.domain.clock import Clock
from runner_pool.domain.ports import CapacityWaitRecords, CheckRuns
from runner_pool.domain.provision import ProvisionPlan
from runner_pool.domain.runners import GitHubError
from runner_pool.observability import count, logger


class CapacityWaitSteps:
    """`check_runs` is the App that tells the jobs' author (None: nobody is told on GitHub)."""

    def __init__(
        self,
        waits: Callable[[], CapacityWaitRecords],
        *,
        clock: Clock,
        check_runs: Callable[[], CheckRuns] | None = None,
    ) -> None:
        self._waits = waits
        self._clock = clock
        self._check_runs = check_runs

    def wait(self, provision: ProvisionPlan, unserved: int, reason: str) -> CapacityWait:
        """EC2 refused the launch after the fallback: asking again at once would be refused again, so the
        jobs wait, and refresh's reconciliation asks again after the back-off."""
        spec = provision.spec
        waits = self._waits()
        wait = waits.note(provision.shortfall(unserved, reason))
        count("JobsWaitingForCapacity", unserved)
        logger.error(
            "jobs wait for capacity: EC2 refused the launch after the fallback; asked again after a back-off",
            run_key=spec.run_key,
            resource_class=spec.resource_class,
            usage=spec.usage.value,
            reason=reason,
            unserved=unserved,
            tries=wait.tries,
            next_try=wait.next_try,
        )
        if wait.check_run is None:
            self._tell_author(waits, provision, wait)
        return wait

    def served(self, repository: str, run_key: str) -> None:
        """Every job a provision asked for is served: the run key's wait, if any, ends in success."""
        ended = self._waits().end(repository, run_key)
        if ended is None:
            return
        count("CapacityWaitsEnded")
        logger.info(
            "capacity is back: jobs that waited for it are served",
            run_key=ended.run_key,
            waited_seconds=self._clock.now() - ended.since,
            tries=ended.tries,
        )
        self._complete(ended, "success", *served_check(ended, self._clock.now()))

    def waiting(self, repository: str, run_key: str) -> CapacityWait | None:
        return self._waits().get(repository, run_key)

    def run_finished(self, repository: str, run_key: str, *, served: bool) -> None:
        """The run finished (its jobs ran, or it was cancelled): the wait ends, served or not."""
        if served:
            self.served(repository, run_key)
            return
        ended = self._waits().end(repository, run_key)
        if ended is not None:
            logger.info("run finished while its jobs waited for capacity", run_key=ended.run_key)
            self._complete(ended, "neutral", *finished_check(ended))

    def _tell_author(self, waits: CapacityWaitRecords, provision: ProvisionPlan, wait: CapacityWait) -> None:
        spec, request = provision.spec, provision.request
        if self._check_runs is None or not spec.run_id.isdigit():
            return  # an instant tier's runner waits for any repository's job: no run to tell
        attempt = request.key.attempt
        try:
            github = self._check_runs()
            jobs, _ = github.run_jobs(request.repository, int(spec.run_id), attempt)
            ours = [
                job
                for job in jobs
                if job.job_id in request.job_ids or (job.queued and job.run_key(attempt) == spec.run_key)
            ]
            head_sha = next((job.head_sha for job in ours if job.head_sha), None)
            if head_sha is None:
                logger.warning(
                    "no check run for jobs waiting for capacity: GitHub lists none", run_key=spec.run_key
                )
                return
            title, summary = waiting_check(wait, [job.name for job in ours if job.name])
            check_run = github.create_check_run(
                request.repository, head_sha=head_sha, name=CHECK_RUN_NAME, title=title, summary=summary
            )
        except GitHubError as refused:
            count("CapacityCheckRunsFailed")
            logger.warning(
                "no check run for jobs waiting for capacity (the App may lack checks: write)",
                run_key=spec.run_key,
                error=str(refused),
            )
            return
        waits.mark_check_run(request.repository, spec.run_key, check_run)
        count("CapacityCheckRunsCreated")

    def _complete(self, ended: CapacityWait, conclusion: Conclusion, title: str, summary: str) -> None:
        if ended.check_run is None or self._check_runs is None:
            return
        try:
            self._check_runs().complete_check_run(
                ended.repository, ended.check_run, conclusion=conclusion, title=title, summary=summary
            )
        except GitHubError as failed:
            # Left in progress on the commit: it says the jobs waited, which they did.
            logger.warning(
                "the check run of jobs that waited for capacity was not completed", error=str(failed)
            )
