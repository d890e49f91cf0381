"""Instance ARNs: the name IAM knows an instance by, and so the partition key of all its items.

IAM resolves `${ec2:SourceInstanceARN}` to this ARN for requests an instance signs with its profile's
credentials. It is the only policy variable that names the calling instance, so the state table keys
every item of an instance by it: the instance role's `dynamodb:LeadingKeys` condition then lets
each instance reach its own items and no other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner_pool.adapters import aws_clients

_INSTANCE_RESOURCE = ":instance/"


@dataclass(frozen=True)
class InstanceArns:
    """Where the instances live (partition, region, account): what turns an instance id into its ARN."""

    partition: str
    region: str
    account_id: str

    def arn(self, instance_id: str) -> str:
        return f"arn:{self.partition}:ec2:{self.region}:{self.account_id}{_INSTANCE_RESOURCE}{instance_id}"

    @classmethod
    def of_caller(cls, client: Any, sts: Any = None) -> InstanceArns:
        """The instances of the account and region `client` works in, as its caller's STS identity says.

        `client` is any boto3 client of that region (its partition follows from the region); `sts`
        defaults to a client of the same region. One GetCallerIdentity call, which needs no permission.
        """
        region: str = client.meta.region_name
        sts = sts or aws_clients.client("sts", region_name=region)
        account_id: str = sts.get_caller_identity()["Account"]
        return cls(partition=client.meta.partition, region=region, account_id=account_id)


def instance_arn(instance_id: str, region: str, account_id: str, partition: str = "aws") -> str:
    """The ARN IAM knows the instance by, as `${ec2:SourceInstanceARN}` resolves for its own requests."""
    return InstanceArns(partition, region, account_id).arn(instance_id)


def names_instance(arn: str, instance_id: str) -> bool:
    """Whether `arn` is the ARN of the instance `instance_id`."""
    return arn.startswith("arn:") and arn.endswith(_INSTANCE_RESOURCE + instance_id)
