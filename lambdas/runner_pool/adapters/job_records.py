"""Reads what a deployment recorded about one job, for its story (domain/job_story.py): the demand ledger's
items, the provision and release executions (Step Functions DescribeExecution, ListExecutions and
GetExecutionHistory), the instance's record, the registration budget, and the job on GitHub.

Executions are named by a digest of what they serve (domain/executions.py), so the ledger's item names the
provision that counted the job; the provisions that asked again for it (a redrive, a reconciliation) and
its release are found by listing the machine's executions since then and reading their inputs, at most
LISTED_EXECUTIONS of each machine. ListExecutions answers newest first, and is eventually consistent
("Results are sorted by time, with the most recent execution first", AWS Step Functions API Reference,
ListExecutions): an execution started a moment ago may be missing from the story.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

from botocore.exceptions import ClientError

from runner_pool.adapters.aws_clients import error_code
from runner_pool.adapters.demand_ledger import JOB_PREFIX, LEDGER_RETENTION_SECONDS
from runner_pool.adapters.github_api import PAGE_SIZE, GitHubApi
from runner_pool.adapters.ledger_items import EXPIRY_ATTRIBUTE, KEY_ATTRIBUTE
from runner_pool.adapters.registration_budget import DynamoDbRegistrationBudget
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig, WorkflowType
from runner_pool.domain.job_story import (
    ExecutionFacts,
    GitHubJob,
    JobFacts,
    JobRef,
    LedgerJob,
    StateExit,
    instant_tier,
    ran_on,
    unserved_reason,
)
from runner_pool.domain.runners import GitHubError

LISTED_EXECUTIONS = 1000
"""Executions of one machine read back at most, newest first, to find those that name the job."""
MAX_ATTEMPTS = 10
"""Run attempts looked through on GitHub for the job, from the first."""
EXPRESS_UNREAD = (
    "the stack's state machines are EXPRESS workflows, whose executions Step Functions does not describe or "
    'keep a history of (DescribeExecution, GetExecutionHistory: "not supported by EXPRESS state machines")'
)
_JOB_CAUSES = ("job-{}", "started-job-{}", "foreign-job-{}")
"""A release's cause when a job's webhook asked for it (domain/webhooks.py)."""


@dataclass(frozen=True)
class JobSources:
    """Where a deployment keeps what the story reads (the stack's outputs name them)."""

    state_table: str
    """Where the registration budget is kept too."""
    ledger_table: str | None
    """None for a stack older than its output: the story then has no demand."""
    provision_machine_arn: str
    release_machine_arn: str


@dataclass(frozen=True)
class JobRecords:
    """`github`: a client of the App's installation that may read Actions, or None (and `github_unread`
    why not)."""

    sources: JobSources
    table: StateTable
    dynamodb: Any
    stepfunctions: Any
    clock: Clock
    _: KW_ONLY
    github: GitHubApi | None = None
    github_unread: str | None = None
    config: StackConfig | None = None

    def job_ids(self, ref: JobRef) -> list[int]:
        """The jobs of a run's attempts as GitHub lists them; empty when GitHub cannot be asked."""
        if self.github is None:
            return []
        return sorted({job.job_id for job in self._listed(ref)})

    def facts(self, ref: JobRef) -> JobFacts:
        job_id = ref.job_id
        if job_id is None:
            raise ValueError("the facts of one job need its id")
        github, unread = self._github_job(ref, job_id)
        ledger = self._ledger(job_id)
        express = self.config is not None and self.config.workflow_type is WorkflowType.EXPRESS
        provisions = () if express else self._provisions(job_id, ledger)
        since = provisions[0].started_at if provisions else (github.created_at if github else None)
        releases = self._releases(job_id, since) if since is not None and not express else ()
        instance_id = ran_on(github, releases)
        return JobFacts(
            ref=ref,
            now=self.clock.now(),
            github=github,
            github_unread=unread,
            ledger=ledger,
            provisions=provisions,
            releases=releases,
            record=self.table.get(instance_id) if instance_id else None,
            held_until=self._held_until(),
            executions_unread=EXPRESS_UNREAD if express else None,
            unserved=(
                unserved_reason(github, ref.run_id, self.config)
                if github is not None and self.config is not None and ledger is None
                else None
            ),
            instant_tier=(
                instant_tier(github, self.config) if github is not None and self.config is not None else None
            ),
        )

    def _github_job(self, ref: JobRef, job_id: int) -> tuple[GitHubJob | None, str | None]:
        if self.github is None:
            return None, self.github_unread or "GitHub not asked"
        try:
            found = [job for job in self._listed(ref) if job.job_id == job_id]
        except GitHubError as exc:
            return None, f"GitHub did not answer: {exc}"
        if not found:
            return None, f"GitHub lists no job {job_id} in run {ref.run_id} of {ref.repository}"
        return found[-1], None

    def _listed(self, ref: JobRef) -> Iterator[GitHubJob]:
        """Every job of every attempt of the run, the first attempt first; stops at an attempt GitHub does
        not have."""
        api = self.github
        if api is None:
            return
        owner, _, repo = ref.repository.partition("/")
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                jobs = _attempt_jobs(api, owner, repo, ref.run_id, attempt)
            except GitHubError:
                if attempt == 1:
                    raise
                return
            if not jobs:
                return
            yield from jobs

    def _ledger(self, job_id: int) -> LedgerJob | None:
        if self.sources.ledger_table is None:
            return None
        item = self.dynamodb.get_item(
            TableName=self.sources.ledger_table,
            Key={KEY_ATTRIBUTE: {"S": f"{JOB_PREFIX}{job_id}"}},
            ConsistentRead=True,
        ).get("Item")
        if item is None:
            return None
        expiry = item.get(EXPIRY_ATTRIBUTE, {}).get("N")
        return LedgerJob(
            state=item.get("state", {}).get("S", ""),
            execution_name=item.get("execution_name", {}).get("S"),
            counted_at=None if expiry is None else float(expiry) - LEDGER_RETENTION_SECONDS,
        )

    def _provisions(self, job_id: int, ledger: LedgerJob | None) -> tuple[ExecutionFacts, ...]:
        if ledger is None or ledger.execution_name is None:
            return ()
        machine = self.sources.provision_machine_arn
        first = self._execution(_execution_arn(machine, ledger.execution_name))
        if first is None:
            return ()
        later = self._named_since(
            machine, first.started_at, lambda given: job_id in (given.get("job_ids") or ()), first.name
        )
        return (first, *later)

    def _releases(self, job_id: int, since: float) -> tuple[ExecutionFacts, ...]:
        causes = {cause.format(job_id) for cause in _JOB_CAUSES}
        return self._named_since(
            self.sources.release_machine_arn, since, lambda given: given.get("cause") in causes
        )

    def _named_since(
        self, machine: str, since: float, names_the_job: Callable[[dict[str, Any]], bool], *skip: str
    ) -> tuple[ExecutionFacts, ...]:
        found = []
        for listed in self._listed_since(machine, since):
            if listed["name"] in skip:
                continue
            described = self.stepfunctions.describe_execution(executionArn=listed["executionArn"])
            if names_the_job(json.loads(described.get("input") or "{}")):
                found.append(self._facts(described))
        return tuple(sorted(found, key=lambda e: e.started_at))

    def _listed_since(self, machine: str, since: float) -> Iterator[dict[str, Any]]:
        """The machine's executions started at `since` or later, newest first (ListExecutions' order)."""
        seen = 0
        for page in self.stepfunctions.get_paginator("list_executions").paginate(stateMachineArn=machine):
            for execution in page["executions"]:
                seen += 1
                if execution["startDate"].timestamp() < since - 1 or seen > LISTED_EXECUTIONS:
                    return
                yield execution

    def _execution(self, arn: str) -> ExecutionFacts | None:
        try:
            described = self.stepfunctions.describe_execution(executionArn=arn)
        except ClientError as exc:
            if error_code(exc) == "ExecutionDoesNotExist":
                return None
            raise
        return self._facts(described)

    def _facts(self, described: dict[str, Any]) -> ExecutionFacts:
        stopped = described.get("stopDate")
        return ExecutionFacts(
            name=described["name"],
            status=described["status"],
            started_at=described["startDate"].timestamp(),
            input=json.loads(described.get("input") or "{}"),
            stopped_at=None if stopped is None else stopped.timestamp(),
            exits=self._exits(described["executionArn"]),
        )

    def _exits(self, arn: str) -> tuple[StateExit, ...]:
        pages = self.stepfunctions.get_paginator("get_execution_history").paginate(executionArn=arn)
        return tuple(
            StateExit(event["timestamp"].timestamp(), details["name"], _output(details))
            for page in pages
            for event in page["events"]
            if (details := event.get("stateExitedEventDetails")) is not None
        )

    def _held_until(self) -> float | None:
        config = self.config
        if config is None or config.github.app_id is None:
            return None
        github = config.github
        bucket = DynamoDbRegistrationBudget(
            self.sources.state_table,
            str(github.app_id),
            per_minute=github.registrations_per_minute,
            burst=github.registration_burst,
            clock=self.clock,
            client=self.dynamodb,
        ).bucket()
        return None if bucket is None else bucket.held_until


def _attempt_jobs(api: GitHubApi, owner: str, repo: str, run_id: int, attempt: int) -> list[GitHubJob]:
    """One attempt's jobs: GET /repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt}/jobs
    (docs.github.com, "List jobs for a workflow run attempt"; `actions: read`)."""
    jobs: list[GitHubJob] = []

    def listed() -> list[GitHubJob]:
        page = 1
        while True:
            data = api.rest.actions.list_jobs_for_workflow_run_attempt(
                owner, repo, run_id, attempt, per_page=PAGE_SIZE, page=page, headers=api.headers
            ).parsed_data
            jobs.extend(_github_job(job, attempt) for job in data.jobs)
            if len(data.jobs) < PAGE_SIZE or len(jobs) >= data.total_count:
                return jobs
            page += 1

    return api.call(listed)


def _github_job(job: Any, attempt: int) -> GitHubJob:
    return GitHubJob(
        job_id=job.id,
        run_attempt=job.run_attempt or attempt,
        name=job.name,
        status=str(job.status),
        labels=tuple(job.labels),
        created_at=job.created_at.timestamp(),
        # GitHub gives a job that has not started its creation time as `started_at`.
        started_at=job.started_at.timestamp() if job.runner_name and job.started_at else None,
        completed_at=None if job.completed_at is None else job.completed_at.timestamp(),
        conclusion=None if job.conclusion is None else str(job.conclusion),
        runner_id=job.runner_id,
        runner_name=job.runner_name,
    )


def _output(details: dict[str, Any]) -> dict[str, Any]:
    """A state's output as its history event carries it; empty when the history cut it short
    (`outputDetails.truncated`) or it is not a JSON object."""
    try:
        output = json.loads(details.get("output") or "null")
    except ValueError:
        return {}
    return output if isinstance(output, dict) else {}


def _execution_arn(machine_arn: str, name: str) -> str:
    """An execution's ARN from its machine's and its name (`arn:…:states:…:execution:<machine>:<name>`)."""
    return f"{machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"
