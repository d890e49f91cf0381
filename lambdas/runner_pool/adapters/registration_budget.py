"""The registration budget's bucket in the state table: one item per GitHub App, moved by conditional writes.

    pk = budget#<app id>, sk = budget
    tokens, at, held_until   the bucket (domain.registration_budget.Bucket)
    hourly_limit, hourly_remaining, hourly_reset
                             GitHub's hourly limit as last read from an answer (HourlyQuota), counted
                             down by each take, set again by `observe`
    version                  bumped by every write; a take writes only over the version it read
    taker                    who wrote last (one id per take), so a take whose answer was lost and
                             whose retry then fails its condition recognises its own write

The item carries neither a run key nor a sweep shard, so it stays out of both of the table's indexes,
and its key is no instance's ARN, so no instance role can reach it.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY
from runner_pool.domain.app_choice import registrations_left
from runner_pool.domain.clock import Clock
from runner_pool.domain.registration_budget import Bucket, Grant, HourlyQuota, take, wait_seconds

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

BUDGET_PREFIX = "budget#"
BUDGET_ITEM = "budget"
TAKE_ATTEMPTS = 8
"""Conditional writes one take tries when other takers keep winning; then it asks the caller to wait."""


class DynamoDbRegistrationBudget:
    """`per_minute` registrations a minute on average, up to `burst` at once after a quiet spell."""

    def __init__(
        self,
        table_name: str,
        app_id: str,
        *,
        per_minute: float,
        burst: int,
        clock: Clock,
        client: DynamoDBClient | None = None,
    ) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError("a registration budget needs a positive rate and a burst of at least one")
        self._table = table_name
        self._key = {PARTITION_KEY: {"S": f"{BUDGET_PREFIX}{app_id}"}, SORT_KEY: {"S": BUDGET_ITEM}}
        self._per_second = per_minute / 60.0
        self._capacity = float(burst)
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def take(self, wanted: int) -> Grant:
        for _ in range(TAKE_ATTEMPTS):
            item = self._read()
            bucket, version = _bucket(item), _version(item)
            if bucket is None and item is not None and (hourly := _hourly(item)) is not None:
                # Read from GitHub before any take: a full bucket, within the hour's remainder.
                bucket = Bucket(tokens=self._capacity, at=self._clock.now(), hourly=hourly)
            grant, after = take(bucket, wanted, self._clock.now(), self._per_second, self._capacity)
            if grant.refused:
                return grant  # nothing taken, nothing to write
            if self._write(after, version):
                return grant
        return Grant(0, wait_seconds(1.0))

    def give_back(self, count: int) -> None:
        if count < 1:
            return
        # Not guarded by the version: a refund that lands twice (a lost answer retried) adds a token
        # too many, which the capacity caps at the next take; it never takes one from anybody.
        # No bucket yet: it starts full, nothing to give back to.
        self._update_if(
            # The hour's remainder too: a registration not made spent no request of it.
            UpdateExpression="ADD tokens :count, hourly_remaining :count, version :one",
            ConditionExpression="attribute_exists(tokens)",
            ExpressionAttributeValues={":count": {"N": str(count)}, ":one": {"N": "1"}},
        )

    def hold_off(self, seconds: float) -> None:
        until = self._clock.now() + seconds
        # A hold at least as long is in place already.
        self._update_if(
            # Empty until the hold ends, then refilling from there: no burst the moment it ends.
            UpdateExpression="SET tokens = :zero, #at = :until, held_until = :until ADD version :one",
            ConditionExpression="attribute_not_exists(held_until) OR held_until < :until",
            ExpressionAttributeNames={"#at": "at"},
            ExpressionAttributeValues={
                ":zero": {"N": "0"},
                ":until": {"N": repr(until)},
                ":one": {"N": "1"},
            },
        )

    def observe(self, quota: HourlyQuota) -> None:
        """GitHub's answer said `quota`: kept unless what is kept is as fresh (the same hour, as little
        left or less). Not guarded by the version, so a take in flight is not made to try again; a take
        that lands after it writes the figure it read, less what it granted, which the next answer sets
        right."""
        self._update_if(
            # `version` made to exist, so that a take's write over the version it read applies.
            UpdateExpression="SET hourly_limit = :limit, hourly_remaining = :remaining, "
            "hourly_reset = :reset ADD version :zero",
            ConditionExpression="attribute_not_exists(hourly_reset) OR hourly_reset < :reset "
            "OR (hourly_reset = :reset AND hourly_remaining > :remaining)",
            ExpressionAttributeValues={
                ":limit": {"N": str(quota.limit)},
                ":remaining": {"N": str(quota.remaining)},
                ":reset": {"N": repr(float(quota.reset_at))},
                ":zero": {"N": "0"},
            },
        )

    def _update_if(self, **update: Any) -> None:
        """An update of the bucket that applies only under its condition: a refused one changes nothing."""
        conditional_write(lambda: self._client.update_item(TableName=self._table, Key=self._key, **update))

    def hourly(self) -> HourlyQuota | None:
        return _hourly(self._read())

    def left(self) -> float:
        """Registrations a take would be granted now: how this App compares with the stack's others."""
        item = self._read()
        now = self._clock.now()
        bucket = _bucket(item) or Bucket(tokens=self._capacity, at=now, hourly=_hourly(item))
        return registrations_left(bucket, now, self._per_second, self._capacity)

    def bucket(self) -> Bucket | None:
        """The bucket as it stands (for operators and tests)."""
        return _bucket(self._read())

    def _read(self) -> dict[str, Any] | None:
        response = self._client.get_item(TableName=self._table, Key=self._key, ConsistentRead=True)
        item: dict[str, Any] | None = response.get("Item")
        return item

    def _write(self, bucket: Bucket, version: int | None) -> bool:
        """Write the bucket over `version` (None: no item yet); False when another taker wrote first."""
        taker = uuid.uuid4().hex
        # Over the version read, or over no item yet (`:none` only keeps the values non-empty).
        condition = "attribute_not_exists(pk) OR taker = :none" if version is None else "version = :version"
        values: dict[str, Any] = (
            {":none": {"S": ""}} if version is None else {":version": {"N": str(version)}}
        )
        item = {
            **self._key,
            "tokens": {"N": repr(bucket.tokens)},
            "at": {"N": repr(bucket.at)},
            "held_until": {"N": repr(bucket.held_until)},
            "version": {"N": str((version or 0) + 1)},
            "taker": {"S": taker},
        }
        if bucket.hourly is not None:
            item |= {
                "hourly_limit": {"N": str(bucket.hourly.limit)},
                "hourly_remaining": {"N": str(bucket.hourly.remaining)},
                "hourly_reset": {"N": repr(float(bucket.hourly.reset_at))},
            }
        answer = conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            # Our own write, applied by an attempt whose answer was lost: the take stands.
            return bool(answer.item.get("taker", {}).get("S") == taker)
        return True


def _bucket(item: dict[str, Any] | None) -> Bucket | None:
    if item is None or "tokens" not in item or "at" not in item:
        return None
    return Bucket(
        tokens=float(item["tokens"]["N"]),
        at=float(item["at"]["N"]),
        held_until=float(item.get("held_until", {}).get("N", "0")),
        hourly=_hourly(item),
    )


def _hourly(item: dict[str, Any] | None) -> HourlyQuota | None:
    if item is None or "hourly_reset" not in item:
        return None
    return HourlyQuota(
        limit=int(item["hourly_limit"]["N"]),
        remaining=int(item["hourly_remaining"]["N"]),
        reset_at=float(item["hourly_reset"]["N"]),
    )


def _version(item: dict[str, Any] | None) -> int | None:
    if item is None:
        return None
    return int(item.get("version", {}).get("N", "0"))
