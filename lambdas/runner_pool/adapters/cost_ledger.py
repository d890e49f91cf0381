"""The cost items (domain/cost.py), kept in the state table, one partition per UTC day.

    pk = cost#<yyyy-mm-dd>, sk = hand-over#<instance id>#<start>   one hand-over, filed under the day it ended
    pk = cost#<yyyy-mm-dd>, sk = instance#<instance id>            one instance's life, under the day it ended
    expires_at  TTL, domain/cost.py COST_RETENTION_DAYS after the item's end

A report of N days is N Queries, each reading one day's partition; the budget reads today's. The items
carry no run key, sweep shard, threshold or idle mark, so they stay out of every index, and no key is an
instance's ARN, so no instance role can reach them. Each is written once, conditionally: a retried
release or refresh that meets the item it wrote before takes it for its own (the key is its hand-over's
or its instance's), and a write that fails leaves the job or the termination alone (the caller logs it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import (
    PARTITION_KEY,
    SORT_KEY,
    TTL_ATTRIBUTE,
    attribute_value,
    from_item,
    to_item,
)
from runner_pool.domain.cost import COST_RETENTION_DAYS, HandOverCost, InstanceLife

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

COST_PREFIX = "cost#"
"""Every cost item's partition: its writers' grants are limited to keys with it (dynamodb:LeadingKeys)."""
HAND_OVER = "hand-over#"
INSTANCE = "instance#"


class DynamoDbCostLedger:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self._table = table_name
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def hand_over_ended(self, cost: HandOverCost) -> bool:
        """Record one hand-over; True when it is recorded (now, or by an earlier attempt)."""
        return self._put(cost.day, f"{HAND_OVER}{cost.instance_id}#{cost.started_at!r}", cost)

    def instance_ended(self, life: InstanceLife) -> bool:
        """Record one instance's life; True when it is recorded (now, or by an earlier attempt)."""
        return self._put(life.day, f"{INSTANCE}{life.instance_id}", life)

    def day(self, day: str) -> tuple[list[HandOverCost], list[InstanceLife]]:
        """The hand-overs and lives filed under `day` (`yyyy-mm-dd`); an item that does not parse is
        passed over."""
        hand_overs: list[HandOverCost] = []
        lives: list[InstanceLife] = []
        for item in self._items(day):
            fields = from_item(item)
            sort = str(fields.get(SORT_KEY, ""))
            try:
                if sort.startswith(HAND_OVER):
                    hand_overs.append(HandOverCost.model_validate(fields))
                elif sort.startswith(INSTANCE):
                    lives.append(InstanceLife.model_validate(fields))
            except ValidationError:
                continue
        return hand_overs, lives

    def _put(self, day: str, sort: str, cost: HandOverCost | InstanceLife) -> bool:
        item = {
            **to_item(cost.model_dump(mode="json", exclude_none=True)),
            PARTITION_KEY: attribute_value(f"{COST_PREFIX}{day}"),
            SORT_KEY: attribute_value(sort),
            TTL_ATTRIBUTE: attribute_value(int(cost.ended_at) + COST_RETENTION_DAYS * 86_400),
        }
        answer = conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression=f"attribute_not_exists({PARTITION_KEY})",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if not isinstance(answer, Refusal):
            return True
        # The item is there: an earlier attempt's (the same hand-over or life, the same key) is this one.
        return bool(answer.item)

    def _items(self, day: str) -> Iterator[dict[str, Any]]:
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
            "ExpressionAttributeValues": {":pk": attribute_value(f"{COST_PREFIX}{day}")},
        }
        while True:
            page = self._client.query(**request)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
