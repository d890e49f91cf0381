"""The work local AWS does once or directly (emulator/moto_speedups.py) answers exactly as moto does.

The reference is moto's own serializer, run on the same answer: for every item operation and every
attribute type DynamoDB has (DynamoDB API reference, "AttributeValue": S, N, B, SS, NS, BS, M, L,
NULL, BOOL), the direct JSON is the serializer's JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws
from moto.core.utils import unix_time
from moto.dynamodb.models.table import Table
from moto.dynamodb.responses import DynamoResult
from moto.sqs.models import sqs_backends

from emulator.aws import ACCOUNT, REGION, LocalAws, behaving_as_aws, local_aws
from emulator.moto_internals import patch_point, resolve
from emulator.moto_speedups import ITEM_OPERATIONS

LAMBDA_CLIENT = (
    "moto.stepfunctions.parser.asl.component.state.exec.state_task.lambda_eval_utils:boto_client_for"
)
JSON_PATH = "moto.stepfunctions.parser.asl.utils.json_path:parse"
RESULT_PATH = "moto.stepfunctions.parser.asl.component.common.path.result_path:parse"

EVERY_TYPE: dict[str, Any] = {
    "pk": {"S": "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"},
    "sk": {"S": "record"},
    "n": {"N": "1795720173.321"},
    "b": {"B": b"\x00\x01\xfe\xff ciphertext"},
    "ss": {"SS": ["a", "b"]},
    "ns": {"NS": ["1", "2.5"]},
    "bs": {"BS": [b"\x00", b"\xff"]},
    "m": {"M": {"nested": {"L": [{"S": "x"}, {"N": "3"}, {"BOOL": False}]}, "gone": {"NULL": True}}},
    "l": {"L": [{"M": {"k": {"B": b"\x10"}}}]},
    "t": {"BOOL": True},
    "u": {"S": "ünïcode ✓"},
}
KEY = {"pk": EVERY_TYPE["pk"], "sk": EVERY_TYPE["sk"]}

Seen = tuple[str, str | bytes, str | bytes]
"""An operation, the answer's body as written directly, and the body moto's serializer writes."""


@pytest.fixture
def answers() -> Iterator[tuple[LocalAws, list[Seen]]]:
    """Local AWS whose DynamoDB answers are kept with what moto's serializer makes of the same answer."""
    seen: list[Seen] = []
    serializer = resolve("moto.dynamodb.responses:DynamoResult.execute_result")  # moto's, inherited
    with local_aws() as aws:
        direct = DynamoResult.execute_result

        def both(result: Any, context: Any) -> tuple[int, dict[str, str], str | bytes]:
            status, headers, body = direct(result, context)
            _, _, reference = serializer(result, context)
            seen.append((context.operation_model.name, body, reference))
            return status, headers, body

        with mock.patch.object(DynamoResult, "execute_result", both):
            yield aws, seen


def test_every_item_operation_answers_as_motos_serializer_does(
    answers: tuple[LocalAws, list[Seen]],
) -> None:
    aws, seen = answers
    dynamodb = aws.client("dynamodb")
    dynamodb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName="t", Item=EVERY_TYPE, ReturnConsumedCapacity="TOTAL")
    item = dynamodb.get_item(TableName="t", Key=KEY, ConsistentRead=True)["Item"]
    dynamodb.get_item(TableName="t", Key={**KEY, "sk": {"S": "none"}})
    dynamodb.update_item(
        TableName="t",
        Key=KEY,
        UpdateExpression="SET n = n + :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
        ReturnConsumedCapacity="TOTAL",
    )
    dynamodb.query(
        TableName="t",
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": KEY["pk"]},
        Limit=1,
    )
    dynamodb.scan(TableName="t", ReturnConsumedCapacity="INDEXES")
    dynamodb.batch_get_item(RequestItems={"t": {"Keys": [KEY], "ConsistentRead": True}})
    dynamodb.batch_write_item(RequestItems={"t": [{"PutRequest": {"Item": {**KEY, "sk": {"S": "other"}}}}]})
    dynamodb.transact_get_items(TransactItems=[{"Get": {"TableName": "t", "Key": KEY}}])
    dynamodb.transact_write_items(
        TransactItems=[{"Put": {"TableName": "t", "Item": {**KEY, "sk": {"S": "third"}}}}]
    )
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.put_item(
            TableName="t",
            Item=KEY,
            ConditionExpression="attribute_not_exists(pk)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    dynamodb.delete_item(TableName="t", Key=KEY, ReturnValues="ALL_OLD")
    dynamodb.describe_table(TableName="t")

    # Then the client read every type back as written
    assert item == EVERY_TYPE
    operations = {name for name, _, _ in seen}
    assert ITEM_OPERATIONS | {"DescribeTable"} <= operations
    # And each answer is, as JSON, the one moto's serializer writes
    for name, body, reference in seen:
        assert json.loads(body or "{}") == json.loads(reference or "{}"), name


def test_step_functions_lambda_tasks_share_one_client_per_region() -> None:
    with local_aws():
        client_for = resolve(LAMBDA_CLIENT)
        first = client_for(region="us-east-1", service="lambda", state_credentials=None)
        again = client_for(region="us-east-1", service="lambda", state_credentials=None)
        other = client_for(region="eu-west-1", service="lambda", state_credentials=None)
        assert again is first
        assert other is not first
        assert first.meta.endpoint_url.startswith("http://localhost:")
    # And outside local AWS, moto makes its own clients again
    assert resolve(LAMBDA_CLIENT)(region="us-east-1", service="lambda") is not first


@pytest.mark.parametrize("where", [JSON_PATH, RESULT_PATH])
def test_a_json_path_is_parsed_once_and_finds_as_before(where: str) -> None:
    data = {"a": {"b": [1, 2, 3]}, "c": "x"}
    paths = ("$.a.b", "$.a.b[1]", "$.c", "$")
    outside = [[m.value for m in resolve(where)(path).find(data)] for path in paths]
    with local_aws():
        parse = resolve(where)
        assert parse("$.a.b") is parse("$.a.b")
        inside = [[m.value for m in parse(path).find(data)] for path in paths]
    assert inside == outside == [[[1, 2, 3]], [2], ["x"], [data]]


def test_a_response_class_methods_are_listed_once_and_as_before() -> None:
    handler = resolve("moto.dynamodb.responses:DynamoHandler")
    method_names = "moto.core.responses:method_names_from_class"
    outside = resolve(method_names)(handler)
    with local_aws():
        listed = resolve(method_names)
        assert listed(handler) is listed(handler)
        assert listed(handler) == outside
    assert "update_item" in outside


@pytest.mark.parametrize("range_key", [None, "N", "S"])
def test_a_tables_items_are_listed_in_motos_order(range_key: str | None) -> None:
    # Given a table keyed by a string (and a number or a string), whose items were written out of order,
    # with numbers whose text sorts otherwise than their value
    values = {"N": ["10", "9", "-1", "2.5", "100"], "S": ["b", "a", "", "ab", "B"]}
    schema = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attributes = [{"AttributeName": "pk", "AttributeType": "S"}]
    if range_key:
        schema.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attributes.append({"AttributeName": "sk", "AttributeType": range_key})
    all_items = "moto.dynamodb.models.table:Table.all_items"
    motos = resolve(all_items)
    with local_aws() as aws:
        dynamodb = aws.client("dynamodb")
        dynamodb.create_table(
            TableName="t", KeySchema=schema, AttributeDefinitions=attributes, BillingMode="PAY_PER_REQUEST"
        )
        sort_keys = [{"sk": {range_key: v}} for v in values[range_key] if v] if range_key else [{}]
        for pk in ("i-9", "i-10", "i-1", "i-b"):
            for sort_key in sort_keys:
                dynamodb.put_item(TableName="t", Item={"pk": {"S": pk}, **sort_key})
        owner, name = patch_point(all_items)
        fast = getattr(owner, name)
        tables: list[Table] = []

        def listing(table: Table) -> Any:
            """The listing as patched, keeping the table it is asked of."""
            tables.append(table)
            return fast(table)

        with mock.patch.object(owner, name, listing):
            dynamodb.scan(TableName="t")
        table = tables[0]
        # When its items are listed / Then in the very order moto lists them
        listed = resolve(all_items)(table)
        assert resolve(all_items) is not motos
        assert [(i.hash_key, i.range_key) for i in listed] == [
            (i.hash_key, i.range_key) for i in motos(table)
        ]
        assert len(listed) == (4 * 5 if range_key == "N" else 4 * 4 if range_key else 4)


def _receive_story(queue_url: str, sqs: Any, backend_of: Any) -> list[list[str]]:
    """What a queue hands out, receive by receive: messages delayed, held by a visibility timeout,
    past their retention period, and one that comes round again after its hold."""
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"MessageRetentionPeriod": "60"})
    for body in ("a", "b", "c", "d"):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    sqs.send_message(QueueUrl=queue_url, MessageBody="delayed", DelaySeconds=900)
    queue = backend_of(queue_url)
    old = next(m for m in queue._messages if m.body == "c")
    old.sent_timestamp -= 61_000  # sent 61 s ago: past the queue's 60 s retention
    story = []
    for hold in (0, 900, 900):
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=hold)
        story.append(sorted(m["Body"] for m in answer.get("Messages", [])))
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    story.append([attributes[f"ApproximateNumberOfMessages{kind}"] for kind in ("", "NotVisible", "Delayed")])
    return story


def test_sqs_hands_out_and_counts_what_motos_sqs_does() -> None:
    # Given the same queue story (delays, holds, a message past its retention) on stock moto and on
    # local AWS, whose SQS reads its clock with time.time() and checks retention on the period alone
    def backend_of(queue_url: str) -> Any:
        account, name = queue_url.rsplit("/", 2)[-2:]
        return sqs_backends[account][REGION].queues[name]

    stories = []
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        stories.append(_receive_story(sqs.create_queue(QueueName="pool")["QueueUrl"], sqs, backend_of))
    with local_aws() as aws:
        sqs = aws.client("sqs")
        stories.append(_receive_story(sqs.create_queue(QueueName="pool")["QueueUrl"], sqs, backend_of))
    # Then both hand out and count the very same
    assert stories[0] == stories[1]
    # (stock moto stops at the expired message; the rest are held for 0 s and handed out again)
    assert stories[1][0] == ["a", "b"]


def test_sqs_clock_is_motos_clock() -> None:
    with local_aws():
        seconds, millis = resolve("moto.sqs.models:unix_time"), resolve("moto.sqs.models:unix_time_millis")
        assert abs(seconds() - unix_time()) < 0.05
        assert abs(millis() / 1000 - unix_time()) < 0.05
        instant = datetime(2026, 11, 27, 9, 30, 1, 250000)
        assert seconds(instant) == unix_time(instant)


def test_an_ec2_resources_tags_are_read_by_id_as_moto_lists_them() -> None:
    # Given instances tagged at launch and afterwards (one tag overwritten, one deleted), one untagged, one
    # terminated, and other tagged resources of the region (a launch template, a volume)
    motos = resolve("moto.ec2.models.core:TaggedEC2Resource.get_tags")
    with local_aws() as aws:
        ec2 = aws.client("ec2")
        image = ec2.describe_images()["Images"][0]["ImageId"]
        tagged = [
            {"ResourceType": "instance", "Tags": [{"Key": "stack", "Value": "s"}, {"Key": "b", "Value": "1"}]}
        ]
        launched = [
            ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, TagSpecifications=tagged)["Instances"],
            ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"],
        ]
        ids = [i["InstanceId"] for batch in launched for i in batch]
        ec2.create_tags(Resources=ids[:1], Tags=[{"Key": "a", "Value": "x"}, {"Key": "b", "Value": "2"}])
        ec2.delete_tags(Resources=ids[1:2], Tags=[{"Key": "b"}])
        ec2.terminate_instances(InstanceIds=ids[1:2])
        ec2.create_launch_template(
            LaunchTemplateName="lt",
            LaunchTemplateData={"ImageId": image},
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": [{"Key": "stack", "Value": "s"}]}],
        )
        volume = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=8)["VolumeId"]
        ec2.create_tags(Resources=[volume], Tags=[{"Key": "stack", "Value": "s"}])
        backend = resolve("moto.ec2.models:ec2_backends")[ACCOUNT][REGION]
        resources = [i for r in backend.reservations.values() for i in r.instances]
        resources += [*backend.launch_templates.values(), backend.get_volume(volume)]

        # When each one's tags are read / Then they are moto's very list, in its order
        for resource in resources:
            assert resource.get_tags() == motos(resource), resource.id
        assert resolve("moto.ec2.models.core:TaggedEC2Resource.get_tags") is not motos
        first = next(i for i in resources if i.id == ids[0])
        assert [(t["key"], t["value"], t["resource_type"]) for t in first.get_tags()] == [
            ("stack", "s", "instance"),
            ("b", "2", "instance"),
            ("a", "x", "instance"),
        ]
        # And DescribeInstances filters on them as before
        found = ec2.describe_instances(Filters=[{"Name": "tag:b", "Values": ["1", "2"]}])["Reservations"]
        assert sorted(i["InstanceId"] for r in found for i in r["Instances"]) == sorted(ids[:1])


def test_symmetric_kms_keys_share_a_key_pair_and_stay_keys_of_their_own() -> None:
    # Given two symmetric keys and two asymmetric ones on local AWS
    with local_aws() as aws:
        kms = aws.client("kms")
        first, second = (kms.create_key()["KeyMetadata"]["KeyId"] for _ in range(2))
        signing = [
            kms.create_key(KeySpec="RSA_2048", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["KeyId"]
            for _ in range(2)
        ]
        backend = resolve("moto.kms.models:kms_backends")[ACCOUNT][REGION]
        # Then the symmetric keys are two keys, with their own key material, on one key pair
        assert first != second
        assert backend.keys[first].key_material != backend.keys[second].key_material
        assert backend.keys[first].private_key is backend.keys[second].private_key
        # And each decrypts what it encrypted, and not what the other did
        blob = kms.encrypt(KeyId=first, Plaintext=b"jit config")["CiphertextBlob"]
        assert kms.decrypt(CiphertextBlob=blob)["KeyId"].endswith(first)
        with pytest.raises(kms.exceptions.ClientError):
            kms.decrypt(CiphertextBlob=blob, KeyId=second)
        # And each asymmetric key has a key pair of its own, as in AWS
        public = [kms.get_public_key(KeyId=key)["PublicKey"] for key in signing]
        assert public[0] != public[1]


def test_boto3s_default_session_is_one_for_the_process_while_moto_runs() -> None:
    # Given two mocks one after the other, each behaving as AWS
    sessions = []
    for _ in range(2):
        with mock_aws(), behaving_as_aws():
            boto3.client("sqs", region_name=REGION).create_queue(QueueName="q")
            sessions.append(boto3.DEFAULT_SESSION)
    # Then their clients came from one session, which the second mock did not drop
    assert sessions[0] is not None
    assert sessions[1] is sessions[0]
    # And a plain mock still starts without one, as moto makes it
    with mock_aws():
        assert boto3.DEFAULT_SESSION is None
