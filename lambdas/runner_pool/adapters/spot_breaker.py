"""The spot circuit breaker's counts in the state table (domain/spot_breaker.py): one partition per class.

    pk = spot-breaker#<class>, sk = interruption#<instance id>
    at              when its interruption warning was first heard
    expires_at      TTL: the window after `at`, plus a day, as TTL deletes late ("typically within a few
                    days", DynamoDB Developer Guide, "Using time to live (TTL) in DynamoDB"); reads filter
                    by `at`, never by TTL

    pk = spot-breaker#<class>, sk = open
    open_until      the class's spot demand is served on-demand until then
    opened_at, interruptions
                    when the last opening happened, and the count in its window
    opened_by       which call opened it, so a call whose answer was lost and whose retry then fails the
                    condition recognises its own opening
    expires_at      TTL, a day after open_until

One item per interrupted instance, put only if absent: a warning delivered twice (EventBridge invokes a
rule's target at least once) counts once, and concurrent warnings never lose each other's counts, as an
atomic counter of a window would (it cannot forget what left the window). Each writer counts the window
after its own put, with a strongly consistent read, so the last of several concurrent writers sees every
put before it; the opening is one conditional write, so of several writers who find the window over the
threshold one opens the breaker (and logs, counts, alarms) and the others find it open. The items carry
neither a run key nor a sweep shard, so they stay out of the table's indexes, and their keys are no
instance's ARN, so no instance role can reach them.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.spot_breaker import (
    Interruption,
    Noted,
    SpotBreakerSettings,
    in_window,
    is_open,
    trips,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

BREAKER_PREFIX = "spot-breaker#"
INTERRUPTION_PREFIX = "interruption#"
OPEN_ITEM = "open"
TTL_SLACK_SECONDS = 86_400


class DynamoDbSpotBreaker:
    def __init__(
        self,
        table_name: str,
        settings: SpotBreakerSettings,
        clock: Clock,
        client: DynamoDBClient | None = None,
    ) -> None:
        self._table = table_name
        self._settings = settings
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def note(self, resource_class: str, instance_id: str) -> Noted:
        """Count `instance_id`'s interruption for its class, and open the breaker if the window now trips it.

        Safe to repeat: a second call for the same instance puts nothing and opens nothing new."""
        now = self._clock.now()
        self._put_once(resource_class, instance_id, now)
        interruptions, open_until = self._read(resource_class, now)
        count = in_window(interruptions, now, self._settings)
        if is_open(open_until, now) or not trips(interruptions, now, self._settings):
            return Noted(resource_class, count, opened=False, open_until=open_until)
        until = now + self._settings.cooldown_seconds
        token = str(uuid.uuid4())
        if self._open(resource_class, now, until, count, token):
            return Noted(resource_class, count, opened=True, open_until=until)
        item = self._open_item(resource_class) or {}
        opened = item.get("opened_by", {}).get("S") == token
        open_until = float(item["open_until"]["N"]) if "open_until" in item else None
        return Noted(resource_class, count, opened=opened, open_until=open_until)

    def open_until(self, resource_class: str) -> Epoch | None:
        """Until when the class's spot demand goes on-demand (None: never opened, or forgotten)."""
        if not self._settings.enabled:
            return None
        item = self._open_item(resource_class)
        return None if item is None else float(item["open_until"]["N"])

    def _open_item(self, resource_class: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self._client.get_item(
            TableName=self._table, Key=self._key(resource_class, OPEN_ITEM), ConsistentRead=True
        ).get("Item")
        return item

    def _key(self, resource_class: str, sort_key: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": f"{BREAKER_PREFIX}{resource_class}"}, SORT_KEY: {"S": sort_key}}

    def _put_once(self, resource_class: str, instance_id: str, now: Epoch) -> None:
        """Count the instance once: a refused condition is a warning delivered again, or this call's own
        retry, already counted."""
        expires = now + self._settings.window_seconds + TTL_SLACK_SECONDS
        conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item={
                    **self._key(resource_class, f"{INTERRUPTION_PREFIX}{instance_id}"),
                    "at": {"N": repr(now)},
                    TTL_ATTRIBUTE: {"N": str(int(expires))},
                },
                ConditionExpression=f"attribute_not_exists({PARTITION_KEY})",
            )
        )

    def _read(self, resource_class: str, now: Epoch) -> tuple[list[Interruption], Epoch | None]:
        """The class's interruptions within the window, and until when it is open (None: not recorded)."""
        interruptions: list[Interruption] = []
        open_until: Epoch | None = None
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="#pk = :pk",
            # Key attributes cannot be filtered on; the open item is the one with open_until.
            FilterExpression="#at >= :since OR attribute_exists(open_until)",
            ExpressionAttributeNames={"#pk": PARTITION_KEY, "#at": "at"},
            ExpressionAttributeValues={
                ":pk": {"S": f"{BREAKER_PREFIX}{resource_class}"},
                ":since": {"N": repr(now - self._settings.window_seconds)},
            },
            ConsistentRead=True,
        )
        for item in (item for page in pages for item in page.get("Items", [])):
            sort_key = item[SORT_KEY]["S"]
            if sort_key == OPEN_ITEM:
                open_until = float(item["open_until"]["N"])
            elif sort_key.startswith(INTERRUPTION_PREFIX):
                interruptions.append(
                    Interruption(sort_key.removeprefix(INTERRUPTION_PREFIX), float(item["at"]["N"]))
                )
        return interruptions, open_until

    def _open(self, resource_class: str, now: Epoch, until: Epoch, count: int, token: str) -> bool:
        """Open the breaker unless someone has since; whether this write's condition held."""
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=self._key(resource_class, OPEN_ITEM),
                UpdateExpression=(
                    "SET open_until = :until, opened_at = :now, interruptions = :count, opened_by = :token, "
                    "#ttl = :ttl"
                ),
                ConditionExpression="attribute_not_exists(open_until) OR open_until <= :now",
                ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":until": {"N": repr(until)},
                    ":now": {"N": repr(now)},
                    ":count": {"N": str(count)},
                    ":token": {"S": token},
                    ":ttl": {"N": str(int(until + TTL_SLACK_SECONDS))},
                },
            )
        )
        return not isinstance(answer, Refusal)
