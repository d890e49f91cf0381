"""`runner-pool doctor`: reads a deployment's GitHub App and AWS account once, judges them (domain/doctor.py)
and prints one line per check with its fix.

A deployment is found through its CloudFormation stack: the WebhookUrl and ProvisionStateMachineArn
outputs, and the environment of its functions (the stack config and the launch templates, as the
functions themselves read them). The emulator builds the same Target from its own deployment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

from runner_pool.adapters.account_readings import AccountReadings
from runner_pool.adapters.github_app import GitHubApp
from runner_pool.adapters.github_app_key import GitHubAppKey
from runner_pool.adapters.stack_outputs import stack_outputs
from runner_pool.domain.config import StackConfig
from runner_pool.domain.doctor import Finding, examine, exit_code, report
from runner_pool.domain.doctor_readings import (
    SERVICE_LINKED_ROLES,
    AppGrant,
    AppManifest,
    DeployedStack,
    HookConfig,
    Installation,
    Readings,
    RunnerPolicy,
    SecretState,
    Unread,
)
from runner_pool.domain.records import Arch
from runner_pool.domain.runner_scope import Registration, runner_scope
from runner_pool.environment import ENV_PREFIX

CLONE = Path(__file__).resolve().parents[2]
MANIFESTS: Mapping[Registration, Path] = MappingProxyType(
    {
        Registration.RUNNER_GROUP: CLONE / "github-app-manifest.json",
        Registration.REPOSITORY: CLONE / "github-app-manifest.personal-account.json",
    }
)
"""The App manifest for each registration, in the clone the CLI runs from (the project is installed from
it, editable): the least privileged one for an organisation's runner groups, repository administration
only where registration is at the repository."""
WEBHOOK_OUTPUT = "WebhookUrl"
PROVISION_OUTPUT = "ProvisionStateMachineArn"
CONFIG_VARIABLE = f"{ENV_PREFIX}CONFIG"
TEMPLATES_VARIABLE = f"{ENV_PREFIX}LAUNCH_TEMPLATES"


class TargetNotFoundError(LookupError):
    """The stack, an output or the functions' environment the doctor reads is not there."""


@dataclass(frozen=True)
class Target:
    """What the doctor examines: the deployment's own facts and where its parts are."""

    stack: DeployedStack
    provision_state_machine_arn: str
    launch_templates: Mapping[Arch, str]

    @classmethod
    def of_stack(cls, stack_name: str, cloudformation: Any, lambda_client: Any) -> Target:
        required = (WEBHOOK_OUTPUT, PROVISION_OUTPUT)
        outputs = stack_outputs(cloudformation, stack_name, required, TargetNotFoundError)
        try:
            resources = [
                r["PhysicalResourceId"]
                for page in cloudformation.get_paginator("list_stack_resources").paginate(
                    StackName=stack_name
                )
                for r in page["StackResourceSummaries"]
                if r["ResourceType"] == "AWS::Lambda::Function"
            ]
        except cloudformation.exceptions.ClientError as error:
            raise TargetNotFoundError(f"stack {stack_name!r}: {error}") from None
        for function in resources:
            try:
                variables = lambda_client.get_function_configuration(FunctionName=function)
            except lambda_client.exceptions.ClientError as error:
                raise TargetNotFoundError(f"function {function} of stack {stack_name!r}: {error}") from None
            environment = variables.get("Environment", {}).get("Variables", {})
            if TEMPLATES_VARIABLE in environment:
                return cls(
                    DeployedStack(
                        StackConfig.model_validate_json(environment.get(CONFIG_VARIABLE, "{}")),
                        outputs[WEBHOOK_OUTPUT],
                    ),
                    outputs[PROVISION_OUTPUT],
                    {
                        Arch(arch): template
                        for arch, template in json.loads(environment[TEMPLATES_VARIABLE]).items()
                    },
                )
        raise TargetNotFoundError(f"no function of stack {stack_name!r} is given {TEMPLATES_VARIABLE}")


def load_manifest(path: Path) -> AppManifest:
    return AppManifest.of(json.loads(path.read_text()))


def read(target: Target, clients: Callable[[str], Any], manifest: AppManifest) -> Readings:
    """Every reading the checks need, each made once; GitHub's as the App the stack acts as."""
    aws = AccountReadings(clients)
    github = target.stack.config.github
    secrets = aws.secrets([github.private_key_secret_name, github.webhook_secret_name])
    app = _app(target, clients, secrets[github.private_key_secret_name])
    app_grant: AppGrant | Unread
    installation: Installation | Unread
    hook: HookConfig | Unread
    policy: RunnerPolicy | Unread | None
    groups: tuple[int, ...] | Unread | None
    if isinstance(app, Unread):
        app_grant = installation = hook = policy = groups = app
    else:
        try:
            app_grant, installation, hook = app.app_grant(), app.installation(), app.hook_config()
            policy = groups = None
            if isinstance(installation, Unread):
                policy = groups = installation
            elif installation.organization:
                # The policy on repository-level runners matters to repository registration only.
                if github.effective_registration is Registration.REPOSITORY:
                    policy = app.runner_policy(installation.account)
                groups = app.runner_groups(installation.account)
        finally:
            app.close()
    return Readings(
        stack=target.stack,
        manifest=manifest,
        app=app_grant,
        installation=installation,
        runner_policy=policy,
        runner_groups=groups,
        hook=hook,
        secrets=secrets,
        ebs=aws.ebs_default(),
        lambda_quota=aws.lambda_quota(),
        map_concurrency=aws.map_concurrency(target.provision_state_machine_arn),
        service_roles=aws.service_roles(SERVICE_LINKED_ROLES),
        images=aws.launch_images(target.launch_templates),
    )


def doctor(
    target: Target, clients: Callable[[str], Any], out: TextIO, manifest: AppManifest | None = None
) -> int:
    """Examine `target`, print the report, and answer the exit code (1: something stops jobs). `manifest`:
    what the App was made from; by default this clone's for the stack's registration (MANIFESTS)."""
    registration = target.stack.config.github.effective_registration
    findings = examine_every_app(target, clients, manifest or load_manifest(MANIFESTS[registration]))
    for line in report(findings):
        print(line, file=out)
    return exit_code(findings)


ACCOUNT_CHECKS = frozenset({"ebs encryption", "lambda concurrency", "service-linked roles", "runner image"})
"""The checks of the AWS account, the same whichever App reads GitHub: reported once."""


def examine_every_app(target: Target, clients: Callable[[str], Any], manifest: AppManifest) -> list[Finding]:
    """Every check for a stack of one App; with several (github.apps), GitHub's checks once per App, each
    row naming its App, and the account's once."""
    config = target.stack.config
    apps = config.github.every_app
    if len(apps) < 2:
        return examine(read(target, clients, manifest))
    findings: list[Finding] = []
    for n, app in enumerate(apps):
        github = config.github.model_copy(
            update={"apps": (), **app.model_dump()}  # the App as a stack of it alone would name it
        )
        alone = replace(
            target, stack=replace(target.stack, config=config.model_copy(update={"github": github}))
        )
        findings += [
            finding
            if finding.check in ACCOUNT_CHECKS
            else replace(finding, check=f"{finding.check} (App {app.app_id})")
            for finding in examine(read(alone, clients, manifest))
            if n == 0 or finding.check not in ACCOUNT_CHECKS
        ]
    return findings


def _app(
    target: Target, clients: Callable[[str], Any], key_state: SecretState | Unread
) -> GitHubApp | Unread:
    github = target.stack.config.github
    if key_state is not SecretState.PRESENT:
        return Unread(f"the App's private key ({github.private_key_secret_name}) is not readable")
    if github.app_id is None or github.installation_id is None or github.scope is None:
        return Unread("github.app_id, installation_id and scope are not all set in the stack config")
    key = clients("secretsmanager").get_secret_value(SecretId=github.private_key_secret_name)["SecretString"]
    try:
        return GitHubApp(
            GitHubAppKey(
                github.app_id,
                key,
                github.installation_id,
                base_url=github.api_url,
                api_version=github.api_version,
            ),
            runner_scope(str(github.scope)),
            base_url=github.api_url,
            api_version=github.api_version,
            registration=github.effective_registration,
            groups_allow_public_repositories=github.runner_groups_allow_public_repositories,
        )
    except ValueError as exc:
        return Unread(str(exc))
