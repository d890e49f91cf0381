"""The state table: every lifecycle transition of DESIGN.md section 4 as one conditional DynamoDB write.

The table's layout is state_items.py; its reads, state_reads.py; how one transition is written,
state_writes.py; the control plane's markers, state_markers.py.
"""

from __future__ import annotations

from typing import Any

from runner_pool.adapters.aws_clients import Refusal, conditional_write
from runner_pool.adapters.state_items import (
    IDLE_SINCE_ATTRIBUTE,
    NOT_QUARANTINED,
    POOL_PARTITION_ATTRIBUTE,
    QUARANTINED_ATTRIBUTE,
    REPOSITORY_ATTRIBUTE,
    REPOSITORY_ID_ATTRIBUTE,
    RUN_KEY_ATTRIBUTE,
    STATE_ITEM,
    STOPPED_PARTITION_ATTRIBUTE,
    SWEEP_SHARD_ATTRIBUTE,
    THRESHOLD_ATTRIBUTE,
    TRUST_ATTRIBUTE,
    attribute_value,
    sweep_shard,
    to_item,
)
from runner_pool.adapters.state_markers import StateMarkers
from runner_pool.adapters.state_writes import (
    StateWrites,
    record_found,
    state_placeholders,
    state_values,
)
from runner_pool.domain.clock import Epoch
from runner_pool.domain.config import ReuseScope
from runner_pool.domain.lifecycle import LIVE_STATES, InstanceState, Outcome
from runner_pool.domain.pickup import PLAIN_CLAIM, ClaimTerms
from runner_pool.domain.pool_partitions import PoolPartition
from runner_pool.domain.records import (
    HandOverTier,
    InstanceFacts,
    InstanceRecord,
    TransitionResult,
    UsageClass,
)
from runner_pool.domain.trust import TrustLevel, reuses

_ANY_RUN = object()


class StateTable(StateWrites, StateMarkers):
    """Every lifecycle transition of an instance's record, with the table's reads and markers."""

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
            handed_over_at=now if run_key else None,
            handed_over_from=HandOverTier.COLD if run_key else None,
            created_at=now,
            updated_at=now,
        )
        item = {
            **to_item(record.model_dump(mode="json", exclude_none=True)),
            **self._instance_key(facts.instance_id, STATE_ITEM),
            SWEEP_SHARD_ATTRIBUTE: {"S": sweep_shard(facts.instance_id)},
            POOL_PARTITION_ATTRIBUTE: {"S": PoolPartition.of(facts).name},
        }
        answer = conditional_write(
            lambda: self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )
        if isinstance(answer, Refusal):
            current = record_found(answer)
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
        terms: ClaimTerms = PLAIN_CLAIM,
    ) -> TransitionResult:
        """idle → claimed(run): only an idle, unheld instance whose idle time has not run out.

        The `terms` (domain/pickup.py `ClaimTerms`) say what else the record must be and what it then names.
        With `stopped`, stopped → claimed(run) instead: a stopped instance of the stopped tier, which the
        claim's holder then starts (EC2 StartInstances). Its threshold allows for the start, and it
        leaves the by-stopped index in this same write, so no other request finds it to start it again.

        For a run of `repository`: only an instance that served nothing yet or served a repository
        within `reuse.scope` of it, and fewer than `reuse.max_jobs` jobs; the record
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
        set_fields: dict[str, Any] = {
            RUN_KEY_ATTRIBUTE: run_key,
            "claim_token": claim_token,
            "handed_over_at": now,
            "handed_over_from": (HandOverTier.STOPPED if terms.stopped else HandOverTier.HOT).value,
        }
        removed: tuple[str, ...] = ()
        if terms.repository is not None:
            set_fields |= {REPOSITORY_ATTRIBUTE: terms.repository, "single_use": terms.single_use}
            if terms.repository_id is not None:
                set_fields[REPOSITORY_ID_ATTRIBUTE] = terms.repository_id
            else:
                # A hand-off whose demand named no id must not keep the id of the repository served before.
                removed += (REPOSITORY_ID_ATTRIBUTE,)
            if terms.trust is not None:
                set_fields[TRUST_ATTRIBUTE] = terms.trust.value
            else:
                removed += (TRUST_ATTRIBUTE,)
            values[":zero"] = attribute_value(0)
            pristine = "(attribute_not_exists(jobs_served) OR jobs_served = :zero)"
            if terms.single_use or not reuses(terms.trust):
                conditions.append(pristine)
            else:
                values[":trust"] = attribute_value(terms.trust.value if terms.trust is not None else "")
                conditions.append(f"({pristine} OR {TRUST_ATTRIBUTE} = :trust)")
        if terms.repository is not None and terms.reuse is not None:
            values |= {
                ":max_jobs": attribute_value(terms.reuse.max_jobs),
                ":created_after": attribute_value(now - terms.reuse.max_age_minutes * 60.0),
            }
            conditions += [
                "(attribute_not_exists(jobs_served) OR jobs_served < :max_jobs)",
                "created_at > :created_after",
            ]
            unserved = f"attribute_not_exists({REPOSITORY_ATTRIBUTE})"
            if terms.reuse.scope is ReuseScope.REPOSITORY and terms.repository_id is not None:
                values |= {
                    ":served": attribute_value(terms.repository),
                    ":served_id": attribute_value(terms.repository_id),
                }
                by_name = (
                    f"attribute_not_exists({REPOSITORY_ID_ATTRIBUTE}) AND {REPOSITORY_ATTRIBUTE} = :served"
                )
                conditions.append(f"({unserved} OR {REPOSITORY_ID_ATTRIBUTE} = :served_id OR ({by_name}))")
            elif terms.reuse.scope is ReuseScope.REPOSITORY:
                values[":served"] = attribute_value(terms.repository)
                conditions.append(f"({unserved} OR {REPOSITORY_ATTRIBUTE} = :served)")
            elif terms.reuse.scope is ReuseScope.OWNER:
                values[":owner"] = attribute_value(terms.repository.split("/", 1)[0] + "/")
                conditions.append(f"({unserved} OR begins_with({REPOSITORY_ATTRIBUTE}, :owner))")
        threshold_in = self._timeouts.claimed_threshold_seconds
        if terms.stopped:
            threshold_in += self._timeouts.start_registration_seconds
        return self._transition(
            instance_id,
            now,
            expect_states=(InstanceState.STOPPED if terms.stopped else InstanceState.IDLE,),
            expect_run_key=None,
            new_state=InstanceState.CLAIMED,
            threshold_in=threshold_in,
            set_fields=set_fields,
            # The previous run's runner stays on an idle record, for release to find; a claim starts anew.
            remove_fields=(
                ("runner_id", "runner_run_key", STOPPED_PARTITION_ATTRIBUTE)
                if terms.stopped
                else ("runner_id", "runner_run_key")
            )
            + removed,
            extra_conditions=conditions,
            extra_values=values,
            count_job=terms.repository is not None,
            is_replay=lambda r: (
                r.state is InstanceState.CLAIMED
                and r.claim_token == claim_token
                and not r.threshold_passed(now)
            ),
        )

    def quarantine(self, instance_id: str, runner_id: int) -> TransitionResult:
        """any live → expired and quarantined, while the record still holds the hand-off to `runner_id`:
        GitHub gave that runner a job of another run, attempt or repository, so the
        instance must never serve again. Idle counts too (the run's release may have come first); a later
        hand-off does not; an instance already expired is marked too, so its agent stops the runner now
        rather than when the instance ends. The mark is final: every other transition requires its
        absence."""
        now = self._clock.now()
        return self._expire_live(
            instance_id,
            now,
            _ANY_RUN,
            expect_runner_id=runner_id,
            set_fields={QUARANTINED_ATTRIBUTE: now},
            # Once: a retry (or a second report of the job) finds its own mark and replays.
            extra_conditions=[NOT_QUARANTINED],
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
                f"#state IN ({', '.join(state_placeholders(held))}) AND {RUN_KEY_ATTRIBUTE} = :run_key "
                "AND #threshold > :now AND attribute_not_exists(interrupted_at)"
            ),
            names={"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE},
            values={":now": attribute_value(now), ":run_key": attribute_value(run_key), **state_values(held)},
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
            extra_values={":on_demand": attribute_value(UsageClass.ON_DEMAND.value)},
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
            set_fields={STOPPED_PARTITION_ATTRIBUTE: PoolPartition.of(facts).name, "stopped_at": now},
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

        return self._expire_live(instance_id, now, run_key, is_replay=already_expired)

    def _expire_live(
        self, instance_id: str, now: Epoch, run_key: str | object | None, **terms: Any
    ) -> TransitionResult:
        """any live → expired at `now`, the state kept, a quarantined record too; `run_key` as `expire`'s,
        `terms` the rest of the transition's conditions and fields."""
        return self._transition(
            instance_id,
            now,
            expect_states=tuple(LIVE_STATES),
            expect_run_key=run_key,
            new_state=None,
            threshold_in=0.0,
            may_be_quarantined=True,
            **terms,
        )

    def mark_terminated(self, instance_id: str) -> TransitionResult:
        """expired → terminated, after EC2 TerminateInstances: leaves both indexes, gets a TTL."""
        now = self._clock.now()
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values = {
            ":terminated": attribute_value(InstanceState.TERMINATED.value),
            ":now": attribute_value(now),
            ":expires": attribute_value(self._expiry(now)),
            **state_values(LIVE_STATES),
        }
        return self._write(
            instance_id,
            update=(
                "SET #state = :terminated, expires_at = :expires, updated_at = :now "
                f"REMOVE {RUN_KEY_ATTRIBUTE}, claim_token, {SWEEP_SHARD_ATTRIBUTE}, "
                f"{STOPPED_PARTITION_ATTRIBUTE}, {IDLE_SINCE_ATTRIBUTE}, #threshold"
            ),
            condition=f"#state IN ({', '.join(state_placeholders(LIVE_STATES))}) AND #threshold <= :now",
            names=names,
            values=values,
            may_be_quarantined=True,
            is_replay=lambda r: r.state is InstanceState.TERMINATED,
        )

    def record_runner(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult:
        """Note the GitHub runner registered for the run on a claimed or created instance, before its
        config is stored: a retried hand-off that finds a runner noted but no config for it registers
        anew, one that finds both is complete. Release deletes the runner if it never
        takes a job, and finds the instance a completed job names by it. Not a transition: state and
        threshold stay as they are; a later registration for the same hand-off replaces the earlier. The
        run key is noted beside it (`runner_run_key`): the jobs that runner runs are judged by it."""
        now = self._clock.now()
        held = (InstanceState.CLAIMED, InstanceState.CREATED)
        values: dict[str, Any] = {
            ":runner_id": attribute_value(runner_id),
            ":now": attribute_value(now),
            ":run_key": attribute_value(run_key),
            **state_values(held),
        }
        update = "SET runner_id = :runner_id, runner_run_key = :run_key, updated_at = :now"
        return self._write(
            instance_id,
            update=update,
            condition=(
                f"#state IN ({', '.join(state_placeholders(held))}) "
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
        """running | created | claimed, unchanged: the runner `runner_id` of an instance that waited for any
        job (an instant tier's, domain/instant.py) took one of `repository`. Its runtime starts now, not
        when it began to wait, and the record names the repository it now serves. A runner registered and
        listening can take a job before its provision's Finish has set the instance running (its check
        comes round later): the start is noted all the same, and the activation keeps it. Not for a
        quarantined record."""
        now = self._clock.now()
        handed_over = (InstanceState.RUNNING, InstanceState.CREATED, InstanceState.CLAIMED)
        return self._transition(
            instance_id,
            now,
            expect_states=handed_over,
            expect_run_key=run_key,
            expect_runner_id=runner_id,
            new_state=None,
            threshold_in=max_runtime_minutes * 60.0,
            set_fields={REPOSITORY_ATTRIBUTE: repository},
            is_replay=lambda r: (
                r.state in handed_over
                and r.runner_id == runner_id
                and r.repository == repository
                and not r.threshold_passed(now)
            ),
        )

    def release_served(self, instance_id: str, run_key: str, runner_id: int) -> TransitionResult:
        """running | claimed | created → idle: the hand-off to `runner_id` ends (its job completed, or
        its run did).

        A short job can end before its provision's Finish has set the instance running, and the
        run's completion can be handled before the job's; the instance was handed
        nothing but the run's runner config either way, so it goes back to the pool like any
        released one once its agent has cleaned up. Only the hand-off to that runner: a later
        hand-off of the same instance to the same run (another runner) is not touched.
        """
        now = self._clock.now()
        served = (InstanceState.RUNNING, InstanceState.CLAIMED, InstanceState.CREATED)
        names = {"#state": "state", "#threshold": THRESHOLD_ATTRIBUTE}
        values = {
            ":now": attribute_value(now),
            ":threshold": attribute_value(now + self._timeouts.idle_seconds),
            ":idle": attribute_value(InstanceState.IDLE.value),
            ":run_key": attribute_value(run_key),
            ":runner_id": attribute_value(runner_id),
            **state_values(served),
        }
        return self._write(
            instance_id,
            update=(
                "SET #state = :idle, #threshold = :threshold, updated_at = :now, "
                f"{IDLE_SINCE_ATTRIBUTE} = :now "
                f"REMOVE {RUN_KEY_ATTRIBUTE}, claim_token"
            ),
            condition=(
                f"#state IN ({', '.join(state_placeholders(served))}) AND {RUN_KEY_ATTRIBUTE} = :run_key "
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
