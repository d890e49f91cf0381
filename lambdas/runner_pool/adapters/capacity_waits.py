"""Jobs waiting for capacity (domain/capacity_waits.py), kept in the state table: one item per run key.

    pk = capacity#wait, sk = <repository>#<run key>
    repository, run_key, resource_class, usage
    reason          EC2's error codes for the last short provision
    jobs            jobs it left unserved
    since, tries, next_try, last_execution
                    the wait's start, the short provisions so far, when reconciliation may try again, and
                    the provision that noted it last
    check_run_id    the check run on the run's head commit that tells the jobs' author why they wait, once
                    created; a note never writes it, so it is never lost to one
    check_run_app   the App (of several) that created it, which alone may complete it
    expires_at      TTL: a day after the last note, when GitHub has failed a job queued that long

One partition, written once per short provision and read by refresh for the run keys it would provision
again, and by `runner-pool status`; a note is a read and an update conditional on what was read, so two
Finishes of one run key never lose a try. The items carry neither a run key attribute of the index nor a
sweep shard, so they stay out of the table's indexes, and their keys are no instance's ARN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from runner_pool.domain.capacity_waits import CapacityWait, CheckRun, Shortfall
from runner_pool.domain.clock import Clock
from runner_pool.domain.config import FleetSettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

WAITS_PARTITION = "capacity#wait"
RETENTION_SECONDS = 86_400
NOTE_ATTEMPTS = 5
_FIELDS = ("repository", "run_key", "resource_class", "usage", "reason", "last_execution")
_NUMBERS = ("jobs", "since", "tries", "next_try")


class CapacityWaits:
    def __init__(
        self,
        table_name: str,
        clock: Clock,
        client: DynamoDBClient | None = None,
        first_backoff: float = FleetSettings().capacity_retry_seconds,
    ) -> None:
        self._table = table_name
        self._clock = clock
        self._first_backoff = first_backoff
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")

    def note(self, shortfall: Shortfall) -> CapacityWait:
        """One more short provision of the run key: its wait begun, or tried once more."""
        for _ in range(NOTE_ATTEMPTS):
            now = self._clock.now()
            current = self.get(shortfall.repository, shortfall.run_key)
            if current is None:
                wait = CapacityWait.begun(shortfall, now, self._first_backoff)
            else:
                wait = current.tried_again(shortfall, now=now, first_backoff=self._first_backoff)
                if wait is current:
                    return current  # this execution's note, retried
            if self._write(wait, None if current is None else current.tries):
                return wait
        raise RuntimeError(
            f"the capacity wait of {shortfall.run_key} kept changing under {NOTE_ATTEMPTS} notes"
        )

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

    def mark_check_run(self, repository: str, run_key: str, check_run: CheckRun) -> None:
        """The wait's check run, once created: kept unless the wait has ended meanwhile."""
        values: dict[str, Any] = {":id": {"N": str(check_run.check_run_id)}}
        assignments = "check_run_id = :id"
        if check_run.app_id is not None:
            values[":app"] = {"S": check_run.app_id}
            assignments += ", check_run_app = :app"
        conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=self._key(repository, run_key),
                UpdateExpression=f"SET {assignments}",
                ConditionExpression=f"attribute_exists({PARTITION_KEY})",
                ExpressionAttributeValues=values,
            )
        )

    def _write(self, wait: CapacityWait, tries_read: int | None) -> bool:
        values: dict[str, Any] = {
            **{f":{name}": {"S": str(getattr(wait, name))} for name in _FIELDS},
            **{f":{name}": {"N": repr(getattr(wait, name))} for name in _NUMBERS},
            ":expires": {"N": str(int(self._clock.now() + RETENTION_SECONDS))},
        }
        if tries_read is None:
            condition = f"attribute_not_exists({PARTITION_KEY})"
        else:
            condition = "tries = :read"
            values[":read"] = {"N": str(tries_read)}
        names = {f"#{name}": name for name in (*_FIELDS, *_NUMBERS)} | {"#ttl": TTL_ATTRIBUTE}
        assignments = ", ".join(f"#{name} = :{name}" for name in (*_FIELDS, *_NUMBERS))
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=self._key(wait.repository, wait.run_key),
                UpdateExpression=f"SET {assignments}, #ttl = :expires",
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        )
        return not isinstance(answer, Refusal)


def _wait(item: dict[str, Any]) -> CapacityWait:
    return CapacityWait(
        **{name: item[name]["S"] for name in _FIELDS},
        jobs=int(item["jobs"]["N"]),
        since=float(item["since"]["N"]),
        tries=int(item["tries"]["N"]),
        next_try=float(item["next_try"]["N"]),
        check_run=(
            CheckRun(
                int(item["check_run_id"]["N"]),
                item["check_run_app"]["S"] if "check_run_app" in item else None,
            )
            if "check_run_id" in item
            else None
        ),
    )
