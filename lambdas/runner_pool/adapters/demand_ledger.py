"""The demand ledger over DynamoDB: which jobs have been counted, and which run keys each run used.

It lives in the webhook's idempotency table (partition key `id`, TTL attribute `expiration`), beside
Powertools' delivery records, whose ids never start with the prefixes used here:

    job#<job id>                    state reserved | started | cancelled; the holder and lease of a
                                    reservation; the provision execution that counted the job
    run#<run id>/attempt#<attempt>  run_keys (string set) the attempt's demand used; completed_at once
                                    the attempt completed (written first if the completion comes first);
                                    from_fork once its `requested` webhook named a fork as its head
    batch#<sha256 of repository, run key>
                                    the run key's follow-up window (domain.follow_up): repository, run_key,
                                    opened_at, closes_at, limit_at; once a dispatch joins, leader and
                                    lease_until, joined_at (its first join) and joins (how many
                                    dispatches joined), jobs and public_jobs (number sets); sealed
                                    when the leader closed it to further jobs; started when its
                                    provision started

Each change is one conditional write, so two dispatchers that see the same job never both count
it. Items expire after LEDGER_RETENTION_SECONDS, longer than GitHub lets a run be re-run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.adapters.backoff import Backoff, read_consistently
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.demand import Reservation, RunMark
from runner_pool.domain.follow_up import (
    BatchRole,
    BatchTurn,
    FollowUp,
    Sealing,
    follow_up_closes_at,
    next_follow_up_closes_at,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

KEY_ATTRIBUTE = "id"
EXPIRY_ATTRIBUTE = "expiration"
"""Powertools idempotency's attribute names, so one table and one TTL setting serve both."""
LEDGER_RETENTION_SECONDS = 35 * 24 * 3600
"""GitHub allows re-running a run for 30 days; a run's keys must outlive that."""
JOB_PREFIX = "job#"
BATCH_GET_LIMIT = 100
"""Keys in one BatchGetItem at most (Amazon DynamoDB API Reference, BatchGetItem)."""
RESERVED = "reserved"
STARTED = "started"
CANCELLED = "cancelled"
FORK_ATTRIBUTE = "from_fork"
BATCH_RETENTION_SECONDS = 24 * 3600
"""A follow-up window is over in seconds; its item is kept a day, for an operator to look at."""
TURN_ATTEMPTS = 3
"""Each lost race of take_turn moves the item on (opened, joined, sealed); after three, dispatch apart."""

# take_turn's conditions, on the batch item (see domain.follow_up for the roles)
_QUIET = (
    "attribute_not_exists(#id) OR started <= :quiet OR (attribute_not_exists(leader) AND closes_at <= :quiet)"
)
"""No follow-up is pending, and the last one started (or the window closed with nobody joining) long
enough ago that this demand is not the same burst: the next demand is a first."""
_SETTLED_OF = (
    "opened_at = :opened AND "
    "(attribute_exists(started) OR (attribute_not_exists(leader) AND closes_at < :now))"
)
"""The window seen (by when it opened) is over: its follow-up started, or nobody joined it."""
_JOINABLE = (
    "attribute_exists(#id) AND attribute_not_exists(sealed) AND attribute_not_exists(started) AND "
    "((attribute_not_exists(leader) AND closes_at >= :now) OR lease_until >= :now)"
)
"""The window is open (or its live leader has not sealed it yet)."""
_ABANDONED = (
    "attribute_exists(#id) AND attribute_exists(leader) AND attribute_not_exists(started) "
    "AND lease_until < :now"
)
"""Its leader's lease passed before the follow-up started."""


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
        self._client: DynamoDBClient = client or aws_clients.client("dynamodb")
        self._backoff = backoff or Backoff()

    def reserve(self, job_id: int, holder: str, until: Epoch) -> Reservation:
        now = self._clock.now()
        try:
            self._client.put_item(
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

    def counted(self, job_ids: Collection[int]) -> frozenset[int]:
        ids = sorted(set(job_ids))
        counted: set[int] = set()
        for start in range(0, len(ids), BATCH_GET_LIMIT):
            keys = [{KEY_ATTRIBUTE: {"S": _job(job_id)}} for job_id in ids[start : start + BATCH_GET_LIMIT]]
            counted.update(
                int(item[KEY_ATTRIBUTE]["S"].removeprefix(JOB_PREFIX))
                for item in read_consistently(self._client, self._table, keys, self._backoff)
                if item.get("state", {}).get("S") in (STARTED, CANCELLED)
            )
        return frozenset(counted)

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
            response = self._client.update_item(
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
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return RunMark.COMPLETED
            raise
        from_fork = response.get("Attributes", {}).get(FORK_ATTRIBUTE, {}).get("BOOL", False)
        return RunMark.FROM_FORK if from_fork else RunMark.OPEN

    def mark_fork(self, run_id: int, attempt: int) -> None:
        now = self._clock.now()
        self._client.update_item(
            TableName=self._table,
            Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
            UpdateExpression=f"SET {FORK_ATTRIBUTE} = :yes, #expiry = :expiry",
            ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
            ExpressionAttributeValues={":yes": {"BOOL": True}, ":expiry": {"N": self._expiry(now)}},
        )

    def complete_run(self, run_id: int, attempt: int) -> frozenset[str]:
        now = self._clock.now()
        # Written for every run of the installation, ours or not, seen or not: the ledger cannot tell a
        # run that is not ours from one whose demand is still to come. A repeated completion keeps the
        # first time, and answers the run keys again, to release again.
        response = self._client.update_item(
            TableName=self._table,
            Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
            UpdateExpression="SET completed_at = if_not_exists(completed_at, :now), #expiry = :expiry",
            ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
            ExpressionAttributeValues={":now": {"N": _number(now)}, ":expiry": {"N": self._expiry(now)}},
            ReturnValues="ALL_NEW",
        )
        return _run_keys(response.get("Attributes", {}))

    def take_turn(
        self,
        repository: str,
        run_key: str,
        *,
        job_ids: Sequence[int],
        public_ids: Sequence[int],
        holder: str,
        lease_until: Epoch,
        window_seconds: float,
        limit_seconds: float,
        quiet_seconds: float,
    ) -> BatchTurn:
        key = {KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}}
        for _ in range(TURN_ATTEMPTS):
            now = self._clock.now()
            window = _Window(now, now + window_seconds, now + limit_seconds, now - quiet_seconds)
            current = self._open(key, repository, run_key, window)
            if current is None:
                return BatchTurn(BatchRole.FIRST, closes_at=window.closes_at)
            over = "started" in current or ("leader" not in current and _epoch(current, "closes_at") < now)
            if over:  # the same burst goes on: these jobs open the next follow-up, and this dispatch leads it
                paced = next_follow_up_closes_at(
                    now,
                    last_closed_at=_epoch(current, "closes_at"),
                    limit_at=window.limit_at,
                    window_seconds=window_seconds,
                )
                turn = self._lead_next(
                    key,
                    current,
                    _Window(now, paced, window.limit_at, window.quiet_before),
                    job_ids=job_ids,
                    public_ids=public_ids,
                    holder=holder,
                    lease=lease_until,
                )
                if turn is not None:
                    return turn
                continue
            if "sealed" in current and _epoch(current, "lease_until") >= now:
                return BatchTurn(BatchRole.WAITING)  # its leader is starting it right now
            abandoned = "leader" in current and _epoch(current, "lease_until") < now
            turn = self._add(
                key,
                job_ids=job_ids,
                public_ids=public_ids,
                holder=holder,
                lease_until=lease_until,
                now=now,
                closes_at=follow_up_closes_at(
                    now,
                    closes_at=_epoch(current, "closes_at"),
                    limit_at=_epoch(current, "limit_at"),
                    joined_at=_epoch(current, "joined_at") if "joined_at" in current else None,
                    joined=int(current.get("joins", {}).get("N", "0")),
                    window_seconds=window_seconds,
                    opened_at=_epoch(current, "opened_at"),
                ),
                take_over=abandoned,
            )
            if turn is not None:
                return turn
        return BatchTurn(BatchRole.WAITING)

    def _open(
        self, key: dict[str, Any], repository: str, run_key: str, window: _Window
    ) -> dict[str, Any] | None:
        """Open a new follow-up window when none is pending and the last burst is quiet; None when
        opened, else the item as it is."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=(
                    "SET repository = :repository, run_key = :run_key, opened_at = :now, "
                    "closes_at = :closes, limit_at = :limit, #expiry = :expiry "
                    "REMOVE leader, lease_until, joined_at, joins, sealed, started, jobs, public_jobs"
                ),
                ConditionExpression=_QUIET,
                ExpressionAttributeNames={"#id": KEY_ATTRIBUTE, "#expiry": EXPIRY_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":repository": {"S": repository},
                    ":run_key": {"S": run_key},
                    ":now": {"N": _number(window.now)},
                    ":closes": {"N": _number(window.closes_at)},
                    ":limit": {"N": _number(window.limit_at)},
                    ":quiet": {"N": _number(window.quiet_before)},
                    ":expiry": {"N": str(int(window.now + BATCH_RETENTION_SECONDS))},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            current: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            return current
        return None

    def _lead_next(
        self,
        key: dict[str, Any],
        seen: dict[str, Any],
        window: _Window,
        *,
        job_ids: Sequence[int],
        public_ids: Sequence[int],
        holder: str,
        lease: Epoch,
    ) -> BatchTurn | None:
        """Open the next follow-up of a burst that goes on, with these jobs in it and `holder` leading it;
        None when the item moved on since it was `seen`."""
        values: dict[str, Any] = {
            ":opened": seen.get("opened_at", {"N": "0"}),
            ":now": {"N": _number(window.now)},
            ":closes": {"N": _number(window.closes_at)},
            ":limit": {"N": _number(window.limit_at)},
            ":jobs": {"NS": [str(job_id) for job_id in job_ids]},
            ":me": {"S": holder},
            ":lease": {"N": _number(lease)},
            ":one": {"N": "1"},
        }
        update = (
            "SET opened_at = :now, joined_at = :now, joins = :one, closes_at = :closes, limit_at = :limit, "
            "jobs = :jobs, leader = :me, lease_until = :lease"
        )
        if public_ids:
            values[":public"] = {"NS": [str(job_id) for job_id in public_ids]}
            update += ", public_jobs = :public REMOVE sealed, started"
        else:
            update += " REMOVE sealed, started, public_jobs"
        opened = self._conditional(
            lambda: self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=update,
                ConditionExpression=_SETTLED_OF,
                ExpressionAttributeValues=values,
            )
        )
        return BatchTurn(BatchRole.LEADER, window.closes_at) if opened else None

    def _add(
        self,
        key: dict[str, Any],
        *,
        job_ids: Sequence[int],
        public_ids: Sequence[int],
        holder: str,
        lease_until: Epoch,
        now: Epoch,
        closes_at: Epoch,
        take_over: bool,
    ) -> BatchTurn | None:
        """Add the jobs to the follow-up: joining it, or taking it over (sealed: it starts now); None when
        the item moved on meanwhile."""
        additions = "ADD jobs :jobs, joins :one" + (", public_jobs :public" if public_ids else "")
        values: dict[str, Any] = {
            ":one": {"N": "1"},
            ":jobs": {"NS": [str(job_id) for job_id in job_ids]},
            ":me": {"S": holder},
            ":lease": {"N": _number(lease_until)},
            ":now": {"N": _number(now)},
        }
        if public_ids:
            values[":public"] = {"NS": [str(job_id) for job_id in public_ids]}
        if take_over:
            values[":yes"] = {"BOOL": True}
            update = f"{additions} SET leader = :me, lease_until = :lease, sealed = :yes"
        else:
            # Each join keeps the window open a little longer (follow_up_closes_at, by the caller).
            values[":closes"] = {"N": _number(closes_at)}
            update = (
                f"{additions} SET leader = if_not_exists(leader, :me), "
                "lease_until = if_not_exists(lease_until, :lease), "
                "joined_at = if_not_exists(joined_at, :now), "
                "closes_at = :closes"
            )
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=update,
                ConditionExpression=_ABANDONED if take_over else _JOINABLE,
                ExpressionAttributeValues=values,
                ExpressionAttributeNames={"#id": KEY_ATTRIBUTE},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return None
            raise
        item = response.get("Attributes", {})
        closes_at = _epoch(item, "closes_at")
        if take_over:
            return BatchTurn(BatchRole.TAKEN_OVER, closes_at, _follow_up(item))
        leads = item.get("leader", {}).get("S") == holder
        return BatchTurn(BatchRole.LEADER if leads else BatchRole.JOINED, closes_at)

    def seal(self, repository: str, run_key: str, holder: str, *, started: bool = False) -> Sealing:
        now = self._clock.now()
        values: dict[str, Any] = {":yes": {"BOOL": True}, ":me": {"S": holder}, ":now": {"N": _number(now)}}
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}},
                UpdateExpression="SET sealed = :yes" + (", started = :now" if started else ""),
                ConditionExpression=("leader = :me AND attribute_not_exists(started) AND closes_at <= :now"),
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            current: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            leads = current.get("leader", {}).get("S") == holder
            if leads and "sealed" in current and (started or "started" not in current):
                # Sealed by our own write, whose answer was lost (with `started`, unless the item has
                # moved on to the next follow-up since: then its jobs are reconciliation's to find).
                return Sealing(follow_up=_follow_up(current))
            ours = leads and "started" not in current
            return Sealing(closes_at=_epoch(current, "closes_at") if ours else None)
        return Sealing(follow_up=_follow_up(response.get("Attributes", {})))

    def follow_up_started(self, repository: str, run_key: str, holder: str) -> None:
        now = self._clock.now()
        self._conditional(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _batch(repository, run_key)}},
                UpdateExpression="SET started = :now",
                ConditionExpression="leader = :me",
                ExpressionAttributeValues={":now": {"N": _number(now)}, ":me": {"S": holder}},
            )
        )

    def _conditional(self, write: Callable[[], object]) -> bool:
        """Run a conditional write; False when its condition did not hold."""
        try:
            write()
        except ClientError as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _expiry(self, now: Epoch) -> str:
        return str(int(now + LEDGER_RETENTION_SECONDS))


@dataclass(frozen=True)
class _Window:
    """A take_turn's times: now, when a window opened now closes and reaches its limit, and before when
    the run key's last burst must have ended for this demand to be a first."""

    now: Epoch
    closes_at: Epoch
    limit_at: Epoch
    quiet_before: Epoch


def _job(job_id: int) -> str:
    return f"{JOB_PREFIX}{job_id}"


def _run(run_id: int, attempt: int) -> str:
    return f"run#{run_id}/attempt#{attempt}"


def _batch(repository: str, run_key: str) -> str:
    # Hashed: a run key with many labels can outgrow a partition key (2048 bytes); the item keeps both.
    return "batch#" + hashlib.sha256(f"{repository}\n{run_key}".encode()).hexdigest()


def _epoch(item: Any, name: str) -> Epoch:
    return float(item.get(name, {}).get("N", "0"))


def _follow_up(item: Any) -> FollowUp:
    return FollowUp(
        frozenset(int(job_id) for job_id in item.get("jobs", {}).get("NS", [])),
        frozenset(int(job_id) for job_id in item.get("public_jobs", {}).get("NS", [])),
    )


def _number(value: Epoch) -> str:
    return repr(float(value))


def _run_keys(item: Any) -> frozenset[str]:
    return frozenset(item.get("run_keys", {}).get("SS", []))
