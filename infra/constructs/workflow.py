"""One state machine from its ASL file, with a Lambda for each task it names and nothing else.

The ASL file (infra/statemachines/<machine>.asl.json) is the definition deployed as is, the same file
the integration tests execute. It names each Lambda by a placeholder `${<Pascal>Function}` whose
handler is `runner_pool.handlers.<machine>.<snake>`; the construct that composes a machine says, per
handler, what that handler may do (`Step`), and a placeholder without a Step, or a Step the file
no longer names, fails synth: no function is deployed with permissions nobody reviewed. Each Step
names its retry policy too (infra/constructs/retries.py), and a task whose Retry is not its step's
policy fails synth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aws_cdk import Acknowledgment, ArnFormat, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.constructs.functions import LOG_RETENTION, ControlPlaneFunctions
from infra.constructs.retries import RetryPolicy
from runner_pool.domain.config import WorkflowType

STATE_MACHINES = Path(__file__).resolve().parents[1] / "statemachines"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z][A-Za-z0-9]*)\}")
FUNCTION_PLACEHOLDER = re.compile(r"([A-Z][A-Za-z0-9]*)Function")


@dataclass(frozen=True)
class Step:
    """What one handler of a machine is for, may do (`grant`), is told (`environment`), and how its task is
    tried again (`retry`)."""

    description: str
    grant: Callable[[lambda_.Function], None] = lambda _function: None
    environment: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: int = 30
    memory_mib: int = 512
    retry: RetryPolicy | None = None


def state_machine_arn(scope: Construct, name: str) -> str:
    """The ARN of the stack's state machine named `name`, written out rather than referenced."""
    return Stack.of(scope).format_arn(
        service="states",
        resource="stateMachine",
        resource_name=name,
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


def handler_of(placeholder: str) -> str:
    """`CheckClaimFunction` → `check_claim`; any other placeholder is not ours to fill."""
    match = FUNCTION_PLACEHOLDER.fullmatch(placeholder)
    if match is None:
        raise ValueError(f"${{{placeholder}}} is not a function placeholder (${{<Pascal>Function}})")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()


def function_placeholders(asl: str) -> dict[str, str]:
    """Each placeholder of an ASL text and the handler (snake case) it stands for."""
    return {placeholder: handler_of(placeholder) for placeholder in sorted(set(PLACEHOLDER.findall(asl)))}


def tasks(definition: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every Task state of an ASL definition (a Map's too), with its name."""
    if isinstance(definition, dict):
        for name, state in definition.get("States", {}).items():
            if state.get("Type") == "Task":
                yield name, state
        for value in definition.values():
            yield from tasks(value)
    elif isinstance(definition, list):
        for value in definition:
            yield from tasks(value)


def _check_retries(file: str, asl: str, steps: Mapping[str, Step]) -> None:
    """Each task's Retry is its step's named policy: refused at synth otherwise."""
    for name, task in tasks(json.loads(asl)):
        invoked = json.dumps([task.get("Resource"), task.get("Parameters")])
        for handler in sorted(set(function_placeholders(invoked).values())):
            policy = steps[handler].retry
            if policy is None:
                raise LookupError(f"{file}'s {name} invokes {handler}, whose Step names no retry policy")
            if not policy.matches(task.get("Retry")):
                raise ValueError(
                    f"{file}'s {name} does not retry as {handler}'s policy {policy.name!r} says: "
                    f"{task.get('Retry')} is not {policy.asl()}"
                )


class Workflow(Construct):
    """`state_machine` runs `infra/statemachines/<machine>.asl.json`; `functions` maps handler → Lambda."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        machine: str,
        functions: ControlPlaneFunctions,
        workflow_type: WorkflowType,
        steps: Mapping[str, Step],
        state_machine_name: str | None = None,
    ) -> None:
        """`state_machine_name` fixes the machine's name, for steps that start executions of their own
        machine: their role can name its ARN without a reference to it, which would be a cycle."""
        super().__init__(scope, construct_id)
        path = STATE_MACHINES / f"{machine}.asl.json"
        definition = path.read_text()
        handlers = function_placeholders(definition)
        undeclared = sorted(set(handlers.values()) - set(steps))
        if undeclared:
            raise LookupError(
                f"{path.name} invokes {', '.join(undeclared)}, but {construct_id} declares no Step for "
                "them: say what each may do before it is deployed"
            )
        unused = sorted(set(steps) - set(handlers.values()))
        if unused:
            raise LookupError(f"{construct_id} declares Steps {path.name} never invokes: {', '.join(unused)}")
        _check_retries(path.name, definition, steps)
        built = {}
        for name in sorted(steps):
            step = steps[name]
            function = functions.function(
                self,
                f"{machine}.{name}",
                description=step.description,
                environment=step.environment,
                timeout=Duration.seconds(step.timeout_seconds),
                memory_mib=step.memory_mib,
            )
            step.grant(function)
            built[name] = function
        self.functions: Mapping[str, lambda_.Function] = MappingProxyType(built)
        express = workflow_type is WorkflowType.EXPRESS
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            # The prefix AWS asks for: it keeps CloudWatch Logs' resource policy small.
            log_group_name=f"/aws/vendedlogs/states/{Stack.of(self).stack_name}-{machine}",
            retention=LOG_RETENTION,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=state_machine_name,
            definition_body=sfn.DefinitionBody.from_string(definition),
            definition_substitutions={
                placeholder: built[name].function_arn for placeholder, name in handlers.items()
            },
            state_machine_type=sfn.StateMachineType(workflow_type.value),
            # Express keeps no execution history of its own: its log is the only record of a run.
            logs=sfn.LogOptions(
                destination=self.log_group,
                level=sfn.LogLevel.ALL if express else sfn.LogLevel.ERROR,
                include_execution_data=True,
            ),
            tracing_enabled=True,
        )
        # The unqualified ARNs the definition names, and no version or alias (grant_invoke adds `:*`).
        self.state_machine.add_to_role_policy(
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"],
                resources=[function.function_arn for function in built.values()],
            )
        )
        self._acknowledge(express)

    def _acknowledge(self, express: bool) -> None:
        Validations.of(self.state_machine.role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason=(
                    "CDK's grants for execution logging (logs:CreateLogDelivery and the other log-delivery "
                    "actions) and for X-Ray (xray:PutTraceSegments, PutTelemetryRecords) name `*`: "
                    "neither service supports resource-level permissions for those actions."
                ),
            )
        )
        if not express:
            Validations.of(self.state_machine).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-SF1",
                    reason=(
                        "A Standard workflow keeps every execution's full event history in Step Functions "
                        "for 90 days; logging ALL events would copy that history into CloudWatch at a cost "
                        "per event. Errors are logged; Express workflows, which keep no history, log ALL."
                    ),
                )
            )
