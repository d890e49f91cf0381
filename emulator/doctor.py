"""`runner-pool doctor` against the emulator's own stack: the same checks (runner_pool/checkup.py), the Target
built from the local deployment instead of CloudFormation, and what moto does not model of an account.

moto answers neither Lambda's GetAccountSettings nor EC2's GetEbsDefaultKmsKeyId, and its EC2 makes no
service-linked role when a fleet is first created (EC2 does: "the first CreateFleet of an account makes
them", infra/constructs/permissions.py). LocalAccount answers the first two, each settable to the way a
real account differs; `add_service_linked_roles` gives the account the roles.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from emulator.world import World
from runner_pool.checkup import Target, doctor
from runner_pool.domain.doctor_readings import AWS_MANAGED_EBS_ALIAS, SERVICE_LINKED_ROLES, DeployedStack

LAMBDA_DEFAULT_CONCURRENCY = 1000
"""Lambda's default concurrent executions quota per Region (Lambda Developer Guide, "Lambda quotas":
"Concurrent executions: 1,000"); new accounts may be given less (10 has been seen)."""


@dataclass
class LocalAccount:
    """What the doctor reads of the account that moto does not model."""

    lambda_concurrency: int = LAMBDA_DEFAULT_CONCURRENCY
    lambda_reserved: int = 0
    """Concurrency reserved by functions: what the rest share is the quota less this."""
    ebs_default_key_id: str = AWS_MANAGED_EBS_ALIAS
    """What GetEbsDefaultKmsKeyId answers: `alias/aws/ebs` until the account names a key of its own."""

    def get_account_settings(self) -> dict[str, Any]:
        """Lambda's GetAccountSettings, its AccountLimit as the Lambda API Reference shapes it."""
        return {
            "AccountLimit": {
                "ConcurrentExecutions": self.lambda_concurrency,
                "UnreservedConcurrentExecutions": self.lambda_concurrency - self.lambda_reserved,
            },
            "AccountUsage": {"FunctionCount": 0},
        }

    def get_ebs_default_kms_key_id(self) -> dict[str, Any]:
        return {"KmsKeyId": self.ebs_default_key_id}


class _Answered:
    """A moto client, with some operations answered by LocalAccount instead."""

    def __init__(self, client: Any, **operations: Callable[[], dict[str, Any]]) -> None:
        self._client = client
        self.__dict__.update(operations)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def add_service_linked_roles(iam: Any) -> None:
    """The roles EC2 Fleet and Spot act through, as an account that has launched a fleet has them."""
    for name, service in SERVICE_LINKED_ROLES.items():
        iam.create_role(
            RoleName=name,
            Path=f"/aws-service-role/{service}/",
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
        )


def as_after_first_fleet(world: World) -> None:
    """The world as the README's deploy guide leaves an account and App: the service-linked roles EC2 makes
    at an account's first CreateFleet (moto's does not), and the App granted Organization administration:
    read, so the doctor can read the organisation's runner policy."""
    add_service_linked_roles(world.aws.client("iam"))
    with world.github.state.lock:
        for installation in world.github.state.installations.values():
            installation.permissions.setdefault("organization_administration", "read")


def target(world: World) -> Target:
    """The emulator's deployment as the doctor sees a deployed stack: its config, its webhook URL (the
    local API Gateway's), its provision state machine and launch templates."""
    settings = world.stack.plane.settings
    return Target(
        DeployedStack(settings.config, world.stack.webhook.url),
        settings.require("provision_state_machine_arn", "the doctor"),
        dict(settings.launch_templates),
    )


def clients(aws: Callable[[str], Any], account: LocalAccount) -> Callable[[str], Any]:
    """`aws`'s clients (moto), with what LocalAccount answers in their place."""

    def client(service: str) -> Any:
        if service == "lambda":
            return _Answered(aws("lambda"), get_account_settings=account.get_account_settings)
        if service == "ec2":
            return _Answered(aws("ec2"), get_ebs_default_kms_key_id=account.get_ebs_default_kms_key_id)
        return aws(service)

    return client


def examine(world: World, out: TextIO, account: LocalAccount | None = None) -> int:
    """Run the doctor on the world's stack; its exit code."""
    return doctor(target(world), clients(world.aws.client, account or LocalAccount()), out)
