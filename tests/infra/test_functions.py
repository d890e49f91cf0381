"""Every control-plane Lambda as synthesised: one helper's runtime, layer, tracing, logs and role, and an
environment that the handler's settings model reads back into what it needs."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infra.constructs.functions import HANDLERS_PACKAGE
from infra.dependency_layer import LAMBDA_PYTHON_VERSION
from runner_pool.domain.pickup import PICKUP_BUDGET_SECONDS
from runner_pool.environment import ENV_PREFIX, ControlPlaneSettings
from runner_pool.observability import METRICS_NAMESPACE, SERVICE
from runner_pool.steps.claim_workers import PICKUPS_PER_CLAIM
from tests.infra.synthesis import Synthesis

FUNCTION = "AWS::Lambda::Function"
ACCOUNT = "123456789012"


def functions(synthesis: Synthesis) -> dict[str, Mapping[str, Any]]:
    """Each function's properties by its handler, relative to runner_pool.handlers."""
    return {
        resource["Properties"]["Handler"].removeprefix(f"{HANDLERS_PACKAGE}."): resource["Properties"]
        for resource in synthesis.resources.values()
        if resource["Type"] == FUNCTION
    }


def placeholder(value: Any) -> str:
    """A CloudFormation value as the text a Lambda would see, with stand-ins for what deploy fills in."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(placeholder(part) for part in value)
    (name, argument), *_ = value.items()
    if name == "Fn::Join":
        separator: str
        separator, parts = argument
        return separator.join(placeholder(part) for part in parts)
    if name == "Ref":
        return {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": "us-east-1",
            "AWS::StackName": "RunnerPool",
            "AWS::URLSuffix": "amazonaws.com",
        }.get(argument, f"ref-{argument}")
    if name == "Fn::GetAtt":
        return f"{argument[1].lower()}-{argument[0]}"
    raise AssertionError(f"unexpected intrinsic {name}")


def settings_of(properties: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> ControlPlaneSettings:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in properties["Environment"]["Variables"].items():
        monkeypatch.setenv(name, placeholder(value))
    return ControlPlaneSettings()


def test_every_handler_the_stack_deploys_is_a_function_of_the_handlers_package(synthesis: Synthesis) -> None:
    # Given the synthesised functions (what each one's handler needs from its environment is checked
    # where it runs: emulator/stack.py gives each function only the variables the template gives it)
    deployed = functions(synthesis)
    assert deployed
    for handler in deployed:
        # And each names a callable that exists
        module, _, name = f"{HANDLERS_PACKAGE}.{handler}".rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), handler


def test_every_function_runs_on_the_layers_python_on_arm_with_tracing(synthesis: Synthesis) -> None:
    layers = {i: r for i, r in synthesis.resources.items() if r["Type"] == "AWS::Lambda::LayerVersion"}
    (layer_id,) = layers
    for handler, properties in functions(synthesis).items():
        # Given each function / Then it runs the Python the layer was built for, on Graviton, traced
        assert properties["Runtime"] == f"python{LAMBDA_PYTHON_VERSION}", handler
        assert properties["Architectures"] == ["arm64"], handler
        assert properties["TracingConfig"] == {"Mode": "Active"}, handler
        # And it has the dependency layer, and only that
        assert properties["Layers"] == [{"Ref": layer_id}], handler
    (layer,) = layers.values()
    assert layer["Properties"]["CompatibleRuntimes"] == [f"python{LAMBDA_PYTHON_VERSION}"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


def test_every_function_has_a_role_of_its_own_without_managed_policies(synthesis: Synthesis) -> None:
    # Given the synthesised functions / When their roles are read
    roles = [properties["Role"]["Fn::GetAtt"][0] for properties in functions(synthesis).values()]

    # Then no two share one, and none carries a managed policy (the basic execution role writes any log)
    assert len(set(roles)) == len(roles)
    resources = synthesis.resources
    assert all("ManagedPolicyArns" not in resources[role]["Properties"] for role in roles)


def test_every_function_logs_to_its_own_group_with_a_retention(synthesis: Synthesis) -> None:
    resources = synthesis.resources
    groups = []
    for handler, properties in functions(synthesis).items():
        # Given each function / Then it logs to a log group of the stack that expires its logs
        group = properties["LoggingConfig"]["LogGroup"]["Ref"]
        assert resources[group]["Properties"]["RetentionInDays"] == 30, handler
        groups.append(group)
    assert len(set(groups)) == len(groups)


def test_the_code_asset_holds_the_runner_pool_package_only(synthesis: Synthesis) -> None:
    # Given the staged code asset of the functions
    code = synthesis.stack.functions.code.bind(synthesis.stack)
    assert code.s3_location is not None
    staged = Path(synthesis.app.outdir) / f"asset.{code.s3_location.object_key.removesuffix('.zip')}"
    names = {str(path.relative_to(staged)) for path in staged.rglob("*") if path.is_file()}

    # Then it is the package's source: handlers included, nothing else of the repository, no caches
    assert "runner_pool/handlers/provision.py" in names
    assert all(name.startswith("runner_pool/") for name in names), sorted(names)[:5]
    assert not any("__pycache__" in name for name in names)


def test_every_function_is_told_powertools_service_namespace_and_the_stack_config(
    synthesis: Synthesis, monkeypatch: pytest.MonkeyPatch
) -> None:
    for handler, properties in functions(synthesis).items():
        # Given each function's environment
        variables = properties["Environment"]["Variables"]
        assert variables["POWERTOOLS_SERVICE_NAME"] == SERVICE, handler
        assert variables["POWERTOOLS_METRICS_NAMESPACE"] == METRICS_NAMESPACE, handler

        # When the settings model reads it, as the handler does at cold start
        settings = settings_of(properties, monkeypatch)

        # Then the config is the stack's own and the account needs no call to STS
        assert settings.config == synthesis.config, handler
        assert settings.account_id == ACCOUNT, handler


def test_every_variable_of_ours_is_a_field_of_the_settings_model(synthesis: Synthesis) -> None:
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in ControlPlaneSettings.model_fields}
    for handler, properties in functions(synthesis).items():
        # Given each function / Then each RUNNER_POOL_ variable is one the model reads (none is ignored)
        ours = {name for name in properties["Environment"]["Variables"] if name.startswith(ENV_PREFIX)}
        assert ours <= fields, handler


def test_the_pool_and_launch_settings_name_the_stacks_queues_templates_and_subnets(
    synthesis: Synthesis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given refresh's settings, read as the Lambda reads them
    settings = settings_of(functions(synthesis)["refresh.refresh"], monkeypatch)

    # Then the pool queues are named by one prefix of SQS's URL shape, a template per architecture, and
    # the configured subnets
    assert settings.pool_queue_url_prefix == f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/RunnerPool-pool-"
    assert {arch.value for arch in settings.launch_templates} == {"x64", "arm64"}
    assert settings.subnet_ids == synthesis.config.network.subnet_ids


def test_no_function_reserves_concurrency(synthesis: Synthesis) -> None:
    # Given every function of the stack / Then none reserves concurrency. Lambda refuses a reservation
    # that leaves an account fewer than 100 unreserved executions, and new accounts often have a quota
    # of 10, so stack creation would fail (issue 12, defect 4):
    # https://docs.aws.amazon.com/lambda/latest/dg/configuring-concurrency.html#reserved-and-unreserved-concurrency
    # Refresh stays single-flight without it: its markers give one run each piece of work
    # (tests/integration/test_refresh.py::test_two_refreshes_racing_do_everything_once_and_fail_nothing).
    reserving = {
        name: function["ReservedConcurrentExecutions"]
        for name, function in functions(synthesis).items()
        if "ReservedConcurrentExecutions" in function
    }
    assert reserving == {}


def test_the_claim_step_outlasts_its_pickups_read_to_their_budget(synthesis: Synthesis) -> None:
    # Given the claim step's timeout, and what its pickups may spend reading misfits
    timeout = functions(synthesis)["provision.claim"]["Timeout"]
    pickups = PICKUPS_PER_CLAIM * PICKUP_BUDGET_SECONDS
    # Then every pickup may read to its budget and still leave seconds to hand the candidate over
    # (GitHub's JIT call, KMS, two writes)
    assert timeout - pickups >= 5


def test_fleet_validation_has_the_time_creation_has_for_the_same_hand_overs(synthesis: Synthesis) -> None:
    # CheckFleet hands configs to created instances still waiting, as Create does, and reads every pending one
    steps = functions(synthesis)
    assert steps["provision.check_fleet"]["Timeout"] == steps["provision.create"]["Timeout"] == 120
