"""The state table's reads (records, and views of them with their agents' items, each without a Scan)
and the agent's own items.

A `state` item that does not parse is an UnreadableRecord: every read treats it as no record (a sweep
skips it, a single read finds None), `unreadable` finds those the threshold index holds, and
`set_aside` takes one out of every index once refresh has terminated its instance.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.backoff import Backoff
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.adapters.state_items import (
    HEARTBEAT_ITEM,
    IDLE_INDEX,
    INDEX_KEYS,
    OBSERVED_PER_READ,
    PARTITION_KEY,
    POOL_PARTITION_ATTRIBUTE,
    RUN_KEY_ATTRIBUTE,
    RUN_KEY_INDEX,
    SIGNAL_ITEM,
    STATE_ITEM,
    STOPPED_INDEX,
    STOPPED_PARTITION_ATTRIBUTE,
    STOPPED_READ_LIMIT,
    SWEEP_SHARD_ATTRIBUTE,
    SWEEP_SHARDS,
    THRESHOLD_ATTRIBUTE,
    THRESHOLD_INDEX,
    TTL_ATTRIBUTE,
    UNREADABLE_ATTRIBUTE,
    UnreadableRecordError,
    agent_partition,
    attribute_value,
    from_item,
    item_key,
    read_items,
    readable_record,
    record_from_item,
    to_item,
)
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import Heartbeat, InstanceRecord, Signal, UnreadableRecord, WorkerSignal
from runner_pool.domain.timeouts import Timeouts

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


@dataclass(frozen=True)
class InstanceView:
    """An instance's record and its agent's latest heartbeat and signal, as one read saw them."""

    record: InstanceRecord | None
    heartbeat: Heartbeat | None
    signal: WorkerSignal | None


class StateReads:
    """The table and what every part of it needs: its client, clock, timeouts and instance ARNs."""

    def __init__(
        self,
        table_name: str,
        timeouts: Timeouts,
        clock: Clock,
        client: DynamoDBClient | None = None,
        backoff: Backoff | None = None,
        *,
        arns: InstanceArns | None = None,
    ) -> None:
        """`backoff` paces the retries of `observe`'s unprocessed keys (botocore retries each single call:
        aws_clients). `arns` turns instance ids into the ARNs items are keyed by; without it, they are
        those of the client's region and of the account STS names as the caller's, asked once, when
        first needed."""
        self._table = table_name
        self._timeouts = timeouts
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")
        self._backoff = backoff or Backoff()
        self._arns = arns
        self._arns_lock = threading.Lock()

    @property
    def instance_arns(self) -> InstanceArns:
        if self._arns is None:
            with self._arns_lock:
                if self._arns is None:
                    self._arns = InstanceArns.of_caller(self._client)
        return self._arns

    # --- reads ---------------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceRecord | None:
        response = self._client.get_item(
            TableName=self._table,
            Key=self._instance_key(instance_id, STATE_ITEM),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return None if item is None else readable_record(item)

    def held_by(self, run_key: str) -> list[InstanceRecord]:
        """Every record holding `run_key` (claimed, running, or created for the run).

        Read from a global index, so a transition of the last moment may not show yet; callers
        act through conditional transitions, which see the truth.
        """
        return list(
            self._query(
                IndexName=RUN_KEY_INDEX,
                KeyConditionExpression=f"{RUN_KEY_ATTRIBUTE} = :run_key",
                ExpressionAttributeValues={":run_key": attribute_value(run_key)},
            )
        )

    def due(self, now: Epoch | None = None) -> list[InstanceRecord]:
        """Every live record whose threshold has passed, for refresh to terminate."""
        cutoff = self._clock.now() if now is None else now
        return self._sweep("AND #threshold <= :now", {":now": attribute_value(cutoff)})

    def stopped(self, partition: PoolPartition, now: Epoch | None = None) -> list[InstanceRecord]:
        """Stopped records of a pool partition that may still be claimed (threshold ahead), the ones that
        would be terminated soonest first. From a global index, so a claim of the last moment may not
        show yet: the claim's condition decides."""
        cutoff = self._clock.now() if now is None else now
        page = self._client.query(
            TableName=self._table,
            IndexName=STOPPED_INDEX,
            KeyConditionExpression=f"{STOPPED_PARTITION_ATTRIBUTE} = :partition AND #threshold > :now",
            ExpressionAttributeNames={"#threshold": THRESHOLD_ATTRIBUTE},
            ExpressionAttributeValues={
                ":partition": attribute_value(partition.name),
                ":now": attribute_value(cutoff),
            },
            Limit=STOPPED_READ_LIMIT,
        )
        return [record for item in page.get("Items", []) if (record := readable_record(item)) is not None]

    def holds_idle(self, partition: PoolPartition) -> bool:
        """Whether any record of the partition is idle, from the sparse by-idle index: one Query of one
        key, whatever the pool holds. No means the partition's queue offers nothing a pickup could take
        (pickup takes an offer only while its record is idle); yes may be an idle instance whose offer
        is in another pickup's hands, or one expired but not yet terminated. A global index is
        eventually consistent (DynamoDB Developer Guide, GSI.html: "changes to the table data are
        propagated to the global secondary indexes within a fraction of a second, under normal
        conditions"): an instance gone idle that moment may not show, as an offer sent just after a
        long poll would not."""
        page = self._client.query(
            TableName=self._table,
            IndexName=IDLE_INDEX,
            KeyConditionExpression=f"{POOL_PARTITION_ATTRIBUTE} = :partition",
            ExpressionAttributeValues={":partition": attribute_value(partition.name)},
            Limit=1,
        )
        return bool(page.get("Items"))

    def live(self) -> list[InstanceRecord]:
        """Every record not terminated, whatever its threshold (and none that does not parse)."""
        return self._sweep()

    def unreadable(self) -> list[UnreadableRecord]:
        """Every `state` item of the threshold index that does not parse, for refresh to end."""
        return [
            unreadable for item in self._sweep_items() if (unreadable := self._unreadable(item)) is not None
        ]

    def set_aside(self, unreadable: UnreadableRecord) -> bool:
        """Take an unreadable `state` item out of every index and give it a TTL, once its instance is
        terminated: no sweep meets it again, and it stays (for whoever looks into it) until it expires.
        False if there is no such item (any more)."""
        if unreadable.instance_id is None:
            return False
        now = self._clock.now()
        key = self._instance_key(unreadable.instance_id, STATE_ITEM)
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=(
                    f"SET {TTL_ATTRIBUTE} = :expires, {UNREADABLE_ATTRIBUTE} = :now REMOVE "
                    + ", ".join(INDEX_KEYS)
                ),
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={
                    ":expires": attribute_value(self._expiry(now)),
                    ":now": attribute_value(now),
                },
            )
        )
        return not isinstance(answer, Refusal)

    def _unreadable(self, item: Mapping[str, Any]) -> UnreadableRecord | None:
        try:
            record_from_item(item)
        except UnreadableRecordError as exc:
            return UnreadableRecord(instance_id=self._instance_of(item), reason=str(exc))
        return None

    def _instance_of(self, item: Mapping[str, Any]) -> str | None:
        partition = str(item.get(PARTITION_KEY, {}).get("S", ""))
        instance_id = partition.rpartition("/")[2]
        return instance_id if self.instance_arns.arn(instance_id) == partition else None

    def _sweep(
        self, threshold_condition: str = "", values: Mapping[str, Any] | None = None
    ) -> list[InstanceRecord]:
        """Live records from every shard of the threshold index, optionally only those a condition keeps."""
        return [
            record
            for item in self._sweep_items(threshold_condition, values)
            if (record := readable_record(item)) is not None
        ]

    def _sweep_items(
        self, threshold_condition: str = "", values: Mapping[str, Any] | None = None
    ) -> Iterator[Mapping[str, Any]]:
        request: dict[str, Any] = {"IndexName": THRESHOLD_INDEX}
        if threshold_condition:
            request["ExpressionAttributeNames"] = {"#threshold": THRESHOLD_ATTRIBUTE}
        for shard in range(SWEEP_SHARDS):
            yield from self._query_items(
                **request,
                KeyConditionExpression=f"{SWEEP_SHARD_ATTRIBUTE} = :shard {threshold_condition}".strip(),
                ExpressionAttributeValues={":shard": attribute_value(str(shard)), **(values or {})},
            )

    # --- the agent's items ---------------------------------------------------------------------

    def write_heartbeat(self, instance_id: str) -> Heartbeat:
        now = self._clock.now()
        self._put_agent_item(instance_id, HEARTBEAT_ITEM, {"beat_at": now}, now)
        return Heartbeat(instance_id=instance_id, beat_at=now)

    def read_heartbeat(self, instance_id: str) -> Heartbeat | None:
        return _heartbeat(instance_id, self._get_agent_item(instance_id, HEARTBEAT_ITEM))

    def write_signal(
        self, instance_id: str, signal: Signal, run_key: str | None = None, reason: str | None = None
    ) -> WorkerSignal:
        now = self._clock.now()
        written = WorkerSignal(instance_id=instance_id, signal=signal, run_key=run_key, at=now, reason=reason)
        # `signal_run_key`, not `run_key`: a signal item must never enter the by-run-key index.
        fields = {"signal": signal.value, "signal_run_key": run_key, "at": now, "reason": reason}
        self._put_agent_item(instance_id, SIGNAL_ITEM, fields, now)
        return written

    def read_signal(self, instance_id: str) -> WorkerSignal | None:
        return _signal(instance_id, self._get_agent_item(instance_id, SIGNAL_ITEM))

    def observe(self, instance_id: str) -> InstanceView:
        """The record, heartbeat and signal together: one consistent BatchGetItem of exactly those three
        items, where `get`, `read_heartbeat` and `read_signal` would make three calls. A record that does
        not parse is read as none."""
        return self.observe_many([instance_id])[instance_id]

    def observe_many(self, instance_ids: Sequence[str]) -> dict[str, InstanceView]:
        """Each instance's view as `observe` reads it, OBSERVED_PER_READ instances to a BatchGetItem:
        what a step that watches many instances (fleet validation, refresh's admission) reads."""
        kinds = (HEARTBEAT_ITEM, SIGNAL_ITEM)
        views: dict[str, InstanceView] = {}
        for start in range(0, len(instance_ids), OBSERVED_PER_READ):
            chunk = [
                (instance_id, self.instance_arns.arn(instance_id))
                for instance_id in instance_ids[start : start + OBSERVED_PER_READ]
            ]
            keys = [
                key
                for _, arn in chunk
                for key in (
                    item_key(arn, STATE_ITEM),
                    *(item_key(agent_partition(arn), kind) for kind in kinds),
                )
            ]
            items = read_items(self._client, self._table, keys, self._backoff)
            for instance_id, arn in chunk:
                state = items.get((arn, STATE_ITEM))
                heartbeat = items.get((agent_partition(arn), HEARTBEAT_ITEM))
                signal = items.get((agent_partition(arn), SIGNAL_ITEM))
                views[instance_id] = InstanceView(
                    record=None if state is None else readable_record(state),
                    heartbeat=_heartbeat(instance_id, None if heartbeat is None else from_item(heartbeat)),
                    signal=_signal(instance_id, None if signal is None else from_item(signal)),
                )
        return views

    def _query(self, **request: Any) -> Iterator[InstanceRecord]:
        """The records a query finds; one that does not parse is passed over (it is no record)."""
        for item in self._query_items(**request):
            record = readable_record(item)
            if record is not None:
                yield record

    def _query_items(self, **request: Any) -> Iterator[Mapping[str, Any]]:
        start: dict[str, Any] | None = None
        while True:
            page = self._query_page(request, start)
            yield from page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return

    def _query_page(self, request: Mapping[str, Any], start: Mapping[str, Any] | None) -> Any:
        if start is None:
            return self._client.query(TableName=self._table, **request)
        return self._client.query(TableName=self._table, ExclusiveStartKey=start, **request)

    def _put_agent_item(self, instance_id: str, kind: str, fields: Mapping[str, Any], now: Epoch) -> None:
        item = {
            **to_item({k: v for k, v in fields.items() if v is not None}),
            **self._agent_key(instance_id, kind),
            TTL_ATTRIBUTE: attribute_value(self._expiry(now)),
        }
        self._client.put_item(TableName=self._table, Item=item)

    def _get_agent_item(self, instance_id: str, kind: str) -> dict[str, Any] | None:
        response = self._client.get_item(
            TableName=self._table, Key=self._agent_key(instance_id, kind), ConsistentRead=True
        )
        item = response.get("Item")
        return None if item is None else from_item(item)

    def _instance_key(self, instance_id: str, kind: str) -> dict[str, Any]:
        return item_key(self.instance_arns.arn(instance_id), kind)

    def _agent_key(self, instance_id: str, kind: str) -> dict[str, Any]:
        return item_key(agent_partition(self.instance_arns.arn(instance_id)), kind)

    def _expiry(self, now: Epoch) -> int:
        return int(now) + self._timeouts.terminated_retention_days * 86_400


def _heartbeat(instance_id: str, item: Mapping[str, Any] | None) -> Heartbeat | None:
    return None if item is None else Heartbeat(instance_id=instance_id, beat_at=item["beat_at"])


def _signal(instance_id: str, item: Mapping[str, Any] | None) -> WorkerSignal | None:
    if item is None:
        return None
    return WorkerSignal(
        instance_id=instance_id,
        signal=Signal(item["signal"]),
        run_key=item.get("signal_run_key"),
        at=item["at"],
        reason=item.get("reason"),
    )
