"""Creates, in moto (or any AWS endpoint), the resources the stack would deploy, with the same shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner_pool.adapters import state_table as schema

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient


def create_state_table(client: DynamoDBClient, name: str) -> None:
    """The state table with its two sparse indexes and TTL, as infra/ declares it."""
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
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": schema.RUN_KEY_INDEX,
                "KeySchema": [
                    {"AttributeName": schema.RUN_KEY_ATTRIBUTE, "KeyType": "HASH"},
                    {"AttributeName": schema.PARTITION_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": schema.THRESHOLD_INDEX,
                "KeySchema": [
                    {"AttributeName": schema.SWEEP_SHARD_ATTRIBUTE, "KeyType": "HASH"},
                    {"AttributeName": schema.THRESHOLD_ATTRIBUTE, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
        ],
    )
    client.update_time_to_live(
        TableName=name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.TTL_ATTRIBUTE},
    )


def create_pool_queues(client: SQSClient, prefix: str, classes: list[str]) -> dict[str, str]:
    """One pool queue per resource class; returns the queue URL of each class."""
    return {name: client.create_queue(QueueName=f"{prefix}-pool-{name}")["QueueUrl"] for name in classes}
