"""The stack on local AWS: what the CDK app deploys, and our Lambdas invoked the way AWS invokes them.

`deploy` creates in local AWS (moto's server, executing state machines) the state table, the pool
queues, the network and launch templates, the runner credentials key, the App's private key and
the webhook secret, the idempotency table and the demand queue, and our two state machines from
infra/statemachines/ with every `${<Pascal>Function}` routed to `runner_pool.handlers.<machine>.<snake>`
in this process. It installs one ControlPlane for every handler, with clients that count their
calls, EC2's CreateFleet simulated (emulator/ec2_fleet.py) and the GitHub App aimed at the fake.
Then, until the `with` ends:

- the webhook Lambda behind API Gateway on localhost (emulator/api_gateway.py), and the fake
  GitHub's webhooks pointed at it;
- the dispatcher Lambda fed by the demand queue (an SQS event source with a batching window);
- the refresh Lambda on a timer (an EventBridge rate rule);
- the state machines' Lambda tasks, in Step Functions' own threads.
"""

from __future__ import annotations

import importlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator import iam_check
from emulator.api_gateway import ProxyEndpoint
from emulator.aws import ACCOUNT, REGION, CallCounter, LocalAws
from emulator.ec2_fleet import SimulatedEc2
from emulator.event_sources import QueueEventSource, Schedule
from emulator.fake_github import FakeGitHub
from emulator.iam_stack import synthesized_template
from emulator.resources import (
    create_demand_queue,
    create_idempotency_table,
    create_launch_templates,
    create_network,
    create_pool_queues,
    create_state_table,
)
from emulator.step_functions import Handler, Invocations, LocalStateMachines, lambdas_in_process, render_asl
from runner_pool.adapters.fleet import LAUNCH_TAG
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.config import StackConfig
from runner_pool.domain.demand import BATCHING_WINDOW_SECONDS
from runner_pool.domain.runner_scope import RepositoryScope
from runner_pool.environment import STACK_TAG_KEY, ControlPlaneSettings
from runner_pool.handlers import dispatcher, refresh, webhook
from runner_pool.wiring import ControlPlane, use_control_plane

STATE_MACHINES = Path(__file__).resolve().parents[1] / "infra" / "statemachines"
MACHINES = ("provision", "release")
_FUNCTION = re.compile(r"\$\{([A-Z][A-Za-z0-9]*)Function\}")


@dataclass(frozen=True)
class GitHubAppSetup:
    """The App the stack acts as, on the fake GitHub."""

    app_id: int
    installation_id: int
    private_key_pem: str
    repository: str
    """`owner/repo`: where the runners are registered."""


@dataclass(frozen=True)
class Timers:
    refresh_every_seconds: float = 5.0
    """The refresh schedule; the stack's is every minute."""
    batching_window_seconds: float = BATCHING_WINDOW_SECONDS
    """The dispatcher's batching window on the demand queue."""
    batch_size: int = 100


@dataclass
class Deployment:
    plane: ControlPlane
    stack_name: str
    calls: CallCounter
    """Every AWS call the control plane's Lambdas made, by service and operation."""
    lambdas: Invocations
    """The state machines' Lambda invocations, with their events."""
    meter: LambdaMeter
    """Every Lambda invocation's duration, by function."""
    webhook: ProxyEndpoint
    dispatcher: QueueEventSource
    refresh: Schedule
    stepfunctions: Any
    """An uncounted client, for looking at executions."""
    policy_check: iam_check.PolicyCheck
    """Every AWS call of the Lambdas and in-process agents, checked against the synthesized IAM policies."""

    @property
    def ec2(self) -> FleetEc2:
        ec2: FleetEc2 = self.plane.client("ec2")
        return ec2

    @property
    def table(self) -> StateTable:
        return self.plane.state_table

    @property
    def stack_tag(self) -> tuple[str, str]:
        return STACK_TAG_KEY, self.stack_name

    @property
    def credentials_key_id(self) -> str:
        return self.plane.settings.require("credentials_key_id", "the simulated instances")

    def invocations(self) -> dict[str, int]:
        """Lambda invocations so far, per function."""
        return self.meter.invocations()

    def executions(self) -> list[dict[str, Any]]:
        """Every execution of our state machines so far, each with its machine's name."""
        found = []
        for machine in MACHINES:
            arn = self.plane.settings.require(f"{machine}_state_machine_arn", "looking at executions")
            pages = self.stepfunctions.get_paginator("list_executions").paginate(stateMachineArn=arn)
            found += [{**e, "machine": machine} for page in pages for e in page["executions"]]
        return found

    def state_transitions(self, execution_arn: str) -> int:
        """States entered by one execution: what Step Functions Standard bills."""
        pages = self.stepfunctions.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
        return sum(1 for page in pages for event in page["events"] if event["type"].endswith("StateEntered"))


@contextmanager
def deploy(
    aws: LocalAws,
    config: StackConfig,
    github: FakeGitHub,
    app: GitHubAppSetup,
    *,
    webhook_secret: str,
    stack_name: str = "runner-pool-local",
    timers: Timers | None = None,
) -> Iterator[Deployment]:
    """The stack deployed on `aws` (started with `state_machines=True`), running until the `with` ends."""
    timers = timers or Timers()
    calls = CallCounter()
    ec2, sqs, dynamodb = aws.client("ec2"), aws.client("sqs"), aws.client("dynamodb")
    secrets = aws.client("secretsmanager")
    create_state_table(dynamodb, f"{stack_name}-state")
    create_idempotency_table(dynamodb, f"{stack_name}-idempotency")
    secrets.create_secret(Name=config.github.private_key_secret_name, SecretString=app.private_key_pem)
    secrets.create_secret(Name=config.github.webhook_secret_name, SecretString=webhook_secret)
    machines = LocalStateMachines(aws.client("stepfunctions"), aws.client("lambda"), aws.client("iam"))
    routes: dict[str, Handler] = {}
    arns: dict[str, str] = {}
    for machine in MACHINES:
        arn, handlers = _deploy_machine(machines, machine)
        arns[machine], routes = arn, routes | handlers
    settings = ControlPlaneSettings(
        table_name=f"{stack_name}-state",
        config=config,
        stack_name=stack_name,
        pool_queue_urls=create_pool_queues(sqs, stack_name, list(config.resource_classes)),
        credentials_key_id=aws.client("kms").create_key()["KeyMetadata"]["KeyId"],
        subnet_ids=create_network(ec2),
        launch_templates=create_launch_templates(ec2, stack_name),
        provision_state_machine_arn=arns["provision"],
        release_state_machine_arn=arns["release"],
        demand_queue_url=create_demand_queue(sqs, stack_name),
        idempotency_table_name=f"{stack_name}-idempotency",
        account_id=ACCOUNT,
    )
    meter = LambdaMeter()
    routes = {name: meter.wrap(name, handler) for name, handler in routes.items()}
    check = attach_policy_check(settings)
    owner, repo = app.repository.split("/", 1)
    github_app = GitHubApp(
        app.app_id,
        app.private_key_pem,
        app.installation_id,
        RepositoryScope(owner=owner, repo=repo),
        base_url=github.url,
    )
    clients = _CountedClients(aws, calls, check)
    plane = ControlPlane(settings, clients=clients, github=github_app)
    use_control_plane(plane)
    try:
        with ExitStack() as running:
            invocations = running.enter_context(lambdas_in_process(routes))
            api = running.enter_context(
                ProxyEndpoint(
                    meter.wrap(
                        "webhook",
                        iam_check.as_function("runner_pool.handlers.webhook.receive", webhook.receive),
                    ),
                    webhook.WEBHOOK_PATH,
                    "webhook",
                )
            )
            github.webhooks.point_at(api.url, webhook_secret)
            running.callback(github.webhooks.disconnect)
            demand = running.enter_context(
                QueueEventSource(
                    meter.wrap(
                        "dispatcher",
                        iam_check.as_function(
                            "runner_pool.handlers.dispatcher.dispatch", dispatcher.dispatch
                        ),
                    ),
                    "dispatcher",
                    # Lambda's event source reads the queue with the function's execution role
                    # (Lambda Developer Guide, with-sqs.html, "Execution role permissions").
                    sqs=check.on_client(
                        aws.client("sqs"), check.iam.function("runner_pool.handlers.dispatcher.dispatch")
                    ),
                    queue_url=settings.require("demand_queue_url", "the dispatcher"),
                    batch_size=timers.batch_size,
                    window_seconds=timers.batching_window_seconds,
                )
            )
            schedule = running.enter_context(
                Schedule(
                    meter.wrap(
                        "refresh",
                        iam_check.as_function("runner_pool.handlers.refresh.refresh", refresh.refresh),
                    ),
                    "refresh",
                    every_seconds=timers.refresh_every_seconds,
                    rule=f"{stack_name}-refresh",
                )
            )
            yield Deployment(
                plane,
                stack_name,
                calls,
                invocations,
                meter,
                api,
                demand,
                schedule,
                aws.client("stepfunctions"),
                check,
            )
        check.assert_allowed()
    finally:
        use_control_plane(None)
        iam_check.detach_policy_check(check)
        github_app.close()


@dataclass
class LambdaMeter:
    """How long each invocation of each function took, for its bill (GB-seconds)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wrap(self, function_name: str, handler: Handler) -> Handler:
        def timed(event: dict[str, Any], context: Any) -> Any:
            began = time.perf_counter()
            try:
                return handler(event, context)
            finally:
                with self._lock:
                    self.seconds.setdefault(function_name, []).append(time.perf_counter() - began)

        return timed

    def invocations(self) -> dict[str, int]:
        with self._lock:
            return {name: len(durations) for name, durations in self.seconds.items()}

    def total_seconds(self) -> float:
        with self._lock:
            return sum(sum(durations) for durations in self.seconds.values())


class FleetEc2(SimulatedEc2):
    """The simulated EC2, also noting which launch (the `runner-pool:launch` tag: a provision's execution
    name, or refresh's pool launch) each CreateFleet that launched was for."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.launches: Counter[str] = Counter()

    def create_fleet(self, **params: Any) -> dict[str, Any]:
        replayed = self.calls["CreateFleet replayed"]
        response = super().create_fleet(**params)
        if self.calls["CreateFleet replayed"] == replayed:
            tags = [tag for spec in params.get("TagSpecifications", []) for tag in spec.get("Tags", [])]
            self.launches[next((t["Value"] for t in tags if t["Key"] == LAUNCH_TAG), "")] += 1
        return response


class _CountedClients:
    """The control plane's clients, each counting its calls; EC2's with CreateFleet simulated."""

    def __init__(self, aws: LocalAws, calls: CallCounter, check: iam_check.PolicyCheck) -> None:
        self._aws = aws
        self._calls = calls
        self._check = check

    def __call__(self, service: str) -> Any:
        client = self._aws.client(service, self._calls)
        return self._check.on_client(FleetEc2(client) if service == "ec2" else client)


def attach_policy_check(settings: ControlPlaneSettings) -> iam_check.PolicyCheck:
    """The Lambdas' calls checked against the synthesized policies (emulator/iam_check.py), bound to this
    deployment: one place, to move onto the one local stack's on_client hook."""
    return iam_check.attach_policy_check(
        iam_check.settings_environment(settings), region=REGION, account=ACCOUNT
    )


def _deploy_machine(machines: LocalStateMachines, machine: str) -> tuple[str, dict[str, Handler]]:
    """One of infra/statemachines/ in local Step Functions; its ARN, and the handler of each function."""
    path = STATE_MACHINES / f"{machine}.asl.json"
    module = importlib.import_module(f"runner_pool.handlers.{machine}")
    names = sorted(set(_FUNCTION.findall(path.read_text())))
    handlers: dict[str, Callable[..., Any]] = {
        f"{machine}-{_snake(name)}": iam_check.as_function(
            f"runner_pool.handlers.{machine}.{_snake(name)}", getattr(module, _snake(name))
        )
        for name in names
    }
    function_arns = machines.create_functions(list(handlers))
    filled = {f"{name}Function": function_arns[f"{machine}-{_snake(name)}"] for name in names}
    return machines.create(state_machine_name(machine), render_asl(path, filled)), handlers


def _snake(pascal: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", pascal).lower()


def state_machine_name(machine: str) -> str:
    """The name the synthesized stack gives the machine, where it fixes one (provision: its steps start it
    again, and their roles name it), so the IAM check sees the ARN the roles name; else the machine's."""
    for logical_id, resource in synthesized_template()["Resources"].items():
        named = resource.get("Properties", {}).get("StateMachineName")
        if (
            resource["Type"] == "AWS::StepFunctions::StateMachine"
            and logical_id.lower().startswith(machine)
            and named
        ):
            return str(named)
    return machine
