"""What the stack makes once and hands every workflow construct: one frozen set, named once."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_

from infra.constructs import permissions
from infra.constructs.functions import ControlPlaneFunctions
from infra.constructs.instances import Instances
from infra.constructs.pool_queues import PoolQueues
from runner_pool.domain.config import StackConfig


@dataclass(frozen=True)
class StackResources:
    """The stack's config and the resources its state machines and Lambdas share; each construct takes
    what it grants from here, so a new one is wired by naming this and what it adds."""

    config: StackConfig
    functions: ControlPlaneFunctions
    table: dynamodb.ITable
    pool_queues: PoolQueues
    instances: Instances
    github_tokens: lambda_.IFunction
    """The token function, the one reader of the App's key (infra/constructs/github_tokens.py)."""

    def launch_environment(self) -> dict[str, object]:
        """What a function that launches runner instances reads: the subnets, and the launch templates
        (one per architecture, and those of the classes with Session Manager)."""
        return {"subnet_ids": self.config.network.subnet_ids, **self.instances.launch_environment}

    def grant_launches(self, function: lambda_.Function) -> None:
        """CreateFleet from the stack's launch templates, with the instance roles and their images."""
        permissions.launch_instances(
            function,
            launch_templates=self.instances.every_launch_template,
            instance_roles=self.instances.roles,
            image_parameter_arns=self.instances.image_parameter_arns,
            volume_key=self.instances.volume_key,
        )
