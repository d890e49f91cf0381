"""The state table as synthesised: the adapter's keys and indexes, TTL, recovery, encryption, retention."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk.assertions import Match

from emulator.resources import create_state_table
from runner_pool.adapters import state_items as schema
from tests.infra.synthesis import Synthesis

TABLE = "AWS::DynamoDB::Table"


def table_resource(synthesis: Synthesis) -> Mapping[str, Any]:
    """The state table's resource (the stack has another table: the webhook's idempotency table)."""
    table = synthesis.stack.state_table.table
    return synthesis.resources[synthesis.logical_id(table)]


def test_the_table_is_keyed_by_instance_and_item_kind(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its table is read / Then pk and sk are the adapter's strings
    synthesis.template.has_resource_properties(
        TABLE,
        {
            "KeySchema": [
                {"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": schema.SORT_KEY, "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": Match.array_with(
                [
                    {"AttributeName": schema.PARTITION_KEY, "AttributeType": "S"},
                    {"AttributeName": schema.SORT_KEY, "AttributeType": "S"},
                ]
            ),
        },
    )


def whole_records_index(name: str, partition: str, sort: str) -> Any:
    """A match for the table's indexes holding `name`, keyed by `partition` then `sort`, projecting whole
    records."""
    key_schema = [
        {"AttributeName": partition, "KeyType": "HASH"},
        {"AttributeName": sort, "KeyType": "RANGE"},
    ]
    return Match.array_with(
        [{"IndexName": name, "KeySchema": key_schema, "Projection": {"ProjectionType": "ALL"}}]
    )


def test_release_finds_instances_through_the_run_key_index(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its indexes are read
    # Then by-run-key is keyed by run key then instance, projecting whole records
    synthesis.template.has_resource_properties(
        TABLE,
        {
            "GlobalSecondaryIndexes": whole_records_index(
                schema.RUN_KEY_INDEX, schema.RUN_KEY_ATTRIBUTE, schema.PARTITION_KEY
            )
        },
    )


def test_refresh_sweeps_thresholds_through_the_sharded_threshold_index(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its indexes are read
    # Then by-threshold is keyed by sweep shard then a numeric threshold, projecting whole records
    synthesis.template.has_resource_properties(
        TABLE,
        {
            "GlobalSecondaryIndexes": whole_records_index(
                schema.THRESHOLD_INDEX, schema.SWEEP_SHARD_ATTRIBUTE, schema.THRESHOLD_ATTRIBUTE
            ),
            "AttributeDefinitions": Match.array_with(
                [{"AttributeName": schema.THRESHOLD_ATTRIBUTE, "AttributeType": "N"}]
            ),
        },
    )


def test_terminated_records_expire_by_ttl(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its TTL is read / Then it is on the adapter's TTL attribute
    synthesis.template.has_resource_properties(
        TABLE, {"TimeToLiveSpecification": {"AttributeName": schema.TTL_ATTRIBUTE, "Enabled": True}}
    )


def test_point_in_time_recovery_is_on(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its recovery settings are read / Then PITR is enabled
    synthesis.template.has_resource_properties(
        TABLE, {"PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True}}
    )


def test_the_table_is_encrypted_with_kms(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its encryption is read / Then SSE with KMS is enabled
    synthesis.template.has_resource_properties(TABLE, {"SSESpecification": {"SSEEnabled": True}})


def test_the_table_is_billed_on_demand(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When its billing is read / Then it is pay per request
    synthesis.template.has_resource_properties(TABLE, {"BillingMode": "PAY_PER_REQUEST"})


def test_the_table_outlives_stack_deletion_and_replacement(synthesis: Synthesis) -> None:
    # Given the synthesised stack / When the table's policies are read
    # Then neither deleting the stack nor replacing the table deletes the instances' records
    resource = table_resource(synthesis)
    assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == ("Retain", "Retain")


class _RecordingDynamoDB:
    """Stands in for a DynamoDB client and keeps the requests the emulator makes to build its table."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}

    def create_table(self, **request: Any) -> None:
        self.requests["create_table"] = request

    def update_time_to_live(self, **request: Any) -> None:
        self.requests["update_time_to_live"] = request


def test_the_deployed_table_has_the_emulators_shape(synthesis: Synthesis) -> None:
    # Given the table the emulator creates for tests and the demo
    client = _RecordingDynamoDB()
    create_state_table(client, "runner-pool-state")  # type: ignore[arg-type]
    created = client.requests["create_table"]
    ttl = client.requests["update_time_to_live"]["TimeToLiveSpecification"]
    emulated = _shape(
        created["KeySchema"],
        created["AttributeDefinitions"],
        created["GlobalSecondaryIndexes"],
        created["BillingMode"],
        ttl,
    )

    # When the synthesised table is read the same way
    properties = table_resource(synthesis)["Properties"]
    deployed = _shape(
        properties["KeySchema"],
        properties["AttributeDefinitions"],
        properties["GlobalSecondaryIndexes"],
        properties["BillingMode"],
        properties["TimeToLiveSpecification"],
    )

    # Then keys, attribute types, indexes, billing and TTL are the same: the two cannot drift
    assert deployed == emulated


def _shape(
    keys: list[Any], attributes: list[Any], indexes: list[Any], billing: str, ttl: dict[str, Any]
) -> dict[str, Any]:
    return {
        "keys": keys,
        "attributes": sorted((a["AttributeName"], a["AttributeType"]) for a in attributes),
        "indexes": {i["IndexName"]: (i["KeySchema"], i["Projection"]) for i in indexes},
        "billing": billing,
        "ttl": (ttl["AttributeName"], ttl["Enabled"]),
    }
