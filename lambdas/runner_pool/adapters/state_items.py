"""The state table's layout: its keys, its items, its indexes, and how an item reads as a record.

The control plane's items of one instance share its partition key, told apart by `sk`; the items its
agent writes share another. The keys are built from the instance's ARN
(`arn:<partition>:ec2:<region>:<account>:instance/<id>`), not its bare id: IAM names a calling
instance only by its ARN (`${ec2:SourceInstanceARN}`), so that is what the instance role's
`dynamodb:LeadingKeys` condition can pin each instance's own items to. Records and every method
speak instance ids; only the keys are ARNs.

    pk = <arn>         state      the control plane's InstanceRecord (and its runner config)
    pk = agent#<arn>   heartbeat  the agent's last beat
                       signal     the agent's latest WorkerSignal

Why two partitions: IAM's DynamoDB condition keys can pin a request to partition key values
(`dynamodb:LeadingKeys`) and attribute names (`dynamodb:Attributes`), never to a sort key (DynamoDB
Developer Guide, specifying-conditions.html: LeadingKeys "represents the partition key"; the Service
Authorization Reference, list_amazondynamodb.html, lists no condition key for the sort key). Were the
agent's items beside the record, the agent (or a job that became root) could put an item with the
record's key and the agent's attributes, replacing the record. So the instance role may write only
under `agent#<its ARN>`, which the control plane never reads as a record.

Four sparse indexes keep every read path off Scan: `by-run-key` holds only records that carry a run
key (release looks instances up by run), `by-threshold` holds only live records, spread over a
few shards and sorted by threshold (refresh sweeps what is due), `by-stopped` holds only stopped
records, one index partition per pool partition (class, usage, architecture), sorted by threshold
(pickup finds the stopped tier's instances that fit a request), and `by-idle` holds only idle records,
one index partition per pool partition (pickup knows an empty pool from one Query, without waiting out
a long poll of an empty queue). A terminated record leaves every index and gets a TTL, and so do
heartbeat and signal items on every write.

Why an index and not a queue for the stopped tier: a stopped instance's record is its offer. The
transition that stops it puts it in the index in the same write, the claim that starts it takes it out
in the same write, and refresh's termination of one past `pool.stopped_max_age_minutes` leaves nothing
behind; a queue would be a second write beside each (one that can be lost, and a stale message to drop
after each). The tier is small (`pool.stopped_maximum` per class), so one Query reads a partition's whole
tier, where the hot pool, hundreds of instances taken many times a minute, needs a queue's hand-out.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from pydantic import ValidationError

from runner_pool.adapters.backoff import Backoff, read_consistently
from runner_pool.domain.records import MAX_REASON_CHARS, InstanceRecord

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

PARTITION_KEY = "pk"
SORT_KEY = "sk"
STATE_ITEM = "state"
AGENT_PARTITION_PREFIX = "agent#"
"""Prefixed to an instance's ARN, the partition key of its agent's items (heartbeat, signal)."""
HEARTBEAT_ITEM = "heartbeat"
SIGNAL_ITEM = "signal"
TTL_ATTRIBUTE = "expires_at"
QUARANTINED_ATTRIBUTE = "quarantined_at"
NOT_QUARANTINED = f"attribute_not_exists({QUARANTINED_ATTRIBUTE})"
"""In every write but expiry and termination: a quarantine is final."""
UNREADABLE_ATTRIBUTE = "unreadable_since"
"""Set by `set_aside` on an unreadable `state` item, beside its TTL."""
RUN_KEY_INDEX = "by-run-key"
RUN_KEY_ATTRIBUTE = "run_key"
REPOSITORY_ATTRIBUTE = "repository"
REPOSITORY_ID_ATTRIBUTE = "repository_id"
TRUST_ATTRIBUTE = "trust"
THRESHOLD_INDEX = "by-threshold"
SWEEP_SHARD_ATTRIBUTE = "sweep_shard"
THRESHOLD_ATTRIBUTE = "threshold"
STOPPED_INDEX = "by-stopped"
STOPPED_PARTITION_ATTRIBUTE = "stopped_partition"
"""Set only on a stopped record: its pool partition's name (PoolPartition.name), by-stopped's key."""
IDLE_INDEX = "by-idle"
POOL_PARTITION_ATTRIBUTE = "pool_partition"
"""Every record's pool partition (PoolPartition.name), set at creation: by-idle's partition key."""
IDLE_SINCE_ATTRIBUTE = "idle_since"
"""Set only on an idle record (when it went idle), by-idle's sort key: DynamoDB writes an index entry only
for an item that has the index's sort key ("Take advantage of sparse indexes", DynamoDB Developer Guide,
bp-indexes-general-sparse-indexes), so by-idle holds the idle records and nothing else."""
STOPPED_READ_LIMIT = 50
"""Stopped records one pickup reads of a partition: more than a tier holds with any sensible maximum."""
SWEEP_SHARDS = 4
"""Live records are spread over this many index partitions so no single one gets hot."""
OBSERVED_PER_READ = 33
"""Instances whose three items one BatchGetItem reads: 99 keys, within its 100 ("BatchGetItem",
Amazon DynamoDB API Reference: "A single operation can retrieve up to 16 MB of data, which can contain
as many as 100 items")."""
MARKER_PREFIX = "marker#"
FINISHED_RUN_PREFIX = "run#"
FINISHED_RUN_ITEM = "finished"
MARKER_ITEM = "marker"
MARKER_ATTRIBUTE = "marker_value"
MARKER_MOVER = "moved_by"
"""A token each compare-and-set writes beside the value: a retry that meets it knows the move was its own."""


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()
INDEX_KEYS = (
    SWEEP_SHARD_ATTRIBUTE,
    RUN_KEY_ATTRIBUTE,
    STOPPED_PARTITION_ATTRIBUTE,
    POOL_PARTITION_ATTRIBUTE,
    IDLE_SINCE_ATTRIBUTE,
)
"""The attributes that put a `state` item in an index: its partition key there, or its sort key."""
_BOOKKEEPING = {
    PARTITION_KEY,
    SORT_KEY,
    SWEEP_SHARD_ATTRIBUTE,
    STOPPED_PARTITION_ATTRIBUTE,
    POOL_PARTITION_ATTRIBUTE,
    IDLE_SINCE_ATTRIBUTE,
}


def sweep_shard(instance_id: str) -> str:
    return str(zlib.crc32(instance_id.encode()) % SWEEP_SHARDS)


def agent_partition(arn: str) -> str:
    """The partition key of the agent's items of the instance `arn` names."""
    return AGENT_PARTITION_PREFIX + arn


def item_key(partition_key: str, kind: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": partition_key}, SORT_KEY: {"S": kind}}


def read_together(
    client: DynamoDBClient, table: str, keys: list[dict[str, Any]], backoff: Backoff
) -> dict[str, Mapping[str, Any]]:
    """The items of one instance that `keys` name, by sort key (`read_items`)."""
    return {sort_key: item for (_, sort_key), item in read_items(client, table, keys, backoff).items()}


def read_items(
    client: DynamoDBClient, table: str, keys: list[dict[str, Any]], backoff: Backoff
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The items `keys` name (at most 100, BatchGetItem's limit), by partition and sort key, from one
    consistent BatchGetItem (backoff.read_consistently); an item that does not exist is absent."""
    return {
        (item[PARTITION_KEY]["S"], item[SORT_KEY]["S"]): item
        for item in read_consistently(client, table, keys, backoff)
    }


def attribute_value(value: Any) -> Any:
    if isinstance(value, float):
        value = Decimal(repr(value))
    return _serializer.serialize(value)


def to_item(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: attribute_value(value) for name, value in fields.items()}


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    plain = {name: _deserializer.deserialize(value) for name, value in item.items()}
    return {name: _number(v) if isinstance(v, Decimal) else v for name, v in plain.items()}


def _number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


class UnreadableRecordError(ValueError):
    """A `state` item that is not an InstanceRecord."""


def record_from_item(item: Mapping[str, Any]) -> InstanceRecord:
    """The record an instance's `state` item holds; UnreadableRecordError if it holds none."""
    try:
        fields = {k: v for k, v in from_item(item).items() if k not in _BOOKKEEPING}
        return InstanceRecord.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or 'the item'}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        )
        raise UnreadableRecordError(f"not an instance record: {problems}"[:MAX_REASON_CHARS]) from exc
    except (TypeError, ValueError) as exc:
        raise UnreadableRecordError(f"not an instance record: {exc}"[:MAX_REASON_CHARS]) from exc


def readable_record(item: Mapping[str, Any]) -> InstanceRecord | None:
    """The record a `state` item holds, or None if it does not parse: such an item is no record, and its
    instance untracked (public for an adapter that reads the record beside its own item)."""
    try:
        return record_from_item(item)
    except UnreadableRecordError:
        return None
