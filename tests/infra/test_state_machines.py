"""The provision and release state machines as synthesised: the ASL files deployed as they are, each
placeholder filled with the function of its handler, and their logging, tracing, type and permissions."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_dynamodb as dynamodb

from infra.constructs import retries, workflow
from infra.constructs.functions import HANDLERS_PACKAGE, ControlPlaneFunctions
from infra.constructs.workflow import STATE_MACHINES, Step, Workflow, function_placeholders, handler_of
from runner_pool.domain.config import StackConfig, WorkflowType
from tests.infra.synthesis import Synthesis, stub_layer

MACHINE = "AWS::StepFunctions::StateMachine"
MACHINES = ("provision", "release", "follow_up")


def machine(synthesis: Synthesis, name: str) -> Mapping[str, Any]:
    owner = synthesis.stack.ingress.follow_up if name == "follow_up" else getattr(synthesis.stack, name)
    construct = owner.state_machine
    logical_id = synthesis.logical_id(construct)
    return synthesis.resources[logical_id]


def handler_of_function(synthesis: Synthesis, function_arn: Mapping[str, Any]) -> str:
    (logical_id, attribute) = function_arn["Fn::GetAtt"]
    assert attribute == "Arn"
    handler: str = synthesis.resources[logical_id]["Properties"]["Handler"]
    return handler


@pytest.mark.parametrize("name", MACHINES)
def test_the_deployed_definition_is_the_asl_file_itself(name: str, synthesis: Synthesis) -> None:
    # Given the synthesised state machine / Then its definition is the file, byte for byte, as tested
    properties = machine(synthesis, name)["Properties"]
    assert properties["DefinitionString"] == (STATE_MACHINES / f"{name}.asl.json").read_text()


@pytest.mark.parametrize("name", MACHINES)
def test_each_placeholder_is_the_function_of_its_handler(name: str, synthesis: Synthesis) -> None:
    # Given the machine's placeholders and the substitutions deployed for them
    placeholders = function_placeholders((STATE_MACHINES / f"{name}.asl.json").read_text())
    substitutions = machine(synthesis, name)["Properties"]["DefinitionSubstitutions"]

    # Then every placeholder is filled, with the function whose handler it names
    assert set(substitutions) == set(placeholders)
    for placeholder, snake in placeholders.items():
        expected = f"{HANDLERS_PACKAGE}.{name}.{snake}"
        assert handler_of_function(synthesis, substitutions[placeholder]) == expected


@pytest.mark.parametrize("name", MACHINES)
def test_a_machine_may_invoke_its_own_functions_and_nothing_else(name: str, synthesis: Synthesis) -> None:
    # Given the machine's role and the functions its definition names
    properties = machine(synthesis, name)["Properties"]
    role_id = properties["RoleArn"]["Fn::GetAtt"][0]
    named = sorted(properties["DefinitionSubstitutions"].values(), key=str)

    # When the role's Lambda statements are read
    invoking = [
        s for s in synthesis.statements_of_role(role_id) if "lambda:InvokeFunction" in str(s["Action"])
    ]

    # Then one statement allows invoking exactly those functions, unqualified (no version wildcard)
    (statement,) = invoking
    assert statement["Action"] == "lambda:InvokeFunction"
    resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
    assert sorted(resources, key=str) == named


@pytest.mark.parametrize("name", MACHINES)
def test_a_standard_machine_logs_errors_and_traces(name: str, synthesis: Synthesis) -> None:
    # Given the stack as cdk.json configures it (Standard) / Then errors go to the machine's log group
    properties = machine(synthesis, name)["Properties"]
    assert properties["StateMachineType"] == "STANDARD"
    assert properties["LoggingConfiguration"]["Level"] == "ERROR"
    (destination,) = properties["LoggingConfiguration"]["Destinations"]
    assert "Fn::GetAtt" in destination["CloudWatchLogsLogGroup"]["LogGroupArn"]
    # And executions are traced
    assert properties["TracingConfiguration"] == {"Enabled": True}


@pytest.mark.parametrize("name", MACHINES)
def test_an_express_machine_logs_every_event(name: str, custom_synthesis: Synthesis) -> None:
    # Given an operator's Express configuration / Then the machine is Express and logs ALL (its only record)
    properties = machine(custom_synthesis, name)["Properties"]
    assert properties["StateMachineType"] == "EXPRESS"
    assert properties["LoggingConfiguration"]["Level"] == "ALL"
    assert properties["LoggingConfiguration"]["IncludeExecutionData"] is True


@pytest.mark.parametrize(
    ("placeholder", "handler"),
    [("CheckClaimFunction", "check_claim"), ("BeginFunction", "begin"), ("GiveBackFunction", "give_back")],
)
def test_a_placeholder_names_its_handler_in_snake_case(placeholder: str, handler: str) -> None:
    assert handler_of(placeholder) == handler


def test_a_placeholder_that_is_not_a_function_is_refused() -> None:
    with pytest.raises(ValueError, match="not a function placeholder"):
        handler_of("QueueUrl")


@pytest.fixture
def bare_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Stack, Any]:
    """A stack with the function helper, and state machines read from a folder of the test's own."""
    monkeypatch.setattr(workflow, "STATE_MACHINES", tmp_path)
    (tmp_path / "provision.asl.json").write_text(
        '{"StartAt": "Begin", "States": {"Begin": {"Type": "Task", "Resource": "${BeginFunction}", "End": true}}}'
    )
    stack = Stack(App(), "Bare")
    table = dynamodb.Table(
        stack, "Table", partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING)
    )
    helper = ControlPlaneFunctions(
        stack, "Functions", config=StackConfig(), layer=stub_layer(tmp_path / "out"), table=table
    )
    return stack, helper


def test_a_task_without_a_declared_step_fails_synth(bare_stack: tuple[Stack, Any]) -> None:
    # Given a machine whose file invokes Begin, and a construct that declares no Step for it
    stack, helper = bare_stack

    # When the workflow is built / Then it refuses, naming the handler
    with pytest.raises(LookupError, match="invokes begin, but Provision declares no Step"):
        build_provision(stack, helper, {})


def test_a_declared_step_the_file_never_invokes_fails_synth(bare_stack: tuple[Stack, Any]) -> None:
    # Given a construct that declares a Step the file does not name
    stack, helper = bare_stack
    steps = {"begin": Step("plans"), "claim": Step("claims")}

    # When the workflow is built / Then it refuses, naming the stale step
    with pytest.raises(LookupError, match=r"declares Steps provision\.asl\.json never invokes: claim"):
        build_provision(stack, helper, steps)


def retried_begin(bare_stack: tuple[Stack, Any], retry: list[dict[str, Any]]) -> tuple[Stack, Any]:
    """bare_stack's Begin, retried as `retry` says."""
    stack, helper = bare_stack
    task = {"Type": "Task", "Resource": "${BeginFunction}", "Retry": retry, "End": True}
    (workflow.STATE_MACHINES / "provision.asl.json").write_text(
        json.dumps({"StartAt": "Begin", "States": {"Begin": task}})
    )
    return stack, helper


def build_provision(stack: Stack, helper: Any, steps: dict[str, Step]) -> Workflow:
    """The provision machine's Workflow over `helper`'s functions, with `steps` declared."""
    return Workflow(
        stack,
        "Provision",
        machine="provision",
        functions=helper,
        workflow_type=WorkflowType.STANDARD,
        steps=steps,
    )


def test_a_task_whose_step_names_no_retry_policy_fails_synth(bare_stack: tuple[Stack, Any]) -> None:
    # Given a file whose Begin retries, and a Step for it that names no retry policy
    stack, helper = retried_begin(bare_stack, retries.IDEMPOTENT.asl())
    # When the workflow is built / Then it refuses, naming the task
    with pytest.raises(LookupError, match="Begin invokes begin, whose Step names no retry policy"):
        build_provision(stack, helper, {"begin": Step("plans")})


def test_a_task_that_retries_otherwise_than_its_steps_policy_fails_synth(
    bare_stack: tuple[Stack, Any],
) -> None:
    # Given a file whose Begin retries any error, and a Step that says it refuses a bad request at once
    stack, helper = retried_begin(bare_stack, retries.IDEMPOTENT.asl())
    # When the workflow is built / Then it refuses, naming the policy
    with pytest.raises(ValueError, match="does not retry as begin's policy 'refuse, or retry' says"):
        build_provision(stack, helper, {"begin": Step("plans", retry=retries.REFUSE_OR_RETRY)})


def test_a_task_that_retries_as_its_steps_policy_says_is_built(bare_stack: tuple[Stack, Any]) -> None:
    # Given a file whose Begin retries as its Step's policy, its errors in another order
    policy = retries.REFUSE_OR_RETRY.asl()
    policy[1]["ErrorEquals"].reverse()
    stack, helper = retried_begin(bare_stack, policy)
    # When the workflow is built / Then it is
    assert build_provision(
        stack, helper, {"begin": Step("plans", retry=retries.REFUSE_OR_RETRY)}
    ).functions.keys() == {"begin"}
