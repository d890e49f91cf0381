"""GitHub Actions as the fake plays it: workflow runs with jobs, jobs handed to runners, webhooks about both.

Each behaviour names where GitHub documents it (docs.github.com, Actions, unless said otherwise):

- A run is started with its jobs (a matrix is N jobs of one name); every job is queued at once with
  its `runs-on` labels.
- A job goes only to a runner that carries all of its labels, compared without case ("Using
  self-hosted runners in a workflow": "jobs will be queued on runners that have all the labels that
  you specify"; "Using labels with self-hosted runners": "Labels are case-insensitive"), in a
  repository the runner serves, and that the runner's group admits: a group of `selected` visibility
  only its selected repositories, and no public repository unless it allows them ("Managing access to
  self-hosted runners using groups"; state.FakeRunnerGroup).
- A connected runner that asks for work is offered the oldest such job; the job is in progress once
  the runner picks it up. "If the runner doesn't pick up the assigned job within 60 seconds, the
  job is queued at all levels" ("Using self-hosted runners in a workflow", Routing precedence; the
  runner's side is the acknowledge/acquire seen in actions/runner#4728).
- A runner reports its job's result; the job is completed, and GitHub removes the runner, as it
  does every JIT runner after its one job ("just-in-time runners ... perform at most one job").
- A busy runner that disconnects, or stops talking for `lost_after_seconds`, fails its job ("The
  self-hosted runner: ... lost communication with the server", actions/runner#2040).
- A job queued for `queue_expiry_seconds` (24 h on GitHub) without a runner fails: "Each job for
  self-hosted runners that has been queued for at least 24 hours will be canceled" ("Usage limits
  for self-hosted runners"); the job's annotation says "This request was automatically failed
  because there were no enabled runners online", and the run ends as a failure.
- Cancelling a run completes its queued jobs without a runner and its running jobs as cancelled.
- A completed run can be re-run for 30 days: "Re-run all jobs" or "Re-run failed jobs" keep the
  run id and count up `run_attempt` ("Re-running workflows and jobs"). Re-running all jobs queues
  every job again; re-running failed jobs queues the failed ones again and keeps the others'
  results. Re-run jobs are new jobs (new ids) of the new attempt.

Every change is announced with the webhook events GitHub sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from emulator.fake_github import payloads
from emulator.fake_github.state import (
    Conclusion,
    FakeJob,
    FakeRunner,
    FakeWorkflowRun,
    GitHubState,
    JobStatus,
    RunTrigger,
)
from emulator.fake_github.webhooks import Webhooks
from runner_pool.domain.clock import Epoch

RUN_ID_EXPRESSION = "${{ github.run_id }}"
LOST_AFTER_SECONDS = 60.0
"""GitHub notices a runner is gone after minutes; the emulator compresses that."""
REQUEUE_AFTER_SECONDS = 60.0
"""How long a job offered to a runner waits for it to pick it up before any runner may have it."""
QUEUE_EXPIRY_SECONDS = 24 * 3600.0
"""How long a job waits in the queue for a runner before GitHub fails it; tests scale it down."""
RERUN_WINDOW_SECONDS = 30 * 24 * 3600.0
"""How long after a run was started it may be re-run."""
RERUN_LIMIT = 50
"""'A workflow run can be re-run a maximum of 50 times' ("Re-running workflows and jobs")."""

Event = tuple[str, str, dict[str, Any], str]
"""(event, action, payload, ordering key): a webhook to send once the state lock is released."""


@dataclass(frozen=True)
class JobSpec:
    """One job of a workflow as written: `runs-on` may use `${{ github.run_id }}`, as our label does."""

    name: str
    runs_on: str | tuple[str, ...]
    matrix: int = 1
    """How many jobs the job's matrix expands to (`name (1)`, `name (2)`, ...); 1 for no matrix."""
    seconds: float = 1.0
    """How long the job's steps take once a runner has it."""
    fail_attempts: tuple[int, ...] = ()
    """The run attempts in which the job's steps fail, e.g. (1,): fails first, passes when re-run."""
    environment: str | None = None
    """The environment the job refers to (`environment:` in its YAML): it holds that environment's
    secrets, and its `workflow_job` deliveries carry a `deployment`."""

    def labels(self, run_id: int) -> list[str]:
        written = (self.runs_on,) if isinstance(self.runs_on, str) else self.runs_on
        return [label.replace(RUN_ID_EXPRESSION, str(run_id)) for label in written]

    def names(self) -> list[str]:
        return [self.name] if self.matrix == 1 else [f"{self.name} ({n})" for n in range(1, self.matrix + 1)]


class JobGoneError(LookupError):
    """The runner's job is no longer its own: cancelled, failed after the runner was lost, or (not
    picked up in time) offered to another runner."""


class RerunRefusedError(ValueError):
    """GitHub would not re-run this run now (it is not completed, too old, or has no failed job)."""


@dataclass(eq=False)
class Actions:
    state: GitHubState
    webhooks: Webhooks
    lost_after_seconds: float = LOST_AFTER_SECONDS
    _: KW_ONLY
    requeue_after_seconds: float = REQUEUE_AFTER_SECONDS
    queue_expiry_seconds: float = QUEUE_EXPIRY_SECONDS
    _run_numbers: dict[str, int] = field(default_factory=dict, init=False)

    # --- what users do

    def start_run(
        self,
        repository: str,
        workflow: str,
        jobs: Sequence[JobSpec],
        trigger: RunTrigger | None = None,
    ) -> FakeWorkflowRun:
        """A new run of `workflow` in `repository` (`owner/repo`), caused as `trigger` says (a push by a
        human unless said): requested, then each job queued."""
        state = self.state
        with state.lock:
            now = state.clock.now()
            number = self._run_numbers[repository] = self._run_numbers.get(repository, 0) + 1
            run = FakeWorkflowRun(
                state.new_id(),
                repository,
                workflow,
                number,
                now,
                updated_at=now,
                attempt_started_at=now,
                public=repository.lower() in state.public_repositories,
                trigger=trigger or RunTrigger(),
            )
            state.runs[run.run_id] = run
            events = [self._run_event("requested", run)]
            for spec in jobs:
                for name in spec.names():
                    events.append(self._queue(run, name, spec.labels(run.run_id), spec, now))
        self._send(events)
        return run

    def rerun_all_jobs(self, run_id: int) -> FakeWorkflowRun:
        """ "Re-run all jobs": the next attempt of the run queues every job again."""
        return self._rerun(run_id, lambda _job: True)

    def rerun_failed_jobs(self, run_id: int) -> FakeWorkflowRun:
        """ "Re-run failed jobs": the next attempt queues the failed jobs again and keeps the others."""
        return self._rerun(run_id, lambda job: job.conclusion is Conclusion.FAILURE)

    def _rerun(self, run_id: int, again: Callable[[FakeJob], bool]) -> FakeWorkflowRun:
        state = self.state
        with state.lock:
            run = state.runs[run_id]
            now = state.clock.now()
            if run.status is not JobStatus.COMPLETED:
                raise RerunRefusedError(f"run {run_id} is {run.status.value}: only a completed run is re-run")
            if now - run.created_at > RERUN_WINDOW_SECONDS:
                raise RerunRefusedError(f"run {run_id} is more than 30 days old")
            if run.run_attempt > RERUN_LIMIT:
                raise RerunRefusedError(f"run {run_id} was re-run {RERUN_LIMIT} times already")
            earlier = self._jobs_of(run)
            if not any(again(job) for job in earlier):
                raise RerunRefusedError(f"run {run_id} has no job to re-run")
            run.run_attempt += 1
            run.status, run.conclusion, run.updated_at, run.attempt_started_at = (
                JobStatus.QUEUED,
                None,
                now,
                now,
            )
            events = [self._run_event("requested", run)]
            run.job_ids = []
            for job in earlier:
                if not again(job):
                    run.job_ids.append(job.job_id)
                    continue
                events.append(self._queue(run, job.name, list(job.labels), job, now))
        self._send(events)
        return run

    def cancel_run(self, run_id: int) -> None:
        """Cancel a run: queued jobs complete without a runner, running ones as cancelled."""
        state = self.state
        with state.lock:
            run = state.runs[run_id]
            events: list[Event] = []
            for job in self._jobs_of(run):
                if job.status is not JobStatus.COMPLETED:
                    events += self._complete(job, Conclusion.CANCELLED)
        self._send(events)

    # --- what runners do (the fake's runner protocol)

    def connect(self, runner: FakeRunner) -> None:
        with self.state.lock:
            runner.online = True
            runner.os = "Linux"
            runner.last_seen = self.state.clock.now()

    def disconnect(self, runner: FakeRunner) -> None:
        """The runner closes its session (it was stopped): offline, and a job it was running fails."""
        with self.state.lock:
            runner.online = False
            runner.last_seen = self.state.clock.now()
            events = self._fail_job_of(runner, "its runner disconnected")
        self._send(events)

    def offer(self, runner: FakeRunner) -> FakeJob | None:
        """The job for a connected runner that asks for work: its current one, the one offered to it
        already, or the oldest queued job it fits, which is offered to it (still queued)."""
        state = self.state
        with state.lock:
            runner.online = True
            now = runner.last_seen = state.clock.now()
            if runner.job_id is not None:
                return state.jobs[runner.job_id]
            queued = self._queued()
            offered = next((j for j in queued if j.assigned_runner_id == runner.runner_id), None)
            if offered is not None:
                return offered
            job = next((j for j in queued if j.assigned_runner_id is None and self._fits(runner, j)), None)
            if job is not None:
                job.assigned_runner_id, job.assigned_at = runner.runner_id, now
            return job

    def acquire(self, runner: FakeRunner, job_id: int) -> FakeJob:
        """The runner picks up the job offered to it: in progress. JobGoneError once it went elsewhere."""
        state = self.state
        with state.lock:
            runner.last_seen = state.clock.now()
            job = state.jobs.get(job_id)
            if runner.job_id == job_id and job is not None:
                return job
            if (
                job is None
                or job.status is not JobStatus.QUEUED
                or job.assigned_runner_id != runner.runner_id
            ):
                raise JobGoneError(job_id)
            run = state.runs[job.run_id]
            job.status, job.started_at = JobStatus.IN_PROGRESS, state.clock.now()
            job.runner_id, job.runner_name = runner.runner_id, runner.name
            job.runner_labels = tuple(label.name for label in runner.labels)
            runner.busy, runner.job_id = True, job.job_id
            events = [self._job_event("in_progress", job)]
            if run.status is JobStatus.QUEUED:
                run.status, run.updated_at = JobStatus.IN_PROGRESS, state.clock.now()
                events.append(self._run_event("in_progress", run))
        self._send(events)
        return job

    def next_job(self, runner: FakeRunner) -> FakeJob | None:
        """A runner that asks for work and picks up what it is offered at once."""
        job = self.offer(runner)
        return None if job is None else self.acquire(runner, job.job_id)

    def renew(self, runner: FakeRunner, job_id: int) -> FakeJob:
        """The runner is still working on `job_id`; JobGoneError if the job is not its own any more."""
        with self.state.lock:
            runner.last_seen = self.state.clock.now()
            if runner.job_id != job_id:
                raise JobGoneError(job_id)
            return self.state.jobs[job_id]

    def finish(self, runner: FakeRunner, job_id: int, conclusion: Conclusion) -> None:
        """The runner reports its job's result; the JIT runner is done and GitHub removes it."""
        with self.state.lock:
            if runner.job_id != job_id:
                raise JobGoneError(job_id)
            job = self.state.jobs[job_id]
            if conclusion is Conclusion.FAILURE:
                job.failed_because = "its steps failed"
            events = self._complete(job, conclusion)
        self._send(events)

    def notice_lost_runners(self) -> list[FakeRunner]:
        """Runners silent for `lost_after_seconds` go offline; a job they held fails. Returns them."""
        state = self.state
        events: list[Event] = []
        lost: list[FakeRunner] = []
        with state.lock:
            deadline = state.clock.now() - self.lost_after_seconds
            for runner in list(state.runners.values()):
                if not runner.online or runner.last_seen is None or runner.last_seen > deadline:
                    continue
                lost.append(runner)
                runner.online = False
                events += self._fail_job_of(
                    runner, f"its runner was silent for {self.lost_after_seconds:g} s"
                )
        self._send(events)
        return lost

    def requeue_unpicked(self) -> list[FakeJob]:
        """Jobs offered to a runner that did not pick them up in `requeue_after_seconds`: any runner
        may have them now. Returns them."""
        with self.state.lock:
            deadline = self.state.clock.now() - self.requeue_after_seconds
            lapsed = [
                job
                for job in self._queued()
                if job.assigned_runner_id is not None
                and job.assigned_at is not None
                and job.assigned_at <= deadline
            ]
            for job in lapsed:
                job.assigned_runner_id, job.assigned_at = None, None
        return lapsed

    def expire_queued(self) -> list[FakeJob]:
        """Jobs queued for `queue_expiry_seconds` fail without a runner. Returns them."""
        events: list[Event] = []
        with self.state.lock:
            deadline = self.state.clock.now() - self.queue_expiry_seconds
            expired = [job for job in self._queued() if job.queued_at <= deadline]
            for job in expired:
                job.assigned_runner_id, job.assigned_at = None, None
                job.failed_because = "queued too long"
                events += self._complete(job, Conclusion.FAILURE)
        self._send(events)
        return expired

    def tick(self) -> None:
        """What GitHub does as time passes: lost runners, lapsed offers, expired queued jobs."""
        self.notice_lost_runners()
        self.requeue_unpicked()
        self.expire_queued()

    # --- mechanics (under the state lock)

    def _queued(self) -> list[FakeJob]:
        return sorted(
            (j for j in self.state.jobs.values() if j.status is JobStatus.QUEUED),
            key=lambda j: (j.queued_at, j.job_id),
        )

    def _fits(self, runner: FakeRunner, job: FakeJob) -> bool:
        run = self.state.runs[job.run_id]
        return (
            runner.carries(job.labels)
            and runner.serves(run.repository)
            and self.state.group_admits(runner, run.repository)
        )

    def _fail_job_of(self, runner: FakeRunner, because: str) -> list[Event]:
        """A runner gone while it held a job: the job fails, `because`; a job only offered to it goes back."""
        for job in self._queued():
            if job.assigned_runner_id == runner.runner_id:
                job.assigned_runner_id, job.assigned_at = None, None
        if runner.job_id is None:
            return []
        held = self.state.jobs[runner.job_id]
        held.failed_because = because
        return self._complete(held, Conclusion.FAILURE)

    def _jobs_of(self, run: FakeWorkflowRun) -> list[FakeJob]:
        return [self.state.jobs[job_id] for job_id in run.job_ids]

    def _complete(self, job: FakeJob, conclusion: Conclusion) -> list[Event]:
        state = self.state
        now = state.clock.now()
        job.status, job.conclusion, job.completed_at = JobStatus.COMPLETED, conclusion, now
        events = [self._job_event("completed", job)]
        runner = state.runners.pop(job.runner_id, None) if job.runner_id is not None else None
        if runner is not None:
            # A JIT runner takes one job; GitHub removes it once that job is over.
            runner.busy, runner.job_id = False, None
        run = state.runs[job.run_id]
        jobs = self._jobs_of(run)
        if all(j.status is JobStatus.COMPLETED for j in jobs) and run.status is not JobStatus.COMPLETED:
            conclusions = {j.conclusion for j in jobs}
            run.status, run.updated_at = JobStatus.COMPLETED, now
            worst = (c for c in (Conclusion.CANCELLED, Conclusion.FAILURE) if c in conclusions)
            run.conclusion = next(worst, Conclusion.SUCCESS)
            events.append(self._run_event("completed", run))
        return events

    def _queue(
        self, run: FakeWorkflowRun, name: str, labels: list[str], like: JobSpec | FakeJob, now: Epoch
    ) -> Event:
        """A job of `run`'s attempt queued `now`, its steps as `like`'s (its spec, or the job of an earlier
        attempt it runs again): kept, listed on the run; its `queued` event. Under the state's lock."""
        state = self.state
        job = FakeJob(
            state.new_id(),
            run.run_id,
            name,
            labels,
            like.seconds,
            now,
            run.run_attempt,
            like.fail_attempts,
            environment=like.environment,
        )
        state.jobs[job.job_id] = job
        run.job_ids.append(job.job_id)
        return self._job_event("queued", job)

    def _job_event(self, action: str, job: FakeJob) -> Event:
        run = self.state.runs[job.run_id]
        payload = payloads.workflow_job(
            action, job, run, self.state.repository_id(run.repository), self._installation_id(run)
        )
        return "workflow_job", action, payload, f"job-{job.job_id}"

    def _run_event(self, action: str, run: FakeWorkflowRun) -> Event:
        payload = payloads.workflow_run(
            action, run, self.state.repository_id(run.repository), self._installation_id(run)
        )
        return "workflow_run", action, payload, f"run-{run.run_id}"

    def _installation_id(self, run: FakeWorkflowRun) -> int | None:
        installation = self.state.installation_covering(run.repository)
        return installation.installation_id if installation else None

    def _send(self, events: list[Event]) -> None:
        for event, action, payload, order_key in events:
            if "installation" not in payload and self.state.installation_of(
                payload["repository"]["owner"]["login"]
            ):
                continue  # a repository its account's installation does not select: the App hears nothing
            self.webhooks.send(
                event,
                action,
                payload,
                order_key=order_key,
                installation_id=payload.get("installation", {}).get("id"),
                repository_id=payload["repository"]["id"],
            )
