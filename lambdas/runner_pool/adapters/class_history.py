"""Each resource class's arrivals and boot times (domain/class_history.py), kept in the state table.

    pk = sizing#<class>#<fact>, sk = <minute>   one item per class, fact and minute (fact: arrival, launch,
                                                start, reuse; minute: its first epoch second, zero-padded)
    entries     (string set) "<id>@<figure>": a job id and when it arrived, an instance id and its boot's
                seconds, or an instance's hand-off (<instance id>#<jobs served>) and when it was ready;
                ADD to a set is idempotent, so a write a retried Lambda repeats adds nothing
    expires_at  TTL, domain/class_history.py BOOT_RETENTION_SECONDS after its minute
    pk = sizing#<class>#watch, sk = watch
    since       when refresh first read the class (`watched_since`), written once

A write is one UpdateItem per class, fact and minute touched, whatever the number of entries; a read
one Query per fact, of an hour's items for arrivals and of the newest items for boots. The items carry
no run key and no sweep shard, so they stay out of the table's indexes, and no key is an instance's ARN,
so no instance role can reach them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from runner_pool.domain.class_history import (
    BOOT_RETENTION_SECONDS,
    MEASURED,
    ClassRecord,
    Entry,
    Fact,
)
from runner_pool.domain.clock import Clock, Epoch

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

HISTORY_PREFIX = "sizing#"
"""Every item of the history: its writers' grants are limited to keys with it (dynamodb:LeadingKeys)."""
ENTRIES_ATTRIBUTE = "entries"
WATCH = "watch"
_MINUTE_DIGITS = 12


class DynamoDbClassHistory:
    def __init__(self, table_name: str, clock: Clock, client: DynamoDBClient | None = None) -> None:
        self._table = table_name
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def note(self, fact: Fact, resource_class: str, entries: Collection[Entry], at: Epoch) -> None:
        if not entries:
            return
        minute = int(at // 60) * 60
        self._client.update_item(
            TableName=self._table,
            Key=_key(_partition(resource_class, fact), _minute(minute)),
            UpdateExpression=f"ADD {ENTRIES_ATTRIBUTE} :entries SET #ttl = :ttl",
            ExpressionAttributeNames={"#ttl": TTL_ATTRIBUTE},
            ExpressionAttributeValues={
                ":entries": {"SS": sorted({f"{entry.key}@{entry.value:.1f}" for entry in entries})},
                ":ttl": {"N": str(int(minute + BOOT_RETENTION_SECONDS))},
            },
        )

    def read(self, resource_class: str, arrivals_since: Epoch) -> ClassRecord:
        return ClassRecord(
            arrivals=self._since(resource_class, Fact.ARRIVAL, arrivals_since),
            launches=self._latest(resource_class, Fact.LAUNCH),
            starts=self._latest(resource_class, Fact.START),
            watched_since=self._watched_since(resource_class),
            reuses=self._since(resource_class, Fact.REUSE, arrivals_since),
        )

    def _since(self, resource_class: str, fact: Fact, since: Epoch) -> list[Entry]:
        return [entry for entry in self._entries(resource_class, fact, since=since) if entry.value >= since]

    def _latest(self, resource_class: str, fact: Fact) -> list[Entry]:
        """At least MEASURED entries of the newest minutes (all there are, if fewer), newest first."""
        found: list[Entry] = []
        for entry in self._entries(resource_class, fact, newest_first=True):
            found.append(entry)
            if len(found) >= MEASURED:
                break
        return found

    def _entries(
        self, resource_class: str, fact: Fact, *, since: Epoch | None = None, newest_first: bool = False
    ) -> Iterator[Entry]:
        condition = f"{PARTITION_KEY} = :pk"
        values: dict[str, Any] = {":pk": {"S": _partition(resource_class, fact)}}
        if since is not None:
            condition += f" AND {SORT_KEY} >= :since"
            values[":since"] = {"S": _minute(int(since // 60) * 60)}
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": not newest_first,
        }
        while True:
            page = self._client.query(**request)
            for item in page.get("Items", []):
                # Within a minute, newest first too: an entry's figure is no time for boots, so any order.
                yield from sorted(_parsed(item), key=lambda entry: entry.value, reverse=newest_first)
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _watched_since(self, resource_class: str) -> Epoch:
        """When the class was first read; this read starts its watch when none has."""
        answer = self._client.update_item(
            TableName=self._table,
            Key=_key(f"{HISTORY_PREFIX}{resource_class}#{WATCH}", WATCH),
            UpdateExpression="SET #since = if_not_exists(#since, :now)",
            ExpressionAttributeNames={"#since": "since"},
            ExpressionAttributeValues={":now": {"N": repr(self._clock.now())}},
            ReturnValues="ALL_NEW",
        )
        return float(answer["Attributes"]["since"]["N"])


def _partition(resource_class: str, fact: Fact) -> str:
    return f"{HISTORY_PREFIX}{resource_class}#{fact.value}"


def _minute(minute: int) -> str:
    return str(minute).zfill(_MINUTE_DIGITS)


def _key(partition: str, sort: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": partition}, SORT_KEY: {"S": sort}}


def _parsed(item: dict[str, Any]) -> list[Entry]:
    entries = []
    for text in item.get(ENTRIES_ATTRIBUTE, {}).get("SS", []):
        key, _, figure = text.rpartition("@")
        entries.append(Entry(key, float(figure)))
    return entries
