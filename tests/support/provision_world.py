"""The provision state machine's world for tests: moto (DynamoDB, SQS, EC2 with simulated CreateFleet,
KMS, Secrets Manager, Step Functions executing the real ASL), a fake GitHub, and scripted agents.

Time is a ManualClock that moves only in the machine's Wait states, by as much as each waits, and
after each move the scripted agents act: the machine's polling loops see the world change exactly
as they would on AWS, with no test ever sleeping.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

from emulator.accounting import Accounting, account
from emulator.atomic_dynamodb import atomic_items
from emulator.ec2_fleet import SimulatedEc2
from emulator.fake_github import FakeGitHub
from emulator.instances import instance_facts, put_in_pool
from emulator.resources import create_fleet_setup, create_pool_queues, create_state_table
from emulator.step_functions import (
    MOTO_CONFIG,
    Execution,
    LocalStateMachines,
    lambdas_in_process,
    render_asl,
    without_waiting,
)
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.domain.clock import ManualClock, SystemClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.executions import ProvisionRequest
from runner_pool.domain.records import Arch, InstanceFacts, PoolMessage
from runner_pool.environment import ControlPlaneSettings
from runner_pool.handlers import provision
from runner_pool.wiring import ControlPlane, use_control_plane
from tests.conftest import NO_WAIT, REGION, TABLE_NAME
from tests.support.github_app import APP_ID, INSTALLATION_ID, OWNER, REPO, generate_app_key
from tests.support.scripted_agents import ScriptedAgents

PROVISION_ASL = Path(__file__).resolve().parents[2] / "infra" / "statemachines" / "provision.asl.json"
PROVISION_STEPS = ("begin", "claim", "check_claim", "discard", "create", "check_fleet", "finish", "dump")
STACK_NAME = "runner-pool-test"
REPOSITORY = f"{OWNER}/{REPO}"
_APP_KEY = generate_app_key()


def pascal(step: str) -> str:
    return "".join(part.title() for part in step.split("_"))


@dataclass
class ProvisionWorld:
    clock: ManualClock
    plane: ControlPlane
    ec2: SimulatedEc2
    github: FakeGitHub
    agents: ScriptedAgents
    machines: LocalStateMachines
    machine_arn: str
    invocations: Any

    def warm(self, number: int, **shape: Any) -> PoolMessage:
        """A vetted idle instance in the pool: launched in EC2, recorded, admitted, offered, beating."""
        facts = self.launch(number, **shape)
        message = put_in_pool(self.plane.state_table, self.plane.pool_queues, facts)
        self.plane.state_table.write_heartbeat(facts.instance_id)
        return message

    def launch(self, number: int, **shape: Any) -> InstanceFacts:
        """A real (moto) EC2 instance with the stack's tag, and facts that name it."""
        template = self.plane.settings.launch_templates[Arch.X64]
        reservation = self.ec2.run_instances(
            LaunchTemplate={"LaunchTemplateId": template},
            MinCount=1,
            MaxCount=1,
            InstanceType=shape.get("instance_type", "c7i.large"),
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": "runner-pool:stack", "Value": STACK_NAME}]}
            ],
        )
        instance_id = reservation["Instances"][0]["InstanceId"]
        return instance_facts(number, instance_id=instance_id, **shape)

    def provision(self, run_key: str, count: int, name: str | None = None) -> Execution:
        request = ProvisionRequest(repository=REPOSITORY, run_key=run_key, count=count)
        return self.machines.run(
            self.machine_arn,
            request.model_dump(mode="json"),
            name=name or request.execution_name,
            timeout_seconds=60,
        )

    def provision_concurrently(self, demands: list[tuple[str, int]]) -> list[Execution]:
        """Start one execution per (run key, count) at once, then wait for all of them."""
        started = []
        for run_key, count in demands:
            request = ProvisionRequest(repository=REPOSITORY, run_key=run_key, count=count)
            started.append(
                self.machines.start(self.machine_arn, request.model_dump(mode="json"), request.execution_name)
            )
        return [self.machines.wait(arn, timeout_seconds=60) for arn in started]

    def accounting(self) -> Accounting:
        return account(self.ec2, self.plane.state_table, STACK_NAME, now=self.clock.now())

    def pool_messages(self, resource_class: str = "large") -> list[PoolMessage]:
        """What the class's pool queue holds (received and made visible again at once)."""
        url = self.plane.settings.pool_queue_urls[resource_class]
        sqs = self.plane.client("sqs")
        bodies = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return [PoolMessage.from_body(m["Body"]) for m in bodies.get("Messages", [])]


@contextmanager
def provision_world(
    config: StackConfig | None = None, *, real_time: bool = False
) -> Iterator[ProvisionWorld]:
    """The world on a ManualClock moved by the Wait states; or (`real_time`, for benchmarks) on the
    system clock with real waits, the scripted agents acting every few milliseconds meanwhile."""
    config = config or StackConfig.model_validate(
        {"github": {"app_id": str(APP_ID), "installation_id": INSTALLATION_ID, "scope": REPOSITORY}}
    )
    clock: Any = SystemClock() if real_time else ManualClock()
    with ExitStack() as stack:
        stack.enter_context(mock_aws(config=MOTO_CONFIG))  # type: ignore[arg-type]
        stack.enter_context(atomic_items())
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_state_table(dynamodb, TABLE_NAME)
        sqs = boto3.client("sqs", region_name=REGION)
        queue_urls = create_pool_queues(sqs, "runner-pool", list(config.resource_classes))
        ec2 = SimulatedEc2(boto3.client("ec2", region_name=REGION))
        setup = create_fleet_setup(ec2, STACK_NAME)
        key_id = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["KeyId"]
        boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name=config.github.private_key_secret_name, SecretString=_APP_KEY.private_pem
        )
        github = stack.enter_context(FakeGitHub(APP_ID, _APP_KEY.public_pem, clock=clock))
        github.state.add_installation(INSTALLATION_ID, OWNER)
        settings = ControlPlaneSettings(
            table_name=TABLE_NAME,
            config=config,
            stack_name=STACK_NAME,
            pool_queue_urls=queue_urls,
            credentials_key_id=key_id,
            subnet_ids=setup.subnet_ids,
            launch_templates={arch: template.template_id for arch, template in setup.templates.items()},
        )
        clients = {"ec2": ec2}
        app = GitHubApp(
            APP_ID,
            _APP_KEY.private_pem,
            INSTALLATION_ID,
            config.github.scope,  # type: ignore[arg-type]
            base_url=github.url,
            clock=clock,
        )
        stack.callback(app.close)

        def time_passes(seconds: float) -> None:
            clock.advance(seconds)
            agents.act()

        plane = ControlPlane(
            settings,
            clock=clock,
            clients=lambda service: clients.get(service) or boto3.client(service, region_name=REGION),
            backoff=NO_WAIT,
            github=app,
            pause=time.sleep if real_time else time_passes,
        )
        use_control_plane(plane)
        stack.callback(use_control_plane, None)
        agents = ScriptedAgents(plane.state_table, plane.credentials, plane.instance_arn)

        if real_time:
            stack.enter_context(agents_acting(agents))
        else:
            stack.enter_context(without_waiting(on_wait=time_passes))
        handlers = {step: getattr(provision, step) for step in PROVISION_STEPS}
        invocations = stack.enter_context(lambdas_in_process(handlers))
        machines = LocalStateMachines(
            boto3.client("stepfunctions", region_name=REGION),
            boto3.client("lambda", region_name=REGION),
            boto3.client("iam", region_name=REGION),
        )
        arns = machines.create_functions(list(PROVISION_STEPS))
        definition = render_asl(
            PROVISION_ASL, {f"{pascal(step)}Function": arns[step] for step in PROVISION_STEPS}
        )
        machine_arn = machines.create("provision", definition)
        yield ProvisionWorld(clock, plane, ec2, github, agents, machines, machine_arn, invocations)


@contextmanager
def agents_acting(agents: ScriptedAgents, every_seconds: float = 0.02) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_seconds):
            agents.act()

    thread = threading.Thread(target=loop, name="scripted-agents", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def output(execution: Execution) -> dict[str, Any]:
    if execution.status != "SUCCEEDED":
        raise AssertionError(
            f"execution {execution.status}: {json.dumps(execution.events[-3:], default=str)}"
        )
    return dict(execution.output)
