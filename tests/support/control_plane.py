"""A control plane on moto for integration tests: the stack's resources, a fake GitHub App, our state machines.

`local_control_plane()` creates, inside one moto mock (DynamoDB's item atomicity on, Step Functions
executing ASL), what the stack deploys: the state table, one pool queue per class, a network and
launch templates, a KMS key for runner configs and the App's private key in Secrets Manager. It
starts a fake GitHub with the App installed on the repository, and installs for every handler of
this process a ControlPlane on a ManualClock, with EC2's CreateFleet simulated, no backoff sleeps,
and a GitHubApp aimed at the fake. `deploy(machine)` puts one of infra/statemachines/ into moto,
each `${<Pascal>Function}` routed to `runner_pool.handlers.<machine>.<snake>`.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

from emulator import iam_check
from emulator.accounting import Accounting, account
from emulator.atomic_dynamodb import atomic_items
from emulator.aws import ACCOUNT
from emulator.deployment import state_machine_name
from emulator.ec2_fleet import SimulatedEc2
from emulator.fake_github import FakeGitHub
from emulator.iam_check import PolicyCheck, as_function, detach_policy_check
from emulator.resources import create_launch_templates, create_network, create_pool_queues, create_state_table
from emulator.step_functions import (
    MOTO_CONFIG,
    Execution,
    Handler,
    LambdaContext,
    LocalStateMachines,
    function_arn,
    lambdas_in_process,
    render_asl,
    without_waiting,
)
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.state_table import StateTable, TransitionResult
from runner_pool.domain.clock import Epoch, ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import runner_name
from runner_pool.domain.fleet import LaunchRequest
from runner_pool.domain.records import InstanceFacts, InstanceRecord, PoolMessage, Signal
from runner_pool.domain.runner_scope import RepositoryScope
from runner_pool.environment import ControlPlaneSettings
from runner_pool.handlers.refresh import refresh as refresh_handler
from runner_pool.wiring import ControlPlane, use_control_plane
from tests.conftest import NO_WAIT, REGION
from tests.support.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, AppKey, generate_app_key

STACK_NAME = "runner-pool-test"
TABLE_NAME = "runner-pool-state"
STATE_MACHINES = Path(__file__).resolve().parents[2] / "infra" / "statemachines"
MAX_RUNTIME_MINUTES = 60
_FUNCTION = re.compile(r"\$\{([A-Z][A-Za-z0-9]*)Function\}")


@functools.cache
def aws_session() -> boto3.session.Session:
    """One session for every test of the process: each new one loads botocore's service models again."""
    return boto3.session.Session(region_name=REGION)


def client(service: str) -> Any:
    return aws_session().client(service)  # type: ignore[call-overload]


@functools.cache
def app_key() -> AppKey:
    """One App key per test process: generating RSA keys is the slow part of a fake GitHub."""
    return generate_app_key()


def stack_config(**settings: Any) -> StackConfig:
    """The stack config with the test App configured, and `settings` (e.g. warm_pool_minimum) on top."""
    github = {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": f"{OWNER}/{REPO}"}
    return StackConfig.model_validate({"github": github, **settings})


@dataclass
class LocalControlPlane:
    """The installed ControlPlane and what stands behind it, with builders for instances in each state."""

    plane: ControlPlane
    clock: ManualClock
    github: FakeGitHub
    ec2: SimulatedEc2
    sqs: Any
    policy_check: PolicyCheck
    """Every AWS call the handlers make, checked against the synthesized stack's IAM policies."""
    _launches: Iterator[int] = field(default_factory=itertools.count)

    @property
    def table(self) -> StateTable:
        return self.plane.state_table

    @property
    def config(self) -> StackConfig:
        return self.plane.config

    # --- instances -------------------------------------------------------------------------------

    def launch(
        self, count: int = 1, run_key: str | None = None, resource_class: str = "large"
    ) -> list[InstanceFacts]:
        """Instances launched through the real Fleet and recorded as created, for a run or for the pool."""
        key = f"test-launch-{next(self._launches)}"
        if run_key is None:
            request = LaunchRequest.for_pool(self.config, resource_class, count, key)
        else:
            request = LaunchRequest.for_run(self.config.spec_for(run_key), count, key)
        launched = list(self.plane.fleet.launch(request).launched)
        for facts in launched:
            self.table.create(facts, run_key)
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
        """Every message in the class's pool queue, taken out of it."""
        url = self.plane.settings.pool_queue_urls[resource_class]
        messages: list[PoolMessage] = []
        while batch := self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            messages += [PoolMessage.from_body(message["Body"]) for message in batch]
        return messages

    def ec2_state(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(reservations[0]["Instances"][0]["State"]["Name"])

    # --- the schedule ------------------------------------------------------------------------------

    def refresh(self, at: Epoch | None = None) -> dict[str, Any]:
        """One scheduled refresh through its Lambda handler, for the schedule slot of `at` (default: now)."""
        return as_function(f"{HANDLERS}.refresh.refresh", refresh_handler)(
            scheduled_event(self.clock.now() if at is None else at), lambda_context("refresh")
        )

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
        mock_aws(config=MOTO_CONFIG),  # type: ignore[arg-type]
        atomic_items(),
        FakeGitHub(APP_ID, key.public_pem, clock=clock) as github,
    ):
        github.state.add_installation(INSTALLATION_ID, OWNER)
        ec2 = SimulatedEc2(client("ec2"))
        sqs = client("sqs")
        dynamodb = client("dynamodb")
        create_state_table(dynamodb, TABLE_NAME)
        secrets = client("secretsmanager")
        secrets.create_secret(Name=config.github.private_key_secret_name, SecretString=key.private_pem)
        settings = ControlPlaneSettings(
            table_name=TABLE_NAME,
            config=config,
            stack_name=STACK_NAME,
            pool_queue_urls=create_pool_queues(sqs, STACK_NAME, list(config.resource_classes)),
            credentials_key_id=client("kms").create_key()["KeyMetadata"]["KeyId"],
            subnet_ids=create_network(ec2),
            launch_templates=create_launch_templates(ec2),
        )
        clients: dict[str, Any] = {"ec2": ec2, "sqs": sqs, "dynamodb": dynamodb, "secretsmanager": secrets}
        check = attach_policy_check(settings)
        app = GitHubApp(
            APP_ID,
            key.private_pem,
            INSTALLATION_ID,
            RepositoryScope(owner=OWNER, repo=REPO),
            base_url=github.url,
            clock=clock,
        )
        plane = ControlPlane(
            settings,
            clock=clock,
            clients=lambda service: check.on_client(clients.get(service) or client(service)),
            backoff=NO_WAIT,
            github=app,
            pause=iam_check.as_world(pause),
        )
        use_control_plane(plane)
        try:
            yield LocalControlPlane(plane, clock, github, ec2, sqs, check)
            check.assert_allowed()
        finally:
            use_control_plane(None)
            detach_policy_check(check)
            app.close()


# --- state machines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalStateMachine:
    """One of our state machines in moto; `run` executes it to the end with its tasks on our handlers."""

    machine: str
    arn: str
    handlers: Mapping[str, Handler]
    """The handler of each task, by its name in runner_pool.handlers.<machine>."""
    machines: LocalStateMachines

    def run(
        self,
        payload: Any,
        *,
        name: str | None = None,
        on_wait: Callable[[int], None] | None = None,
        replace: Mapping[str, Handler] | None = None,
    ) -> Execution:
        """`on_wait(seconds)` stands in for each Wait state; `replace` swaps handlers by name."""
        chosen = {**self.handlers, **(replace or {})}
        routed = {
            _function_name(self.machine, handler): as_function(
                f"{HANDLERS}.{self.machine}.{handler}", chosen[handler]
            )
            for handler in self.handlers
        }
        with without_waiting(on_wait), lambdas_in_process(routed):
            return self.machines.run(self.arn, payload, name=name)

    @property
    def routed(self) -> dict[str, Handler]:
        """Each of the machine's moto functions → our handler, for `lambdas_in_process`."""
        return {
            _function_name(self.machine, handler): as_function(
                f"{HANDLERS}.{self.machine}.{handler}", function
            )
            for handler, function in self.handlers.items()
        }


def deploy(machine: str, substitutions: Mapping[str, str] | None = None) -> LocalStateMachine:
    """infra/statemachines/<machine>.asl.json in moto, every `${XFunction}` a function routed to our handler."""
    path = STATE_MACHINES / f"{machine}.asl.json"
    module = importlib.import_module(f"runner_pool.handlers.{machine}")
    pascal_names = sorted(set(_FUNCTION.findall(path.read_text())))
    handlers = {_snake(name): getattr(module, _snake(name)) for name in pascal_names}
    machines = LocalStateMachines(
        client("stepfunctions"),
        client("lambda"),
        client("iam"),
    )
    arns = machines.create_functions([_function_name(machine, handler) for handler in handlers])
    filled = {f"{name}Function": arns[_function_name(machine, _snake(name))] for name in pascal_names}
    arn = machines.create(state_machine_name(machine), render_asl(path, {**filled, **(substitutions or {})}))
    return LocalStateMachine(machine, arn, handlers, machines)


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


def lambda_context(function_name: str) -> LambdaContext:
    return LambdaContext(function_name, str(uuid.uuid4()), function_arn(function_name))


# --- the IAM check (emulator/iam_check.py): one place, to move onto the harness's on_client hook ------

HANDLERS = "runner_pool.handlers"


def attach_policy_check(settings: ControlPlaneSettings) -> PolicyCheck:
    """Every call of the handlers checked against the synthesized policies, bound to this local stack."""
    return iam_check.attach_policy_check(
        iam_check.settings_environment(settings), region=REGION, account=ACCOUNT
    )


def _function_name(machine: str, handler: str) -> str:
    return f"{machine}-{handler}"


def _snake(pascal: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", pascal).lower()


def _applied(result: TransitionResult) -> InstanceRecord:
    assert result.succeeded, result
    assert result.record is not None
    return result.record
