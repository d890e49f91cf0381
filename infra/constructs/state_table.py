"""The state table: every instance's records, with the three sparse indexes and the TTL the adapter relies on.

Names come from the state table adapter, so what the Lambdas read and write and what is deployed
cannot disagree; tests/infra also hold this shape against the emulator's table.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from runner_pool.adapters import state_items as schema


class StateTable(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_text(schema.PARTITION_KEY),
            sort_key=_text(schema.SORT_KEY),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=schema.TTL_ATTRIBUTE,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # The account's aws/dynamodb key: auditable in CloudTrail, and every role (Lambdas and
            # the instances' own) can use the table through DynamoDB without a key grant.
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            # The table is the only record of which EC2 instances exist and who holds them; losing
            # it to a stack deletion or a replacement would strand running, billed instances.
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.table.add_global_secondary_index(
            index_name=schema.RUN_KEY_INDEX,
            partition_key=_text(schema.RUN_KEY_ATTRIBUTE),
            sort_key=_text(schema.PARTITION_KEY),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        self.table.add_global_secondary_index(
            index_name=schema.THRESHOLD_INDEX,
            partition_key=_text(schema.SWEEP_SHARD_ATTRIBUTE),
            sort_key=_number(schema.THRESHOLD_ATTRIBUTE),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # Added after the first two: CloudFormation adds one global secondary index per update, and this
        # is the only one this change adds.
        self.table.add_global_secondary_index(
            index_name=schema.STOPPED_INDEX,
            partition_key=_text(schema.STOPPED_PARTITION_ATTRIBUTE),
            sort_key=_number(schema.THRESHOLD_ATTRIBUTE),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # Added after by-stopped, alone in its change for the same reason. Keys only: pickup asks
        # whether a partition has an idle record, never reads one from here.
        self.table.add_global_secondary_index(
            index_name=schema.IDLE_INDEX,
            partition_key=_text(schema.POOL_PARTITION_ATTRIBUTE),
            sort_key=_number(schema.IDLE_SINCE_ATTRIBUTE),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )


def _text(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)


def _number(name: str) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.NUMBER)
