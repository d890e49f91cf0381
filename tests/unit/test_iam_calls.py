"""The call table (emulator/iam_calls.py): what IAM authorizes for each call, as the Service Authorization
Reference (SAR) and the services' guides say."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from emulator.iam_calls import LaunchInputs, UnmappedCallError, authorizations

TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/state"
ROLE = "arn:aws:iam::123456789012:role/InstancesRole"


@dataclass
class World:
    partition: str = "aws"
    region: str = "us-east-1"
    account: str = "123456789012"

    def partition_key(self, table_name: str) -> str:
        return "pk"

    def secret_arn(self, secret_id: str) -> str:
        return f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{secret_id}-AbCdEf"

    def instance_tags(self, instance_id: str) -> Mapping[str, str]:
        return {"runner-pool:stack": "pool"} if instance_id == "i-1" else {}

    def launch_inputs(self, template_id: str) -> LaunchInputs:
        return LaunchInputs("ami-1", ("sg-1",), ROLE)

    def key_arn(self, key_id: str) -> str:
        return f"arn:aws:kms:us-east-1:123456789012:key/{key_id}"

    def queue_tags(self, queue_url: str) -> Mapping[str, str] | None:
        name = queue_url.rsplit("/", 1)[-1]
        if name.startswith("pool-notice-"):
            return {"runner-pool:instance": f"arn:aws:ec2:us-east-1:123456789012:instance/{name[12:]}"}
        return None if name == "gone" else {}


def test_a_query_on_an_index_authorizes_the_index_not_the_table() -> None:
    # SAR list_amazondynamodb.html: the `index` resource type of Query
    (found,) = authorizations(
        "dynamodb",
        "Query",
        {"TableName": "state", "IndexName": "by-run-key", "KeyConditionExpression": "run_key = :k"},
        World(),
    )
    assert (found.action, found.resource) == ("dynamodb:Query", f"{TABLE}/index/by-run-key")


def test_a_batch_get_authorizes_every_table_with_every_leading_key() -> None:
    found = authorizations(
        "dynamodb",
        "BatchGetItem",
        {
            "RequestItems": {
                "state": {
                    "Keys": [{"pk": {"S": "a"}, "sk": {"S": "1"}}, {"pk": {"S": "b"}, "sk": {"S": "1"}}]
                },
                "other": {"Keys": [{"pk": {"S": "c"}, "sk": {"S": "1"}}]},
            }
        },
        World(),
    )
    assert [(f.resource.rsplit("/", 1)[-1], f.context["dynamodb:LeadingKeys"]) for f in found] == [
        ("state", ("a", "b")),
        ("other", ("c",)),
    ]


def test_an_update_names_the_key_and_the_attributes_it_writes() -> None:
    # DynamoDB Developer Guide, specifying-conditions.html: dynamodb:Attributes
    (found,) = authorizations(
        "dynamodb",
        "UpdateItem",
        {
            "TableName": "state",
            "Key": {"pk": {"S": "a"}, "sk": {"S": "state"}},
            "UpdateExpression": "SET #s = :s, threshold = if_not_exists(threshold, :t) REMOVE run_key",
            "ExpressionAttributeNames": {"#s": "state"},
            "ReturnValues": "ALL_NEW",
        },
        World(),
    )
    assert found.context["dynamodb:Attributes"] == ("pk", "sk", "state", "threshold", "run_key")
    assert found.context["dynamodb:ReturnValues"] == "ALL_NEW"


def test_batch_queue_calls_need_their_single_actions() -> None:
    # SQS Developer Guide, sqs-api-permissions-reference.html
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/pool-large"
    (sent,) = authorizations("sqs", "SendMessageBatch", {"QueueUrl": url, "Entries": []}, World())
    (deleted,) = authorizations("sqs", "DeleteMessageBatch", {"QueueUrl": url, "Entries": []}, World())
    assert (sent.action, deleted.action) == ("sqs:SendMessage", "sqs:DeleteMessage")
    assert sent.resource == "arn:aws:sqs:us-east-1:123456789012:pool-large"


def test_a_queue_call_carries_the_queues_tags() -> None:
    # SQS Developer Guide, sqs-abac-condition-keys.html: aws:ResourceTag for queue resource operations
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/pool-notice-i-1"
    (received,) = authorizations("sqs", "ReceiveMessage", {"QueueUrl": url}, World())
    assert received.context == {
        "aws:ResourceTag/runner-pool:instance": "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
    }


def test_a_call_on_a_queue_that_does_not_exist_is_left_to_sqs() -> None:
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/gone"
    assert authorizations("sqs", "ReceiveMessage", {"QueueUrl": url}, World()) == []


def test_creating_a_tagged_queue_needs_tag_queue_with_the_request_tags() -> None:
    # Amazon SQS API Reference, CreateQueue: tagging on creation needs sqs:CreateQueue and sqs:TagQueue
    params = {"QueueName": "pool-notice-i-1", "tags": {"runner-pool:stack": "pool"}}
    created, tagged = authorizations("sqs", "CreateQueue", params, World())
    assert (created.action, tagged.action) == ("sqs:CreateQueue", "sqs:TagQueue")
    assert created.resource == "arn:aws:sqs:us-east-1:123456789012:pool-notice-i-1"
    assert tagged.context == {
        "aws:RequestTag/runner-pool:stack": "pool",
        "aws:TagKeys": ("runner-pool:stack",),
    }


def test_listing_queues_authorizes_every_resource() -> None:
    # Given/When ListQueues by a prefix; Then it authorizes `*`: the action has no resource type (SAR list_amazonsqs.html)
    (listed,) = authorizations("sqs", "ListQueues", {"QueueNamePrefix": "pool-notice-"}, World())
    assert listed.resource == "*"


def test_terminating_reads_each_instances_tags_and_id() -> None:
    # SAR list_amazonec2.html: the `instance` resource's aws:ResourceTag/${TagKey} and ec2:InstanceID
    tagged, vanished = authorizations("ec2", "TerminateInstances", {"InstanceIds": ["i-1", "i-2"]}, World())
    assert tagged.context == {
        "ec2:InstanceID": "i-1",
        "aws:ResourceTag/runner-pool:stack": "pool",
        "ec2:ResourceTag/runner-pool:stack": "pool",
    }
    assert vanished.context == {"ec2:InstanceID": "i-2"}


def test_an_instant_fleet_needs_run_instances_tags_at_launch_and_passes_the_instance_role() -> None:
    # SAR: CreateFleet's dependent actions; EC2 User Guide, ec2-fleet-prerequisites.html
    found = authorizations(
        "ec2",
        "CreateFleet",
        {
            "Type": "instant",
            "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"},
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-1", "Version": "$Default"},
                    "Overrides": [{"SubnetId": "subnet-1"}],
                }
            ],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}],
        },
        World(),
    )
    pairs = {(f.action, f.resource.split(":", 5)[5]) for f in found}
    assert {
        ("ec2:CreateFleet", "fleet/*"),
        ("ec2:CreateFleet", "launch-template/lt-1"),
        ("ec2:RunInstances", "instance/*"),
        ("ec2:RunInstances", "subnet/subnet-1"),
        ("ec2:RunInstances", "security-group/sg-1"),
        ("ec2:RunInstances", "image/ami-1"),
        ("ec2:RunInstances", "spot-instances-request/*"),
        ("ec2:CreateTags", "instance/*"),
        ("iam:PassRole", "role/InstancesRole"),
    } <= pairs
    (tagging,) = [f for f in found if f.action == "ec2:CreateTags"]
    assert tagging.context == {"ec2:CreateAction": "CreateFleet"}


def test_kms_calls_carry_the_encryption_context_as_condition_keys() -> None:
    # KMS Developer Guide, conditions-kms.html#conditions-kms-encryption-context
    (found,) = authorizations(
        "kms",
        "Decrypt",
        {"KeyId": "k-1", "CiphertextBlob": b"x", "EncryptionContext": {"instance-arn": "a"}},
        World(),
    )
    assert found.resource == "arn:aws:kms:us-east-1:123456789012:key/k-1"
    assert found.context == {
        "kms:EncryptionContext:instance-arn": "a",
        "kms:EncryptionContextKeys": ("instance-arn",),
    }


def test_an_operation_without_a_row_fails_instead_of_passing_unseen() -> None:
    with pytest.raises(UnmappedCallError, match="dynamodb:Scan"):
        authorizations("dynamodb", "Scan", {"TableName": "state"}, World())
