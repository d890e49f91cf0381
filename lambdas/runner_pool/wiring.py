"""The control plane's adapters, built once per Lambda process from its environment.

Handlers ask `control_plane()` for what they need; each adapter is built on first use, so a function
only creates the clients it calls. Tests and the local emulator install a ControlPlane of their
own (`use_control_plane`), with their clock, their clients and a GitHub App aimed at the fake; a
harness that runs several functions in one process gives each invocation its function's own
(`invoked_with`), as each Lambda builds its own from its environment.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cached_property
from typing import Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.capacity_waits import CapacityWaits
from runner_pool.adapters.class_history import DynamoDbClassHistory
from runner_pool.adapters.cost_ledger import DynamoDbCostLedger
from runner_pool.adapters.demand_ledger import DynamoDbLedger
from runner_pool.adapters.executions import Executions
from runner_pool.adapters.fleet import Fleet, FleetSetup, LaunchTemplate
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.github_apps import GitHubApps, UsableOrNot
from runner_pool.adapters.github_token_function import TokenFunction, invoking_client
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.notice_queues import NoticeQueues
from runner_pool.adapters.pool_queues import PoolQueues
from runner_pool.adapters.recent_demand import RecentDemand
from runner_pool.adapters.registration_budget import DynamoDbRegistrationBudget
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.spot_breaker import DynamoDbSpotBreaker
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Clock, SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.github_apps import GitHubAppEntry
from runner_pool.domain.github_tokens import AppIdentity
from runner_pool.domain.pickup import PickupManager
from runner_pool.domain.registration_budget import HourlyQuota
from runner_pool.domain.runners import GitHubAuthError
from runner_pool.environment import STACK_TAG_KEY, ControlPlaneSettings
from runner_pool.observability import logger
from runner_pool.steps.class_history import HistoryNotes
from runner_pool.steps.demand_starts import DemandStarts
from runner_pool.steps.dispatcher import Dispatcher
from runner_pool.steps.follow_up import FollowUpSteps
from runner_pool.steps.reruns import Reruns
from runner_pool.steps.run_trust import RunTrust
from runner_pool.steps.spend import Spend

ClientFactory = Callable[[str], Any]
"""service name → boto3 client."""


class ControlPlane:
    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        clock: Clock | None = None,
        clients: ClientFactory | None = None,
        backoff: Backoff | None = None,
        github: GitHubApp | GitHubApps | None = None,
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._clients: ClientFactory = clients or _default_client
        self.backoff = backoff or Backoff()
        """Paces the state table's retries of whole operations; single calls are retried by botocore."""
        self._github = github
        self.pause = pause
        """How a step waits briefly in-line (tests and the emulator let simulated time pass instead)."""
        self._made: dict[str, Any] = {}
        self._making = threading.Lock()
        """Clients are made one at a time: boto3's default session is not safe to make clients from on
        several threads at once (its Session is not thread-safe, boto3 guide "Multithreading or
        multiprocessing with clients"), and a step makes some in the background (steps.hand_over)."""
        self._github_made = threading.RLock()
        self._app_keys: dict[str, GitHubAppKey] = {}

    @property
    def config(self) -> StackConfig:
        return self.settings.config

    def client(self, service: str) -> Any:
        """One client per service for the life of the process (boto3 clients are thread-safe)."""
        with self._making:
            if service not in self._made:
                self._made[service] = self._clients(service)
            return self._made[service]

    @cached_property
    def state_table(self) -> StateTable:
        return StateTable(
            self.settings.table_name,
            self.config.timeouts,
            self.clock,
            self.client("dynamodb"),
            self.backoff,
            arns=self.instance_arns,
        )

    @cached_property
    def pool_queues(self) -> PoolQueues:
        return PoolQueues(
            self.settings.require("pool_queue_url_prefix", "the pool queues"),
            self.config.resource_classes,
            self.client("sqs"),
        )

    @cached_property
    def notices(self) -> NoticeQueues | None:
        """The instances' notice queues; None where the stack gives no prefix (then none is sent)."""
        prefix = self.settings.notice_queue_url_prefix
        if not prefix:
            return None
        return NoticeQueues(
            prefix,
            self.client("sqs"),
            stack_tag=(STACK_TAG_KEY, self.settings.stack_name),
            arns=self.instance_arns,
        )

    @cached_property
    def pickup(self) -> PickupManager:
        return PickupManager(
            self.pool_queues,
            self.state_table,
            self.clock,
            self.config.pickup,
            reuse=self.config.reuse,
            partitions=self.pool_queues.partitions,
        )

    @cached_property
    def fleet(self) -> Fleet:
        setup = FleetSetup(
            subnet_ids=self.settings.subnet_ids,
            templates={
                arch: LaunchTemplate(template) for arch, template in self.settings.launch_templates.items()
            },
            stack_tag_key=STACK_TAG_KEY,
            stack_tag_value=self.settings.stack_name,
            session_templates={
                arch: LaunchTemplate(template)
                for arch, template in self.settings.session_launch_templates.items()
            },
            session_classes=self.config.session_classes,
        )
        return Fleet(setup, self.client("ec2"))

    @cached_property
    def credentials(self) -> RunnerCredentials:
        return RunnerCredentials(
            self.settings.table_name,
            self.config.timeouts,
            self.clock,
            key_id=self.settings.require("credentials_key_id", "encrypting runner configs"),
            dynamodb=self.client("dynamodb"),
            kms=self.client("kms"),
        )

    @cached_property
    def registration_budget(self) -> DynamoDbRegistrationBudget | GitHubApps:
        """The App's shared budget of JIT registrations, an item of the state table; with several Apps,
        each App's, a take going to the App with the most left (adapters/github_apps.py)."""
        apps = self.config.github.every_app
        return self.github_apps or self._budget_of(apps[0].app_id if apps else "app")

    def _budget_of(self, app_id: str) -> DynamoDbRegistrationBudget:
        github = self.config.github
        return DynamoDbRegistrationBudget(
            self.settings.table_name,
            app_id,
            per_minute=github.registrations_per_minute,
            burst=github.registration_burst,
            clock=self.clock,
            client=self.client("dynamodb"),
        )

    @cached_property
    def spot_breaker(self) -> DynamoDbSpotBreaker:
        """The classes whose spot demand goes on-demand for a while, an item of the state table per class."""
        return DynamoDbSpotBreaker(
            self.settings.table_name, self.config.fleet.spot_breaker, self.clock, self.client("dynamodb")
        )

    @cached_property
    def capacity_waits(self) -> CapacityWaits:
        """Run keys whose jobs wait for EC2 capacity, an item of the state table each."""
        return CapacityWaits(
            self.settings.table_name,
            self.clock,
            self.client("dynamodb"),
            first_backoff=self.config.fleet.capacity_retry_seconds,
        )

    @cached_property
    def github_apps(self) -> GitHubApps | None:
        """The stack's Apps as one registry and budget, when it has more than one (else None)."""
        apps = self.config.github.every_app
        if len(apps) < 2:
            return None
        return GitHubApps(
            {app.app_id: functools.partial(self._github_app, app) for app in apps},
            {app.app_id: self._budget_of(app.app_id) for app in apps},
            self.clock,
        )

    @cached_property
    def recent_demand(self) -> RecentDemand:
        """Runs with recent demand, for refresh to reconcile with GitHub's queued jobs."""
        return RecentDemand(self.settings.table_name, self.clock, self.client("dynamodb"))

    @cached_property
    def class_history(self) -> DynamoDbClassHistory:
        """Each class's arrivals and boot times, for adaptive sizing."""
        return DynamoDbClassHistory(self.settings.table_name, self.clock, self.client("dynamodb"))

    @cached_property
    def spend(self) -> Spend:
        """The cost items (a hand-over's, an instance's life) and the daily budget, in the state table."""
        return Spend(
            lambda: DynamoDbCostLedger(self.settings.table_name, self.client("dynamodb")),
            self.clock,
            self.config,
        )

    @cached_property
    def history_notes(self) -> HistoryNotes:
        return HistoryNotes(self.class_history, self.config, self.clock)

    def executions(
        self, provision_machine_arn: str | None = None, *, release_machine_arn: str | None = None
    ) -> Executions:
        """Starts provisions and releases, each on the machine given (e.g. a step's own machine), else on
        the configured one."""
        provision = provision_machine_arn or self.settings.provision_state_machine_arn or ""
        release = release_machine_arn or self.settings.release_state_machine_arn or ""
        return Executions(provision, release, self.client("stepfunctions"))

    def dispatcher(self) -> Dispatcher:
        """Turns a batch of demand into executions over the demand ledger."""
        ledger = self._ledger()
        return Dispatcher(
            self._demand_starts(ledger),
            reruns=self._reruns(ledger),
            tier_group=lambda: self.github.keep_instant_group_in_step(),  # noqa: PLW0108 - GitHub on first use
            history=self.history_notes,
        )

    def reruns(self) -> Reruns:
        """Re-runs of interrupted jobs' runs, over the demand ledger (for the release's give back)."""
        return self._reruns(self._ledger())

    def _reruns(self, ledger: DynamoDbLedger) -> Reruns:
        enabled = self.config.fleet.rerun_interrupted_jobs
        return Reruns(ledger, lambda: self.github, self.clock, enabled=enabled)

    def follow_up_steps(self) -> FollowUpSteps:
        """The follow-up state machine's steps: gather a follow-up batch and start its provisions."""
        return FollowUpSteps(self._demand_starts(self._ledger()), run_jobs=lambda: self.github)

    def _run_trust(self, ledger: DynamoDbLedger) -> RunTrust:
        """Runs' levels of trust: from their `requested` deliveries, else read from GitHub (built on first
        use) within the hourly share the registration budget keeps."""
        return RunTrust(
            ledger,
            self.clock,
            by_event=self.config.reuse.trust_by_event,
            reader=lambda: self.github,
            hourly=self.registration_budget.hourly,
        )

    def _demand_starts(self, ledger: DynamoDbLedger) -> DemandStarts:
        """Starts demand over the ledger on the provision, release and follow-up machines, pausing as
        the Lambda does, with runs' levels of trust (the dispatcher's and the follow-up's steps share it)."""
        settings = self.settings
        executions = Executions(
            settings.require("provision_state_machine_arn", "starting provisions"),
            settings.release_state_machine_arn or "",  # the follow-up machine's steps start no release
            self.client("stepfunctions"),
            follow_up_machine_arn=settings.follow_up_state_machine_arn,
        )
        return DemandStarts(ledger, executions, self.clock, self.pause, self._run_trust(ledger))

    def _ledger(self) -> DynamoDbLedger:
        return DynamoDbLedger(
            self.settings.require("idempotency_table_name", "the demand ledger"),
            self.clock,
            self.client("dynamodb"),
            self.backoff,
        )

    @cached_property
    def instance_arns(self) -> InstanceArns:
        """Where the stack's instances live (this region, this account): what keys their items.

        The account comes from the environment when the stack gives it, else STS answers (any
        principal may ask), once per process.
        """
        dynamodb = self.client("dynamodb")
        if self.settings.account_id:
            return InstanceArns(dynamodb.meta.partition, dynamodb.meta.region_name, self.settings.account_id)
        return InstanceArns.of_caller(dynamodb, self.client("sts"))

    def instance_arn(self, instance_id: str) -> str:
        return self.instance_arns.arn(instance_id)

    @property
    def github(self) -> GitHubApp | GitHubApps:
        with self._github_made:  # once, also when a step's background thread asks first
            if self._github is None:
                apps = self.config.github.every_app
                self._github = self.github_apps or self._github_app(apps[0] if apps else None)
            return self._github

    def _github_app(self, app: GitHubAppEntry | None) -> GitHubApp:
        """The App as this function may act as it: through the token function, which the stack names to
        every function but itself; with the key only where no token function is named (the token
        function's own process, a local run). One of several Apps tells an unusable App apart."""
        github = self.config.github
        if app is None or github.scope is None:
            raise LookupError("github.installation_id and github.scope must be configured")
        token_function = self.settings.github_token_function_name
        several = self.github_apps is not None
        identity: AppIdentity = (
            TokenFunction(
                token_function, app.installation_id, self.client("lambda"), app.app_id if several else None
            )
            if token_function
            else self.app_key_of(app.app_id if several else None)
        )
        on_hourly_quota = self.publish_hourly
        if self.github_apps is not None:
            identity = UsableOrNot(identity)
            on_hourly_quota = functools.partial(self.github_apps.observe, app.app_id)
        return GitHubApp(
            identity,
            github.scope,
            base_url=github.api_url,
            api_version=github.api_version,
            clock=self.clock,
            registration=github.effective_registration,
            groups_allow_public_repositories=github.runner_groups_allow_public_repositories,
            on_hourly_quota=on_hourly_quota,
        )

    @property
    def app_key(self) -> GitHubAppKey:
        """The (first) App's private key at work (Secrets Manager): only the token function's role may
        read it."""
        return self.app_key_of(None)

    def app_key_of(self, app_id: str | None) -> GitHubAppKey:
        """The private key of the App `app_id` (None: the first) at work, read once; a key GitHub could
        never take (not an RSA PEM) is GitHub's refusal of the App (GitHubAuthError), as GitHub would."""
        github = self.config.github
        apps = {app.app_id: app for app in github.every_app}
        app = apps.get(app_id) if app_id is not None else next(iter(apps.values()), None)
        if app is None:
            raise LookupError(f"no App {app_id or ''} configured (github.app_id or github.apps)")
        with self._github_made:
            if app.app_id not in self._app_keys:
                secret = self.client("secretsmanager").get_secret_value(SecretId=app.private_key_secret_name)
                try:
                    self._app_keys[app.app_id] = GitHubAppKey(
                        app.app_id,
                        secret["SecretString"],
                        app.installation_id,
                        base_url=github.api_url,
                        api_version=github.api_version,
                        clock=self.clock,
                    )
                except ValueError as exc:
                    raise GitHubAuthError(f"App {app.app_id}: {exc}", 401) from exc
            return self._app_keys[app.app_id]

    def publish_hourly(self, quota: HourlyQuota) -> None:
        """GitHub's hourly remainder, read off an answer, shared with every process through the budget.
        Bookkeeping: a failed write never fails the GitHub call it rode on (the next answer tries again)."""
        budget = self.registration_budget
        if isinstance(budget, GitHubApps):  # several Apps: each App's own answers go to its own budget
            return
        try:
            budget.observe(quota)
        except Exception:
            logger.warning("GitHub's hourly remainder not shared with the budget", exc_info=True)


def _default_client(service: str) -> Any:
    if service == "lambda":  # only ever to invoke the token function, which may take longer than a call
        return invoking_client()
    return aws_clients.client(service)


_current: ControlPlane | None = None
_invoked: ContextVar[ControlPlane | None] = ContextVar("runner_pool_invoked_plane", default=None)


def control_plane() -> ControlPlane:
    """The process's control plane: built from the environment on first use (a Lambda's cold start)."""
    global _current  # noqa: PLW0603 - one per Lambda process, by design
    invoked = _invoked.get()
    if invoked is not None:
        return invoked
    if _current is None:
        _current = ControlPlane(ControlPlaneSettings())
    return _current


def use_control_plane(plane: ControlPlane | None) -> None:
    """Install `plane` for every handler of this process (tests, the emulator); None forgets it."""
    global _current  # noqa: PLW0603
    _current = plane


@contextmanager
def invoked_with(plane: ControlPlane) -> Iterator[None]:
    """`plane` for the handlers this thread runs until the block ends, over `use_control_plane`'s."""
    token = _invoked.set(plane)
    try:
        yield
    finally:
        _invoked.reset(token)
