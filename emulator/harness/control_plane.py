"""A control plane on moto for integration tests: the stack's resources, a fake GitHub App, our state machines.

`local_control_plane()` builds, inside one moto mock (DynamoDB's item atomicity on, Step Functions
executing ASL), the local stack (emulator/stack.py) with the state table and what instances need (pool
queues, a network and launch templates, a KMS key for runner configs, the App's private key). It starts
a fake GitHub with the App installed on the repository, and runs the stack with a ControlPlane on a
ManualClock, EC2's CreateFleet simulated, no backoff sleeps, and a GitHubApp aimed at the fake.
`local.deploy(machine)` puts one of our state machines into moto as the synthesized template defines it.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
from moto import mock_aws

from emulator import aws
from emulator.accounting import Accounting, account
from emulator.aws import behaving_as_aws
from emulator.ec2_events import SpotReclaim
from emulator.ec2_fleet import SimulatedEc2
from emulator.fake_github import FakeGitHub
from emulator.harness.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, app_key
from emulator.iam_check import PolicyCheck
from emulator.stack import DeployedMachine, FunctionSpec, InProcess, LocalStack, handler_function
from emulator.step_functions import (
    MOTO_CONFIG,
    Execution,
    Handler,
    LocalStateMachines,
    lambdas_in_process,
    stop_running_executions,
    without_waiting,
)
from runner_pool.adapters import aws_clients
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import Epoch, ManualClock
from runner_pool.domain.config import ReuseSettings, StackConfig
from runner_pool.domain.executions import runner_name
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import InstanceFacts, InstanceRecord, PoolMessage, Signal, TransitionResult
from runner_pool.domain.refresh import RefreshReport, refresh_tick
from runner_pool.domain.trust import TrustLevel
from runner_pool.environment import ControlPlaneSettings
from runner_pool.handlers.refresh import refresh_of
from runner_pool.steps.release import Release
from runner_pool.wiring import ControlPlane

REGION = aws.REGION
NO_WAIT = Backoff(sleep=lambda _seconds: None)
"""The house backoff (whole operations) with its sleeps zeroed: a world proves the retry path, not the
waiting."""
STACK_NAME = "runner-pool-test"
MAX_RUNTIME_MINUTES = 60


@functools.cache
def aws_session() -> boto3.session.Session:
    """One session for every test of the process: each new one loads botocore's service models again."""
    return boto3.session.Session(region_name=REGION)


def client(service: str) -> Any:
    """A client as the product builds it (aws_clients), from the shared session."""
    return aws_clients.client(service, aws_session())


def stack_config(**settings: Any) -> StackConfig:
    """The stack config with the test App configured, and `settings` (e.g. warm_pool_minimum) on top."""
    github = {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": f"{OWNER}/{REPO}"}
    return StackConfig.model_validate({"github": github, **settings})


@dataclass
class LocalControlPlane:
    """The installed ControlPlane and what stands behind it, with builders for instances in each state."""

    stack: LocalStack
    clock: ManualClock
    github: FakeGitHub
    ec2: SimulatedEc2
    sqs: Any
    _launches: Iterator[int] = field(default_factory=itertools.count)

    @property
    def plane(self) -> ControlPlane:
        return self.stack.plane

    @property
    def policy_check(self) -> PolicyCheck:
        """Every AWS call the handlers make, checked against the synthesized stack's IAM policies."""
        return self.stack.policy_check

    @property
    def table(self) -> StateTable:
        return self.plane.state_table

    @property
    def config(self) -> StackConfig:
        return self.plane.config

    def release(self, reuse: ReuseSettings | None = None) -> Release:
        """The release steps over this plane's adapters; without `reuse` none retires an instance."""
        plane = self.plane
        return Release(
            plane.state_table,
            lambda: plane.pool_queues,
            lambda: plane.github,
            clock=self.clock,
            timeouts=plane.config.timeouts,
            reuse=reuse,
        )

    # --- instances -------------------------------------------------------------------------------

    def launch(
        self, count: int = 1, run_key: str | None = None, resource_class: str = "large"
    ) -> list[InstanceFacts]:
        """Instances launched through the real Fleet and recorded as created, for a run (of trusted jobs,
        whose instances go back to the pool after them) or for the pool."""
        key = f"test-launch-{next(self._launches)}"
        if run_key is None:
            request = LaunchRequest.for_pool(self.config, resource_class, count, key)
        else:
            request = LaunchRequest.for_run(self.config.spec_for(run_key), count, key)
        launched = list(self.plane.fleet.launch(request).launched)
        for facts in launched:
            self.table.create(facts, run_key, trust=TrustLevel.TRUSTED if run_key else None)
        return launched

    def register_runner(self, instance_id: str, run_key: str, claim: str = "test") -> int:
        """A JIT runner registered for the run on GitHub and noted on the (created or claimed) record."""
        runner = self.plane.github.jit_config(runner_name(instance_id, claim), [run_key])
        self.table.record_runner(instance_id, run_key, runner.runner_id)
        return runner.runner_id

    def running(self, run_key: str, count: int = 1) -> list[InstanceRecord]:
        """Instances created for the run, their runners registered, and activated: running the run's jobs."""
        records = []
        for facts in self.launch(count, run_key, self.config.spec_for(run_key).resource_class):
            self.register_runner(facts.instance_id, run_key)
            self.table.write_signal(facts.instance_id, Signal.UD_REG_OK, run_key)
            records.append(_applied(self.table.activate(facts.instance_id, run_key, MAX_RUNTIME_MINUTES)))
        return records

    def pooled(self, count: int = 1, resource_class: str = "large") -> list[InstanceRecord]:
        """Instances launched for the pool, admitted to idle and offered in their class's queue."""
        records = []
        for facts in self.launch(count, None, resource_class):
            idle = _applied(self.table.admit(facts.instance_id))
            self.plane.pool_queues.offer(PoolMessage.for_idle(idle))
            records.append(idle)
        return records

    def record(self, instance_id: str) -> InstanceRecord:
        found = self.table.get(instance_id)
        assert found is not None, f"{instance_id} has no record"
        return found

    # --- what the world looks like ------------------------------------------------------------------

    def drain_pool(self, resource_class: str = "large") -> list[PoolMessage]:
        """Every message in the class's pool queues (each usage and architecture), taken out of them."""
        messages: list[PoolMessage] = []
        for url in pool_queue_urls(self.plane.settings, resource_class):
            while batch := self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
                messages += [PoolMessage.from_body(message["Body"]) for message in batch]
        return messages

    def ec2_state(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(reservations[0]["Instances"][0]["State"]["Name"])

    # --- the schedule ------------------------------------------------------------------------------

    def refresh(self, at: Epoch | None = None) -> dict[str, Any]:
        """One scheduled refresh through its Lambda handler, for the schedule slot of `at` (default: now)."""
        return dict(self.stack.invoke("refresh", scheduled_event(self.clock.now() if at is None else at)))

    def hear(self, event: dict[str, Any]) -> dict[str, Any]:
        """One EC2 event (emulator/ec2_events.py) delivered to the interruptions function, as its rules do."""
        return dict(self.stack.invoke("interruptions", event))

    def spot_reclaim(self) -> SpotReclaim:
        """EC2 taking spot instances back, its events delivered to the interruptions function."""
        return SpotReclaim(self.ec2, self.hear)

    def refreshes_at_once(self) -> list[RefreshReport]:
        """Two refreshes of the same schedule slot at once, each on its own thread: the domain's run, as
        Powertools' metrics are one set per process, which two handlers in one process would share."""
        tick = refresh_tick(self.clock.now(), self.config)
        start = threading.Barrier(2, timeout=30)
        reports: list[RefreshReport] = []

        def refresh() -> None:
            start.wait()
            reports.append(refresh_of(self.plane).run(tick))

        threads = [threading.Thread(target=refresh) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return reports

    def deploy(self, machine: str) -> LocalStateMachine:
        """One of our state machines in moto, as the synthesized template defines it."""
        return LocalStateMachine(self.stack, self.stack.create_state_machine(machine))

    def accounting(self) -> Accounting:
        """Every EC2 instance with the stack's tag has a live record, and every live record an instance
        (or, expired, a terminated one that refresh has yet to mark)."""
        return account(self.ec2, self.table, STACK_NAME, now=self.clock.now())


@contextmanager
def local_control_plane(
    config: StackConfig | None = None,
    clock: ManualClock | None = None,
    *,
    pause: Callable[[float], None] = time.sleep,
) -> Iterator[LocalControlPlane]:
    """`pause` is how steps wait in-line (ControlPlane.pause): a test lets simulated time pass there."""
    clock = clock or ManualClock()
    config = config or stack_config()
    key = app_key()
    with (
        mock_aws(config=MOTO_CONFIG),  # type: ignore[call-overload]
        behaving_as_aws(),
        FakeGitHub(APP_ID, key.public_pem, clock=clock) as github,
    ):
        github.state.add_installation(INSTALLATION_ID, OWNER)
        ec2 = SimulatedEc2(client("ec2"))
        stack = LocalStack(config, client, stack_name=STACK_NAME)
        stack.create_state_table()
        stack.create_instance_resources(key.private_pem)
        if config.github.scope is None:
            raise ValueError("a local control plane registers runners at github.scope: the config names none")
        app = GitHubApp(
            GitHubAppKey(APP_ID, key.private_pem, INSTALLATION_ID, base_url=github.url, clock=clock),
            config.github.scope,
            base_url=github.url,
            clock=clock,
            registration=config.github.effective_registration,
            groups_allow_public_repositories=config.github.runner_groups_allow_public_repositories,
            on_hourly_quota=lambda quota: stack.plane.publish_hourly(quota),  # noqa: PLW0108 (plane made later)
        )
        functions_clients: dict[str, Any] = {"ec2": ec2}
        try:
            with stack.running(
                clients=lambda service: functions_clients.get(service) or client(service),
                clock=clock,
                backoff=NO_WAIT,
                github=app,
                pause=pause,
            ):
                yield LocalControlPlane(stack, clock, github, ec2, client("sqs"))
        finally:
            stop_running_executions(client("stepfunctions"))
            app.close()


# --- state machines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalStateMachine:
    """One of our state machines in moto; `run` executes it to the end with its tasks on our handlers."""

    stack: LocalStack
    deployed: DeployedMachine

    @property
    def arn(self) -> str:
        return self.deployed.arn

    @property
    def machines(self) -> LocalStateMachines:
        return self.deployed.machines

    @property
    def handlers(self) -> dict[str, Handler]:
        """The real handler of each task, by its function's name in the handler module (`give_back`)."""
        return {name: handler_function(spec.handler) for name, spec in self._functions.items()}

    @property
    def _functions(self) -> dict[str, FunctionSpec]:
        """The machine's functions, by their handler's name in the handler module (`give_back`)."""
        specs = (self.stack.function(name) for name in self.deployed.spec.functions.values())
        return {spec.handler.rsplit(".", 1)[-1]: spec for spec in specs}

    @property
    def routed(self) -> dict[str, Handler]:
        """Each of the machine's moto functions → the stack's handler, for `lambdas_in_process`."""
        return self.stack.routes(self.deployed.spec.machine)

    def run(
        self,
        payload: Any,
        *,
        name: str | None = None,
        on_wait: Callable[[int], None] | None = None,
        replace: Mapping[str, Handler] | None = None,
    ) -> Execution:
        """`on_wait(seconds)` stands in for each Wait state; `replace` swaps handlers (`swapped`)."""
        with without_waiting(on_wait), self.swapped(replace or {}), lambdas_in_process(self.routed):
            return self.machines.run(self.arn, payload, name=name)

    def swapped(self, replace: Mapping[str, Handler]) -> AbstractContextManager[None]:
        """Swap handlers by their name in the handler module (`begin`); they still run as their function."""
        runtime = self.stack.runtime
        assert isinstance(runtime, InProcess), "handlers are swapped in-process only"
        functions = self._functions
        return runtime.replacing({functions[handler].name: function for handler, function in replace.items()})


def scheduled_event(at: Epoch) -> dict[str, Any]:
    """What EventBridge sends a scheduled rule's target; `time` is the schedule slot."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:123456789012:rule/{STACK_NAME}-refresh"],
        "detail": {},
    }


def _applied(result: TransitionResult) -> InstanceRecord:
    assert result.succeeded, result
    assert result.record is not None
    return result.record


def pool_queue_urls(settings: ControlPlaneSettings, resource_class: str) -> list[str]:
    """The URLs of a class's pool queues, one per usage and architecture, as the functions name them."""
    prefix = settings.require("pool_queue_url_prefix", "reading the pool")
    return [partition.queue_name(prefix) for partition in PoolPartition.every([resource_class])]
