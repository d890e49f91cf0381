"""moto's DynamoDB with DynamoDB's item atomicity (emulator/atomic_dynamodb.py): what an item operation
answers is a copy taken under its lock, so the request handler that writes the answer out after the
lock is released never reads an item another thread's write is changing in place (DynamoDB Developer
Guide, "Read consistency": a read returns whole writes only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from emulator.atomic_dynamodb import atomic_items
from emulator.moto_internals import resolve
from runner_pool.adapters import aws_clients

MOTO_ACCOUNT = "123456789012"
"""moto's default account, the one a client with any keys talks to."""
KEY = {"pk": {"S": "i"}}


@pytest.fixture
def dynamodb() -> Iterator[Any]:
    with mock_aws(), atomic_items():
        client = aws_clients.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName="t",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        client.put_item(TableName="t", Item={**KEY, "generation": {"N": "1"}})
        yield client


@pytest.fixture
def backend(dynamodb: Any) -> Any:
    return resolve("moto.dynamodb.models:dynamodb_backends")[MOTO_ACCOUNT]["us-east-1"]


def test_a_read_answers_a_copy_that_a_later_write_does_not_change(backend: Any, dynamodb: Any) -> None:
    # Given an item read through the backend, as moto's GetItem and UpdateItem handlers read it
    read = backend.get_item("t", KEY)
    # When another write changes the item in place
    dynamodb.update_item(
        TableName="t",
        Key=KEY,
        UpdateExpression="SET generation = :g, added = :g",
        ExpressionAttributeValues={":g": {"N": "2"}},
    )
    # Then what was read is still the item as it was: its handler writes out a whole write, never half
    assert read.attrs["generation"].value == "1"
    assert "added" not in read.attrs
    assert backend.get_item("t", KEY).attrs["generation"].value == "2"


def test_a_reader_changing_its_answer_changes_nothing_stored(backend: Any) -> None:
    backend.get_item("t", KEY).attrs["generation"].value = "changed by a reader"
    assert backend.get_item("t", KEY).attrs["generation"].value == "1"
