"""`runner-pool job <job URL or run URL>`: a job's story from the stack's own records (domain/job_story.py),
as text or, with `--json`, as one JSON document.

The deployment is found through the stack's outputs (the state table, the demand ledger, the provision and
release state machines); the stack config, and with it the GitHub App, through the functions' environment
as the doctor finds it (runner_pool/checkup.py). GitHub is asked as the App's installation, with the
App's private key from Secrets Manager and `actions: read` only; without it the story has no queued,
started or ended time and says so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from runner_pool.adapters.github_api import GitHubApi
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.job_records import JobRecords, JobSources
from runner_pool.adapters.stack_outputs import stack_outputs
from runner_pool.adapters.state_table import StateTable
from runner_pool.checkup import Target, TargetNotFoundError
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.github_tokens import RUN_READS
from runner_pool.domain.job_story import JobRef, Story, parse_job_url, tell
from runner_pool.domain.timeouts import Timeouts

TABLE_OUTPUT = "StateTableName"
LEDGER_OUTPUT = "DemandLedgerTableName"
PROVISION_OUTPUT = "ProvisionStateMachineArn"
RELEASE_OUTPUT = "ReleaseStateMachineArn"
LOG_GROUP_OUTPUT = "JobLogGroupName"


class JobTargetNotFoundError(LookupError):
    """The stack, or an output the story needs, is not there."""


@dataclass(frozen=True)
class JobTarget:
    """Where one deployment keeps a job's records, its config when readable, and why not when not."""

    sources: JobSources
    config: StackConfig | None
    config_unread: str | None = None
    log_group: str | None = None
    """The job logs' group (`runner-pool logs`); None for a stack deployed before it had one."""

    @classmethod
    def of_stack(cls, stack_name: str, clients: Callable[[str], Any]) -> JobTarget:
        cloudformation = clients("cloudformation")
        required = (TABLE_OUTPUT, PROVISION_OUTPUT, RELEASE_OUTPUT)
        outputs = stack_outputs(cloudformation, stack_name, required, JobTargetNotFoundError)
        sources = JobSources(
            state_table=outputs[TABLE_OUTPUT],
            ledger_table=outputs.get(LEDGER_OUTPUT),
            provision_machine_arn=outputs[PROVISION_OUTPUT],
            release_machine_arn=outputs[RELEASE_OUTPUT],
        )
        log_group = outputs.get(LOG_GROUP_OUTPUT)
        try:
            config = Target.of_stack(stack_name, cloudformation, clients("lambda")).stack.config
        except TargetNotFoundError as error:
            return cls(sources, None, str(error), log_group)
        return cls(sources, config, log_group=log_group)


def job(
    target: JobTarget, url: str, clients: Callable[[str], Any], clock: Clock, out: TextIO, *, as_json: bool
) -> int:
    """Print the story of the job `url` names, or of every job of the run it names; 2 for a URL that names
    neither, 1 when a run's jobs cannot be listed."""
    stories = told(target, url, clients, clock)
    if isinstance(stories, int):
        return stories
    if as_json:
        documents = [_document(s) for s in stories]
        one = parse_job_url(url).job_id is not None
        print(json.dumps(documents[0] if one else documents, indent=2), file=out)
        return 0
    for story in stories:
        for line in render(story):
            print(line, file=out)
        if story.instance_id is not None:
            print(f"  its agent's and runner's lines: runner-pool logs {job_url(url, story.ref)}", file=out)
    return 0


def told(target: JobTarget, url: str, clients: Callable[[str], Any], clock: Clock) -> list[Story] | int:
    """The stories of the job or run `url` names, or the exit code once it has said why there are none: 2
    for a URL that names neither, 1 when a run's jobs cannot be listed."""
    try:
        ref = parse_job_url(url)
    except ValueError as error:
        print(f"runner-pool: {error}", file=sys.stderr)
        return 2
    stories, unread = stories_of(target, ref, clients, clock)
    if stories is None:
        print(
            f"runner-pool: the jobs of run {ref.run_id} are listed by GitHub only: {unread}", file=sys.stderr
        )
        return 1
    return stories


def job_url(url: str, ref: JobRef) -> str:
    """The URL of the job `ref` names, on the host and repository of `url` (a job's or its run's)."""
    run = url.split("?", maxsplit=1)[0].split("#", maxsplit=1)[0]
    base = run[: run.index(f"/actions/runs/{ref.run_id}")]
    return f"{base}/actions/runs/{ref.run_id}/job/{ref.job_id}"


def stories_of(
    target: JobTarget, ref: JobRef, clients: Callable[[str], Any], clock: Clock
) -> tuple[list[Story] | None, str | None]:
    """The story of the job `ref` names, or of each job of its run (None when the run's jobs are unknown),
    and why GitHub could not be asked, if it could not."""
    with ExitStack() as opened:
        github, unread = _github(target, clients, opened)
        return _stories(target, ref, clients=clients, clock=clock, github=github, unread=unread), unread


def state_table(target: JobTarget, clients: Callable[[str], Any], clock: Clock) -> StateTable:
    """The state table, for reading records only: no transition depends on the timeouts' values."""
    dynamodb = clients("dynamodb")
    return StateTable(
        target.sources.state_table,
        Timeouts(),
        clock,
        dynamodb,
        arns=InstanceArns.of_caller(dynamodb, clients("sts")),
    )


def _stories(
    target: JobTarget,
    ref: JobRef,
    *,
    clients: Callable[[str], Any],
    clock: Clock,
    github: GitHubApi | None,
    unread: str | None,
) -> list[Story] | None:
    """The story of the job `ref` names, or of each job of its run; None when the run's jobs are unknown."""
    dynamodb = clients("dynamodb")
    records = JobRecords(
        target.sources,
        state_table(target, clients, clock),
        dynamodb,
        clients("stepfunctions"),
        clock,
        github=github,
        github_unread=unread,
        config=target.config,
    )
    job_ids = [ref.job_id] if ref.job_id is not None else records.job_ids(ref)
    if not job_ids:
        return None
    return [tell(records.facts(JobRef(ref.repository, ref.run_id, job_id))) for job_id in job_ids]


def render(story: Story) -> list[str]:
    """The story as an operator reads it: one line a step, its time, the wait it added, what happened."""
    ref = story.ref
    tier = f", {story.tier.value}" if story.tier else ""
    on = f" on {story.instance_id}{tier}" if story.instance_id else ""
    lines = [f"job {ref.job_id} of run {ref.run_id} in {ref.repository}{on}"]
    for step in story.steps:
        at = clock_time(step.at) if step.at is not None else "--:--:--.---"
        wait = f"+{step.wait_seconds:.1f}s" if step.wait_seconds is not None else ""
        lines.append(f"  {at}  {wait:>8}  {step.what:<14} {step.detail}")
    if story.waiting:
        lines.append(f"  waiting: {story.waiting}")
    lines += [f"  not recorded: {gap}" for gap in story.gaps]
    return lines


def _document(story: Story) -> dict[str, Any]:
    document = asdict(story)
    document["tier"] = story.tier.value if story.tier else None
    return document


def _github(
    target: JobTarget, clients: Callable[[str], Any], opened: ExitStack
) -> tuple[GitHubApi | None, str | None]:
    """A client of the App's installation that reads Actions (closed with `opened`), or None and why not."""
    config = target.config
    if config is None:
        return None, f"the stack config is not readable ({target.config_unread})"
    github = config.github
    if github.app_id is None or github.installation_id is None:
        return None, "github.app_id and installation_id are not set in the stack config"
    secrets = clients("secretsmanager")
    try:
        key = secrets.get_secret_value(SecretId=github.private_key_secret_name)["SecretString"]
    except secrets.exceptions.ClientError as error:
        return None, f"the App's private key ({github.private_key_secret_name}) is not readable: {error}"
    identity = GitHubAppKey(
        github.app_id, key, github.installation_id, base_url=github.api_url, api_version=github.api_version
    )
    opened.callback(identity.close)
    api = GitHubApi(
        identity.installation_token,
        github.installation_id,
        permissions=RUN_READS,
        base_url=github.api_url,
        api_version=github.api_version,
    )
    opened.callback(api.close)
    return api, None


def clock_time(at: float) -> str:
    """A time as a step's or a line's column shows it: UTC, to the millisecond."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]
