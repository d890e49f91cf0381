"""The demand ledger over DynamoDB: which jobs have been counted, and which run keys each run used.

It lives in the webhook's idempotency table (partition key `id`, TTL attribute `expiration`), beside
Powertools' delivery records, whose ids never start with the prefixes used here:

    job#<job id>                    state reserved | started | cancelled; the holder and lease of a
                                    reservation; the provision execution that counted the job
    run#<run id>/attempt#<attempt>  run_keys (string set) the attempt's demand used; completed_at once
                                    the attempt completed (written first if the completion comes first);
                                    from_fork once its `requested` webhook named a fork as its head

Each change is one conditional write, so two dispatchers that see the same job never both count
it. Items expire after LEDGER_RETENTION_SECONDS, longer than GitHub lets a run be re-run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError

from runner_pool.adapters.backoff import Backoff, error_code
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.demand import Reservation, RunMark

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

KEY_ATTRIBUTE = "id"
EXPIRY_ATTRIBUTE = "expiration"
"""Powertools idempotency's attribute names, so one table and one TTL setting serve both."""
LEDGER_RETENTION_SECONDS = 35 * 24 * 3600
"""GitHub allows re-running a run for 30 days; a run's keys must outlive that."""
RESERVED = "reserved"
STARTED = "started"
CANCELLED = "cancelled"
FORK_ATTRIBUTE = "from_fork"


class DynamoDbLedger:
    def __init__(
        self,
        table_name: str,
        clock: Clock,
        client: DynamoDBClient | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._table = table_name
        self._clock = clock
        self._client: DynamoDBClient = client or boto3.client("dynamodb")
        self._backoff = backoff or Backoff()

    def reserve(self, job_id: int, holder: str, until: Epoch) -> Reservation:
        now = self._clock.now()
        try:
            self._backoff.call(
                lambda: self._client.put_item(
                    TableName=self._table,
                    Item={
                        KEY_ATTRIBUTE: {"S": _job(job_id)},
                        "state": {"S": RESERVED},
                        "holder": {"S": holder},
                        "lease_until": {"N": _number(until)},
                        EXPIRY_ATTRIBUTE: {"N": self._expiry(now)},
                    },
                    # A reservation whose holder died lapses; started and cancelled jobs never do.
                    ConditionExpression=(
                        "attribute_not_exists(#id) OR (#state = :reserved AND lease_until < :now)"
                    ),
                    ExpressionAttributeNames={"#id": KEY_ATTRIBUTE, "#state": "state"},
                    ExpressionAttributeValues={":reserved": {"S": RESERVED}, ":now": {"N": _number(now)}},
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            current: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            state = current.get("state", {}).get("S")
            if state == RESERVED and current.get("holder", {}).get("S") == holder:
                # Our own reservation, met by a retry after its answer was lost (issue 12, defect 6).
                return Reservation.RESERVED
            return Reservation.HELD if state == RESERVED else Reservation.COUNTED
        return Reservation.RESERVED

    def confirm(self, job_ids: Sequence[int], holder: str, execution_name: str) -> None:
        for job_id in job_ids:
            self._confirm_one(job_id, holder, execution_name)

    def free(self, job_ids: Sequence[int], holder: str) -> None:
        for job_id in job_ids:
            self._free_one(job_id, holder)

    def _confirm_one(self, job_id: int, holder: str, execution_name: str) -> None:
        values = {":started": {"S": STARTED}, ":name": {"S": execution_name}}
        # Lost only if the reservation lapsed and another dispatcher took the job: theirs stands.
        self._conditional(
            lambda: self._client.update_item(
                **self._held(job_id, holder, values),
                UpdateExpression="SET #state = :started, execution_name = :name REMOVE lease_until",
            )
        )

    def _free_one(self, job_id: int, holder: str) -> None:
        self._conditional(lambda: self._client.delete_item(**self._held(job_id, holder, {})))

    def _held(self, job_id: int, holder: str, values: dict[str, Any]) -> dict[str, Any]:
        """The key and condition of a write that only happens while `holder`'s reservation stands."""
        return {
            "TableName": self._table,
            "Key": {KEY_ATTRIBUTE: {"S": _job(job_id)}},
            "ConditionExpression": "#state = :reserved AND holder = :holder",
            "ExpressionAttributeNames": {"#state": "state"},
            "ExpressionAttributeValues": {":reserved": {"S": RESERVED}, ":holder": {"S": holder}, **values},
        }

    def cancel(self, job_id: int) -> bool:
        return self._conditional(
            lambda: self._client.put_item(
                TableName=self._table,
                Item={
                    KEY_ATTRIBUTE: {"S": _job(job_id)},
                    "state": {"S": CANCELLED},
                    EXPIRY_ATTRIBUTE: {"N": self._expiry(self._clock.now())},
                },
                ConditionExpression="attribute_not_exists(#id)",
                ExpressionAttributeNames={"#id": KEY_ATTRIBUTE},
            )
        )

    def remember_run_key(self, run_id: int, run_key: str, attempt: int) -> RunMark:
        try:
            response = self._backoff.call(
                lambda: self._client.update_item(
                    TableName=self._table,
                    Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
                    UpdateExpression="ADD run_keys :key SET #expiry = :expiry",
                    ConditionExpression="attribute_not_exists(completed_at)",
                    ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
                    ExpressionAttributeValues={
                        ":key": {"SS": [run_key]},
                        ":expiry": {"N": self._expiry(self._clock.now())},
                    },
                    ReturnValues="ALL_NEW",
                )
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return RunMark.COMPLETED
            raise
        from_fork = response.get("Attributes", {}).get(FORK_ATTRIBUTE, {}).get("BOOL", False)
        return RunMark.FROM_FORK if from_fork else RunMark.OPEN

    def mark_fork(self, run_id: int, attempt: int) -> None:
        now = self._clock.now()
        self._backoff.call(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
                UpdateExpression=f"SET {FORK_ATTRIBUTE} = :yes, #expiry = :expiry",
                ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
                ExpressionAttributeValues={":yes": {"BOOL": True}, ":expiry": {"N": self._expiry(now)}},
            )
        )

    def complete_run(self, run_id: int, attempt: int) -> frozenset[str]:
        now = self._clock.now()
        # Written for every run of the installation, ours or not, seen or not: the ledger cannot tell a
        # run that is not ours from one whose demand is still to come. A repeated completion keeps the
        # first time, and answers the run keys again, to release again.
        response = self._backoff.call(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
                UpdateExpression="SET completed_at = if_not_exists(completed_at, :now), #expiry = :expiry",
                ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
                ExpressionAttributeValues={":now": {"N": _number(now)}, ":expiry": {"N": self._expiry(now)}},
                ReturnValues="ALL_NEW",
            )
        )
        return _run_keys(response.get("Attributes", {}))

    def _conditional(self, write: Callable[[], object]) -> bool:
        """Run a conditional write; False when its condition did not hold."""
        try:
            self._backoff.call(write)
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _expiry(self, now: Epoch) -> str:
        return str(int(now + LEDGER_RETENTION_SECONDS))


def _job(job_id: int) -> str:
    return f"job#{job_id}"


def _run(run_id: int, attempt: int) -> str:
    return f"run#{run_id}/attempt#{attempt}"


def _number(value: Epoch) -> str:
    return repr(float(value))


def _run_keys(item: Any) -> frozenset[str]:
    return frozenset(item.get("run_keys", {}).get("SS", []))
