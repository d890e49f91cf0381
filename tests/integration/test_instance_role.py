"""The instance role as synthesized, evaluated with the context EC2 gives an instance's calls: each instance
reaches its own items, its own runner config and itself, and nothing of another instance.

The agent's adapters (StateTable, RunnerCredentials, SelfTermination's TerminateInstances) run on moto
with their clients checked as instance A (emulator/iam_check.py); the control plane's side is played
with unchecked clients. Conditions evaluated: dynamodb:LeadingKeys and dynamodb:Attributes (DynamoDB
Developer Guide, specifying-conditions.html), kms:EncryptionContext:instance-arn (KMS Developer Guide,
conditions-kms.html), ec2:SourceInstanceARN against ec2:InstanceID (SAR list_amazonec2.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError

from emulator.aws import ACCOUNT
from emulator.harness.control_plane import NO_WAIT, REGION
from emulator.iam_check import PolicyCheck
from emulator.iam_stack import StackIam, checked_template
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.runner_credentials import RunnerCredentials
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.records import Signal
from runner_pool.domain.runner_configs import CredentialsUnreadableError
from tests.conftest import TABLE_NAME
from tests.support import builders

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import KeysAndAttributesTypeDef

ARNS = InstanceArns("aws", REGION, ACCOUNT)


@dataclass
class Instances:
    check: PolicyCheck
    a: str
    b: str
    own_table: StateTable
    """Instance A's agent's view of the table, checked as A."""
    own_credentials: RunnerCredentials
    own_ec2: Any
    own_dynamodb: Any
    """Instance A's raw DynamoDB client, checked as A: what a job that became root on A can call."""
    plane_table: StateTable
    plane_credentials: RunnerCredentials


def run_instance(ec2: Any) -> str:
    instance_id: str = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0][
        "InstanceId"
    ]
    return instance_id


@pytest.fixture
def instances(dynamodb: Any, clock: ManualClock, config: StackConfig) -> Instances:
    kms = boto3.client("kms", region_name=REGION)
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    ec2 = boto3.client("ec2", region_name=REGION)
    a, b = run_instance(ec2), run_instance(ec2)
    environment = {"RUNNER_POOL_TABLE_NAME": TABLE_NAME, "RUNNER_POOL_CREDENTIALS_KEY_ID": key_id}
    check = PolicyCheck(StackIam.bound(checked_template(), environment, region=REGION, account=ACCOUNT))
    as_a = check.iam.instance(a)
    own = {s: check.on_client(boto3.client(s, region_name=REGION), as_a) for s in ("dynamodb", "kms", "ec2")}

    def credentials(dynamodb_client: Any, kms_client: Any) -> RunnerCredentials:
        return RunnerCredentials(
            TABLE_NAME,
            config.timeouts,
            clock,
            key_id=key_id,
            dynamodb=dynamodb_client,
            kms=kms_client,
        )

    return Instances(
        check=check,
        a=a,
        b=b,
        own_table=StateTable(TABLE_NAME, config.timeouts, clock, own["dynamodb"], NO_WAIT, arns=ARNS),
        own_credentials=credentials(own["dynamodb"], own["kms"]),
        own_ec2=own["ec2"],
        own_dynamodb=own["dynamodb"],
        plane_table=StateTable(TABLE_NAME, config.timeouts, clock, dynamodb, NO_WAIT, arns=ARNS),
        plane_credentials=credentials(dynamodb, kms),
    )


def denied_operations(check: PolicyCheck) -> list[str]:
    return [call.operation for call in check.denials()]


def test_an_instance_writes_and_reads_its_own_heartbeat_and_signal(instances: Instances) -> None:
    # When instance A's agent beats, signals and reads both back
    instances.own_table.write_heartbeat(instances.a)
    instances.own_table.write_signal(instances.a, Signal.UD_REG_OK, "pool=1")
    assert instances.own_table.read_heartbeat(instances.a) is not None
    assert instances.own_table.read_signal(instances.a) is not None
    # Then the instance role allowed every call
    assert instances.check.checked() == 4
    instances.check.assert_allowed()


def test_an_instance_cannot_read_or_write_another_instances_items(instances: Instances) -> None:
    # Given B's record and heartbeat, written by the control plane
    instances.plane_table.create(builders.facts(instance_id=instances.b), run_key=None)
    instances.plane_table.write_heartbeat(instances.b)
    # When A's agent reads B's heartbeat, and writes a signal as B
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_table.read_heartbeat(instances.b)
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_table.write_signal(instances.b, Signal.UD_REG_OK, "pool=1")
    # Then both were denied for B's partition key, the LeadingKeys condition naming A's ARN
    assert denied_operations(instances.check) == ["dynamodb:GetItem", "dynamodb:PutItem"]
    explained = "\n".join(call.explain() for call in instances.check.denials())
    assert "dynamodb:LeadingKeys" in explained
    assert ARNS.arn(instances.b) in explained


def test_an_instance_cannot_write_its_own_state_record(instances: Instances) -> None:
    # Given A's own key / When its agent writes an attribute the role does not list (its state)
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_table.create(builders.facts(instance_id=instances.a), run_key=None)
    # Then the dynamodb:Attributes condition refused it
    assert denied_operations(instances.check) == ["dynamodb:PutItem"]
    assert "dynamodb:Attributes" in instances.check.denials()[0].explain()


STATE_ITEM_WRITES = {
    "PutItem": lambda client, key: client.put_item(
        TableName=TABLE_NAME, Item={**key, "beat_at": {"N": "1"}, "expires_at": {"N": "1"}}
    ),
    "UpdateItem": lambda client, key: client.update_item(
        TableName=TABLE_NAME,
        Key=key,
        UpdateExpression="SET beat_at = :beat",
        ExpressionAttributeValues={":beat": {"N": "1"}},
    ),
    "DeleteItem": lambda client, key: client.delete_item(TableName=TABLE_NAME, Key=key),
}
"""Writes of the `state` item with only attributes the agent may write: what a root job on A would try."""


@pytest.mark.parametrize("operation", sorted(STATE_ITEM_WRITES))
def test_an_instance_cannot_replace_change_or_delete_its_own_state_item(
    instances: Instances, operation: str
) -> None:
    # Given A's record, written by the control plane
    created = instances.plane_table.create(builders.facts(instance_id=instances.a), run_key=None).record
    key = {"pk": {"S": ARNS.arn(instances.a)}, "sk": {"S": "state"}}

    # When A writes its own state item, naming only the agent's own attributes (the sort key is the one
    # part of the key IAM cannot pin: DynamoDB Developer Guide, specifying-conditions.html)
    with pytest.raises(ClientError, match="AccessDenied"):
        STATE_ITEM_WRITES[operation](instances.own_dynamodb, key)

    # Then the synthesized instance role denied it, and the record is as the control plane wrote it
    assert denied_operations(instances.check) == [f"dynamodb:{operation}"]
    assert instances.plane_table.get(instances.a) == created


def test_an_instances_agent_writes_only_under_its_agent_partition(
    instances: Instances, dynamodb: Any
) -> None:
    # When A's agent beats and signals
    instances.own_table.write_heartbeat(instances.a)
    instances.own_table.write_signal(instances.a, Signal.UD_OK)

    # Then both items are under `agent#` and A's ARN, a partition the control plane reads no record from
    keys = {
        (item["pk"]["S"], item["sk"]["S"])
        for item in dynamodb.scan(TableName=TABLE_NAME, ConsistentRead=True)["Items"]
    }
    assert keys == {
        (f"agent#{ARNS.arn(instances.a)}", "heartbeat"),
        (f"agent#{ARNS.arn(instances.a)}", "signal"),
    }
    instances.check.assert_allowed()


def test_an_instance_decrypts_its_own_runner_config_and_not_another_instances(instances: Instances) -> None:
    # Given a runner config stored for A and one for B
    instances.plane_credentials.store(instances.a, ARNS.arn(instances.a), "pool=1", "config-for-a")
    instances.plane_credentials.store(instances.b, ARNS.arn(instances.b), "pool=1", "config-for-b")
    # When A's agent loads its own / Then it decrypts it
    own = instances.own_credentials.load(instances.a, ARNS.arn(instances.a), "pool=1")
    assert own is not None
    assert own.jit_config == "config-for-a"
    assert not instances.check.denials()
    # When it reaches for B's item / Then the read is denied
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_credentials.load(instances.b, ARNS.arn(instances.b), "pool=1")
    # And had it B's ciphertext, decrypting it under B's context is denied by the key condition
    blob = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=TABLE_NAME, Key={"pk": {"S": ARNS.arn(instances.b)}, "sk": {"S": "runner-config"}}
    )["Item"]["ciphertext"]["L"][0]["B"]
    with pytest.raises(CredentialsUnreadableError, match="AccessDenied"):
        instances.own_credentials._decrypt(blob, ARNS.arn(instances.b))
    assert denied_operations(instances.check) == ["dynamodb:GetItem", "kms:Decrypt"]
    assert "kms:EncryptionContext:instance-arn" in instances.check.denials()[1].explain()


def test_an_instance_reads_its_record_and_config_in_one_batch_and_no_other_instances(
    instances: Instances,
) -> None:
    # Given A's and B's records, each with its runner config stored
    for instance_id in (instances.a, instances.b):
        instances.plane_table.create(builders.facts(instance_id=instance_id), run_key="pool=1")
        instances.plane_credentials.store(
            instance_id, ARNS.arn(instance_id), "pool=1", f"config-for-{instance_id}"
        )
    # When A's agent reads its own record and config together / Then the instance role allows the batch
    record, stored = instances.own_credentials.read_with_record(instances.a, ARNS.arn(instances.a))
    assert record is not None
    assert stored is not None
    assert record.instance_id == instances.a
    assert not instances.check.denials()
    # When it reads B's pair, or its own record beside B's config / Then each batch is denied: every key of
    # a batch must be A's own (ForAllValues over dynamodb:LeadingKeys)
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_credentials.read_with_record(instances.b, ARNS.arn(instances.b))
    mixed: dict[str, KeysAndAttributesTypeDef] = {
        TABLE_NAME: {
            "Keys": [
                {"pk": {"S": ARNS.arn(instances.a)}, "sk": {"S": "state"}},
                {"pk": {"S": ARNS.arn(instances.b)}, "sk": {"S": "runner-config"}},
            ],
            "ConsistentRead": True,
        }
    }
    with pytest.raises(ClientError, match="AccessDenied"):
        instances.own_credentials._dynamodb.batch_get_item(RequestItems=mixed)
    assert denied_operations(instances.check) == ["dynamodb:BatchGetItem", "dynamodb:BatchGetItem"]
    assert all("dynamodb:LeadingKeys" in call.explain() for call in instances.check.denials())


def test_an_instance_terminates_itself_and_no_other_instance(instances: Instances) -> None:
    # When A's agent terminates B / Then EC2 answers UnauthorizedOperation and B still runs
    with pytest.raises(ClientError, match="UnauthorizedOperation"):
        instances.own_ec2.terminate_instances(InstanceIds=[instances.b])
    assert "ec2:SourceInstanceARN" in instances.check.denials()[0].explain()
    # When A terminates itself / Then the TerminateSelf statement allows it
    instances.own_ec2.terminate_instances(InstanceIds=[instances.a])
    assert denied_operations(instances.check) == ["ec2:TerminateInstances"]
    assert instances.check.checked() == 2


def test_the_checks_own_lookups_are_not_checked_where_every_session_client_is(
    instances: Instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given every boto3 Session's clients checked as instance A, as emulator/iam_agent.py does in an
    # agent's process (a self-termination once failed a scenario: the check's own DescribeInstances,
    # made to read B's tags, was taken for A's call)
    make_client = boto3.session.Session.client

    def checked_client(session: Any, *args: Any, **kwargs: Any) -> Any:
        return instances.check.on_client(
            make_client(session, *args, **kwargs), instances.check.iam.instance(instances.a)
        )

    monkeypatch.setattr(boto3.session.Session, "client", checked_client)
    # When A terminates itself
    instances.own_ec2.terminate_instances(InstanceIds=[instances.a])
    # Then the one call checked is A's TerminateInstances, allowed
    assert instances.check.checked() == 1
    assert denied_operations(instances.check) == []
