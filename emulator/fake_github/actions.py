"""GitHub Actions as the fake plays it: workflow runs with jobs, jobs handed to runners, webhooks about both.

A run is started with its jobs (a matrix is N jobs of one name); every job is queued at once with
its `runs-on` labels. A runner that connects asks for work, and gets the oldest queued job whose
labels it all carries (GitHub's rule) in a repository it serves. The job is in progress until the
runner reports its result; then it is completed, and GitHub removes the runner, as it does every
JIT runner after its one job. A runner that stops talking for `lost_after_seconds` is lost: its
job fails and it goes offline. Cancelling a run completes its queued jobs without a runner and
its running jobs as cancelled. Every change is announced with the webhook events GitHub sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emulator.fake_github import payloads
from emulator.fake_github.state import (
    Conclusion,
    FakeJob,
    FakeRunner,
    FakeWorkflowRun,
    GitHubState,
    JobStatus,
)
from emulator.fake_github.webhooks import Webhooks

RUN_ID_EXPRESSION = "${{ github.run_id }}"
LOST_AFTER_SECONDS = 60.0
"""GitHub notices a runner is gone after minutes; the emulator compresses that."""

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

    def labels(self, run_id: int) -> list[str]:
        written = (self.runs_on,) if isinstance(self.runs_on, str) else self.runs_on
        return [label.replace(RUN_ID_EXPRESSION, str(run_id)) for label in written]

    def names(self) -> list[str]:
        return [self.name] if self.matrix == 1 else [f"{self.name} ({n})" for n in range(1, self.matrix + 1)]


class JobGoneError(LookupError):
    """The runner's job is no longer its own: cancelled, or failed after the runner was lost."""


class Actions:
    def __init__(
        self, state: GitHubState, webhooks: Webhooks, lost_after_seconds: float = LOST_AFTER_SECONDS
    ) -> None:
        self.state = state
        self.webhooks = webhooks
        self.lost_after_seconds = lost_after_seconds
        self._run_numbers: dict[str, int] = {}

    # --- what users do

    def start_run(self, repository: str, workflow: str, jobs: Sequence[JobSpec]) -> FakeWorkflowRun:
        """A new run of `workflow` in `repository` (`owner/repo`): requested, then each job queued."""
        state = self.state
        with state.lock:
            now = state.clock.now()
            number = self._run_numbers[repository] = self._run_numbers.get(repository, 0) + 1
            run = FakeWorkflowRun(state.new_id(), repository, workflow, number, now, updated_at=now)
            state.runs[run.run_id] = run
            events = [self._run_event("requested", run)]
            for spec in jobs:
                for name in spec.names():
                    labels = spec.labels(run.run_id)
                    job = FakeJob(state.new_id(), run.run_id, name, labels, spec.seconds, now)
                    state.jobs[job.job_id] = job
                    run.job_ids.append(job.job_id)
                    events.append(self._job_event("queued", job))
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
        with self.state.lock:
            runner.online = False
            runner.last_seen = self.state.clock.now()

    def next_job(self, runner: FakeRunner) -> FakeJob | None:
        """The job for a connected runner that asks for work: its current one, or the oldest it fits."""
        state = self.state
        with state.lock:
            runner.online = True
            runner.last_seen = state.clock.now()
            if runner.job_id is not None:
                return state.jobs[runner.job_id]
            job = next((j for j in self._queued() if self._fits(runner, j)), None)
            if job is None:
                return None
            run = state.runs[job.run_id]
            job.status, job.started_at = JobStatus.IN_PROGRESS, state.clock.now()
            job.runner_id, job.runner_name = runner.runner_id, runner.name
            runner.busy, runner.job_id = True, job.job_id
            events = [self._job_event("in_progress", job)]
            if run.status is JobStatus.QUEUED:
                run.status, run.updated_at = JobStatus.IN_PROGRESS, state.clock.now()
                events.append(self._run_event("in_progress", run))
        self._send(events)
        return job

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
            events = self._complete(self.state.jobs[job_id], conclusion)
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
                if runner.job_id is not None:
                    events += self._complete(state.jobs[runner.job_id], Conclusion.FAILURE)
        self._send(events)
        return lost

    # --- mechanics (under the state lock)

    def _queued(self) -> list[FakeJob]:
        return sorted(
            (j for j in self.state.jobs.values() if j.status is JobStatus.QUEUED),
            key=lambda j: (j.queued_at, j.job_id),
        )

    def _fits(self, runner: FakeRunner, job: FakeJob) -> bool:
        run = self.state.runs[job.run_id]
        return set(job.labels) <= runner.label_names and runner.serves(run.repository)

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

    def _job_event(self, action: str, job: FakeJob) -> Event:
        run = self.state.runs[job.run_id]
        payload = payloads.workflow_job(
            action, job, run, self.state.repository_id(run.repository), self._installation_id(run)
        )
        return "workflow_job", action, payload, str(run.run_id)

    def _run_event(self, action: str, run: FakeWorkflowRun) -> Event:
        payload = payloads.workflow_run(
            action, run, self.state.repository_id(run.repository), self._installation_id(run)
        )
        return "workflow_run", action, payload, str(run.run_id)

    def _installation_id(self, run: FakeWorkflowRun) -> int | None:
        installation = self.state.installation_of(run.owner)
        return installation.installation_id if installation else None

    def _send(self, events: list[Event]) -> None:
        for event, action, payload, order_key in events:
            self.webhooks.send(
                event,
                action,
                payload,
                order_key=order_key,
                installation_id=payload.get("installation", {}).get("id"),
                repository_id=payload["repository"]["id"],
            )
