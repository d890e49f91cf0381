"""The stack on local AWS: what the CDK app deploys, and our Lambdas invoked the way AWS invokes them.

`deploy` builds the whole local stack (emulator/stack.py) on local AWS (moto's server, executing state
machines): the state table, what instances need (pool queues, network, launch templates, the runner
credentials key, the App's private key), the ingress (webhook secret, idempotency table, demand queue)
and our two state machines, all as the synthesized template declares them. It runs the stack with
clients that count their calls, EC2's CreateFleet simulated (emulator/ec2_fleet.py) and the GitHub App
aimed at the fake, each function run from the deployed artifacts (emulator/lambda_runtime.py). Then,
until the `with` ends:

- the webhook Lambda behind API Gateway on localhost (emulator/api_gateway.py), throttled as the
  template's stage throttles it, and the fake GitHub's webhooks pointed at it;
- the dispatcher Lambda fed by the demand queue (an SQS event source with Lambda's five pollers);
- the refresh Lambda on a timer (an EventBridge rate rule);
- the state machines' Lambda tasks, in Step Functions' own threads.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from emulator import iam_check
from emulator.api_gateway import ProxyEndpoint, TokenBucket
from emulator.aws import CallCounter, LocalAws
from emulator.ec2_fleet import SimulatedEc2
from emulator.event_sources import STANDARD_QUEUE_POLLERS, EventRule, QueueEventSource, Schedule
from emulator.fake_github import FakeGitHub
from emulator.lambda_runtime import FunctionSpec, LambdaRuntime, host_artifacts
from emulator.stack import LocalStack, RuntimeFactory
from emulator.step_functions import Handler, Invocations, lambdas_in_process, stop_running_executions
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.config import StackConfig
from runner_pool.domain.fleet import LAUNCH_TAG
from runner_pool.domain.runner_scope import runner_scope
from runner_pool.environment import STACK_TAG_KEY
from runner_pool.handlers import webhook
from runner_pool.wiring import ControlPlane

MACHINES = ("provision", "release", "follow_up")


@dataclass(frozen=True)
class GitHubAppSetup:
    """The App the stack acts as, on the fake GitHub."""

    app_id: int
    installation_id: int
    private_key_pem: str
    repository: str
    """The App's scope: `owner/repo` for a repository installation, `org` for an organisation's."""


@dataclass(frozen=True)
class Timers:
    refresh_every_seconds: float = 5.0
    """The refresh schedule; the stack's is every minute."""
    batching_window_seconds: float | None = None
    """The dispatcher's batching window on the demand queue; None: the template's event source mapping's."""
    batch_size: int | None = None
    """The dispatcher's batch size; None: the template's event source mapping's."""
    dispatcher_pollers: int = STANDARD_QUEUE_POLLERS
    """Concurrent batches of the demand queue's event source: Lambda's five for a standard queue."""


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
    ec2_events: EventRule
    """The interruptions function's rules: what EC2 says of instances (emulator/ec2_events.py) goes here."""
    stepfunctions: Any
    """An uncounted client, for looking at executions."""
    policy_check: iam_check.PolicyCheck
    """Every AWS call of the Lambdas and in-process agents, checked against the synthesized IAM policies."""
    job_log_group: str
    """Where the instances' agents ship their lines and the runner's (infra/constructs/job_logs.py)."""
    lambda_runtime: LambdaRuntime | None = None
    """The functions' execution environments, when they run from the artifacts (a diagnosis reads them)."""

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

    def stop_executions(self) -> int:
        """Stop every execution still running (a world ends with this); returns how many."""
        return stop_running_executions(self.stepfunctions)

    def history(self, execution_arn: str) -> list[dict[str, Any]]:
        """One execution's history events, in order (GetExecutionHistory's, every page)."""
        pages = self.stepfunctions.get_paginator("get_execution_history").paginate(executionArn=execution_arn)
        return [event for page in pages for event in page["events"]]

    def state_transitions(self, execution_arn: str) -> int:
        """States entered by one execution: what Step Functions Standard bills."""
        return sum(1 for event in self.history(execution_arn) if event["type"].endswith("StateEntered"))


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
    runtime: RuntimeFactory | None = None,
    more_apps: Sequence[GitHubAppSetup] = (),
) -> Iterator[Deployment]:
    """The stack deployed on `aws` (started with `state_machines=True`), running until the `with` ends;
    its functions run by `runtime`: by default as deployed, from the code asset and the layer built for
    this machine, each in execution environments of its own (emulator/lambda_runtime.py), so a
    dependency missing from the layer or a variable CDK does not give fails here as on Lambda;
    `emulator.stack.InProcess` calls our handlers in this process instead. `more_apps`: the config's
    other Apps (github.apps), installed on the fake; deliveries come signed by the first."""
    timers = timers or Timers()
    calls = CallCounter()
    # The functions' own config names the fake as GitHub's API, as an operator's names GitHub Enterprise
    # Server's: a function that builds its App from its environment (a runtime out of this process)
    # reaches the fake.
    config = config.model_copy(update={"github": config.github.model_copy(update={"api_url": github.url})})
    stack = LocalStack(config, aws.client, stack_name=stack_name)
    stack.create_state_table()
    stack.create_instance_resources(app.private_key_pem, *(more.private_key_pem for more in more_apps))
    stack.create_ingress_resources(webhook_secret, *(secrets.token_hex(20) for _ in more_apps))
    job_log_group = stack.create_job_log_group()
    for machine in MACHINES:
        stack.create_state_machine(machine)
    unset = {name: stack.missing(name) for name in stack.template.function_names() if stack.missing(name)}
    if unset:
        raise LookupError(f"the local stack gives no value for what the template gives: {unset}")
    meter = LambdaMeter()
    github_app = GitHubApp(
        GitHubAppKey(app.app_id, app.private_key_pem, app.installation_id, base_url=github.url),
        runner_scope(app.repository),
        base_url=github.url,
        registration=config.github.effective_registration,
        groups_allow_public_repositories=config.github.runner_groups_allow_public_repositories,
    )

    fleet = FleetEc2(aws.client("ec2", calls))

    def counted(service: str) -> Any:
        return fleet if service == "ec2" else aws.client(service, calls)

    def from_artifacts(running_stack: LocalStack) -> LambdaRuntime:
        """Every function run as deployed: its code asset and the layer, in execution environments of
        their own (emulator/lambda_runtime.py), its calls counted, checked and CreateFleet simulated."""
        return LambdaRuntime(
            host_artifacts(),
            {
                name: FunctionSpec(
                    spec.name, spec.handler, spec.environment, spec.timeout_seconds, spec.memory_mb
                )
                for name, spec in running_stack.functions().items()
            },
            endpoint=aws.endpoint,
            policy_check=running_stack.policy_check,
            ec2=fleet,
            calls=calls.calls,
        )

    try:
        with (
            # With several Apps, each function chooses among them itself (wiring.ControlPlane.github_apps).
            stack.running(
                clients=counted, github=None if more_apps else github_app, runtime=runtime or from_artifacts
            ),
            ExitStack() as running,
        ):
            check = stack.policy_check
            if isinstance(stack.runtime, LambdaRuntime):
                running.callback(stack.runtime.assert_no_faults)
                # One warm environment per function before anything arrives, as provisioned concurrency
                # (or a deployment that has been serving) has: without it the demo's first jobs measured
                # the environments' cold starts, not the control plane (warm-hit ratio 4 of 12 jobs
                # instead of 7, under load), which is not what its figures are about.
                stack.runtime.warm()
            routes = {
                name: meter.wrap(name, stack.handler(name)) for m in MACHINES for name in stack.routes(m)
            }
            invocations = running.enter_context(lambdas_in_process(routes))
            api = running.enter_context(
                ProxyEndpoint(
                    meter.wrap("webhook", stack.handler("webhook")),
                    webhook.WEBHOOK_PATH,
                    "webhook",
                    one_at_a_time=not isinstance(stack.runtime, LambdaRuntime),
                    throttle=TokenBucket(*stack.template.method_throttle("webhook")),
                )
            )
            github.webhooks.point_at(api.url, webhook_secret)
            running.callback(github.webhooks.disconnect)
            batch_size, window_seconds = stack.template.event_source("dispatcher")
            demand = running.enter_context(
                QueueEventSource(
                    meter.wrap("dispatcher", stack.handler("dispatcher")),
                    "dispatcher",
                    # Lambda's event source reads the queue with the function's execution role
                    # (Lambda Developer Guide, with-sqs.html, "Execution role permissions").
                    sqs=check.on_client(
                        aws.client("sqs"), check.iam.function(stack.function("dispatcher").handler)
                    ),
                    queue_url=stack.settings.require("demand_queue_url", "the dispatcher"),
                    batch_size=batch_size if timers.batch_size is None else timers.batch_size,
                    window_seconds=(
                        window_seconds
                        if timers.batching_window_seconds is None
                        else timers.batching_window_seconds
                    ),
                    pollers=timers.dispatcher_pollers,
                    one_at_a_time=not isinstance(stack.runtime, LambdaRuntime),
                )
            )
            schedule = running.enter_context(
                Schedule(
                    meter.wrap("refresh", stack.handler("refresh")),
                    "refresh",
                    every_seconds=timers.refresh_every_seconds,
                    rule=f"{stack_name}-refresh",
                )
            )
            ec2_events = running.enter_context(
                EventRule(
                    meter.wrap("interruptions", stack.handler("interruptions")),
                    "interruptions",
                    retry_attempts=stack.template.rule_retries("interruptions"),
                )
            )
            yield Deployment(
                stack.plane,
                stack_name,
                calls,
                invocations,
                meter,
                api,
                demand,
                schedule,
                ec2_events,
                aws.client("stepfunctions"),
                check,
                job_log_group,
                stack.runtime if isinstance(stack.runtime, LambdaRuntime) else None,
            )
    finally:
        github_app.close()


@dataclass
class LambdaMeter:
    """How long each invocation of each function took, for its bill (GB-seconds)."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    ended: list[Callable[[str], None]] = field(default_factory=list)
    """Told each invocation's function name as it ends, in the thread that ran it (bench/aws_model.py)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wrap(self, function_name: str, handler: Handler) -> Handler:
        def timed(event: dict[str, Any], context: Any) -> Any:
            began = time.perf_counter()
            try:
                return handler(event, context)
            finally:
                with self._lock:
                    self.seconds.setdefault(function_name, []).append(time.perf_counter() - began)
                for listener in self.ended:
                    listener(function_name)

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

    def answer_create_fleet(self, **params: Any) -> dict[str, Any]:
        replayed = self.calls["CreateFleet replayed"]
        response = super().answer_create_fleet(**params)
        if self.calls["CreateFleet replayed"] == replayed:
            tags = [tag for spec in params.get("TagSpecifications", []) for tag in spec.get("Tags", [])]
            self.launches[next((t["Value"] for t in tags if t["Key"] == LAUNCH_TAG), "")] += 1
        return response
