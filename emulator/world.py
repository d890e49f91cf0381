"""The whole system on one machine: local AWS, the fake GitHub, the stack deployed, simulated instances.

`with world(scratch) as w:` gives a running system in which a scenario only acts as GitHub's users
do (start workflow runs, cancel them) and as fate does (crash an instance, drop a webhook), and then
looks at what happened. The demo, the end-to-end tests and the emulator benchmark all run on it.
Timings are compressed (`compressed_config`): heartbeats every second, waits of seconds, not minutes.
"""

from __future__ import annotations

import logging
import os
import secrets
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.accounting import Accounting, account
from emulator.aws import INSTANCE_ARNS, LocalAws, local_aws
from emulator.aws_faults import AwsFaults
from emulator.deployment import Deployment, GitHubAppSetup, Timers, deploy
from emulator.ec2_events import SpotReclaim
from emulator.fake_github import FakeGitHub, FakeWorkflowRun, JobSpec
from emulator.harness.github_app import app_key
from emulator.simulated_instances import InstanceSettings, SimulatedInstances
from emulator.stack import RuntimeFactory
from emulator.timeline import RecordWatcher, Timeline, TimelineEvent
from runner_pool.adapters.job_records import JobSources
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.runner_scope import REGISTRATION_PERMISSIONS
from runner_pool.job_command import JobTarget
from runner_pool.observability import logger

APP_ID = 4242
INSTALLATION_ID = 77
OWNER = "octo-org"
REPOSITORY = f"{OWNER}/app"
STACK_NAME = "runner-pool-local"
METRICS_DISABLED = "POWERTOOLS_METRICS_DISABLED"
MOTO_STEP_FUNCTIONS = "moto.stepfunctions"
LOST_RUNNER_SECONDS = 6.0
"""How long GitHub waits for a silent runner before it fails its job (minutes on GitHub)."""
RECORD_WATCH_SECONDS = 0.25
SPOT_NOTICE_SECONDS = 5.0
"""From a spot interruption warning to the instance's end (two minutes on EC2)."""


COMPRESSED_TIMEOUTS: dict[str, float] = {
    "heartbeat_period_seconds": 1,
    "healthy_window_seconds": 4,
    "claim_registration_seconds": 10,
    "fleet_validation_seconds": 60,
    "fleet_validation_poll_seconds": 1,
    "release_receipt_seconds": 15,
    "release_receipt_poll_seconds": 1,
    "created_threshold_seconds": 120,
    "claimed_threshold_seconds": 100,
    "idle_seconds": 300,
}
"""The lifecycle's timeouts in seconds where the design has minutes; the agents beat every second."""


def compressed_config(**overrides: Any) -> StackConfig:
    """The stack config with the App on the fake GitHub's organisation, registering in runner groups (an
    organisation's default), and the compressed timeouts."""
    settings: dict[str, Any] = {
        "timeouts": COMPRESSED_TIMEOUTS,
        "github": {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": OWNER},
        **overrides,
    }
    return StackConfig.model_validate(settings)


def apps_settings(count: int, scope: str = OWNER) -> dict[str, Any]:
    """`github` settings of `count` Apps (github.apps), each installed on the world's owner: APP_ID and
    INSTALLATION_ID first, then the next ids, each with secrets of its own."""
    return {
        "apps": [
            {
                "app_id": str(APP_ID + n),
                "installation_id": INSTALLATION_ID + n,
                "private_key_secret_name": f"runner-pool/github-app-{n}-private-key",
                "webhook_secret_name": f"runner-pool/github-app-{n}-webhook-secret",
            }
            for n in range(count)
        ],
        "scope": scope,
    }


def accepted_permissions(config: StackConfig) -> dict[str, str]:
    """What the installation accepts: what the manifest for the stack's registration asks (with `checks:
    write` for the check run of jobs waiting for capacity), so a world registering in runner groups runs with
    no repository administration at all."""
    permission, level = REGISTRATION_PERMISSIONS[config.github.effective_registration]
    return {"actions": "write", "checks": "write", permission: level}


@dataclass
class World:
    aws: LocalAws
    github: FakeGitHub
    stack: Deployment
    instances: SimulatedInstances
    timeline: Timeline
    records: StateTable
    """The state table read through a client of the emulator's own (its reads are not counted)."""
    spot: SpotReclaim
    """EC2 taking spot instances back: warnings to the stack's rules and the instances' metadata, then the
    end of each instance after SPOT_NOTICE_SECONDS (emulator/ec2_events.py)."""

    def start_run(self, workflow: str, *jobs: JobSpec) -> FakeWorkflowRun:
        return self.github.actions.start_run(REPOSITORY, workflow, jobs)

    def events(self) -> list[TimelineEvent]:
        """The timeline so far, with the jobs as the fake GitHub saw them."""
        with self.github.state.lock:
            jobs = list(self.github.state.jobs.values())
        return self.timeline.events(jobs)

    def accounting(self) -> Accounting:
        return account(self.aws.client("ec2"), self.records, self.stack.stack_name)

    def job_target(self) -> JobTarget:
        """Where `runner-pool job` and `connect` read this stack's records, as its outputs and functions'
        environment would give them."""
        settings = self.stack.plane.settings
        sources = JobSources(
            state_table=settings.table_name,
            ledger_table=settings.require("idempotency_table_name", "the job story"),
            provision_machine_arn=settings.require("provision_state_machine_arn", "the job story"),
            release_machine_arn=settings.require("release_state_machine_arn", "the job story"),
        )
        return JobTarget(sources, settings.config, log_group=self.stack.job_log_group)


@contextmanager
def world(
    scratch: Path,
    *,
    config: StackConfig | None = None,
    instance_settings: InstanceSettings | None = None,
    timers: Timers | None = None,
    lost_runner_seconds: float = LOST_RUNNER_SECONDS,
    runtime: RuntimeFactory | None = None,
    record_watch_seconds: float = RECORD_WATCH_SECONDS,
    faults: AwsFaults | None = None,
) -> Iterator[World]:
    """`runtime` runs the stack's functions (emulator/stack.py; in this process by default).
    `record_watch_seconds`: how often the timeline looks at every live record (a sweep of the whole
    threshold index, which a world of hundreds of instances wants less often). `faults`: the Lambdas'
    calls failing as AWS's do, on a seeded fraction (emulator/aws_faults.py)."""
    config = config or compressed_config()
    key = app_key()
    scope = str(config.github.scope or REPOSITORY)
    app = GitHubAppSetup(APP_ID, INSTALLATION_ID, key.private_pem, scope)
    # Each App of a config of several (apps_settings) has a key of its own and is installed on the owner.
    more_keys = {
        int(more.app_id): (more.installation_id, app_key(index))
        for index, more in enumerate(config.github.every_app[1:], start=1)
    }
    with (
        lambdas_quiet(),
        local_aws(state_machines=True, faults=faults) as aws,
        FakeGitHub(APP_ID, key.public_pem, lost_runner_seconds=lost_runner_seconds) as github,
    ):
        github.state.add_installation(INSTALLATION_ID, OWNER, accepted_permissions(config))
        for app_id, (installation_id, more_key) in more_keys.items():
            github.state.add_app(app_id, more_key.public_pem)
            github.state.add_installation(installation_id, OWNER, accepted_permissions(config), app_id=app_id)
        with deploy(
            aws,
            config,
            github,
            app,
            webhook_secret=secrets.token_hex(20),
            stack_name=STACK_NAME,
            timers=timers,
            runtime=runtime,
            more_apps=[
                GitHubAppSetup(app_id, installation_id, more_key.private_pem, scope)
                for app_id, (installation_id, more_key) in more_keys.items()
            ],
        ) as stack:
            timeline = Timeline()
            records = StateTable(
                stack.plane.settings.table_name,
                config.timeouts,
                SystemClock(),
                aws.client("dynamodb"),
                arns=INSTANCE_ARNS,
            )
            watcher = RecordWatcher(records, timeline, record_watch_seconds).start()
            try:
                with SimulatedInstances(
                    aws,
                    table_name=stack.plane.settings.table_name,
                    credentials_key_id=stack.credentials_key_id,
                    notice_queue_url_prefix=stack.plane.settings.notice_queue_url_prefix,
                    log_group_name=stack.job_log_group,
                    stack_tag=stack.stack_tag,
                    scratch=scratch,
                    timeline=timeline,
                    settings=instance_settings,
                ) as instances:
                    spot = SpotReclaim(
                        aws.client("ec2"), stack.ec2_events.put, instances.metadata, SPOT_NOTICE_SECONDS
                    )
                    try:
                        yield World(aws, github, stack, instances, timeline, records, spot)
                    finally:
                        spot.close()
            finally:
                watcher.stop()
                # Executions still under way when local AWS stops fail loudly in moto's log; they are
                # cut short by the emulator's end, not by a fault of theirs. Stopped first, so that none
                # goes on into the next world of this process.
                logging.getLogger(MOTO_STEP_FUNCTIONS).setLevel(logging.CRITICAL)
                stack.stop_executions()


@contextmanager
def lambdas_quiet() -> Iterator[None]:
    """Our Lambdas log and publish metrics on stdout, as on AWS (to CloudWatch); here only warnings show."""
    saved = os.environ.get(METRICS_DISABLED)
    os.environ[METRICS_DISABLED] = "true"
    level = logger.log_level
    logger.setLevel(logging.WARNING)
    moto_level = logging.getLogger(MOTO_STEP_FUNCTIONS).level
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No application metrics to publish")
            yield
    finally:
        logging.getLogger(MOTO_STEP_FUNCTIONS).setLevel(moto_level)
        logger.setLevel(level)
        if saved is None:
            os.environ.pop(METRICS_DISABLED, None)
        else:
            os.environ[METRICS_DISABLED] = saved
