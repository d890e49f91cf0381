"""The state table: every lifecycle transition of DESIGN.md section 4 as one conditional DynamoDB write.

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

A `state` item that does not parse is an UnreadableRecord: every read treats it as no record (a sweep
skips it, a single read finds None), `unreadable` finds those the threshold index holds, and
`set_aside` takes one out of every index once refresh has terminated its instance.

The control plane's own markers (refresh's high-water marks) are items of their own, `pk` =
`marker#<name>`, outside both indexes.

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

import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError
from pydantic import ValidationError

from runner_pool.adapters import aws_clients
from runner_pool.adapters.aws_clients import error_code
from runner_pool.adapters.backoff import Backoff, read_consistently
from runner_pool.adapters.instance_arns import InstanceArns
from runner_pool.domain.clock import Clock, Epoch
from runner_pool.domain.config import ReuseScope, ReuseSettings, Timeouts
from runner_pool.domain.lifecycle import LIVE_STATES, InstanceState, Outcome
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import (
    MAX_REASON_CHARS,
    Heartbeat,
    InstanceFacts,
    InstanceRecord,
    Signal,
    UnreadableRecord,
    UsageClass,
    WorkerSignal,
)
from runner_pool.domain.trust import TrustLevel, reuses

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
"""In every write but expiry and termination: a quarantine is final (issue 36, item 3)."""
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

_ANY_RUN = object()
_serializer = TypeSerializer()
_deserializer = TypeDeserializer()
_INDEX_KEYS = (
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


@dataclass(frozen=True)
class TransitionResult:
    """The outcome of one transition and the record as it stands afterwards (None if there is none)."""

    outcome: Outcome
    record: InstanceRecord | None

    @property
    def succeeded(self) -> bool:
        return self.outcome.succeeded


@dataclass(frozen=True)
class InstanceView:
    """An instance's record and its agent's latest heartbeat and signal, as one read saw them."""

    record: InstanceRecord | None
    heartbeat: Heartbeat | None
    signal: WorkerSignal | None


def sweep_shard(instance_id: str) -> str:
    return str(zlib.crc32(instance_id.encode()) % SWEEP_SHARDS)


class StateTable:
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

    # --- transitions -------------------------------------------------------------------------

    def create(
        self,
        facts: InstanceFacts,
        run_key: str | None,
        *,
        repository: str | None = None,
        repository_id: int | None = None,
        single_use: bool = False,
        for_stopped_tier: bool = False,
        trust: TrustLevel | None = None,
    ) -> TransitionResult:
        """(new) → created: record a launched instance, for a run of `repository` (whose jobs are of level
        `trust`) or (run_key None) for the pool; `for_stopped_tier` (pool only) marks one launched for a
        stopped minimum."""
        now = self._clock.now()
        record = InstanceRecord(
            **facts.model_dump(),
            state=InstanceState.CREATED,
            run_key=run_key,
            threshold=now + self._timeouts.created_threshold_seconds,
            repository=repository if run_key else None,
            repository_id=repository_id if run_key else None,
            jobs_served=1 if run_key else 0,
            single_use=single_use and bool(run_key),
            trust=trust if run_key else None,
            for_stopped_tier=for_stopped_tier and not run_key,
            created_at=now,
            updated_at=now,
        )
        item = {
            **_to_item(record.model_dump(mode="json", exclude_none=True)),
            **self._instance_key(facts.instance_id, STATE_ITEM),
            SWEEP_SHARD_ATTRIBUTE: {"S": sweep_shard(facts.instance_id)},
            POOL_PARTITION_ATTRIBUTE: {"S": PoolPartition.of(facts).name},
        }
        try:
            self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            current = _lost_race_record(exc)
            replayed = (
                current is not None
                and current.state is InstanceState.CREATED
                and current.run_key == run_key
                and not current.threshold_passed(now)
            )
            return TransitionResult(Outcome.REPLAYED if replayed else Outcome.LOST, current)
        return TransitionResult(Outcome.APPLIED, record)

    def claim(
        self,
        instance_id: str,
        run_key: str,
        claim_token: str,
        *,
        repository: str | None = None,
        repository_id: int | None = None,
        reuse: ReuseSettings | None = None,
        single_use: bool = False,
        trust: TrustLevel | None = None,
        stopped: bool = False,
    ) -> TransitionResult:
        """idle → claimed(run): only an idle, unheld instance whose idle time has not run out.

        With `stopped`, stopped → claimed(run) instead: a stopped instance of the stopped tier, which the
        claim's holder then starts (EC2 StartInstances). Its threshold allows for the start, and it
        leaves the by-stopped index in this same write, so no other request finds it to start it again.

        For a run of `repository`: only an instance that served nothing yet or served a repository
        within `reuse.scope` of it, and fewer than `reuse.max_jobs` jobs (issue 14, item 2); the record
        then names `repository` and counts the hand-off. Pickup chose it by the same rule from a read
        a moment older: the condition, not that read, decides. With `repository_id`, the repository
        scope compares ids (a record that has none, from before ids were kept, by name), so a new
        repository that took an old one's name never reuses its instances. A quarantined record is never
        claimed, whatever its threshold says (a clock behind the quarantine's would still find it ahead).

        And by level of trust (domain/trust.py `may_follow`), for jobs of level `trust`: a pristine
        instance (no hand-off counted) always; a used one only if the jobs reuse (not `single_use`, and a
        level that reuses) and the record's level is theirs. The record then names `trust` (none when
        None). So an offer from a stale or forged message never crosses a level, whatever pickup read.
        """
        now = self._clock.now()
        conditions: list[str] = []
        values: dict[str, Any] = {}
        set_fields: dict[str, Any] = {RUN_KEY_ATTRIBUTE: run_key, "claim_token": claim_token}
        removed: tuple[str, ...] = ()
        if repository is not None:
            set_fields |= {REPOSITORY_ATTRIBUTE: repository, "single_use": single_use}
            if repository_id is not None:
                set_fields[REPOSITORY_ID_ATTRIBUTE] = repository_id
            else:
                # A hand-off whose demand named no id must not keep the id of the repository served before.
                removed += (REPOSITORY_ID_ATTRIBUTE,)
            if trust is not None:
                set_fields[TRUST_ATTRIBUTE] = trust.value
            else:
                removed += (TRUST_ATTRIBUTE,)
            values[":zero"] = _value(0)
            pristine = "(attribute_not_exists(jobs_served) OR jobs_served = :zero)"
            if single_use or not reuses(trust):
                conditions.append(pristine)
            else:
                values[":trust"] = _value(trust.value if trust is not None else "")
                conditions.append(f"({pristine} OR {TRUST_ATTRIBUTE} = :trust)")
        if repository is not None and reuse is not None:
            values |= {
                ":max_jobs": _value(reuse.max_jobs),
                ":created_after": _value(now - reuse.max_age_minutes * 60.0),
            }
            conditions += [
                "(attribute_not_exists(jobs_served) OR jobs_served < :max_jobs)",
                "created_at > :created_after",
            ]
            unserved = f"attribute_not_exists({REPOSITORY_ATTRIBUTE})"
            if reuse.scope is ReuseScope.REPOSITORY and repository_id is not None:
                values |= {":served": _value(repository), ":served_id": _value(repository_id)}
                by_name = (
                    f"attribute_not_exists({REPOSITORY_ID_ATTRIBUTE}) AND {REPOSITORY_ATTRIBUTE} = :served"
                )
                conditions.append(f"({unserved} OR {REPOSITORY_ID_ATTRIBUTE} = :served_id OR ({by_name}))")
            elif reuse.scope is ReuseScope.REPOSITORY:
                values[":served"] = _value(repository)
                conditions.append(f"({unserved} OR {REPOSITORY_ATTRIBUTE} = :served)")
            elif reuse.scope is ReuseScope.OWNER:
                values[":owner"] = _value(repository.split("/", 1)[0] + "/")
                conditions.append(f"({unserved} OR begins_with({REPOSITORY_ATTRIBUTE}, :owner))")
        threshold_in = self._timeouts.claimed_threshold_seconds
        if stopped:
            threshold_in += self._timeouts.start_registration_seconds
        return self._transition(
            instance_id,
            now,
            expect_states=(InstanceState.STOPPED if stopped else InstanceState.IDLE,),
            expect_run_key=None,
            new_state=InstanceState.CLAIMED,
            threshold_in=threshold_in,
            set_fields=set_fields,
            # The previous run's runner stays on an idle record, for release to find; a claim starts anew.
            remove_fields=(
                ("runner_id", "runner_run_key", STOPPED_PARTITION_ATTRIBUTE)
                if stopped
                else ("runner_id", "runner_run_key")
            )
            + removed,
            extra_conditions=conditions,
            extra_values=values,
            count_job=repository is not None,
            is_replay=lambda r: (
                r.state is InstanceState.CLAIMED
                and r.claim_token == claim_token
                and not r.threshold_passed(now)
            ),
        )

    def quarantine(self, instance_id: str, runner_id: int) -> TransitionResult:
        """any live → expired and quarantined, while the record still holds the hand-off to `runner_id`:
        GitHub gave that runner a job of another run, attempt or repository (issues 14 and 36), so the
        instance must never serve again. Idle counts too (the run's release may have come first); a later
        hand-off does not; an instance already expired is marked too, so its agent stops the runner now
        rather than when the instance ends. The mark is final: every other transition requires its
        absence."""
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=tuple(LIVE_STATES),
            expect_run_key=_ANY_RUN,
            expect_runner_id=runner_id,
            new_state=None,
            threshold_in=0.0,
            set_fields={QUARANTINED_ATTRIBUTE: now},
            # Once: a retry (or a second report of the job) finds its own mark and replays.
            extra_conditions=[NOT_QUARANTINED],
            may_be_quarantined=True,
            threshold_ahead=False,
            is_replay=lambda r: (
                r.state in LIVE_STATES and r.runner_id == runner_id and r.quarantined_at is not None
            ),
        )

    def mark_interrupted(self, instance_id: str, run_key: str) -> TransitionResult:
        """Held for `run_key` (running, claimed or created) → the same, interrupted: EC2 warned that it
        interrupts the instance while a job of the run may run on it (GitHub can give the job to its runner
        before the provision has set it running). Not a transition of state or threshold: what follows (an
        expiry, its release, refresh's termination) reads the mark. Once: a second warning replays."""
        now = self._clock.now()
        held = (InstanceState.RUNNING, InstanceState.CLAIMED, InstanceState.CREATED)
        return self._write(
            instance_id,
            update="SET interrupted_at = :now, updated_at = :now",
            condition=(
                f"#state IN ({', '.join(_state_placeholders(held))}) AND {RUN_KEY_ATTRIBUTE} = :run_key "
                "AND #threshold > :now AND attribute_not_exists(interrupted_at)"
            ),
            names={"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE},
            values={":now": _value(now), ":run_key": _value(run_key), **_state_values(held)},
            is_replay=lambda r: r.run_key == run_key and r.interrupted_at is not None,
        )

    def activate(
        self, instance_id: str, run_key: str, max_runtime_minutes: int, claim_token: str | None = None
    ) -> TransitionResult:
        """created | claimed → running: the instance registered for the run and is healthy.

        A claimed instance is activated by its claim's holder (`claim_token`); without a token only
        an instance created for the run is. The run key alone is not enough: every claim worker of
        one run shares it, so a late retry from an earlier claim must not act on a later one.
        """
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=(InstanceState.CLAIMED,) if claim_token else (InstanceState.CREATED,),
            expect_run_key=run_key,
            expect_claim_token=claim_token,
            new_state=InstanceState.RUNNING,
            threshold_in=max_runtime_minutes * 60.0,
            remove_fields=("claim_token",),
            is_replay=lambda r: (
                r.state is InstanceState.RUNNING and r.run_key == run_key and not r.threshold_passed(now)
            ),
        )

    def unclaim(self, instance_id: str, run_key: str, claim_token: str) -> TransitionResult:
        """claimed → idle: the claim's holder could not use the instance and gives it back."""
        return self._to_idle(instance_id, InstanceState.CLAIMED, run_key, claim_token)

    def release(self, instance_id: str, run_key: str, runner_id: int | None = None) -> TransitionResult:
        """running → idle: the run is done with the instance; the run key is cleared.

        With `runner_id`, only the hand-off to that runner is released: the same run may have taken the
        instance again since, for another of its jobs, under another runner.
        """
        return self._to_idle(instance_id, InstanceState.RUNNING, run_key, runner_id=runner_id)

    def admit(self, instance_id: str) -> TransitionResult:
        """created → idle for an instance launched for the warm pool (no run key) once it is ready."""
        return self._to_idle(instance_id, InstanceState.CREATED, None)

    def stop(self, instance_id: str) -> TransitionResult:
        """idle → stopping: refresh chose this idle on-demand instance for the stopped tier, before its idle
        time runs out (a passed threshold stays final: no transition revives an instance once it has
        passed, so refresh's sweep and the agent's own watch never race a stop). The instance leaves
        the hot pool here: its pool message no longer matches its record and is dropped as stale.
        Refresh then asks EC2 to stop it; `timeouts.stopping_seconds` later, stopped or not, it is due."""
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=(InstanceState.IDLE,),
            expect_run_key=None,
            new_state=InstanceState.STOPPING,
            threshold_in=self._timeouts.stopping_seconds,
            # A spot instance of an instant fleet cannot be stopped (config.PoolSettings): the record's
            # usage class, which creation took from EC2's own `Lifecycle`, decides in the write itself.
            extra_conditions=["usage_class = :on_demand"],
            extra_values={":on_demand": _value(UsageClass.ON_DEMAND.value)},
            is_replay=lambda r: r.state is InstanceState.STOPPING and not r.threshold_passed(now),
        )

    def mark_stopped(self, facts: InstanceFacts, until: Epoch) -> TransitionResult:
        """stopping → stopped, once EC2 reports the instance stopped: it joins the by-stopped index, under
        its pool partition, and may be claimed and started until `until` (then refresh terminates it)."""
        now = self._clock.now()
        return self._transition(
            facts.instance_id,
            now,
            expect_states=(InstanceState.STOPPING,),
            expect_run_key=None,
            new_state=InstanceState.STOPPED,
            threshold_in=until - now,
            set_fields={STOPPED_PARTITION_ATTRIBUTE: PoolPartition.of(facts).name},
            is_replay=lambda r: r.state is InstanceState.STOPPED and not r.threshold_passed(now),
        )

    def expire(self, instance_id: str, run_key: str | object | None = _ANY_RUN) -> TransitionResult:
        """any live → expired: the threshold is set to now, the state kept, for refresh to terminate.

        With `run_key` given (a str, or None for an unheld instance), only while the record still
        holds exactly that run key, so a failing execution never expires an instance that has
        since moved on to another run.
        """
        now = self._clock.now()

        def already_expired(record: InstanceRecord) -> bool:
            holder_matches = run_key is _ANY_RUN or record.run_key == run_key
            return record.state in LIVE_STATES and holder_matches and record.threshold_passed(now)

        return self._transition(
            instance_id,
            now,
            expect_states=tuple(LIVE_STATES),
            expect_run_key=run_key,
            new_state=None,
            threshold_in=0.0,
            may_be_quarantined=True,
            is_replay=already_expired,
        )

    def mark_terminated(self, instance_id: str) -> TransitionResult:
        """expired → terminated, after EC2 TerminateInstances: leaves both indexes, gets a TTL."""
        now = self._clock.now()
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values = {
            ":terminated": _value(InstanceState.TERMINATED.value),
            ":now": _value(now),
            ":expires": _value(self._expiry(now)),
            **_state_values(LIVE_STATES),
        }
        return self._write(
            instance_id,
            update=(
                "SET #state = :terminated, expires_at = :expires, updated_at = :now "
                f"REMOVE {RUN_KEY_ATTRIBUTE}, claim_token, {SWEEP_SHARD_ATTRIBUTE}, "
                f"{STOPPED_PARTITION_ATTRIBUTE}, {IDLE_SINCE_ATTRIBUTE}, #threshold"
            ),
            condition=f"#state IN ({', '.join(_state_placeholders(LIVE_STATES))}) AND #threshold <= :now",
            names=names,
            values=values,
            may_be_quarantined=True,
            is_replay=lambda r: r.state is InstanceState.TERMINATED,
        )

    def record_runner(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult:
        """Note the GitHub runner registered for the run on a claimed or created instance, before its
        config is stored: a retried hand-off that finds a runner noted but no config for it registers
        anew, one that finds both is complete (issue 13, fix 5). Release deletes the runner if it never
        takes a job, and finds the instance a completed job names by it. Not a transition: state and
        threshold stay as they are; a later registration for the same hand-off replaces the earlier. The
        run key is noted beside it (`runner_run_key`): the jobs that runner runs are judged by it."""
        now = self._clock.now()
        held = (InstanceState.CLAIMED, InstanceState.CREATED)
        values: dict[str, Any] = {
            ":runner_id": _value(runner_id),
            ":now": _value(now),
            ":run_key": _value(run_key),
            **_state_values(held),
        }
        update = "SET runner_id = :runner_id, runner_run_key = :run_key, updated_at = :now"
        return self._write(
            instance_id,
            update=update,
            condition=(
                f"#state IN ({', '.join(_state_placeholders(held))}) "
                f"AND {RUN_KEY_ATTRIBUTE} = :run_key AND #threshold > :now"
            ),
            names={"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE},
            values=values,
            is_replay=lambda r: (
                r.runner_id == runner_id and r.run_key == run_key and not r.threshold_passed(now)
            ),
        )

    def job_started(
        self, instance_id: str, run_key: str, runner_id: int, repository: str, max_runtime_minutes: int
    ) -> TransitionResult:
        """running → running: the runner `runner_id` of an instance that waited for any job (an instant
        tier's, domain/instant.py) took one of `repository`. Its runtime starts now, not when it began to
        wait, and the record names the repository it now serves. Not for a quarantined record."""
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=(InstanceState.RUNNING,),
            expect_run_key=run_key,
            expect_runner_id=runner_id,
            new_state=None,
            threshold_in=max_runtime_minutes * 60.0,
            set_fields={REPOSITORY_ATTRIBUTE: repository},
            is_replay=lambda r: (
                r.state is InstanceState.RUNNING
                and r.runner_id == runner_id
                and r.repository == repository
                and not r.threshold_passed(now)
            ),
        )

    def release_served(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult:
        """running | claimed | created → idle: the hand-off to `runner_id` ends (its job completed, or
        its run did).

        A short job can end before its provision's Finish has set the instance running (issue 13,
        fix 6), and the run's completion can be handled before the job's; the instance was handed
        nothing but the run's runner config either way, so it goes back to the pool like any
        released one once its agent has cleaned up. Only the hand-off to that runner: a later
        hand-off of the same instance to the same run (another runner) is not touched.
        """
        now = self._clock.now()
        served = (InstanceState.RUNNING, InstanceState.CLAIMED, InstanceState.CREATED)
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values = {
            ":now": _value(now),
            ":threshold": _value(now + self._timeouts.idle_seconds),
            ":idle": _value(InstanceState.IDLE.value),
            ":run_key": _value(run_key),
            ":runner_id": _value(runner_id),
            **_state_values(served),
        }
        return self._write(
            instance_id,
            update=(
                "SET #state = :idle, #threshold = :threshold, updated_at = :now, "
                f"{IDLE_SINCE_ATTRIBUTE} = :now "
                f"REMOVE {RUN_KEY_ATTRIBUTE}, claim_token"
            ),
            condition=(
                f"#state IN ({', '.join(_state_placeholders(served))}) AND {RUN_KEY_ATTRIBUTE} = :run_key "
                "AND runner_id = :runner_id AND #threshold > :now"
            ),
            names=names,
            values=values,
            is_replay=lambda r: (
                r.state is InstanceState.IDLE
                and r.run_key is None
                and r.runner_id == runner_id
                and not r.threshold_passed(now)
            ),
        )

    # --- markers -------------------------------------------------------------------------------

    def mark_run_finished(self, run_key: str) -> None:
        """Note that a run attempt is over (its release began), so a provision still in flight for its
        run key gives back what it holds instead of setting it running. The run key names the attempt
        (domain.run_keys): a re-run's provision, under its own key, never finds its earlier attempt's
        mark. Expires with the terminated records."""
        now = self._clock.now()
        item = {
            **_key(FINISHED_RUN_PREFIX + run_key, FINISHED_RUN_ITEM),
            "finished_at": _value(now),
            TTL_ATTRIBUTE: _value(self._expiry(now)),
        }
        self._client.put_item(TableName=self._table, Item=item)

    def run_finished(self, run_key: str) -> bool:
        response = self._client.get_item(
            TableName=self._table,
            Key=_key(FINISHED_RUN_PREFIX + run_key, FINISHED_RUN_ITEM),
            ConsistentRead=True,
        )
        return "Item" in response

    def read_marker(self, name: str) -> float | None:
        """A marker's value (e.g. refresh's redelivery high-water mark); None if it was never set."""
        response = self._client.get_item(
            TableName=self._table, Key=_key(MARKER_PREFIX + name, MARKER_ITEM), ConsistentRead=True
        )
        item = response.get("Item")
        return None if item is None else float(_from_item(item)[MARKER_ATTRIBUTE])

    def move_marker(self, name: str, value: float, *, expected: float | None) -> bool:
        """Compare-and-set: the marker becomes `value` only if it still is `expected` (None: not set yet).

        Runs that overlap (two refreshes) both read a marker; whichever moves it first owns what it
        stands for, and the other gets False and leaves that work alone. A move whose answer was lost
        and that is retried (by botocore) meets its own write: the token it wrote beside
        the value tells it so, and it has won (issue 12, defect 6).
        """
        mover = uuid.uuid4().hex
        values: dict[str, Any] = {":value": _value(value), ":mover": {"S": mover}}
        if expected is None:
            condition = "attribute_not_exists(pk)"
        else:
            condition = f"{MARKER_ATTRIBUTE} = :expected"
            values[":expected"] = _value(expected)
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_key(MARKER_PREFIX + name, MARKER_ITEM),
                UpdateExpression=f"SET {MARKER_ATTRIBUTE} = :value, {MARKER_MOVER} = :mover",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            current: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            return bool(current.get(MARKER_MOVER, {}).get("S") == mover)
        return True

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
                ExpressionAttributeValues={":run_key": _value(run_key)},
            )
        )

    def due(self, now: Epoch | None = None) -> list[InstanceRecord]:
        """Every live record whose threshold has passed, for refresh to terminate."""
        cutoff = self._clock.now() if now is None else now
        return self._sweep("AND #threshold <= :now", {":now": _value(cutoff)})

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
            ExpressionAttributeValues={":partition": _value(partition.name), ":now": _value(cutoff)},
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
            ExpressionAttributeValues={":partition": _value(partition.name)},
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
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._instance_key(unreadable.instance_id, STATE_ITEM),
                UpdateExpression=(
                    f"SET {TTL_ATTRIBUTE} = :expires, {UNREADABLE_ATTRIBUTE} = :now REMOVE "
                    + ", ".join(_INDEX_KEYS)
                ),
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={":expires": _value(self._expiry(now)), ":now": _value(now)},
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            return False
        return True

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
                ExpressionAttributeValues={":shard": _value(str(shard)), **(values or {})},
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
                for key in (_key(arn, STATE_ITEM), *(_key(agent_partition(arn), kind) for kind in kinds))
            ]
            items = read_items(self._client, self._table, keys, self._backoff)
            for instance_id, arn in chunk:
                state = items.get((arn, STATE_ITEM))
                heartbeat = items.get((agent_partition(arn), HEARTBEAT_ITEM))
                signal = items.get((agent_partition(arn), SIGNAL_ITEM))
                views[instance_id] = InstanceView(
                    record=None if state is None else readable_record(state),
                    heartbeat=_heartbeat(instance_id, None if heartbeat is None else _from_item(heartbeat)),
                    signal=_signal(instance_id, None if signal is None else _from_item(signal)),
                )
        return views

    # --- mechanics -----------------------------------------------------------------------------

    def _to_idle(
        self,
        instance_id: str,
        from_state: InstanceState,
        run_key: str | None,
        claim_token: str | None = None,
        *,
        runner_id: int | None = None,
    ) -> TransitionResult:
        now = self._clock.now()
        return self._transition(
            instance_id,
            now,
            expect_states=(from_state,),
            expect_run_key=run_key,
            expect_claim_token=claim_token,
            expect_runner_id=runner_id,
            new_state=InstanceState.IDLE,
            threshold_in=self._timeouts.idle_seconds,
            remove_fields=(RUN_KEY_ATTRIBUTE, "claim_token"),
            is_replay=lambda r: (
                r.state is InstanceState.IDLE
                and r.run_key is None
                and not r.threshold_passed(now)
                and runner_id in (None, r.runner_id)
            ),
        )

    def _transition(
        self,
        instance_id: str,
        now: Epoch,
        *,
        expect_states: tuple[InstanceState, ...],
        expect_run_key: str | object | None,
        expect_claim_token: str | None = None,
        expect_runner_id: int | None = None,
        new_state: InstanceState | None,
        threshold_in: float,
        is_replay: Callable[[InstanceRecord], bool],
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: tuple[str, ...] = (),
        extra_conditions: list[str] | None = None,
        extra_values: Mapping[str, Any] | None = None,
        count_job: bool = False,
        may_be_quarantined: bool = False,
        threshold_ahead: bool = True,
    ) -> TransitionResult:
        """One conditional UpdateItem: expected state, expected run key, threshold still ahead, and (but
        for expiry and quarantine) not quarantined.

        `is_replay` judges, at the same `now`, the record found when the condition fails. A replay
        is reported as success, so (but for expire) it must find the record still valid: once the
        threshold has passed, the call's effect has been overtaken and the instance is on its way out.
        """
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values: dict[str, Any] = {
            ":now": _value(now),
            ":threshold": _value(now + threshold_in),
            **_state_values(expect_states),
        }
        assignments = ["#threshold = :threshold", "updated_at = :now"]
        if new_state is not None:
            values[":new_state"] = _value(new_state.value)
            assignments.append("#state = :new_state")
            # In by-idle exactly while idle: a state's every write passes here or names it itself.
            if new_state is InstanceState.IDLE:
                assignments.append(f"{IDLE_SINCE_ATTRIBUTE} = :now")
            else:
                remove_fields = (*remove_fields, IDLE_SINCE_ATTRIBUTE)
        for index, (name, value) in enumerate((set_fields or {}).items()):
            values[f":set{index}"] = _value(value)
            assignments.append(f"{name} = :set{index}")
        if count_job:
            values |= {":zero": _value(0), ":one": _value(1)}
            assignments.append("jobs_served = if_not_exists(jobs_served, :zero) + :one")
        values |= dict(extra_values or {})
        conditions = [f"#state IN ({', '.join(_state_placeholders(expect_states))})"]
        if threshold_ahead:
            conditions.append("#threshold > :now")
        if expect_run_key is None:
            conditions.append(f"attribute_not_exists({RUN_KEY_ATTRIBUTE})")
        elif isinstance(expect_run_key, str):
            values[":expected_run_key"] = _value(expect_run_key)
            conditions.append(f"{RUN_KEY_ATTRIBUTE} = :expected_run_key")
        if expect_claim_token is not None:
            values[":expected_claim_token"] = _value(expect_claim_token)
            conditions.append("claim_token = :expected_claim_token")
        if expect_runner_id is not None:
            values[":expected_runner_id"] = _value(expect_runner_id)
            conditions.append("runner_id = :expected_runner_id")
        conditions += extra_conditions or []
        update = "SET " + ", ".join(assignments)
        if remove_fields:
            update += " REMOVE " + ", ".join(remove_fields)
        return self._write(
            instance_id,
            update=update,
            condition=" AND ".join(conditions),
            names=names,
            values=values,
            may_be_quarantined=may_be_quarantined,
            is_replay=is_replay,
        )

    def _write(
        self,
        instance_id: str,
        *,
        update: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
        is_replay: Callable[[InstanceRecord], bool],
        may_be_quarantined: bool = False,
    ) -> TransitionResult:
        """One conditional UpdateItem of the record. Without `may_be_quarantined`, a quarantined record
        fails the condition and is never taken for a replay. A record that does not parse, before or
        after, is no record: the write is LOST, with none."""
        if not may_be_quarantined:
            condition = f"{condition} AND {NOT_QUARANTINED}"
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=self._instance_key(instance_id, STATE_ITEM),
                UpdateExpression=update,
                ConditionExpression=f"attribute_exists(pk) AND {condition}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            current = _lost_race_record(exc)
            if (
                current is not None
                and (may_be_quarantined or current.quarantined_at is None)
                and is_replay(current)
            ):
                return TransitionResult(Outcome.REPLAYED, current)
            return TransitionResult(Outcome.LOST, current)
        applied = readable_record(response["Attributes"])
        return TransitionResult(Outcome.LOST if applied is None else Outcome.APPLIED, applied)

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
            **_to_item({k: v for k, v in fields.items() if v is not None}),
            **self._agent_key(instance_id, kind),
            TTL_ATTRIBUTE: _value(self._expiry(now)),
        }
        self._client.put_item(TableName=self._table, Item=item)

    def _get_agent_item(self, instance_id: str, kind: str) -> dict[str, Any] | None:
        response = self._client.get_item(
            TableName=self._table, Key=self._agent_key(instance_id, kind), ConsistentRead=True
        )
        item = response.get("Item")
        return None if item is None else _from_item(item)

    def _instance_key(self, instance_id: str, kind: str) -> dict[str, Any]:
        return _key(self.instance_arns.arn(instance_id), kind)

    def _agent_key(self, instance_id: str, kind: str) -> dict[str, Any]:
        return _key(agent_partition(self.instance_arns.arn(instance_id)), kind)

    def _expiry(self, now: Epoch) -> int:
        return int(now) + self._timeouts.terminated_retention_days * 86_400


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


def _lost_race_record(exc: ClientError) -> InstanceRecord | None:
    """The record that beat us, from a failed condition (None if none, or none that parses); anything but
    a lost race is re-raised."""
    if error_code(exc) != "ConditionalCheckFailedException":
        raise exc
    item = exc.response.get("Item")
    return None if not item else readable_record(item)  # type: ignore[arg-type]


def _key(partition_key: str, kind: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": partition_key}, SORT_KEY: {"S": kind}}


def _state_placeholders(states: tuple[InstanceState, ...] | frozenset[InstanceState]) -> list[str]:
    return [f":state_{state.value}" for state in sorted(states)]


def _state_values(states: tuple[InstanceState, ...] | frozenset[InstanceState]) -> dict[str, Any]:
    return {f":state_{state.value}": _value(state.value) for state in states}


def _value(value: Any) -> Any:
    if isinstance(value, float):
        value = Decimal(repr(value))
    return _serializer.serialize(value)


def _to_item(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _value(value) for name, value in fields.items()}


def _from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    plain = {name: _deserializer.deserialize(value) for name, value in item.items()}
    return {name: _number(v) if isinstance(v, Decimal) else v for name, v in plain.items()}


def _number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


class UnreadableRecordError(ValueError):
    """A `state` item that is not an InstanceRecord."""


def record_from_item(item: Mapping[str, Any]) -> InstanceRecord:
    """The record an instance's `state` item holds; UnreadableRecordError if it holds none."""
    try:
        fields = {k: v for k, v in _from_item(item).items() if k not in _BOOKKEEPING}
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


def agent_partition(arn: str) -> str:
    """The partition key of the agent's items of the instance `arn` names."""
    return AGENT_PARTITION_PREFIX + arn
