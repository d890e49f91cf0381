"""The runner-pool stack: composes one construct per concern and nothing else."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnParameter, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from infra.constructs import Instances, PoolQueues, StateTable
from runner_pool.domain.config import StackConfig


class RunnerPoolStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: StackConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            construct_id,
            description="runner-pool: a warm pool of self-hosted EC2 runners for GitHub Actions",
            **kwargs,
        )
        self.state_table = StateTable(self, "StateTable")
        self.pool_queues = PoolQueues(self, "PoolQueues", config=config)
        self.instances = Instances(
            self, "Instances", config=config, vpc=self._runner_vpc(), table=self.state_table.table
        )

    def _runner_vpc(self) -> ec2.IVpc:
        """The operator's VPC, named at deploy time: a stand-in until the network's own construct lands.

        A deploy-time parameter keeps `cdk synth` free of AWS credentials and lookups, and creates no
        network (or NAT cost) that the network construct would have to replace.
        """
        vpc_id = CfnParameter(
            self,
            "RunnerVpcId",
            type="AWS::EC2::VPC::Id",
            description="The VPC runner instances launch in; its subnets need a route to GitHub and AWS.",
        )
        # Only the security group uses it, and that needs the id alone; the zone is a placeholder
        # CDK requires and nothing reads until the network construct brings the subnets.
        return ec2.Vpc.from_vpc_attributes(
            self,
            "RunnerVpc",
            vpc_id=vpc_id.value_as_string,
            availability_zones=[Fn.select(0, Fn.get_azs())],
        )
