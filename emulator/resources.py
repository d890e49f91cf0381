"""Creates, in moto (or any AWS endpoint), the resources the stack would deploy, with the same shape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import state_items as schema
from runner_pool.adapters.fleet import FleetSetup, LaunchTemplate
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Arch
from runner_pool.environment import STACK_TAG_KEY

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_sqs.client import SQSClient


def create_state_table(client: DynamoDBClient, name: str) -> None:
    """The state table with its three sparse indexes and TTL, as infra/ declares it."""
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[
            {"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": schema.SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": schema.PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": schema.SORT_KEY, "AttributeType": "S"},
            {"AttributeName": schema.RUN_KEY_ATTRIBUTE, "AttributeType": "S"},
            {"AttributeName": schema.SWEEP_SHARD_ATTRIBUTE, "AttributeType": "S"},
            {"AttributeName": schema.THRESHOLD_ATTRIBUTE, "AttributeType": "N"},
            {"AttributeName": schema.STOPPED_PARTITION_ATTRIBUTE, "AttributeType": "S"},
            {"AttributeName": schema.POOL_PARTITION_ATTRIBUTE, "AttributeType": "S"},
            {"AttributeName": schema.IDLE_SINCE_ATTRIBUTE, "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            _index(schema.RUN_KEY_INDEX, schema.RUN_KEY_ATTRIBUTE, schema.PARTITION_KEY),
            _index(schema.THRESHOLD_INDEX, schema.SWEEP_SHARD_ATTRIBUTE, schema.THRESHOLD_ATTRIBUTE),
            _index(schema.STOPPED_INDEX, schema.STOPPED_PARTITION_ATTRIBUTE, schema.THRESHOLD_ATTRIBUTE),
            _index(
                schema.IDLE_INDEX, schema.POOL_PARTITION_ATTRIBUTE, schema.IDLE_SINCE_ATTRIBUTE, "KEYS_ONLY"
            ),
        ],
    )
    client.update_time_to_live(
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.TTL_ATTRIBUTE},
    )


def _index(name: str, partition: str, sort: str, projection: str = "ALL") -> Any:
    """One global secondary index: `partition` its hash key, `sort` its range key."""
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": partition, "KeyType": "HASH"},
            {"AttributeName": sort, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": projection},
    }


def create_pool_queues(client: SQSClient, name_prefix: str, classes: Iterable[str]) -> str:
    """One pool queue per partition of the classes, named as infra/ names them under `name_prefix`
    (pool_partitions.queue_name_prefix); returns the URL prefix the functions are told.

    The prefix has SQS's own shape, `https://sqs.<region>.amazonaws.com/<account>/` (SQS Developer Guide,
    "Amazon SQS queue and message identifiers"), as the template builds it, not the local server's
    address: moto finds a queue by the URL's last part, whatever host it names.
    """
    urls = [
        client.create_queue(QueueName=partition.queue_name(name_prefix))["QueueUrl"]
        for partition in PoolPartition.every(classes)
    ]
    account = urls[0].rstrip("/").split("/")[-2]
    return f"https://sqs.{client.meta.region_name}.amazonaws.com/{account}/{name_prefix}"


AMI_ARCHITECTURES = {Arch.X64: "x86_64", Arch.ARM64: "arm64"}
"""EC2's name of each architecture, as DescribeImages reports it."""
NETWORK_ZONES = 3
"""Availability zones of the emulated network: the most a CDK VPC spreads over by default."""


def create_network(ec2: EC2Client, zones: int = NETWORK_ZONES) -> tuple[str, ...]:
    """A VPC with one subnet in each of the region's first `zones` availability zones; the subnet ids.

    Each subnet is a /20 (4,091 usable addresses: AWS reserves five in every subnet, and moto, like EC2,
    refuses an instance when its subnet has no address left). A /24 holds 251 and ran out in the
    300-job burst. The user brings the subnets (`network.subnet_ids`): the README asks for room for
    the pool's maximum in them.
    https://docs.aws.amazon.com/vpc/latest/userguide/subnet-sizing.html
    """
    vpc_id = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    names = [zone["ZoneName"] for zone in ec2.describe_availability_zones()["AvailabilityZones"]]
    return tuple(
        ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.0.{block}.0/20", AvailabilityZone=zone)["Subnet"][
            "SubnetId"
        ]
        for block, zone in zip(range(0, 256, 16), sorted(names)[:zones], strict=False)
    )


def create_launch_templates(ec2: EC2Client, prefix: str = "runner-pool") -> dict[Arch, str]:
    """One launch template per architecture, shaped as infra/constructs/instances.py builds them; the ids.

    Each boots the newest Amazon Linux 2023 image of its architecture among moto's default images,
    with IMDSv2 required at one hop and an encrypted root volume; no user data, as no agent boots here.
    """
    return {
        arch: ec2.create_launch_template(
            LaunchTemplateName=f"{prefix}-{arch.value}",
            LaunchTemplateData={
                "ImageId": _amazon_linux_image(ec2, AMI_ARCHITECTURES[arch]),
                "MetadataOptions": {
                    "HttpEndpoint": "enabled",
                    "HttpTokens": "required",
                    "HttpPutResponseHopLimit": 1,
                },
                "InstanceInitiatedShutdownBehavior": "terminate",
                "BlockDeviceMappings": [
                    {
                        "DeviceName": "/dev/xvda",
                        "Ebs": {
                            "VolumeSize": 40,
                            "VolumeType": "gp3",
                            "Encrypted": True,
                            "DeleteOnTermination": True,
                        },
                    }
                ],
            },
        )["LaunchTemplate"]["LaunchTemplateId"]
        for arch in Arch
    }


def create_fleet_setup(ec2: EC2Client, stack_name: str) -> FleetSetup:
    """A network and launch templates, and the FleetSetup a launching Lambda would be given for them."""
    return FleetSetup(
        subnet_ids=create_network(ec2),
        templates={
            arch: LaunchTemplate(template_id) for arch, template_id in create_launch_templates(ec2).items()
        },
        stack_tag_key=STACK_TAG_KEY,
        stack_tag_value=stack_name,
    )


def _amazon_linux_image(ec2: EC2Client, architecture: str) -> str:
    images = ec2.describe_images(
        Owners=["amazon"],
        Filters=[
            {"Name": "architecture", "Values": [architecture]},
            {"Name": "name", "Values": [f"al2023-ami-2023.*-{architecture}"]},
        ],
    )["Images"]
    if not images:
        raise LookupError(f"no Amazon Linux 2023 image for {architecture} among the EC2 images")
    return max(images, key=lambda image: image.get("Name", ""))["ImageId"]


def create_idempotency_table(client: DynamoDBClient, name: str) -> None:
    """The webhook's idempotency table, which also holds the dispatcher's demand ledger: key `id`, TTL."""
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
    )
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"}
    )


DEMAND_MAX_RECEIVES = 5
"""Deliveries of one demand message before it moves to the dead-letter queue."""


def create_demand_queue(client: SQSClient, prefix: str) -> str:
    """The demand queue with its dead-letter queue; returns the demand queue's URL."""
    dead_letters = client.create_queue(QueueName=f"{prefix}-demand-dlq")["QueueUrl"]
    dead_letters_arn = client.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    redrive = f'{{"deadLetterTargetArn": "{dead_letters_arn}", "maxReceiveCount": "{DEMAND_MAX_RECEIVES}"}}'
    demand = client.create_queue(QueueName=f"{prefix}-demand", Attributes={"RedrivePolicy": redrive})
    return demand["QueueUrl"]
