"""The one local stack (emulator/stack.py): what it deploys is what the synthesized template declares.

Each function's environment is the template's list of variables with the local values, nothing more;
each state machine is the template's definition with each placeholder filled with the local ARN of the
function the template's DefinitionSubstitutions name; and a local value the template gives no function
is refused, so the harness cannot drift from what CDK deploys.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from emulator.harness.control_plane import NO_WAIT, REGION, client
from emulator.iam_stack import BindingError
from emulator.stack import ACCOUNT_THROTTLE, LocalStack, StackTemplate, settings_of
from emulator.template import synthesized_template
from runner_pool.domain.config import StackConfig
from runner_pool.environment import ENV_PREFIX, ControlPlaneSettings
from runner_pool.wiring import control_plane


def clients() -> Any:
    """A client per service, from one session for the process (a new session loads botocore's models)."""
    made: dict[str, Any] = {}

    def made_once(service: str) -> Any:
        return made.setdefault(service, client(service))

    return made_once


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    """Every part of the stack on moto (state machines record their executions, they do not run)."""
    with mock_aws():
        made = clients()
        local = LocalStack(StackConfig(), made, stack_name="stack-test")
        local.create_state_table()
        local.create_instance_resources("not a key")
        local.create_ingress_resources("a secret")
        for machine in ("provision", "release", "follow_up"):
            local.create_state_machine(machine)
        yield local


def test_every_function_gets_exactly_the_variables_the_template_gives_it(stack: LocalStack) -> None:
    template = synthesized_template()["Resources"]
    for name, spec in stack.functions().items():
        # Given each of our functions in the template
        declared = template[spec.logical_id]["Properties"]
        # Then the local function is that one: its handler, role, limits and exactly its variables
        assert spec.handler == declared["Handler"], name
        assert spec.role == declared["Role"]["Fn::GetAtt"][0], name
        assert (spec.timeout_seconds, spec.memory_mb) == (declared["Timeout"], declared["MemorySize"]), name
        assert set(spec.environment) == set(declared["Environment"]["Variables"]), name
        assert stack.missing(name) == [], name


def test_a_function_reads_only_the_settings_the_template_gives_it(stack: LocalStack) -> None:
    # Given the stack running, and a probe run as the webhook function in place of its handler
    read: list[ControlPlaneSettings] = []

    def probe(_event: Any, _context: Any) -> dict[str, Any]:
        read.append(control_plane().settings)
        return {}

    with stack.running(clients=clients(), backoff=NO_WAIT):
        runtime = stack.runtime
        with runtime.replacing({"webhook": probe}):  # type: ignore[attr-defined]
            # When it is invoked
            stack.invoke("webhook", {})
        # Then it saw what CDK gives the webhook (its tables, the demand queue), not what the stack gives
        # other functions (pool queues, the credentials key, the state machines), which the harness's
        # own plane holds
        (settings,) = read
        assert settings.demand_queue_url == stack.plane.settings.demand_queue_url
        assert settings.idempotency_table_name == stack.plane.settings.idempotency_table_name
        assert settings.pool_queue_url_prefix is None
        assert settings.credentials_key_id is None
        assert settings.provision_state_machine_arn is None
        assert stack.plane.settings.pool_queue_url_prefix
        assert stack.plane.settings.provision_state_machine_arn


def test_each_state_machine_is_the_templates_definition_with_its_functions_filled_in(
    stack: LocalStack,
) -> None:
    template = synthesized_template()["Resources"]
    sfn = clients()("stepfunctions")
    for machine, deployed in stack.machines.items():
        # Given the machine as the template declares it
        declared = template[deployed.spec.logical_id]["Properties"]
        substitutions = declared["DefinitionSubstitutions"]
        # When its local definition is read back
        definition = sfn.describe_state_machine(stateMachineArn=deployed.arn)["definition"]
        # Then each placeholder holds the ARN of the local function for the template's function there,
        # whose handler is the one the template gives that function
        expected = declared["DefinitionString"]
        for placeholder, target in substitutions.items():
            name = deployed.spec.functions[placeholder]
            assert stack.function(name).logical_id == target["Fn::GetAtt"][0], (machine, placeholder)
            expected = expected.replace(
                "${" + placeholder + "}", f"arn:aws:lambda:{REGION}:123456789012:function:{name}"
            )
        assert json.loads(definition) == json.loads(expected), machine
        assert deployed.spec.name == declared.get("StateMachineName", machine)


def test_a_value_the_template_gives_no_function_is_refused() -> None:
    # Given a template whose functions are not told the demand queue's URL
    template = copy.deepcopy(synthesized_template())
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::Lambda::Function":
            resource["Properties"].get("Environment", {}).get("Variables", {}).pop(
                f"{ENV_PREFIX}DEMAND_QUEUE_URL", None
            )
    with mock_aws():
        local = LocalStack(StackConfig(), clients(), stack_name="stack-test", template=template)
        # When the local stack creates the demand queue and would give its URL / Then it is refused
        with pytest.raises(BindingError, match=f"{ENV_PREFIX}DEMAND_QUEUE_URL"):
            local.create_ingress_resources("a secret")


def test_settings_read_from_a_functions_environment_are_what_the_lambda_reads_at_cold_start(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, spec in stack.functions().items():
        # Given a function's environment, set as the Lambda runtime sets it
        for variable in [v for v in os.environ if v.startswith(ENV_PREFIX)]:
            monkeypatch.delenv(variable)
        for variable, value in spec.environment.items():
            monkeypatch.setenv(variable, value)
        # When the settings are read from the mapping instead / Then they are the same
        assert settings_of(spec.environment) == ControlPlaneSettings(), name


def _stage_settings(template: dict[str, Any]) -> list[dict[str, Any]]:
    (stage,) = (r for r in template["Resources"].values() if r["Type"] == "AWS::ApiGateway::Stage")
    settings: list[dict[str, Any]] = stage["Properties"].setdefault("MethodSettings", [])
    return settings


def test_the_webhooks_throttle_is_the_stages_as_the_template_sets_it() -> None:
    # Given the template with the stage's throttle for every method changed to a burst of 7 at 3 a second
    template = copy.deepcopy(synthesized_template())
    (every_method,) = _stage_settings(template)
    assert (every_method["ResourcePath"], every_method["HttpMethod"]) == ("/*", "*")
    every_method.update(ThrottlingBurstLimit=7, ThrottlingRateLimit=3)
    # When the local stack reads the throttle of the method in front of the webhook / Then it is those
    assert StackTemplate(template).method_throttle("webhook") == (7, 3.0)
    # And a setting of the webhook's own method (its path written as CloudFormation wants it) wins
    _stage_settings(template).append(
        {
            "ResourcePath": "/~1webhook",
            "HttpMethod": "POST",
            "ThrottlingBurstLimit": 2,
            "ThrottlingRateLimit": 1,
        }
    )
    assert StackTemplate(template).method_throttle("webhook") == (2, 1.0)
    # And with no setting at all, the account's Regional limits apply
    _stage_settings(template).clear()
    assert StackTemplate(template).method_throttle("webhook") == ACCOUNT_THROTTLE
