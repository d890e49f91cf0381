"""The demand ledger over DynamoDB: which jobs have been counted, and which run keys each run used.

It lives in the webhook's idempotency table (partition key `id`, TTL attribute `expiration`), beside
Powertools' delivery records, whose ids never start with the prefixes used here:

    job#<job id>                    state reserved | started | cancelled; the holder and lease of a
                                    reservation; the provision execution that counted the job
    run#<run id>/attempt#<attempt>  run_keys (string set) the attempt's demand used; completed_at once
                                    the attempt completed (written first if the completion comes first);
                                    trust: its jobs' level (domain.trust.TrustLevel), as first decided
                                    (from its `requested` delivery, or GitHub's answer when that came
                                    late), never overwritten; privileged_labels (string set): its pool
                                    labels that had a job with an environment; from_fork, written
                                    with trust (an earlier release wrote it alone: untrusted);
                                    interrupted (string set): label sets whose jobs failed on an
                                    instance EC2 was interrupting; on_demand (string set) and rerun
                                    (asking | asked, with rerun_holder and rerun_lease_until): this
                                    stack asked to re-run the attempt before, and this attempt serves
                                    those label sets on-demand (domain/reruns.py)
    batch#<...>                     a run key's follow-up batch: adapters.follow_up_batches

Each change is one conditional write, so two dispatchers that see the same job never both count
it. Items expire after LEDGER_RETENTION_SECONDS, longer than GitHub lets a run be re-run.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.backoff import Backoff, read_consistently
from runner_pool.adapters.follow_up_batches import FollowUpBatches
from runner_pool.adapters.ledger_items import EXPIRY_ATTRIBUTE, KEY_ATTRIBUTE, number
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.demand import Reservation, RunAttempt, RunMark, privileged_label
from runner_pool.domain.follow_up import Arrival, BatchTurn, Sealing, WindowSpan
from runner_pool.domain.reruns import Claim, RerunRecord
from runner_pool.domain.trust import TrustLevel

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

LEDGER_RETENTION_SECONDS = 35 * 24 * 3600
"""GitHub allows re-running a run for 30 days; a run's keys must outlive that."""
JOB_PREFIX = "job#"
BATCH_GET_LIMIT = 100
"""Keys in one BatchGetItem at most (Amazon DynamoDB API Reference, BatchGetItem)."""
RESERVED = "reserved"
STARTED = "started"
CANCELLED = "cancelled"
FORK_ATTRIBUTE = "from_fork"
"""Written with the level; an earlier release wrote it alone, and it then reads as untrusted."""
TRUST_ATTRIBUTE = "trust"
PRIVILEGED_ATTRIBUTE = "privileged_labels"
INTERRUPTED_ATTRIBUTE = "interrupted"
ON_DEMAND_ATTRIBUTE = "on_demand"
RERUN_ATTRIBUTE = "rerun"
ASKING = "asking"
ASKED = "asked"


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
        self._batches = FollowUpBatches(table_name, clock, self._client)

    def reserve(self, job_id: int, holder: str, until: Epoch) -> Reservation:
        now = self._clock.now()
        answer = conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item=self._job_item(
                    job_id, RESERVED, now, holder={"S": holder}, lease_until={"N": number(until)}
                ),
                # A reservation whose holder died lapses; started and cancelled jobs never do.
                ConditionExpression=(
                    "attribute_not_exists(#id) OR (#state = :reserved AND lease_until < :now)"
                ),
                ExpressionAttributeNames={"#id": KEY_ATTRIBUTE, "#state": "state"},
                ExpressionAttributeValues={":reserved": {"S": RESERVED}, ":now": {"N": number(now)}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            state = answer.item.get("state", {}).get("S")
            if state == RESERVED and answer.item.get("holder", {}).get("S") == holder:
                # Our own reservation, met by a retry after its answer was lost.
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
        conditional_write(
            lambda: self._client.update_item(
                **self._held(job_id, holder, values),
                UpdateExpression="SET #state = :started, execution_name = :name REMOVE lease_until",
            )
        )

    def _free_one(self, job_id: int, holder: str) -> None:
        conditional_write(lambda: self._client.delete_item(**self._held(job_id, holder, {})))

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
        cancelled = conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item=self._job_item(job_id, CANCELLED, self._clock.now()),
                ConditionExpression="attribute_not_exists(#id)",
                ExpressionAttributeNames={"#id": KEY_ATTRIBUTE},
            )
        )
        return not isinstance(cancelled, Refusal)

    def _job_item(self, job_id: int, state: str, now: Epoch, **more: dict[str, str]) -> dict[str, Any]:
        """A job's whole item in `state`, written at `now`, with `more` attributes of the state."""
        return {
            KEY_ATTRIBUTE: {"S": _job(job_id)},
            "state": {"S": state},
            EXPIRY_ATTRIBUTE: {"N": self._expiry(now)},
            **more,
        }

    def remember_run_key(
        self, run_id: int, run_key: str, attempt: int, *, privileged: bool = False
    ) -> RunAttempt:
        values: dict[str, Any] = {
            ":key": {"SS": [run_key]},
            ":expiry": {"N": self._expiry(self._clock.now())},
        }
        additions = "run_keys :key"
        if privileged:
            additions += f", {PRIVILEGED_ATTRIBUTE} :label"
            values[":label"] = {"SS": [privileged_label(run_key)]}
        response = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
                UpdateExpression=f"ADD {additions} SET #expiry = :expiry",
                ConditionExpression="attribute_not_exists(completed_at)",
                ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        )
        if isinstance(response, Refusal):
            return RunAttempt(RunMark.COMPLETED)
        item = response.get("Attributes", {})
        return RunAttempt(
            RunMark.OPEN,
            trust=_trust(item),
            privileged_labels=_strings(item, PRIVILEGED_ATTRIBUTE),
            from_fork=item.get(FORK_ATTRIBUTE, {}).get("BOOL", False),
            on_demand=_strings(item, ON_DEMAND_ATTRIBUTE),
        )

    def decide_trust(self, run_id: int, attempt: int, level: TrustLevel, *, from_fork: bool) -> TrustLevel:
        now = self._clock.now()
        # Whenever it comes, and whatever else the item holds (a completion, run keys): the first
        # level stands, so a later delivery that disagrees changes nothing already served by it.
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
                UpdateExpression="SET #trust = :level, #fork = :fork, #expiry = :expiry",
                ConditionExpression="attribute_not_exists(#trust) AND attribute_not_exists(#fork)",
                ExpressionAttributeNames={
                    "#trust": TRUST_ATTRIBUTE,
                    "#fork": FORK_ATTRIBUTE,
                    "#expiry": EXPIRY_ATTRIBUTE,
                },
                ExpressionAttributeValues={
                    ":level": {"S": level},
                    ":fork": {"BOOL": from_fork},
                    ":expiry": {"N": self._expiry(now)},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            standing = _trust(answer.item)
            return level if standing is None else standing
        return level

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
            ExpressionAttributeValues={":now": {"N": number(now)}, ":expiry": {"N": self._expiry(now)}},
            ReturnValues="ALL_NEW",
        )
        return _run_keys(response.get("Attributes", {}))

    def note_interrupted(self, run_id: int, attempt: int, label_set: str) -> bool:
        now = self._clock.now()
        # Adding to a set is its own idempotence: a retried release notes the same label set again.
        response = self._client.update_item(
            TableName=self._table,
            Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt)}},
            UpdateExpression=f"ADD {INTERRUPTED_ATTRIBUTE} :labels SET #expiry = :expiry",
            ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
            ExpressionAttributeValues={":labels": {"SS": [label_set]}, ":expiry": {"N": self._expiry(now)}},
            ReturnValues="ALL_NEW",
        )
        return "completed_at" in response.get("Attributes", {})

    def rerun_record(self, run_id: int, attempt: int) -> RerunRecord:
        this = self._read(_run(run_id, attempt))
        interrupted = _strings(this, INTERRUPTED_ATTRIBUTE)
        if not interrupted:
            return RerunRecord()
        following = self._read(_run(run_id, attempt + 1))
        return RerunRecord(
            interrupted=interrupted,
            ours=RERUN_ATTRIBUTE in this,
            asked=following.get(RERUN_ATTRIBUTE, {}).get("S") == ASKED,
        )

    def claim_rerun(
        self, run_id: int, attempt: int, on_demand: Collection[str], holder: str, until: Epoch
    ) -> Claim:
        now = self._clock.now()
        answer = conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt + 1)}},
                UpdateExpression=(
                    f"SET {RERUN_ATTRIBUTE} = :asking, rerun_holder = :holder, rerun_lease_until = :until, "
                    f"#expiry = :expiry ADD {ON_DEMAND_ATTRIBUTE} :labels"
                ),
                # Our own claim (a retry whose answer was lost), or one whose holder died before asking.
                ConditionExpression=(
                    f"attribute_not_exists({RERUN_ATTRIBUTE}) OR ({RERUN_ATTRIBUTE} = :asking AND "
                    "(rerun_holder = :holder OR rerun_lease_until < :now))"
                ),
                ExpressionAttributeNames={"#expiry": EXPIRY_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":asking": {"S": ASKING},
                    ":holder": {"S": holder},
                    ":until": {"N": number(until)},
                    ":now": {"N": number(now)},
                    ":labels": {"SS": sorted(on_demand)},
                    ":expiry": {"N": self._expiry(now)},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if not isinstance(answer, Refusal):
            return Claim.CLAIMED
        return Claim.ASKED if answer.item.get(RERUN_ATTRIBUTE, {}).get("S") == ASKED else Claim.HELD

    def rerun_asked(self, run_id: int, attempt: int, holder: str) -> None:
        conditional_write(
            lambda: self._client.update_item(
                TableName=self._table,
                Key={KEY_ATTRIBUTE: {"S": _run(run_id, attempt + 1)}},
                UpdateExpression=f"SET {RERUN_ATTRIBUTE} = :asked REMOVE rerun_lease_until",
                ConditionExpression="rerun_holder = :holder",
                ExpressionAttributeValues={":asked": {"S": ASKED}, ":holder": {"S": holder}},
            )
        )

    def _read(self, key: str) -> dict[str, Any]:
        response = self._client.get_item(
            TableName=self._table, Key={KEY_ATTRIBUTE: {"S": key}}, ConsistentRead=True
        )
        return response.get("Item", {})

    def take_turn(self, repository: str, run_key: str, *, arrival: Arrival, span: WindowSpan) -> BatchTurn:
        return self._batches.take_turn(repository, run_key, arrival=arrival, span=span)

    def seal(self, repository: str, run_key: str, holder: str, *, started: bool = False) -> Sealing:
        return self._batches.seal(repository, run_key, holder, started=started)

    def follow_up_started(self, repository: str, run_key: str, holder: str) -> None:
        self._batches.follow_up_started(repository, run_key, holder)

    def _expiry(self, now: Epoch) -> str:
        return str(int(now + LEDGER_RETENTION_SECONDS))


def _job(job_id: int) -> str:
    return f"{JOB_PREFIX}{job_id}"


def _run(run_id: int, attempt: int) -> str:
    return f"run#{run_id}/attempt#{attempt}"


def _trust(item: Any) -> TrustLevel | None:
    """The level stored on a run attempt's item; an earlier release's fork mark is untrusted."""
    stored = item.get(TRUST_ATTRIBUTE, {}).get("S")
    if stored is not None:
        return TrustLevel(stored)
    if item.get(FORK_ATTRIBUTE, {}).get("BOOL", False):
        return TrustLevel.UNTRUSTED
    return None


def _run_keys(item: Any) -> frozenset[str]:
    return _strings(item, "run_keys")


def _strings(item: Any, attribute: str) -> frozenset[str]:
    return frozenset(item.get(attribute, {}).get("SS", []))
