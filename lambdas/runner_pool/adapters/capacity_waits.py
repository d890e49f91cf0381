"""Jobs waiting for capacity (domain/capacity_waits.py), kept in the state table: one item per run key.

    pk = capacity#wait, sk = <repository>#<run key>
    repository, run_key, resource_class, usage
    reason          EC2's error codes for the last short provision
    jobs            jobs it left unserved
    since, tries, next_try, last_execution
                    the wait's start, the short provisions so far, when reconciliation may try again, and
                    the provision that noted it last
    expires_at      TTL: a day after the last note, when GitHub has failed a job queued that long

One partition, written once per short provision and read by refresh for the run keys it would provision
again, and by `runner-pool status`; a note is a read and a write conditional on what was read, so two
Finishes of one run key never lose a try. The items carry neither a run key attribute of the index nor a
sweep shard, so they stay out of the table's indexes, and their keys are no instance's ARN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.adapters.state_table import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from runner_pool.domain.capacity_waits import CapacityWait, backoff_seconds
from runner_pool.domain.clock import Clock

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

WAITS_PARTITION = "capacity#wait"
RETENTION_SECONDS = 86_400
NOTE_ATTEMPTS = 5
_FIELDS = ("repository", "run_key", "resource_class", "usage", "reason", "last_execution")
_NUMBERS = ("jobs", "since", "tries", "next_try")


class CapacityWaits:
    def __init__(self, table_name: str, clock: Clock, client: DynamoDBClient | None = None) -> None:
        self._table = table_name
        self._clock = clock
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def note(
        self,
        *,
        repository: str,
        run_key: str,
        resource_class: str,
        usage: str,
        reason: str,
        jobs: int,
        execution: str,
    ) -> CapacityWait:
        """One more short provision of the run key: its wait begun, or tried once more."""
        for _ in range(NOTE_ATTEMPTS):
            now = self._clock.now()
            current = self.get(repository, run_key)
            if current is None:
                wait = CapacityWait(
                    repository=repository,
                    run_key=run_key,
                    resource_class=resource_class,
                    usage=usage,
                    reason=reason,
                    jobs=jobs,
                    since=now,
                    tries=1,
                    next_try=now + backoff_seconds(1),
                    last_execution=execution,
                )
            else:
                wait = current.tried_again(execution=execution, jobs=jobs, reason=reason, now=now)
                if wait is current:
                    return current  # this execution's note, retried
            if self._write(wait, None if current is None else current.tries):
                return wait
        raise RuntimeError(f"the capacity wait of {run_key} kept changing under {NOTE_ATTEMPTS} notes")

    def get(self, repository: str, run_key: str) -> CapacityWait | None:
        item = self._client.get_item(
            TableName=self._table, Key=self._key(repository, run_key), ConsistentRead=True
        ).get("Item")
        return None if item is None else _wait(item)

    def end(self, repository: str, run_key: str) -> CapacityWait | None:
        """The run key's jobs are served: its wait, if it had one, is over (and returned)."""
        item = self._client.delete_item(
            TableName=self._table, Key=self._key(repository, run_key), ReturnValues="ALL_OLD"
        ).get("Attributes")
        return None if item is None else _wait(item)

    def all(self) -> list[CapacityWait]:
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": PARTITION_KEY},
            ExpressionAttributeValues={":pk": {"S": WAITS_PARTITION}},
        )
        return [_wait(item) for page in pages for item in page.get("Items", [])]

    def _key(self, repository: str, run_key: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": WAITS_PARTITION}, SORT_KEY: {"S": f"{repository}#{run_key}"}}

    def _write(self, wait: CapacityWait, tries_read: int | None) -> bool:
        item = {
            **self._key(wait.repository, wait.run_key),
            **{name: {"S": str(getattr(wait, name))} for name in _FIELDS},
            **{name: {"N": repr(getattr(wait, name))} for name in _NUMBERS},
            TTL_ATTRIBUTE: {"N": str(int(self._clock.now() + RETENTION_SECONDS))},
        }
        condition: dict[str, Any] = (
            {"ConditionExpression": f"attribute_not_exists({PARTITION_KEY})"}
            if tries_read is None
            else {
                "ConditionExpression": "tries = :read",
                "ExpressionAttributeValues": {":read": {"N": str(tries_read)}},
            }
        )
        try:
            self._client.put_item(TableName=self._table, Item=item, **condition)
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            return False
        return True


def _wait(item: dict[str, Any]) -> CapacityWait:
    return CapacityWait(
        **{name: item[name]["S"] for name in _FIELDS},
        jobs=int(item["jobs"]["N"]),
        since=float(item["since"]["N"]),
        tries=int(item["tries"]["N"]),
        next_try=float(item["next_try"]["N"]),
    )
