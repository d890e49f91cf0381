"""The one helper that builds every control-plane Lambda: same code asset, layer, runtime and wiring.

Each function gets its own role (granted by the construct that uses it), its own log group with a
retention, active tracing, Powertools' service and namespace, and an environment named by the
fields of `runner_pool.environment.ControlPlaneSettings`, so a function receives exactly the
variables its handler reads and a misspelt one fails synth instead of a cold start.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import Acknowledgment, AssetHashType, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.dependency_layer import LAMBDA_PLATFORM, LAMBDA_PYTHON_VERSION, DependencyLayer
from runner_pool.domain.config import ConfigError, StackConfig
from runner_pool.environment import ENV_PREFIX, ControlPlaneSettings
from runner_pool.observability import METRICS_NAMESPACE, SERVICE

LAMBDAS_ROOT = Path(__file__).resolve().parents[2] / "lambdas"
HANDLERS_PACKAGE = "runner_pool.handlers"
CODE_EXCLUDES = ("*", "!runner_pool", "!runner_pool/**", "**/__pycache__", "**/*.pyc", "**/.*")
"""Only the runner_pool package: the Lambdas' code and nothing else of the repository."""
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = (
    lambda_.Architecture.ARM_64 if LAMBDA_PLATFORM.startswith("aarch64") else lambda_.Architecture.X86_64
)
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
ENVIRONMENT_LIMIT_BYTES = 4096
"""Lambda's limit on a function's environment, names and values together."""
CONFIG_BUDGET_BYTES = 2048
"""What the stack config's JSON may take of that limit; the other variables are names and ids."""


class ControlPlaneFunctions(Construct):
    """Builds the control-plane Lambdas; `function()` makes one, in the construct that owns it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        layer: DependencyLayer,
        table: dynamodb.ITable,
    ) -> None:
        super().__init__(scope, construct_id)
        # Every function is told the table: the settings model requires it of all of them.
        self.table_name = table.table_name
        if RUNTIME.name != f"python{LAMBDA_PYTHON_VERSION}":
            raise ValueError(
                f"the layer is built for Python {LAMBDA_PYTHON_VERSION}, the runtime is {RUNTIME}"
            )
        self.config_json = config.model_dump_json(exclude_defaults=True)
        if len(self.config_json) > CONFIG_BUDGET_BYTES:
            raise ConfigError(
                [
                    f"runner-pool: the settings take {len(self.config_json)} bytes as JSON, more than "
                    f"the {CONFIG_BUDGET_BYTES} a Lambda environment can spare "
                    f"({ENVIRONMENT_LIMIT_BYTES} in all); fix: leave settings at their defaults where you can"
                ]
            )
        self.code = lambda_.Code.from_asset(str(LAMBDAS_ROOT), exclude=list(CODE_EXCLUDES))
        self.layer = lambda_.LayerVersion(
            self,
            "Dependencies",
            # The key is the digest of the pinned requirements: hashing 90 MB of files each synth
            # would say the same thing, slower.
            code=lambda_.Code.from_asset(
                str(layer.path), asset_hash=layer.key, asset_hash_type=AssetHashType.CUSTOM
            ),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description=f"runner-pool runtime dependencies ({layer.key})",
        )

    def function(
        self,
        scope: Construct,
        handler: str,
        *,
        description: str,
        environment: Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
        memory_mib: int = 512,
        construct_id: str | None = None,
    ) -> lambda_.Function:
        """The Lambda of `runner_pool.handlers.<handler>` (e.g. `provision.check_claim`), in `scope`.

        The construct is named after the handler's function (`CheckClaim`) unless `construct_id` says
        otherwise. `environment` maps ControlPlaneSettings fields to values; structured values (mappings,
        sequences) are passed as JSON, as the settings model reads them. Every function also gets
        the table's name, the stack config, the stack name and the account.
        """
        module, _, name = f"{HANDLERS_PACKAGE}.{handler}".rpartition(".")
        _require_handler(module, name)
        construct_id = construct_id or "".join(part.capitalize() for part in name.split("_"))
        log_group = logs.LogGroup(
            scope,
            f"{construct_id}Logs",
            retention=LOG_RETENTION,
            removal_policy=RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            scope,
            f"{construct_id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"runner-pool {handler}: {description}"[:1000],
        )
        # The basic execution policy would let it write to any log group; this is its own.
        log_group.grant_write(role)
        function = lambda_.Function(
            scope,
            construct_id,
            description=f"runner-pool {handler}: {description}"[:256],
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=f"{module}.{name}",
            code=self.code,
            layers=[self.layer],
            role=role,
            log_group=log_group,
            timeout=timeout or Duration.seconds(30),
            memory_size=memory_mib,
            tracing=lambda_.Tracing.ACTIVE,
            environment=self._environment(scope, environment or {}),
        )
        Validations.of(role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::*]",
                reason=(
                    "Active tracing's xray:PutTraceSegments and xray:PutTelemetryRecords support no "
                    "resource-level permissions, so CDK grants them on `*`; EC2's Describe actions, granted "
                    "to some functions, likewise accept only `*`."
                ),
            )
        )
        Validations.of(function).acknowledge(
            Acknowledgment(
                id="AwsSolutions-L1",
                reason=(
                    f"The runtime is pinned to Python {LAMBDA_PYTHON_VERSION}: the dependency layer holds "
                    "wheels compiled for one Python ABI (pydantic-core, cryptography, cffi, msgpack), so "
                    "a newer runtime is a reviewed change of LAMBDA_PYTHON_VERSION, not a side effect "
                    "of a cdk-nag upgrade."
                ),
            )
        )
        return function

    def _environment(self, scope: Construct, settings: Mapping[str, Any]) -> dict[str, str]:
        unknown = sorted(set(settings) - set(ControlPlaneSettings.model_fields))
        if unknown:
            raise ValueError(f"not fields of ControlPlaneSettings: {', '.join(unknown)}")
        stack = Stack.of(scope)
        variables = {
            "POWERTOOLS_SERVICE_NAME": SERVICE,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            f"{ENV_PREFIX}TABLE_NAME": self.table_name,
            f"{ENV_PREFIX}CONFIG": self.config_json,
            f"{ENV_PREFIX}STACK_NAME": stack.stack_name,
            # Instance ARNs (the state table's keys) without a call to STS at cold start.
            f"{ENV_PREFIX}ACCOUNT_ID": stack.account,
        }
        for field, value in settings.items():
            variables[f"{ENV_PREFIX}{field.upper()}"] = (
                value if isinstance(value, str) else stack.to_json_string(_jsonable(value))
            )
        return variables


def _jsonable(value: Any) -> Any:
    """Tuples and mappings as JSON lists and objects (tokens inside them stay tokens for CloudFormation)."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(item) for item in value]
    return value


def _require_handler(module: str, name: str) -> None:
    """Fail synth, not the first invocation, when a handler the template names does not exist."""
    try:
        handler = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise LookupError(f"{module}.{name} is not a handler: there is no such module or function") from None
    if not callable(handler):
        raise LookupError(f"{module}.{name} is not callable")
