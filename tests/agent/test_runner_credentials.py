"""The runner credential hand-off against moto: only the instance it was stored for can decrypt a config."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from emulator.aws import ACCOUNT
from emulator.harness.control_plane import REGION
from runner_pool.adapters.instance_arns import instance_arn
from runner_pool.adapters.runner_credentials import (
    CONFIG_RUN_KEY_ATTRIBUTE,
    KMS_MAX_PLAINTEXT_BYTES,
    RUNNER_CONFIG_ITEM,
    RunnerCredentials,
)
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY
from runner_pool.adapters.state_table import StateTable
from runner_pool.domain.clock import ManualClock
from runner_pool.domain.config import StackConfig
from runner_pool.domain.runner_configs import CredentialsUnreadableError
from tests.conftest import TABLE_NAME
from tests.support import builders

ONE = builders.facts(1).instance_id
OTHER = builders.facts(2).instance_id
RUN = builders.run_key(1)


@pytest.fixture
def store(dynamodb: Any, clock: ManualClock, config: StackConfig) -> RunnerCredentials:
    kms = boto3.client("kms", region_name=REGION)
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    return RunnerCredentials(TABLE_NAME, config.timeouts, clock, key_id=key_id, dynamodb=dynamodb, kms=kms)


def arn_of(instance_id: str) -> str:
    return instance_arn(instance_id, REGION, ACCOUNT)


def stored_item(dynamodb: Any, instance_id: str) -> dict[str, Any]:
    item: dict[str, Any] = dynamodb.get_item(
        TableName=TABLE_NAME,
        Key={PARTITION_KEY: {"S": arn_of(instance_id)}, SORT_KEY: {"S": RUNNER_CONFIG_ITEM}},
    )["Item"]
    return item


def test_an_instance_decrypts_the_config_stored_for_it(store: RunnerCredentials) -> None:
    # Given a JIT config larger than KMS encrypts in one call, stored for instance ONE and RUN
    config = "eyJ" + "x" * (2 * KMS_MAX_PLAINTEXT_BYTES + 100)
    store.store(ONE, arn_of(ONE), RUN, config)

    # When instance ONE loads it for RUN / Then it gets exactly that config back
    loaded = store.load(ONE, arn_of(ONE), RUN)
    assert loaded is not None
    assert (loaded.jit_config, loaded.run_key) == (config, RUN)


def test_the_stored_item_holds_no_plaintext_and_stays_out_of_the_run_key_index(
    store: RunnerCredentials, dynamodb: Any, clock: ManualClock, config: StackConfig
) -> None:
    # Given a config stored for ONE
    secret = "very-secret-jit-config"
    store.store(ONE, arn_of(ONE), RUN, secret)

    # When its item is read raw
    item = stored_item(dynamodb, ONE)

    # Then no part of it is the config in the clear
    assert secret.encode() not in repr(item).encode()
    # And it names its run under its own attribute, never `run_key` (the by-run-key index's key)
    assert item[CONFIG_RUN_KEY_ATTRIBUTE] == {"S": RUN}
    assert "run_key" not in item
    # And it expires once no record it was handed out with could still register
    lifetime = max(config.timeouts.created_threshold_seconds, config.timeouts.claimed_threshold_seconds)
    assert int(item["expires_at"]["N"]) == int(clock.now() + lifetime)


def test_the_config_is_an_item_of_the_instances_own_partition_keyed_by_its_arn(
    store: RunnerCredentials, dynamodb: Any
) -> None:
    # Given a config stored for ONE
    store.store(ONE, arn_of(ONE), RUN, "config")

    # When the table is read raw / Then the one item's partition key is ONE's ARN, the key the
    # instance role's LeadingKeys condition lets ONE (and only ONE) read
    (item,) = dynamodb.scan(TableName=TABLE_NAME)["Items"]
    assert item[PARTITION_KEY] == {"S": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{ONE}"}


def test_storing_for_one_instance_under_the_arn_of_another_is_refused(store: RunnerCredentials) -> None:
    # Given ONE's id with OTHER's ARN / When a config is stored / Then it is refused, nothing stored
    with pytest.raises(ValueError, match="is not the ARN of instance"):
        store.store(ONE, arn_of(OTHER), RUN, "config")
    assert store.load(OTHER, arn_of(OTHER), RUN) is None


def test_the_run_index_never_mistakes_a_config_for_a_record(
    store: RunnerCredentials, state_table: StateTable
) -> None:
    # Given an instance claimed for RUN, whose config is stored
    state_table.create(builders.facts(1), None)
    state_table.admit(ONE)
    state_table.claim(ONE, RUN, "token")
    store.store(ONE, arn_of(ONE), RUN, "config")

    # When release looks the run's instances up by run key / Then it finds the one record, unharmed
    assert [record.instance_id for record in state_table.held_by(RUN)] == [ONE]


def test_decrypting_under_another_instances_context_fails(store: RunnerCredentials, dynamodb: Any) -> None:
    # Given a config stored for instance ONE, and OTHER holding a copy of ONE's ciphertext item
    store.store(ONE, arn_of(ONE), RUN, "config of one")
    copied = {**stored_item(dynamodb, ONE), PARTITION_KEY: {"S": arn_of(OTHER)}}
    dynamodb.put_item(TableName=TABLE_NAME, Item=copied)

    # When OTHER decrypts it under its own ARN (the only context its role may use)
    # Then KMS refuses
    with pytest.raises(CredentialsUnreadableError, match="InvalidCiphertextException"):
        store.load(OTHER, arn_of(OTHER), RUN)


def test_a_config_for_another_run_or_none_at_all_is_not_there(store: RunnerCredentials) -> None:
    # Given nothing stored for ONE / Then loading finds nothing
    assert store.load(ONE, arn_of(ONE), RUN) is None

    # Given a config stored for another run / Then loading it for RUN finds nothing either
    store.store(ONE, arn_of(ONE), builders.run_key(2), "config of run 2")
    assert store.load(ONE, arn_of(ONE), RUN) is None


def test_a_later_run_replaces_the_config_of_an_earlier_one(store: RunnerCredentials) -> None:
    # Given a config for RUN, then one for the next run on the same instance
    later = builders.run_key(2)
    store.store(ONE, arn_of(ONE), RUN, "first")
    store.store(ONE, arn_of(ONE), later, "second")

    # When each run's config is loaded / Then only the latest is there
    loaded = store.load(ONE, arn_of(ONE), later)
    assert loaded is not None
    assert loaded.jit_config == "second"
    assert store.load(ONE, arn_of(ONE), RUN) is None


def test_every_config_handed_over_has_an_id_of_its_own(store: RunnerCredentials) -> None:
    # Given two configs stored one after the other for the same instance and the same run
    first = store.store(ONE, arn_of(ONE), RUN, "first")
    second = store.store(ONE, arn_of(ONE), RUN, "second")

    # When the config is loaded / Then it is the second, under its own id, not the first's
    loaded = store.load(ONE, arn_of(ONE), RUN)
    assert loaded is not None
    assert first != second
    assert (loaded.config_id, loaded.jit_config) == (second, "second")


def test_the_record_and_the_config_are_read_in_one_consistent_batch(
    store: RunnerCredentials, state_table: StateTable, dynamodb: Any
) -> None:
    # Given ONE's record, claimed for RUN, and its config
    state_table.create(builders.facts(instance_id=ONE), run_key=RUN)
    config_id = store.store(ONE, arn_of(ONE), RUN, "config of run 1", runner_id=7)
    calls: list[tuple[str, dict[str, Any]]] = []
    dynamodb.meta.events.register(
        "provide-client-params.dynamodb.*", lambda params, model, **_: calls.append((model.name, params))
    )

    # When both are read together
    record, stored = store.read_with_record(ONE, arn_of(ONE))

    # Then one consistent BatchGetItem brought the record and the config, which decrypts as stored
    assert [name for name, _ in calls] == ["BatchGetItem"]
    assert calls[0][1]["RequestItems"][TABLE_NAME]["ConsistentRead"] is True
    assert record is not None
    assert (record.instance_id, record.run_key) == (ONE, RUN)
    assert stored is not None
    assert (stored.config_id, stored.run_key, stored.runner_id) == (config_id, RUN, 7)
    assert store.decrypt(stored, arn_of(ONE)).jit_config == "config of run 1"


def test_reading_together_finds_what_is_there(store: RunnerCredentials, state_table: StateTable) -> None:
    # Given no item of ONE / Then neither is found
    assert store.read_with_record(ONE, arn_of(ONE)) == (None, None)
    # Given its record only (an idle instance) / Then the record, and no config
    state_table.create(builders.facts(instance_id=ONE), run_key=None)
    record, stored = store.read_with_record(ONE, arn_of(ONE))
    assert record is not None
    assert stored is None


def test_storing_without_a_key_is_a_programming_error(
    dynamodb: Any, clock: ManualClock, config: StackConfig
) -> None:
    # Given the agent's side of the store, which has no key to encrypt with
    agent_side = RunnerCredentials(TABLE_NAME, config.timeouts, clock, dynamodb=dynamodb, kms=object())

    # When it is asked to store / Then it says what is missing
    with pytest.raises(ValueError, match="KMS key id"):
        agent_side.store(ONE, arn_of(ONE), RUN, "config")


def test_the_arn_is_the_one_iam_resolves_for_the_instance() -> None:
    # Given an instance id, region, account and partition / Then its ARN is EC2's instance ARN
    assert instance_arn("i-0abc", "cn-north-1", ACCOUNT, "aws-cn") == (
        "arn:aws-cn:ec2:cn-north-1:123456789012:instance/i-0abc"
    )
