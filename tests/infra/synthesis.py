"""Synthesising the CDK app for tests: as cdk.json configures it, or with other pool settings.

The Lambdas' dependency layer is a stand-in directory: the real one is built from PyPI (`make synth`),
and tests run without the network. What the layer holds is tested in test_dependency_layer.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import App, CfnElement
from aws_cdk.assertions import Template
from constructs import IConstruct

from infra.app import CONFIG_CONTEXT_KEY, STACK_ID, build_app, project_context
from infra.dependency_layer import DependencyLayer
from infra.stack import RunnerPoolStack
from runner_pool.domain.config import StackConfig, load_config

DEPLOYABLE: dict[str, Any] = {
    "github": {"app_id": "4242", "installation_id": 777, "scope": "octo-org/octo-repo"},
    "network": {"vpc_id": "vpc-0abc0abc0abc0abc0", "subnet_ids": ["subnet-0abc0abc0abc0abc1"]},
}
"""The settings a deployable stack cannot do without; other settings in tests go on top of these."""

DISABLE_ASSET_STAGING_CONTEXT = "aws:cdk:disable-asset-staging"
"""CDK's context key (cx-api's DISABLE_ASSET_STAGING_CONTEXT, not exported to Python)."""

CUSTOM_SETTINGS: dict[str, Any] = {
    **DEPLOYABLE,
    "github": {
        "apps": [
            {
                "app_id": str(4242 + n),
                "installation_id": 777 + n,
                "private_key_secret_name": f"runner-pool/app-{n}-key",
                "webhook_secret_name": f"runner-pool/app-{n}-webhook",
            }
            for n in (0, 1)
        ],
        "scope": "octo-org/octo-repo",
    },
    "resource_classes": {
        "small": {"cpu": 1, "memory_mib": 2048},
        "build-farm": {"cpu": 48, "memory_mib": 96 * 1024, "ssm": True},
    },
    "defaults": {"resource_class": "small"},
    "timeouts": {"idle_seconds": 3600},
    "workflow_type": "EXPRESS",
    "alarms": {"email": "oncall@example.com"},
    "budget": {"daily_usd": 5, "drop_warm_minimums": True},
    "instances": {
        "ebs_kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    },
}
"""An operator's own Apps (two), class list (one with Session Manager), idle time, workflow type, alarm address,
daily budget and EBS key: unlike the defaults in every respect."""


@dataclass(frozen=True)
class Synthesis:
    config: StackConfig
    app: App
    stack: RunnerPoolStack
    template: Template
    resources: dict[str, dict[str, Any]]
    """The template's resources by logical id, as plain JSON: read without a call into jsii each time."""

    def logical_id(self, construct: IConstruct) -> str:
        """The logical id of the CloudFormation resource an L2 construct (a table, a queue, a role) wraps."""
        resource = construct.node.default_child
        assert isinstance(resource, CfnElement), f"{construct.node.path} wraps no CloudFormation resource"
        return self.stack.get_logical_id(resource)

    def statements_of_role(self, role_id: str) -> list[Mapping[str, Any]]:
        """Every statement of the IAM policies attached to the role of logical id `role_id`."""
        return [
            statement
            for policy in self.resources.values()
            if policy["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in policy["Properties"]["Roles"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        ]


def stub_layer(outdir: Path) -> DependencyLayer:
    """A layer directory shaped like the real one (`python/`), holding one marker file."""
    path = outdir.parent / f"{outdir.name}-layer"
    (path / "python").mkdir(parents=True, exist_ok=True)
    (path / "python" / "STUB").write_text("the tests' stand-in for the dependency layer\n")
    return DependencyLayer(path=path, key="stub-layer")


def app_with(
    settings: Mapping[str, Any] | None,
    outdir: Path,
    *,
    stage_assets: bool = True,
    context: Mapping[str, Any] | None = None,
) -> App:
    """The app as cdk.json configures it, with the "runner-pool" settings replaced when given (on top of
    DEPLOYABLE's), and `context` on top of cdk.json's, as `-c` gives it. Without `stage_assets` nothing
    is copied into the assembly, which saves seconds a synth (the agent's source is most of it) where a
    test reads the template only."""
    context = {**project_context(), **(context or {})}
    if settings is not None:
        context[CONFIG_CONTEXT_KEY] = {**DEPLOYABLE, **settings}
    if not stage_assets:
        context[DISABLE_ASSET_STAGING_CONTEXT] = True
    return build_app(context, outdir=str(outdir), layer=stub_layer(outdir))


def stack_of(app: App) -> RunnerPoolStack:
    stack = app.node.find_child(STACK_ID)
    assert isinstance(stack, RunnerPoolStack)
    return stack


def synthesize(
    settings: Mapping[str, Any] | None,
    outdir: Path,
    *,
    stage_assets: bool = True,
    context: Mapping[str, Any] | None = None,
) -> Synthesis:
    """Synthesise with cdk-nag, as `make synth` does; any unacknowledged finding raises here."""
    app = app_with(settings, outdir, stage_assets=stage_assets, context=context)
    app.synth()
    stack = stack_of(app)
    config = load_config(
        project_context()[CONFIG_CONTEXT_KEY] if settings is None else {**DEPLOYABLE, **settings}
    )
    template = Template.from_stack(stack)
    resources: dict[str, Any] = template.to_json()["Resources"]
    return Synthesis(config=config, app=app, stack=stack, template=template, resources=resources)
